package webhook

import (
	"encoding/json"
	"reflect"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
)

func TestDiff(t *testing.T) {
	tests := []struct {
		name, before, after string
		ops                 int
	}{
		{"unchanged", `{"a":1,"b":{"c":[1,2]}}`, `{"a":1,"b":{"c":[1,2]}}`, 0},
		{"stamp into bare object", `{"metadata":{"name":"vm"},"spec":{}}`,
			`{"metadata":{"name":"vm","annotations":{"vmipam.io/token":"t","vmipam.io/pool":"p"},"finalizers":["vmipam.io/release-address"]},"spec":{"addresses":["10.0.0.1"]}}`, 3},
		{"stamp beside existing annotations and finalizers",
			`{"metadata":{"annotations":{"x~y/z":"1"},"finalizers":["other"]},"spec":{"addresses":[]}}`,
			`{"metadata":{"annotations":{"x~y/z":"1","vmipam.io/token":"t"},"finalizers":["other","vmipam.io/release-address"]},"spec":{"addresses":["fd00::1"]}}`, 3},
		{"no spec at all", `{"kind":"VirtualMachine"}`, `{"kind":"VirtualMachine","spec":{"addresses":["10.0.0.1"]}}`, 1},
		{"removed and retyped", `{"a":{"b":1},"c":2,"d":"x"}`, `{"a":"flat","d":"x"}`, 2},
		{"big integers are left alone", `{"n":9007199254740993,"m":{}}`, `{"n":9007199254740993,"m":{"k":"v"}}`, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before, after map[string]any
			if err := json.Unmarshal([]byte(tt.before), &before); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tt.after), &after); err != nil {
				t.Fatal(err)
			}
			ops := diff(before, after)
			if len(ops) != tt.ops {
				t.Errorf("diff made %d operations, want %d: %v", len(ops), tt.ops, ops)
			}
			raw, err := json.Marshal(ops)
			if err != nil {
				t.Fatal(err)
			}
			p, err := jsonpatch.DecodePatch(raw)
			if err != nil {
				t.Fatalf("decode patch %s: %v", raw, err)
			}
			got, err := p.Apply([]byte(tt.before))
			if err != nil {
				t.Fatalf("apply patch %s to %s: %v", raw, tt.before, err)
			}
			if !jsonpatch.Equal(got, []byte(tt.after)) {
				t.Errorf("patch %s turned %s into %s, want %s", raw, tt.before, got, tt.after)
			}
		})
	}
}

func TestDiffLeavesInputsAlone(t *testing.T) {
	before := map[string]any{"metadata": map[string]any{"name": "vm"}}
	after := map[string]any{"metadata": map[string]any{"name": "vm", "finalizers": []any{"f"}}}
	want := map[string]any{"metadata": map[string]any{"name": "vm"}}
	diff(before, after)
	if !reflect.DeepEqual(before, want) {
		t.Errorf("diff changed its input: %v", before)
	}
}

func TestEscapePointer(t *testing.T) {
	for in, want := range map[string]string{"plain": "plain", "vmipam.io/token": "vmipam.io~1token", "a~b": "a~0b", "~/": "~0~1"} {
		if got := escapePointer(in); got != want {
			t.Errorf("escapePointer(%q) = %q, want %q", in, got, want)
		}
	}
}
