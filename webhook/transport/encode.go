package transport

import (
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"unicode/utf8"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// encodeReview returns the AdmissionReview that answers the request uid
// with resp: the bytes encoding/json writes for the Response that
// admission.Response.Complete fills in.
//
// The answer almost every create gets (allowed, with a JSON patch of
// strings, string lists and maps of them) is written directly, without
// reflection: json.Marshal of the patch and of the review was 15% of
// vmipam's CPU per create in make bench's profile (BenchmarkEncodeReview
// compares the two). Every other answer, and a patch holding a value of
// another type, takes the general path. FuzzEncodeReview checks that both
// write the same bytes.
func encodeReview(uid types.UID, resp admission.Response) ([]byte, error) {
	if out, ok := appendAllowed(make([]byte, 0, 512), uid, resp); ok {
		return out, nil
	}
	return marshalReview(uid, resp)
}

// marshalReview is the general path of encodeReview.
func marshalReview(uid types.UID, resp admission.Response) ([]byte, error) {
	if err := resp.Complete(admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{UID: uid}}); err != nil {
		return nil, err
	}
	return json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: &resp.AdmissionResponse,
	})
}

// appendAllowed appends the review of an allowed answer with at most a
// JSON patch in resp.Patches, and reports whether resp was one it writes.
func appendAllowed(dst []byte, uid types.UID, resp admission.Response) ([]byte, bool) {
	r := resp.AdmissionResponse
	// Complete gives a result with no code the code 200.
	plain := r.Result == nil || *r.Result == metav1.Status{} || *r.Result == metav1.Status{Code: http.StatusOK}
	if !r.Allowed || !plain || len(r.Patch) > 0 ||
		r.PatchType != nil && *r.PatchType != admissionv1.PatchTypeJSONPatch || len(r.AuditAnnotations) > 0 || len(r.Warnings) > 0 {
		return dst, false
	}
	dst = append(dst, `{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","response":{"uid":`...)
	dst = appendString(dst, string(uid))
	dst = append(dst, `,"allowed":true,"status":{"metadata":{},"code":200}`...)
	if len(resp.Patches) > 0 {
		patch, ok := appendPatch(make([]byte, 0, 384), resp.Patches)
		if !ok {
			return dst, false
		}
		dst = append(dst, `,"patch":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, patch)
		dst = append(dst, `","patchType":"JSONPatch"`...)
	}
	return append(dst, "}}"...), true
}

// appendPatch appends the JSON of ops as jsonpatch.Operation's MarshalJSON
// writes them, or reports false for a value it does not write.
func appendPatch(dst []byte, ops []jsonpatch.Operation) ([]byte, bool) {
	dst = append(dst, '[')
	for i, op := range ops {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"op":`...)
		dst = appendString(dst, op.Operation)
		dst = append(dst, `,"path":`...)
		dst = appendString(dst, op.Path)
		// MarshalJSON writes a null value for add and replace, and leaves
		// it out for the other operations.
		if op.Value != nil || op.Operation == "add" || op.Operation == "replace" {
			dst = append(dst, `,"value":`...)
			var ok bool
			if dst, ok = appendValue(dst, op.Value); !ok {
				return dst, false
			}
		}
		dst = append(dst, '}')
	}
	return append(dst, ']'), true
}

// appendValue appends v as encoding/json writes it, for the types of
// vmipam's patches; it reports false for any other.
func appendValue(dst []byte, v any) ([]byte, bool) {
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...), true
	case string:
		return appendString(dst, v), true
	case []string:
		if v == nil {
			return append(dst, "null"...), true
		}
		dst = append(dst, '[')
		for i, s := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, s)
		}
		return append(dst, ']'), true
	case map[string]string:
		return appendMap(dst, v, func(dst []byte, s string) ([]byte, bool) { return appendString(dst, s), true })
	case map[string]any:
		return appendMap(dst, v, appendValue)
	case json.RawMessage:
		// vmipam's own encoding of a value (a VM's network), compact as
		// encoding/json would write it.
		if v == nil {
			return append(dst, "null"...), true
		}
		return append(dst, v...), true
	}
	return dst, false
}

// appendMap appends m with its keys sorted, as encoding/json does.
func appendMap[V any](dst []byte, m map[string]V, value func([]byte, V) ([]byte, bool)) ([]byte, bool) {
	if m == nil {
		return append(dst, "null"...), true
	}
	dst = append(dst, '{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, k)
		dst = append(dst, ':')
		var ok bool
		if dst, ok = value(dst, m[k]); !ok {
			return dst, false
		}
	}
	return append(dst, '}'), true
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string the way encoding/json writes it:
// HTML characters escaped, invalid UTF-8 replaced by U+FFFD, and U+2028
// and U+2029 escaped.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
