package transport

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/kinds"
)

// stampOps is a stamp as the mutating webhook answers it: every value type
// vmipam's patches hold.
func stampOps(s string) []jsonpatch.Operation {
	return []jsonpatch.Operation{
		jsonpatch.NewOperation("add", "/metadata/annotations", map[string]string{"vmipam.io/token": s, "vmipam.io/pool": "default"}),
		jsonpatch.NewOperation("add", "/metadata/annotations/"+kinds.EscapePointer("vmipam.io/address"), s),
		jsonpatch.NewOperation("add", "/metadata/finalizers", []string{"vmipam.io/release-address", s}),
		jsonpatch.NewOperation("add", "/metadata/labels", map[string]string{"vmipam.io/holder": s}),
		jsonpatch.NewOperation("add", "/spec", map[string]any{"addresses": []string{s}, "x": map[string]any{"y": s, "z": nil}}),
		jsonpatch.NewOperation("add", "/spec/network", networkJSON(s)),
		jsonpatch.NewOperation("replace", "/spec/addresses", []string(nil)),
		jsonpatch.NewOperation("add", "/metadata/x", nil),
		jsonpatch.NewOperation("remove", "/metadata/annotations/vmipam.io~1token", nil),
		jsonpatch.NewOperation("test", "/metadata/name", ""),
	}
}

// allowedPatch is an allowed answer with the JSON patch ops, as the
// mutating webhook gives it.
func allowedPatch(ops []jsonpatch.Operation) admission.Response {
	pt := admissionv1.PatchTypeJSONPatch
	return admission.Response{Patches: ops, AdmissionResponse: admissionv1.AdmissionResponse{Allowed: true, PatchType: &pt}}
}

// denied is a denial carrying err's status, as the handlers deny.
func denied(err *apierrors.StatusError) admission.Response {
	st := err.Status()
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
}

// networkJSON is a VM's network holding s, encoded as the stamp encodes
// it.
func networkJSON(s string) json.RawMessage {
	raw, err := json.Marshal(vmipamv1.Network{Addresses: []string{s}, Gateways: []string{s}, Routes: []vmipamv1.Route{{Destination: s, Via: s}}})
	if err != nil {
		panic(err)
	}
	return raw
}

// TestEncodeReview: every answer is encoded as encoding/json encodes it
// after Complete, the common ones without it.
func TestEncodeReview(t *testing.T) {
	tests := map[string]struct {
		resp admission.Response
		fast bool
	}{
		"stamp":                {allowedPatch(stampOps("10.0.0.5")), true},
		"allowed":              {admission.Allowed(""), true},
		"allowed, bare":        {admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: true}}, true},
		"allowed with message": {admission.Allowed("fine"), false},
		"denied":               {denied(apierrors.NewForbidden(schema.GroupResource{Resource: "virtualmachines"}, "a", errors.New("no <pool> & no \"luck\""))), false},
		"errored":              {admission.Errored(http.StatusInternalServerError, errors.New("boom")), false},
		"warnings":             {admission.Allowed("").WithWarnings("careful"), false},
		"other value type":     {allowedPatch([]jsonpatch.Operation{jsonpatch.NewOperation("add", "/spec/cpus", 2)}), false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			checkEncoding(t, "u-1", tc.resp, tc.fast)
		})
	}
}

// checkEncoding fails t unless encodeReview writes what encoding/json
// writes for resp, and takes the direct path exactly when fast.
func checkEncoding(t *testing.T, uid types.UID, resp admission.Response, fast bool) {
	t.Helper()
	want, err := marshalReview(uid, resp)
	if err != nil {
		t.Fatal(err)
	}
	got, err := encodeReview(uid, resp)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("encoded\n%s\nencoding/json\n%s", got, want)
	}
	if _, ok := appendAllowed(nil, uid, resp); ok != fast {
		t.Errorf("direct path taken: %v, want %v", ok, fast)
	}
}

// FuzzEncodeReview: whatever the strings of a stamp hold (HTML characters,
// control characters, invalid UTF-8, line separators), the direct path
// writes what encoding/json writes.
func FuzzEncodeReview(f *testing.F) {
	for _, s := range []string{"10.0.0.5", "<&>\"\\\b\f\n\r\t\x00\x1f", "\u2028\u2029é", "\xff\xfe", "a\xc3"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, uid, s string) {
		checkEncoding(t, types.UID(uid), allowedPatch(stampOps(s)), true)
	})
}

func BenchmarkEncodeReview(b *testing.B) {
	resp := allowedPatch(stampOps("10.0.0.5"))
	uid := types.UID("705ab4f5-6393-11e8-b7cc-42010a800002")
	for name, encode := range map[string]func(types.UID, admission.Response) ([]byte, error){
		"direct":        encodeReview,
		"encoding-json": marshalReview,
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := encode(uid, resp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
