package kinds

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/lib/jsonscan"
)

// DecodeTrimmed decodes the JSON object data (one object of the kind, as
// the API server sends it in a list or a watch event) into what Trim keeps
// of it, equal to Trim applied to the object decoded whole, without
// decoding the rest: the spec a kind without a condition does not read,
// the status, managedFields, the other labels and annotations are skipped
// by a scan (package jsonscan), and only the kept values are decoded, as
// unstructured decodes them (whole numbers as int64).
//
// This is how a replica reads the objects it does not look after (those
// without a holder label, most of them not vmipam's at all): decoding each
// of their watch events whole into maps was most of vmipam's CPU in a
// fleet whose creates did not go through vmipam.
//
// data must be valid JSON (the watch's framing checks each event); on
// invalid input the result is unspecified, but DecodeTrimmed does not
// panic.
func (t Kind) DecodeTrimmed(data []byte) (*unstructured.Unstructured, error) {
	out := &unstructured.Unstructured{Object: map[string]any{}}
	var apiVersion, kind, metadata []byte
	var err error
	// The root's members: the type, the metadata and, for a kind with a
	// condition, everything but the status (see Trim).
	var kept map[string]any
	if t.Condition != "" {
		kept = map[string]any{}
	}
	if merr := jsonscan.Members(data, func(key, value []byte) bool {
		switch {
		case jsonscan.KeyEquals(key, "apiVersion"):
			apiVersion = value
		case jsonscan.KeyEquals(key, "kind"):
			kind = value
		case jsonscan.KeyEquals(key, "metadata"):
			metadata = value
			return true
		}
		if kept == nil || jsonscan.KeyEquals(key, "status") {
			return true
		}
		var k string
		if k, err = jsonscan.UnquoteKey(key); err != nil {
			return false
		}
		kept[k], err = decodeValue(value)
		return err == nil
	}); merr != nil {
		return nil, fmt.Errorf("decode %s: %w", t.GVK.Kind, merr)
	}
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", t.GVK.Kind, err)
	}
	out.SetAPIVersion(stringOrEmpty(apiVersion))
	out.SetKind(stringOrEmpty(kind))
	for k, v := range kept {
		out.Object[k] = v
	}
	md, err := t.decodeTrimmedMetadata(metadata)
	if err != nil {
		return nil, fmt.Errorf("decode %s's metadata: %w", t.GVK.Kind, err)
	}
	out.Object["metadata"] = md
	paths := t.trimPaths()
	for i, raw := range jsonscan.Extract(data, paths...) {
		if raw == nil {
			continue
		}
		v, err := decodeValue(raw)
		if err != nil {
			return nil, fmt.Errorf("decode %s's %v: %w", t.GVK.Kind, paths[i], err)
		}
		_ = unstructured.SetNestedField(out.Object, v, paths[i]...)
	}
	return out, nil
}

// decodeTrimmedMetadata decodes what Trim keeps of the metadata raw.
func (t Kind) decodeTrimmedMetadata(raw []byte) (map[string]any, error) {
	md := map[string]any{}
	if jsonscan.KindOf(raw) != jsonscan.KindObject {
		return md, nil
	}
	var labels, annotations []byte
	var err error
	if merr := jsonscan.Members(raw, func(key, value []byte) bool {
		switch {
		case jsonscan.KeyEquals(key, "labels"):
			labels = value
			return true
		case jsonscan.KeyEquals(key, "annotations"):
			annotations = value
			return true
		}
		for _, k := range trimMetadata {
			if jsonscan.KeyEquals(key, k) {
				md[k], err = decodeValue(value)
				return err == nil
			}
		}
		return true
	}); merr != nil {
		return nil, merr
	}
	if err != nil {
		return nil, err
	}
	if jsonscan.KindOf(annotations) == jsonscan.KindObject {
		keep, err := pick(annotations, t.trimAnnotations())
		if err != nil {
			return nil, fmt.Errorf("annotations: %w", err)
		}
		if len(keep) > 0 {
			md["annotations"] = keep
		}
	}
	if jsonscan.KindOf(labels) == jsonscan.KindObject {
		keep, err := pick(labels, []string{vmipamv1.HolderLabel})
		if err != nil {
			return nil, fmt.Errorf("labels: %w", err)
		}
		if len(keep) > 0 {
			md["labels"] = keep
		}
	}
	if t.Condition != "" {
		// The condition may read all the labels and annotations.
		for k, raw := range map[string][]byte{"labels": labels, "annotations": annotations} {
			if raw == nil {
				continue
			}
			if md[k], err = decodeValue(raw); err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
		}
	}
	return md, nil
}

// pick decodes the members of the JSON object raw named in keys (an empty
// key is none); the last of two members of one name wins.
func pick(raw []byte, keys []string) (map[string]any, error) {
	var keep map[string]any
	var err error
	if merr := jsonscan.Members(raw, func(key, value []byte) bool {
		for _, k := range keys {
			if k == "" || !jsonscan.KeyEquals(key, k) {
				continue
			}
			if keep == nil {
				keep = map[string]any{}
			}
			keep[k], err = decodeValue(value)
			return err == nil
		}
		return true
	}); merr != nil {
		return nil, merr
	}
	return keep, err
}

// decodeValue decodes the JSON value raw as unstructured does.
func decodeValue(raw []byte) (any, error) {
	switch jsonscan.KindOf(raw) {
	case jsonscan.KindString:
		return jsonscan.String(raw)
	case jsonscan.KindNumber:
		// The metadata's generation.
		if n, ok := smallInt(raw); ok {
			return n, nil
		}
	case jsonscan.KindArray:
		// The metadata's finalizers.
		if ss, err := jsonscan.Strings(raw, len(raw)); err == nil {
			v := make([]any, len(ss))
			for i, s := range ss {
				v[i] = s
			}
			return v, nil
		}
	}
	var v any
	if err := utiljson.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	return v, nil
}

// smallInt decodes raw, a JSON number, as an integer of at most 18
// digits, as utiljson.Unmarshal decodes one into an interface (int64),
// and reports whether it is one.
func smallInt(raw []byte) (int64, bool) {
	digits := raw
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if raw[0] == '-' {
		n = -n
	}
	return n, true
}

// stringOrEmpty is the JSON string raw, or "" when raw is absent or not a
// string (as unstructured's getters read it).
func stringOrEmpty(raw []byte) string {
	if jsonscan.KindOf(raw) != jsonscan.KindString {
		return ""
	}
	s, err := jsonscan.String(raw)
	if err != nil {
		return ""
	}
	return s
}
