package jsonscan

import (
	"encoding/json"
	"testing"
)

func TestNameEquals(t *testing.T) {
	// Each name is compared with encoding/json's reading of it, with that
	// reading changed by a byte at either end, and with want when given.
	tests := map[string]struct {
		raw  string
		want string // "" to rely on encoding/json alone
	}{
		"plain":               {raw: `spec`, want: "spec"},
		"empty":               {raw: ``},
		"short escapes":       {raw: `\"\\\/\b\f\n\r\t`, want: "\"\\/\b\f\n\r\t"},
		"unicode escape":      {raw: `spe\u0063`, want: "spec"},
		"upper hex":           {raw: `\u00E9\u00e9`, want: "éé"},
		"html escapes":        {raw: `\u003cscript\u003e\u0026`, want: "<script>&"},
		"surrogate pair":      {raw: `\ud83d\ude00`, want: "😀"},
		"lone high surrogate": {raw: `\ud83d`, want: "\uFFFD"},
		"lone low surrogate":  {raw: `\ude00x`, want: "\uFFFDx"},
		"reversed pair":       {raw: `\ude00\ud83d`, want: "\uFFFD\uFFFD"},
		"high then letter":    {raw: `\ud83d\u0041`, want: "\uFFFDA"},
		"high then text":      {raw: `\ud83dab`, want: "\uFFFDab"},
		"high then short esc": {raw: `\ud83d\n`, want: "\uFFFD\n"},
		"two highs":           {raw: `\ud83d\ud83d\ude00`, want: "\uFFFD😀"},
		"raw unicode":         {raw: `日本\u8a9e`, want: "日本語"},
		"raw replacement":     {raw: "\uFFFD\\n", want: "\uFFFD\n"},
		"invalid utf-8":       {raw: "a\xff\\n", want: "a\uFFFD\n"},
		"truncated utf-8":     {raw: "\xe6\x97\\n", want: "\uFFFD\uFFFD\n"},
		"encoded surrogate":   {raw: "\xed\xa0\x80", want: "\uFFFD\uFFFD\uFFFD"},
		"nul escape":          {raw: `a\u0000b`, want: "a\x00b"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var decoded string
			if err := json.Unmarshal([]byte(`"`+tc.raw+`"`), &decoded); err != nil {
				t.Fatalf("bad test name %#q: %v", tc.raw, err)
			}
			if tc.want != "" && decoded != tc.want {
				t.Fatalf("encoding/json reads %#q as %q, test says %q", tc.raw, decoded, tc.want)
			}
			checkName(t, []byte(tc.raw), decoded)
		})
	}
}

func TestNameEqualsMalformed(t *testing.T) {
	for _, raw := range []string{`\`, `a\`, `\x`, `\u12`, `\u12g4`, `\'`, `a"b`, "a\x01", `\ud83d\u12`} {
		for _, want := range []string{"", raw, "a", "\uFFFD"} {
			if nameEquals([]byte(raw), want) {
				t.Errorf("nameEquals(%#q, %q) = true for a malformed name", raw, want)
			}
		}
	}
}

// FuzzKeyEquals checks KeyEquals and UnquoteKey against encoding/json for
// member names as written between quotes.
func FuzzKeyEquals(f *testing.F) {
	for _, s := range []string{`spec`, `spe\u0063`, `\ud83d\ude00`, `\ud83d\u0041`, "a\xff", `\"\\\/\b`, `\u`, `日本`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		quoted := append(append([]byte{'"'}, raw...), '"')
		var decoded string
		if !json.Valid(quoted) || json.Unmarshal(quoted, &decoded) != nil {
			_ = KeyEquals(raw, string(raw))
			_, _ = UnquoteKey(raw)
			return
		}
		checkName(t, raw, decoded)
	})
}

// checkName checks that the name raw (between quotes) equals decoded and
// nothing a byte away from it, through KeyEquals, UnquoteKey and Extract.
func checkName(t *testing.T, raw []byte, decoded string) {
	t.Helper()
	if !KeyEquals(raw, decoded) {
		t.Errorf("KeyEquals(%#q, %q) = false", raw, decoded)
	}
	if got, err := UnquoteKey(raw); err != nil || got != decoded {
		t.Errorf("UnquoteKey(%#q) = %q, %v; want %q", raw, got, err, decoded)
	}
	near := []string{decoded + "x", "x" + decoded, decoded + "\x00"}
	if len(decoded) > 0 {
		near = append(near, decoded[1:], decoded[:len(decoded)-1],
			decoded[:len(decoded)-1]+string(decoded[len(decoded)-1]^1))
	}
	for _, n := range near {
		if n != decoded && KeyEquals(raw, n) {
			t.Errorf("KeyEquals(%#q, %q) = true, encoding/json reads %q", raw, n, decoded)
		}
	}
	doc := []byte(`{"` + string(raw) + `":1}`)
	got := Extract(doc, []string{decoded}, []string{decoded + "x"})
	if string(got[0]) != "1" || got[1] != nil {
		t.Errorf("Extract(%#q) by %q: got %#q, %#q; want 1, absent", doc, decoded, got[0], got[1])
	}
}
