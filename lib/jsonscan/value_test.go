package jsonscan

import (
	"slices"
	"strings"
	"testing"
)

func TestKindOf(t *testing.T) {
	tests := map[string]struct {
		raw  string
		want Kind
	}{
		"object":        {raw: `{"a":1}`, want: KindObject},
		"array":         {raw: `[1]`, want: KindArray},
		"string":        {raw: `"x"`, want: KindString},
		"number":        {raw: `12`, want: KindNumber},
		"negative":      {raw: `-0.5`, want: KindNumber},
		"true":          {raw: `true`, want: KindBool},
		"false":         {raw: `false`, want: KindBool},
		"null":          {raw: `null`, want: KindNull},
		"leading space": {raw: " \n[", want: KindArray},
		"empty":         {raw: ``, want: KindInvalid},
		"space only":    {raw: ` `, want: KindInvalid},
		"garbage":       {raw: `}`, want: KindInvalid},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := KindOf([]byte(tc.raw)); got != tc.want {
				t.Errorf("KindOf(%#q) = %v, want %v", tc.raw, got, tc.want)
			}
		})
	}
	if got := KindOf(nil); got != KindInvalid {
		t.Errorf("KindOf(nil) = %v, want invalid", got)
	}
}

func TestString(t *testing.T) {
	tests := map[string]struct {
		raw     string
		want    string
		wantErr string
	}{
		"plain":           {raw: `"10.0.0.5"`, want: "10.0.0.5"},
		"empty":           {raw: `""`, want: ""},
		"unicode":         {raw: `"日本"`, want: "日本"},
		"escapes":         {raw: `"a\"b\\c\/d\u0065\n"`, want: "a\"b\\c/de\n"},
		"surrogate pair":  {raw: `"\ud83d\ude00"`, want: "😀"},
		"trailing slash":  {raw: `"a\\"`, want: `a\`},
		"whitespace":      {raw: " \"x\"\n", want: "x"},
		"invalid utf-8":   {raw: "\"a\xffb\"", want: "a\uFFFDb"},
		"number":          {raw: `5`, wantErr: "value is a number, not a string"},
		"null":            {raw: `null`, wantErr: "value is null, not a string"},
		"object":          {raw: `{"a":"b"}`, wantErr: "value is an object, not a string"},
		"absent":          {raw: ``, wantErr: "value is not a JSON value, not a string"},
		"two strings":     {raw: `"a" "b"`, wantErr: "decode string: invalid character"},
		"unterminated":    {raw: `"abc`, wantErr: "decode string: unexpected end of JSON input"},
		"control char":    {raw: "\"a\x01\"", wantErr: "decode string: invalid character"},
		"bad escape":      {raw: `"\x"`, wantErr: "decode string: invalid character"},
		"unescaped quote": {raw: `"a"b"`, wantErr: "decode string: invalid character"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := String([]byte(tc.raw))
			checkErr(t, err, tc.wantErr)
			if got != tc.want {
				t.Errorf("String(%#q) = %q, want %q", tc.raw, got, tc.want)
			}
		})
	}
}

func TestStrings(t *testing.T) {
	tests := map[string]struct {
		raw     string
		max     int
		want    []string
		wantErr string
	}{
		"addresses":       {raw: `["10.0.0.5"]`, max: 1, want: []string{"10.0.0.5"}},
		"several":         {raw: ` [ "a" , "b\u0021" ,"" ] `, max: 3, want: []string{"a", "b!", ""}},
		"empty":           {raw: `[]`, max: 0, want: []string{}},
		"empty spaced":    {raw: `[ ]`, max: 5, want: []string{}},
		"too many":        {raw: `["a","b"]`, max: 1, wantErr: "more than 1 elements"},
		"too many first":  {raw: `["a",1]`, max: 1, wantErr: "more than 1 elements"},
		"not a string":    {raw: `["a","b",3]`, max: 5, wantErr: "element 2 is a number, not a string"},
		"null element":    {raw: `[null]`, max: 5, wantErr: "element 0 is null, not a string"},
		"nested array":    {raw: `[["a"]]`, max: 5, wantErr: "element 0 is an array, not a string"},
		"null":            {raw: `null`, max: 5, wantErr: "value is null, not an array"},
		"string":          {raw: `"a"`, max: 5, wantErr: "value is a string, not an array"},
		"negative max":    {raw: `[]`, max: -1, wantErr: "negative maximum -1"},
		"malformed":       {raw: `["a" "b"]`, max: 5, wantErr: "malformed array: byte 5 after element 0"},
		"bad element":     {raw: `["\x"]`, max: 5, wantErr: "element 0: decode string: invalid character"},
		"unterminated":    {raw: `["a",`, max: 5, wantErr: "malformed array: element 1 at byte 5"},
		"unterminated 2":  {raw: `["a"`, max: 5, wantErr: "malformed array: unterminated after element 0"},
		"hostile length":  {raw: "[" + strings.Repeat(`"a",`, 100_000) + `"a"]`, max: 1, wantErr: "more than 1 elements"},
		"hostile element": {raw: "[" + strings.Repeat(`"a",`, 100_000) + `{}]`, max: 200_000, wantErr: "element 100000 is an object, not a string"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Strings([]byte(tc.raw), tc.max)
			checkErr(t, err, tc.wantErr)
			if !slices.Equal(got, tc.want) || (got == nil) != (tc.want == nil) {
				t.Errorf("Strings(%.40q, %d) = %q, want %q", tc.raw, tc.max, got, tc.want)
			}
		})
	}
}

func TestEach(t *testing.T) {
	tests := map[string]struct {
		raw     string
		stop    int // stop after this many elements; 0 never stops
		want    []string
		wantErr string
	}{
		"mixed":     {raw: ` [1, "a,]" ,{"b":[2]}, [ ], null,true ] `, want: []string{`1`, `"a,]"`, `{"b":[2]}`, `[ ]`, `null`, `true`}},
		"empty":     {raw: `[]`, want: nil},
		"stop":      {raw: `[1,2,3]`, stop: 2, want: []string{`1`, `2`}},
		"object":    {raw: `{}`, wantErr: "value is an object, not an array"},
		"nil":       {raw: ``, wantErr: "value is not a JSON value, not an array"},
		"malformed": {raw: `[1,2`, want: []string{`1`, `2`}, wantErr: "malformed array: unterminated after element 1"},
		"deep":      {raw: "[" + nested(100_000) + ",1]", want: []string{nested(100_000), "1"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			raw := []byte(tc.raw)
			var got []string
			err := Each(raw, func(i int, elem []byte) bool {
				if i != len(got) {
					t.Errorf("index %d, want %d", i, len(got))
				}
				checkSubslice(t, raw, elem)
				got = append(got, string(elem))
				return tc.stop == 0 || len(got) < tc.stop
			})
			checkErr(t, err, tc.wantErr)
			if !slices.Equal(got, tc.want) {
				t.Errorf("elements %.60q, want %.60q", got, tc.want)
			}
		})
	}
}

func TestMembers(t *testing.T) {
	type member struct{ key, value string }
	tests := map[string]struct {
		raw     string
		stop    int
		want    []member
		wantErr string
	}{
		"mixed": {
			raw:  ` { "a" : 1 , "b\"}" :"x}" ,"c":{"d":[]},"a":null } `,
			want: []member{{`a`, `1`}, {`b\"}`, `"x}"`}, {`c`, `{"d":[]}`}, {`a`, `null`}},
		},
		"empty":     {raw: `{ }`, want: nil},
		"stop":      {raw: `{"a":1,"b":2,"c":3}`, stop: 1, want: []member{{`a`, `1`}}},
		"array":     {raw: `[]`, wantErr: "value is an array, not an object"},
		"malformed": {raw: `{"a":1,2}`, want: []member{{`a`, `1`}}, wantErr: "malformed object: member 1 at byte 7"},
		"no colon":  {raw: `{"a" 1}`, wantErr: "malformed object: no colon after name of member 0"},
		"no value":  {raw: `{"a":}`, wantErr: "malformed object: value of member 0 at byte 5"},
		"open name": {raw: `{"a`, wantErr: "malformed object: unterminated name of member 0"},
		"open":      {raw: `{"a":1`, want: []member{{`a`, `1`}}, wantErr: "malformed object: unterminated after member 0"},
		"bad next":  {raw: `{"a":1]`, want: []member{{`a`, `1`}}, wantErr: "malformed object: byte 6 after member 0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			raw := []byte(tc.raw)
			var got []member
			err := Members(raw, func(key, value []byte) bool {
				checkSubslice(t, raw, value)
				got = append(got, member{string(key), string(value)})
				return tc.stop == 0 || len(got) < tc.stop
			})
			checkErr(t, err, tc.wantErr)
			if !slices.Equal(got, tc.want) {
				t.Errorf("members %q, want %q", got, tc.want)
			}
		})
	}
}

func TestKeys(t *testing.T) {
	tests := map[string]struct {
		key     string
		want    string
		wantErr string
	}{
		"plain":         {key: `vmipam.io/token`, want: "vmipam.io/token"},
		"empty":         {key: ``, want: ""},
		"unicode":       {key: `ключ`, want: "ключ"},
		"escaped":       {key: `vmipam.io\/tok\u0065n`, want: "vmipam.io/token"},
		"quote":         {key: `a\"b`, want: `a"b`},
		"backslash":     {key: `a\\`, want: `a\`},
		"invalid utf-8": {key: "a\xff", want: "a\uFFFD"},
		"bad escape":    {key: `a\q`, wantErr: "unquote member name: invalid character"},
		"bare quote":    {key: `a"b`, wantErr: "unquote member name: invalid character"},
		"lone slash":    {key: `a\`, wantErr: "unquote member name: unexpected end of JSON input"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := UnquoteKey([]byte(tc.key))
			checkErr(t, err, tc.wantErr)
			if got != tc.want {
				t.Errorf("UnquoteKey(%#q) = %q, want %q", tc.key, got, tc.want)
			}
			if ok := KeyEquals([]byte(tc.key), tc.want); ok != (tc.wantErr == "") {
				t.Errorf("KeyEquals(%#q, %q) = %v", tc.key, tc.want, ok)
			}
			if KeyEquals([]byte(tc.key), tc.want+"x") {
				t.Errorf("KeyEquals(%#q, %q) = true", tc.key, tc.want+"x")
			}
		})
	}
}

func TestValueAllocs(t *testing.T) {
	raw := []byte(`{"vmipam.io/token":"t","spec":{"addresses":["10.0.0.5","fd00::5"],"n":1}}`)
	spec := Extract(raw, p("spec"))[0]
	addrs := Extract(raw, p("spec", "addresses"))[0]
	tests := map[string]func(){
		"Each": func() {
			_ = Each(addrs, func(int, []byte) bool { return true })
		},
		"Members and KeyEquals": func() {
			_ = Members(raw, func(key, _ []byte) bool { return !KeyEquals(key, "vmipam.io/token") })
		},
		"Members nested": func() {
			_ = Members(spec, func(_, value []byte) bool { return KindOf(value) != KindNull })
		},
	}
	for name, fn := range tests {
		t.Run(name, func(t *testing.T) {
			if got := testing.AllocsPerRun(20, fn); got != 0 {
				t.Errorf("%v allocations per run, want 0", got)
			}
		})
	}
}

// checkErr fails the test unless err is nil when want is empty, or has a
// message starting with want otherwise.
func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Errorf("no error, want %q", want)
	case want != "" && !strings.HasPrefix(err.Error(), want):
		t.Errorf("error %q, want %q", err, want)
	}
}
