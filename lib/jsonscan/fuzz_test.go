package jsonscan

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// FuzzExtract checks Extract against encoding/json. paths holds up to
// eight paths separated by '|', names separated by '/', an empty path
// standing for the whole document; one more path is chosen from the
// decoded document itself, steered by the bytes of paths, so that present
// values are exercised as often as absent ones. Every value found is also
// run through KindOf, String, Strings, Each and Members and compared with
// encoding/json's reading of it. For input json.Valid refuses, only safety
// is checked: no panic, no hang, results inside the input.
func FuzzExtract(f *testing.F) {
	seeds := []struct{ data, paths string }{
		{review, "request/object/metadata/name|request/object/metadata/annotations|request/object/spec/addresses|request/dryRun"},
		{string(hostileVM(30)), "metadata/annotations/vmipam.io|spec/addresses|status/conditions|"},
		{`{"a":{"b":{"c":1}},"d":2}`, "a/b/c|a/b|a|d|x|a/x"},
		{`{"arr":[{"b":1}],"str":"{\"b\":1}","n":null}`, "arr/b|str/b|n/b|arr"},
		{`[{"a":1}]`, "a||0"},
		{`{"a":1,"b":0,"a":2}`, "a|b"},
		{`{"a":{"x":1,"y":1},"a":{"y":2}}`, "a/x|a/y|a"},
		{`{"a":7,"a":{"x":1}}`, "a/x|a"},
		{`{"spe\u0063":1,"a\"b":2,"a\\b":3,"a\/b":4,"\u0041":5}`, `spec|a"b|a\b|A|spe\u0063`},
		{`{"ключ":1,"日本":2,"😀":3,"\ud83d\ude01":4}`, "ключ|日本|😀|😁"},
		{"{\"a\xffb\":1,\"\xed\xa0\x80\":2}", "a\xffb|a\uFFFDb"},
		{`{"Spec":1,"spec":3}`, "spec|Spec|SPEC"},
		{`{"":{"":1}}`, "|/"},
		{" \t\n{ \"a\" \r\n : \t { \"b\" : [ 1 , 2 ] \n } , \"c\" :\ttrue\t} \n", "a|a/b|c|"},
		{`{"big":1E700,"small":-1e-700,"z":-0}`, "big|small|z"},
		{`{"n":-1.5e+10,"t":true,"f":false,"null":null,"s":"x","e":""}`, "n|t|f|null|s|e"},
		{`{"x":"}]{[","a":1,"y":"\"}","b":2,"z":"a\\","c":3,"w":"\\\"","d":4}`, "a|b|c|d|z|w"},
		{`{"}":{"]":1},"{\"":{"[":2},"\\":3}`, "}/]|{\"/[|\\"},
		{`{"o":{},"a":[],"s":{ },"t":[ ]}`, "o|o/x|a|s|t"},
		{`{"addresses":["10.0.0.5","fd00::5"],"m":{"a":"b","a":"c"}}`, "addresses|m"},
		{`{"a":` + nested(1000) + `,"b":1}`, "a|b"},
		{strings.Repeat(`{"a":`, 200) + "1" + strings.Repeat("}", 200), "a/a/a|a/b"},
		{``, "a|"},
		{`{"a":1`, "a|"},
		{`{"a":"\`, "a"},
		{`{"a":[}`, "a|"},
		{`{"a":{"b":1]}`, "a/b"},
		{`{"a" 1}`, "a"},
		{`]`, ""},
	}
	for _, s := range seeds {
		f.Add([]byte(s.data), s.paths)
	}
	f.Fuzz(func(t *testing.T, data []byte, spec string) {
		paths := fuzzPaths(spec)
		if !json.Valid(data) {
			got := Extract(data, paths...)
			for _, v := range got {
				checkSubslice(t, data, v)
				exercise(v)
			}
			exercise(data)
			return
		}
		doc := decode(t, data)
		paths = append(paths, choosePath(doc, spec))
		got := Extract(data, paths...)
		if len(got) != len(paths) {
			t.Fatalf("Extract returned %d values for %d paths", len(got), len(paths))
		}
		for i, path := range paths {
			want, ok := lookup(doc, path)
			switch {
			case !ok && got[i] != nil:
				t.Errorf("path %q: got %#q, encoding/json has nothing", path, got[i])
			case ok && got[i] == nil:
				t.Errorf("path %q: absent, encoding/json has %s", path, canonical(t, want))
			case ok:
				checkSubslice(t, data, got[i])
				checkValue(t, got[i], want)
			}
		}
	})
}

// fuzzPaths splits spec into at most eight paths.
func fuzzPaths(spec string) [][]string {
	var paths [][]string
	for s := range strings.SplitSeq(spec, "|") {
		if len(paths) == 8 {
			break
		}
		if s == "" {
			paths = append(paths, nil)
			continue
		}
		paths = append(paths, strings.Split(s, "/"))
	}
	return paths
}

// choosePath walks doc from the root, at each object taking the member
// (in sorted order) that the next byte of spec picks, and returns the
// names taken; byte 0 or the end of spec stops the walk.
func choosePath(doc any, spec string) []string {
	var path []string
	for i := 0; i < len(spec) && spec[i] != 0; i++ {
		m, ok := doc.(map[string]any)
		if !ok || len(m) == 0 {
			break
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		k := keys[int(spec[i])%len(keys)]
		path, doc = append(path, k), m[k]
	}
	return path
}

// lookup follows path through doc as decoded by encoding/json.
func lookup(doc any, path []string) (any, bool) {
	for _, name := range path {
		m, ok := doc.(map[string]any)
		if !ok {
			return nil, false
		}
		if doc, ok = m[name]; !ok {
			return nil, false
		}
	}
	return doc, true
}

// decode decodes the valid JSON data with encoding/json, numbers kept as
// written so that 1E700 decodes too.
func decode(t *testing.T, data []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %#q: %v", data, err)
	}
	return v
}

// canonical re-marshals a decoded value: sorted keys, one spelling.
func canonical(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %v: %v", v, err)
	}
	return string(b)
}

// checkValue compares raw, as Extract found it, with want, as encoding/json
// decoded it, directly and through each of the package's readers.
func checkValue(t *testing.T, raw []byte, want any) {
	t.Helper()
	if len(trimSpace(raw)) != len(raw) {
		t.Errorf("value %#q has surrounding whitespace", raw)
	}
	got := decode(t, raw)
	if g, w := canonical(t, got), canonical(t, want); g != w {
		t.Fatalf("value %s, encoding/json has %s", g, w)
	}

	if k, w := KindOf(raw), kindOfDecoded(want); k != w {
		t.Errorf("KindOf(%#q) = %v, want %v", raw, k, w)
	}

	switch want := want.(type) {
	case string:
		if s, err := String(raw); err != nil || s != want {
			t.Errorf("String(%#q) = %q, %v; want %q", raw, s, err, want)
		}
	case []any:
		elems := []any{}
		allStrings := true
		if err := Each(raw, func(i int, elem []byte) bool {
			if i != len(elems) {
				t.Errorf("Each: index %d, want %d", i, len(elems))
			}
			v := decode(t, elem)
			_, isString := v.(string)
			allStrings = allStrings && isString
			elems = append(elems, v)
			return true
		}); err != nil {
			t.Fatalf("Each(%#q): %v", raw, err)
		}
		if g, w := canonical(t, elems), canonical(t, want); len(elems) != len(want) || g != w {
			t.Errorf("Each gave %s, want %s", g, w)
		}
		ss, err := Strings(raw, len(want))
		switch {
		case allStrings && err != nil:
			t.Errorf("Strings(%#q): %v", raw, err)
		case allStrings && canonical(t, ss) != canonical(t, want):
			t.Errorf("Strings gave %q, want %s", ss, canonical(t, want))
		case !allStrings && err == nil:
			t.Errorf("Strings(%#q) accepted a non-string", raw)
		}
		if _, err := Strings(raw, len(want)-1); len(want) > 0 && err == nil {
			t.Errorf("Strings(%#q, %d) accepted %d elements", raw, len(want)-1, len(want))
		}
	case map[string]any:
		members := map[string]any{}
		if err := Members(raw, func(key, value []byte) bool {
			name, err := UnquoteKey(key)
			if err != nil {
				t.Fatalf("UnquoteKey(%#q): %v", key, err)
			}
			if !KeyEquals(key, name) {
				t.Errorf("KeyEquals(%#q, %q) = false", key, name)
			}
			members[name] = decode(t, value)
			return true
		}); err != nil {
			t.Fatalf("Members(%#q): %v", raw, err)
		}
		if g, w := canonical(t, members), canonical(t, want); g != w {
			t.Errorf("Members gave %s, want %s", g, w)
		}
	}
}

// kindOfDecoded is the Kind of a value decoded by encoding/json into any.
func kindOfDecoded(v any) Kind {
	switch v.(type) {
	case map[string]any:
		return KindObject
	case []any:
		return KindArray
	case string:
		return KindString
	case json.Number:
		return KindNumber
	case bool:
		return KindBool
	case nil:
		return KindNull
	default:
		return KindInvalid
	}
}

// exercise runs every reader over raw, which may be anything, for panics.
func exercise(raw []byte) {
	_ = KindOf(raw)
	_, _ = String(raw)
	_, _ = Strings(raw, 4)
	_ = Each(raw, func(_ int, elem []byte) bool {
		_ = Extract(elem, nil, []string{"a"})
		return true
	})
	_ = Members(raw, func(key, value []byte) bool {
		_, _ = UnquoteKey(key)
		_ = KeyEquals(key, "a")
		_ = bytes.Equal(key, value)
		return true
	})
}
