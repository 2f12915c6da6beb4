package jsonscan

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestSkipString(t *testing.T) {
	// Escapes on both sides of the switch from the byte loop to IndexByte.
	escapes := []string{``, `\\`, `\"`, `\\\"`, `\"\\`, `\\\\`, `\u0022`, `\/`}
	for _, esc := range escapes {
		for before := range 40 {
			for _, after := range []int{0, 1, 2, 17} {
				s := `"` + strings.Repeat("a", before) + esc + strings.Repeat("b", after) + `"`
				if !json.Valid([]byte(s)) {
					t.Fatalf("bad test string %#q", s)
				}
				data := []byte(s + `,"x"]`)
				if got := skipString(data, 1); got != len(s) {
					t.Errorf("skipString(%#q) = %d, want %d", data, got, len(s))
				}
				if got := skipString([]byte(s[:len(s)-1]), 1); got != -1 {
					t.Errorf("skipString(%#q) = %d, want -1", s[:len(s)-1], got)
				}
			}
		}
	}
}

func TestSkipValue(t *testing.T) {
	tests := map[string]struct {
		data string
		want int // -1: malformed
	}{
		"number":            {data: `-1.5e3,`, want: 6},
		"literal at end":    {data: `true`, want: 4},
		"string":            {data: `"a\"b",`, want: 6},
		"array":             {data: `[1,[2],{"a":"]"}] `, want: 17},
		"object":            {data: `{"}":{"{":[]}},1`, want: 14},
		"deep":              {data: nested(1_000_000) + ",", want: 2_000_000},
		"unterminated":      {data: `[[]`, want: -1},
		"unterminated text": {data: `["]`, want: -1},
		"nothing":           {data: `,`, want: -1},
		"empty":             {data: ``, want: -1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := skipValue([]byte(tc.data), 0); got != tc.want {
				t.Errorf("skipValue(%.40q) = %d, want %d", tc.data, got, tc.want)
			}
		})
	}
}
