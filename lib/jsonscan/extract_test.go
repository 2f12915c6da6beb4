package jsonscan

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"
)

// absent stands for a nil result in the tables below; no JSON value is
// spelled like it.
const absent = "<absent>"

// p builds a path from its names, for shorter tables.
func p(names ...string) []string { return names }

func TestExtract(t *testing.T) {
	tests := map[string]struct {
		data  string
		paths [][]string
		want  []string
	}{
		"nested": {
			data:  `{"a":{"b":{"c":1}},"d":2}`,
			paths: [][]string{p("a", "b", "c"), p("a", "b"), p("a"), p("d")},
			want:  []string{`1`, `{"c":1}`, `{"b":{"c":1}}`, `2`},
		},
		"missing": {
			data:  `{"a":{"b":1}}`,
			paths: [][]string{p("x"), p("a", "x"), p("a", "b", "c"), p("a", "b", "c", "d")},
			want:  []string{absent, absent, absent, absent},
		},
		"intermediate not an object": {
			data: `{"arr":[{"b":1}],"str":"{\"b\":1}","num":1,"null":null,"t":true}`,
			paths: [][]string{p("arr", "b"), p("arr", "0"), p("str", "b"), p("num", "b"),
				p("null", "b"), p("t", "b")},
			want: []string{absent, absent, absent, absent, absent, absent},
		},
		"root not an object": {
			data:  ` [ {"a":1} ] `,
			paths: [][]string{p("a"), p(), p("0")},
			want:  []string{absent, `[ {"a":1} ]`, absent},
		},
		"root scalar": {
			data:  "\t\"a\"\n",
			paths: [][]string{p(), p("a")},
			want:  []string{`"a"`, absent},
		},
		"empty path is the document": {
			data:  " \n{\"a\" : 1 }\r\n",
			paths: [][]string{p(), p("a"), p()},
			want:  []string{`{"a" : 1 }`, `1`, `{"a" : 1 }`},
		},
		"no paths": {
			data:  `{"a":1}`,
			paths: nil,
			want:  []string{},
		},
		"same path twice": {
			data:  `{"a":{"b":1}}`,
			paths: [][]string{p("a", "b"), p("a", "b")},
			want:  []string{`1`, `1`},
		},
		"value and a path through it": {
			data:  `{"a":{"b":{"c":[1]}}}`,
			paths: [][]string{p("a", "b", "c"), p("a"), p("a", "b")},
			want:  []string{`[1]`, `{"b":{"c":[1]}}`, `{"c":[1]}`},
		},
		"duplicate key last wins": {
			data:  `{"a":1,"b":0,"a":2}`,
			paths: [][]string{p("a"), p("b")},
			want:  []string{`2`, `0`},
		},
		"duplicate object replaced, not merged": {
			data:  `{"a":{"x":1,"y":1},"a":{"y":2}}`,
			paths: [][]string{p("a", "x"), p("a", "y"), p("a")},
			want:  []string{absent, `2`, `{"y":2}`},
		},
		"duplicate object replaced by scalar": {
			data:  `{"a":{"x":1},"a":null}`,
			paths: [][]string{p("a", "x"), p("a")},
			want:  []string{absent, `null`},
		},
		"duplicate scalar replaced by object": {
			data:  `{"a":7,"a":{"x":1}}`,
			paths: [][]string{p("a", "x")},
			want:  []string{`1`},
		},
		"duplicate inner key": {
			data:  `{"a":{"x":1,"x":[2]}}`,
			paths: [][]string{p("a", "x")},
			want:  []string{`[2]`},
		},
		"duplicate spelled differently": {
			data:  `{"spec":{"ipPool":"a"},"spe\u0063":{"ipPool":"b"}}`,
			paths: [][]string{p("spec", "ipPool")},
			want:  []string{`"b"`},
		},
		"escaped keys": {
			data: `{"spe\u0063":1,"a\"b":2,"a\\b":3,"a\/b":4,"vmipam.io\/token":"t","\u0041":5,"tab\t":6}`,
			paths: [][]string{p("spec"), p(`a"b`), p(`a\b`), p("a/b"), p("vmipam.io/token"), p("A"),
				p("tab\t")},
			want: []string{`1`, `2`, `3`, `4`, `"t"`, `5`, `6`},
		},
		"escapes are not matched literally": {
			data:  `{"spe\u0063":1,"a\\b":2,"x":3}`,
			paths: [][]string{p(`spe\u0063`), p(`a\\b`), p(`\u0078`)},
			want:  []string{absent, absent, absent},
		},
		"unicode keys": {
			data:  `{"ключ":1,"日本":2,"😀":3,"\ud83d\ude01":4,"caf\u00e9":5}`,
			paths: [][]string{p("ключ"), p("日本"), p("😀"), p("😁"), p("café")},
			want:  []string{`1`, `2`, `3`, `4`, `5`},
		},
		"invalid utf-8 key reads as encoding/json reads it": {
			data:  "{\"a\xffb\":1}",
			paths: [][]string{p("a\xffb"), p("a\uFFFDb")},
			want:  []string{absent, `1`},
		},
		"case sensitive": {
			data:  `{"Spec":1,"SPEC":2,"spec":3}`,
			paths: [][]string{p("spec"), p("Spec"), p("sPec")},
			want:  []string{`3`, `1`, absent},
		},
		"key prefixes": {
			data:  `{"ab":1,"a":2,"abc":3}`,
			paths: [][]string{p("a"), p("ab"), p("abc"), p("abcd")},
			want:  []string{`2`, `1`, `3`, absent},
		},
		"empty key": {
			data:  `{"":{"":1}}`,
			paths: [][]string{p(""), p("", "")},
			want:  []string{`{"":1}`, `1`},
		},
		"whitespace everywhere": {
			data:  " \t\n{ \"a\" \r\n : \t { \"b\" : [ 1 , 2 ] \n } , \"c\" :\ttrue\t} \n",
			paths: [][]string{p("a"), p("a", "b"), p("c")},
			want:  []string{"{ \"b\" : [ 1 , 2 ] \n }", `[ 1 , 2 ]`, `true`},
		},
		"scalars": {
			data:  `{"n":-1.5e+10,"z":0,"t":true,"f":false,"null":null,"s":"x","e":""}`,
			paths: [][]string{p("n"), p("z"), p("t"), p("f"), p("null"), p("s"), p("e")},
			want:  []string{`-1.5e+10`, `0`, `true`, `false`, `null`, `"x"`, `""`},
		},
		"strings holding structure": {
			data: `{"x":"}]{[","a":1,"y":"\"}","b":2,"z":"a\\","c":3,"w":"\\\"","d":4,` +
				`"v":"\\\\","e":5,"u":"\u0022}","f":6}`,
			paths: [][]string{p("a"), p("b"), p("c"), p("d"), p("e"), p("f"), p("z"), p("w")},
			want:  []string{`1`, `2`, `3`, `4`, `5`, `6`, `"a\\"`, `"\\\""`},
		},
		"keys holding structure": {
			data:  `{"}":{"]":1},"{\"":{"[":2},"\\":3}`,
			paths: [][]string{p("}", "]"), p(`{"`, "["), p(`\`)},
			want:  []string{`1`, `2`, `3`},
		},
		"skipped containers holding strings": {
			data:  `{"x":[{"a":"]"},"}",["\\"]],"a":{"x":{"a":"}"}},"b":1}`,
			paths: [][]string{p("b"), p("a", "x", "a")},
			want:  []string{`1`, `"}"`},
		},
		"empty containers": {
			data:  `{"o":{},"a":[],"s":{ },"t":[ ]}`,
			paths: [][]string{p("o"), p("o", "x"), p("a"), p("s"), p("s", "x"), p("t")},
			want:  []string{`{}`, absent, `[]`, `{ }`, absent, `[ ]`},
		},
		"empty root object": {
			data:  `{}`,
			paths: [][]string{p("a"), p()},
			want:  []string{absent, `{}`},
		},
		"empty document": {
			data:  ``,
			paths: [][]string{p("a"), p()},
			want:  []string{absent, absent},
		},
		"whitespace document": {
			data:  " \n\t ",
			paths: [][]string{p("a"), p()},
			want:  []string{absent, absent},
		},
		"admission review": {
			data:  review,
			paths: reviewPaths,
			want: []string{`"web-0"`, `"team-a"`, `"8a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"`,
				`"c2VjcmV0LXRva2VuLWZvci13ZWItMA"`, `"frontend"`, `"frontend"`, `["10.20.0.17"]`, `false`},
		},
		"admission review old object": {
			data:  review,
			paths: [][]string{p("request", "oldObject"), p("request", "oldObject", "metadata")},
			want:  []string{`null`, absent},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			data := []byte(tc.data)
			got := Extract(data, tc.paths...)
			if len(got) != len(tc.want) {
				t.Fatalf("Extract returned %d values, want %d", len(got), len(tc.want))
			}
			for i, want := range tc.want {
				checkSubslice(t, data, got[i])
				switch {
				case want == absent && got[i] != nil:
					t.Errorf("path %q: got %#q, want absent", tc.paths[i], got[i])
				case want != absent && got[i] == nil:
					t.Errorf("path %q: absent, want %#q", tc.paths[i], want)
				case want != absent && string(got[i]) != want:
					t.Errorf("path %q: got %#q, want %#q", tc.paths[i], got[i], want)
				}
			}
		})
	}
}

// checkSubslice fails the test unless v is nil or a subslice of data whose
// capacity ends where it does.
func checkSubslice(t *testing.T, data, v []byte) {
	t.Helper()
	if v == nil {
		return
	}
	if len(v) != cap(v) {
		t.Errorf("value %#q has capacity %d beyond its length %d", v, cap(v), len(v))
	}
	if len(v) == 0 {
		t.Errorf("value is empty but not nil")
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	at := uintptr(unsafe.Pointer(unsafe.SliceData(v)))
	if at < start || at+uintptr(len(v)) > start+uintptr(len(data)) {
		t.Errorf("value %#q is not a subslice of the input", v)
	}
}

func TestAppendExtract(t *testing.T) {
	data := []byte(`{"a":1,"b":2}`)
	prefix := []byte("kept")
	dst := make([][]byte, 1, 4)
	dst[0] = prefix
	dst = append(dst[:1], []byte("stale"), []byte("stale"))[:1] // leftovers in the capacity must not show
	got := AppendExtract(dst, data, p("b"), p("x"), p("a"))
	want := []string{"kept", "2", absent, "1"}
	if len(got) != len(want) {
		t.Fatalf("got %d values, want %d", len(got), len(want))
	}
	for i, w := range want {
		if (w == absent) != (got[i] == nil) || w != absent && string(got[i]) != w {
			t.Errorf("value %d: got %#q, want %#q", i, got[i], w)
		}
	}
}

func TestExtractManyPaths(t *testing.T) {
	// More paths than one bit-set word holds, some sharing prefixes.
	var doc strings.Builder
	var paths [][]string
	doc.WriteString(`{`)
	for i := range 150 {
		if i > 0 {
			doc.WriteByte(',')
		}
		fmt.Fprintf(&doc, `"k%d":{"v":%d}`, i, i)
		paths = append(paths, p(fmt.Sprintf("k%d", i), "v"), p(fmt.Sprintf("k%d", i)))
	}
	doc.WriteString(`}`)
	paths = append(paths, p("k149", "w"), p())
	got := Extract([]byte(doc.String()), paths...)
	for i := range 150 {
		if want := fmt.Sprint(i); string(got[2*i]) != want {
			t.Errorf("path %q: got %#q, want %s", paths[2*i], got[2*i], want)
		}
		if want := fmt.Sprintf(`{"v":%d}`, i); string(got[2*i+1]) != want {
			t.Errorf("path %q: got %#q, want %s", paths[2*i+1], got[2*i+1], want)
		}
	}
	if got[300] != nil {
		t.Errorf("path %q: got %#q, want absent", paths[300], got[300])
	}
	if string(got[301]) != doc.String() {
		t.Errorf("empty path: not the whole document")
	}
}

func TestExtractLongPath(t *testing.T) {
	// Recursion follows the path, not the document: a long path is fine.
	const depth = 2000
	data := strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
	path := make([]string, depth)
	for i := range path {
		path[i] = "a"
	}
	got := Extract([]byte(data), path, path[:depth-1], append(path[:depth:depth], "a"))
	if string(got[0]) != "1" || string(got[1]) != `{"a":1}` || got[2] != nil {
		t.Errorf("got %#q, %#q, %#q; want 1, {\"a\":1}, absent", got[0], got[1], got[2])
	}
}

func TestExtractHostileNesting(t *testing.T) {
	// Each document is skipped with constant stack; one of ten million
	// bytes finishes at once only because skipping is linear.
	tests := map[string]struct {
		data  string
		paths [][]string
		want  []string
	}{
		"deep arrays skipped": {
			data:  `{"a":` + nested(100_000) + `,"b":1}`,
			paths: [][]string{p("b"), p("a", "x")},
			want:  []string{`1`, absent},
		},
		"deep arrays taken whole": {
			data:  `{"a":` + nested(100_000) + `}`,
			paths: [][]string{p("a")},
			want:  []string{nested(100_000)},
		},
		"deep arrays as the root": {
			data:  nested(100_000),
			paths: [][]string{p(), p("a")},
			want:  []string{nested(100_000), absent},
		},
		"deeper arrays": {
			data:  `{"a":` + nested(5_000_000) + `,"b":1}`,
			paths: [][]string{p("b")},
			want:  []string{`1`},
		},
		"deep objects followed only two levels": {
			data:  strings.Repeat(`{"a":`, 100_000) + "1" + strings.Repeat("}", 100_000),
			paths: [][]string{p("a", "a", "b"), p("a", "b")},
			want:  []string{absent, absent},
		},
		"long backslash run": {
			data:  `{"x":"` + strings.Repeat(`\\`, 1_000_000) + `","a":1}`,
			paths: [][]string{p("a")},
			want:  []string{`1`},
		},
		"many escaped quotes": {
			data:  `{"x":"` + strings.Repeat(`\"`, 1_000_000) + `","a":1}`,
			paths: [][]string{p("a")},
			want:  []string{`1`},
		},
		"escaped keys in a wanted object": {
			data:  string(escapedAnnotations(1 << 20)),
			paths: [][]string{p("metadata", "annotations", "vmipam.io/token"), p("metadata", "annotations", "<7")},
			want:  []string{`"tok"`, `""`},
		},
		"huge wanted object": {
			data:  `{"m":{` + strings.Repeat(`"k":[1,{"a":"}"}],`, 200_000) + `"a":2}}`,
			paths: [][]string{p("m", "a"), p("m", "k")},
			want:  []string{`2`, `[1,{"a":"}"}]`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Extract([]byte(tc.data), tc.paths...)
			for i, want := range tc.want {
				switch {
				case want == absent && got[i] != nil:
					t.Errorf("path %q: got %d bytes, want absent", tc.paths[i], len(got[i]))
				case want != absent && string(got[i]) != want:
					t.Errorf("path %q: got %d bytes, want %d", tc.paths[i], len(got[i]), len(want))
				}
			}
		})
	}
}

func TestExtractMalformed(t *testing.T) {
	// Unspecified results, but no panic, no hang, and nothing outside data.
	inputs := []string{
		`{`, `{"a"`, `{"a":`, `{"a":1`, `{"a":1,`, `{"a":"`, `{"a":"\`, `{"a":"\"}`, `{"a":[`,
		`{"a":{"b":`, `{"a":}`, `{"a" 1}`, `{"a":1 "b":2}`, `{1:2}`, `{"a":1}}`, `]`, `}`,
		`{"a":{"b":1]}`, `{"a":[}`, `"`, `"\`, `{"a\`, `{"\u00":1}`, `{"a":1,}`, "{\"a\":\x00}",
	}
	for _, in := range inputs {
		data := []byte(in)
		got := Extract(data, p("a"), p("a", "b"), p("b"), p())
		for _, v := range got {
			checkSubslice(t, data, v)
		}
	}
}

func TestExtractAllocs(t *testing.T) {
	big := hostileVM(10_000)
	escaped := escapedAnnotations(64 << 10)
	tests := map[string]struct {
		data  []byte
		paths [][]string
		into  bool // AppendExtract into a slice with room
		want  float64
	}{
		"review":           {data: []byte(review), paths: reviewPaths, want: 1}, // the result slice
		"review into dst":  {data: []byte(review), paths: reviewPaths, into: true, want: 0},
		"hostile":          {data: big, paths: objectPaths, want: 1},
		"hostile into dst": {data: big, paths: objectPaths, into: true, want: 0},
		"escaped into dst": {data: escaped, paths: objectPaths, into: true, want: 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dst := make([][]byte, 0, len(tc.paths))
			got := testing.AllocsPerRun(20, func() {
				if tc.into {
					dst = AppendExtract(dst[:0], tc.data, tc.paths...)
				} else {
					dst = Extract(tc.data, tc.paths...)
				}
			})
			if got != tc.want {
				t.Errorf("%v allocations per run, want %v", got, tc.want)
			}
		})
	}
}
