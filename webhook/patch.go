package webhook

import (
	"maps"
	"reflect"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
)

// diff returns the JSON patch (RFC 6902) that turns before into after, two
// objects decoded from JSON. It descends into objects present on both
// sides, and replaces anything else that changed whole: arrays included,
// which for the few short fields a webhook touches is what a patch would
// say anyway. Unlike a generic diff of two JSON documents, it encodes and
// decodes nothing, so a large object costs a comparison, not two decodes.
func diff(before, after map[string]any) []jsonpatch.Operation {
	var ops []jsonpatch.Operation
	diffInto(&ops, "", before, after)
	return ops
}

func diffInto(ops *[]jsonpatch.Operation, path string, before, after map[string]any) {
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if _, ok := after[k]; !ok {
			*ops = append(*ops, jsonpatch.NewOperation("remove", path+"/"+escapePointer(k), nil))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		p := path + "/" + escapePointer(k)
		b, had := before[k]
		a := after[k]
		bm, bok := b.(map[string]any)
		am, aok := a.(map[string]any)
		switch {
		case had && bok && aok:
			diffInto(ops, p, bm, am)
		case !had:
			*ops = append(*ops, jsonpatch.NewOperation("add", p, a))
		case !reflect.DeepEqual(b, a):
			*ops = append(*ops, jsonpatch.NewOperation("replace", p, a))
		}
	}
}

// pointerEscaper escapes a key for a JSON pointer (RFC 6901).
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// escapePointer escapes a key for a JSON pointer (RFC 6901).
func escapePointer(k string) string {
	if !strings.ContainsAny(k, "~/") {
		return k
	}
	return pointerEscaper.Replace(k)
}
