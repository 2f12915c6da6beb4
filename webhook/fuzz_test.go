package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	sigsjson "sigs.k8s.io/json"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/webhook/transport"
)

// newTestRegistry returns a registry with one recovered default pool over
// cidr. Its store is a fake client: the tests that use it are about the
// handlers, not persistence.
func newTestRegistry(tb testing.TB, cidr string, mutate ...func(*vmipamv1.IPPool)) (*pools.Registry, *runtime.Scheme, client.Client) {
	tb.Helper()
	scheme := ippoolTestScheme(tb)
	pool := fixture.Pool("fuzz", fixture.Stored("uid-fuzz"), fixture.WithDefault(), fixture.WithCIDRs(cidr))
	for _, f := range mutate {
		f(pool)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pool.DeepCopy()).Build()
	reg := pools.NewRegistry(pools.Options{Client: c, APIReader: c, Kinds: kinds.Default(), Holder: "fuzz", RunInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	go func() { _ = reg.Start(ctx) }()
	if err := reg.Ensure(ctx, pool); err != nil {
		tb.Fatalf("recover the pool: %v", err)
	}
	return reg, scheme, c
}

// fuzzServers builds vmipam's three admission webhooks over one recovered
// pool, behind one transport.Reviews.
func fuzzServers(f *testing.F) map[string]http.Handler {
	f.Helper()
	reg, scheme, c := newTestRegistry(f, "10.0.0.0/24")
	srv := transport.NewReviews(transport.Limits{})
	wrap := func(h admission.Handler) http.Handler { return srv.Handler(h) }
	return map[string]http.Handler{
		"mutate":   wrap(&Assigner{Registry: reg, Kind: kinds.VirtualMachine}),
		"validate": wrap(&StampGuard{Kind: kinds.VirtualMachine}),
		"ippool":   wrap(NewIPPoolValidator(c, scheme)),
	}
}

func review(t testing.TB, op admissionv1.Operation, kind string, obj, old any, dryRun bool) []byte {
	t.Helper()
	raw := func(v any) runtime.RawExtension {
		if v == nil {
			return runtime.RawExtension{}
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	r := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "1", Operation: op, DryRun: &dryRun, Namespace: "default",
			Kind:     metav1.GroupVersionKind{Group: "vmipam.io", Version: "v1alpha1", Kind: kind},
			Resource: metav1.GroupVersionResource{Group: "vmipam.io", Version: "v1alpha1", Resource: map[string]string{"VirtualMachine": "virtualmachines", "IPPool": "ippools"}[kind]},
			Object:   raw(obj), OldObject: raw(old),
		},
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzAdmission feeds arbitrary bodies to every webhook: never a panic; a
// well-formed AdmissionReview v1 request always gets an AdmissionReview
// answer with its UID, anything else a 4xx with a message or an answer
// that allows or denies with a reason.
func FuzzAdmission(f *testing.F) {
	servers := fuzzServers(f)
	vm := map[string]any{"apiVersion": "vmipam.io/v1alpha1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": "a", "namespace": "default"}, "spec": map[string]any{"ipPool": "fuzz"}}
	static := map[string]any{"apiVersion": "vmipam.io/v1alpha1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": "b", "namespace": "default", "annotations": map[string]any{vmipamv1.TokenAnnotation: "t"}},
		"spec":     map[string]any{"addresses": []any{"10.0.0.7"}}}
	wrongTypes := map[string]any{"apiVersion": "vmipam.io/v1alpha1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": 7, "annotations": "x"}, "spec": map[string]any{"addresses": "10.0.0.1", "ipPool": []any{1}}}
	pool := map[string]any{"apiVersion": "vmipam.io/v1alpha1", "kind": "IPPool",
		"metadata": map[string]any{"name": "p"}, "spec": map[string]any{"ranges": []any{map[string]any{"cidr": "10.1.0.0/24", "first": "10.1.0.9", "last": "10.1.0.2"}}}}
	for _, seed := range [][]byte{
		review(f, admissionv1.Create, "VirtualMachine", vm, nil, false),
		review(f, admissionv1.Create, "VirtualMachine", vm, nil, true),
		review(f, admissionv1.Create, "VirtualMachine", static, nil, false),
		review(f, admissionv1.Update, "VirtualMachine", static, vm, false),
		review(f, admissionv1.Create, "VirtualMachine", wrongTypes, nil, false),
		review(f, admissionv1.Create, "IPPool", pool, nil, false),
		review(f, admissionv1.Update, "IPPool", pool, pool, false),
		[]byte(`{"request":{"uid":"x","operation":"CREATE","object":{"spec":{"addresses":[1,2]}}}}`),
		[]byte(`{}`), []byte(`null`), []byte(`{"request":{"object":"\u0000"}}`),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var in admissionv1.AdmissionReview
		uidIn := ""
		// Case-sensitively, as the API server's own decoding: "ApiVersion"
		// is not apiVersion.
		if sigsjson.UnmarshalCaseSensitivePreserveInts(body, &in) == nil && in.Request != nil && in.APIVersion == "admission.k8s.io/v1" && in.Kind == "AdmissionReview" {
			uidIn = string(in.Request.UID)
		}
		for name, srv := range servers {
			req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			srv.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				if uidIn != "" || rec.Code < 400 || rec.Code >= 500 || rec.Body.Len() == 0 {
					t.Fatalf("%s: HTTP %d %q for a request with UID %q", name, rec.Code, rec.Body.String(), uidIn)
				}
				continue
			}
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatalf("%s: answer is not an AdmissionReview (%v): %q", name, err, rec.Body.String())
			}
			if out.Response == nil {
				t.Fatalf("%s: no response in %q", name, rec.Body.String())
			}
			// A body that is not a well-formed review (invalid JSON that
			// still carries a UID) may be answered with the UID the decoder
			// read: it does not validate the body as a whole (see
			// transport's decodeReview), and every field a handler uses is
			// decoded strictly.
			if uidIn != "" && string(out.Response.UID) != uidIn {
				t.Fatalf("%s: response UID %q for request UID %q", name, out.Response.UID, uidIn)
			}
			if !out.Response.Allowed && (out.Response.Result == nil || out.Response.Result.Message == "" && out.Response.Result.Reason == "") {
				t.Fatalf("%s: a denial without a reason: %q", name, rec.Body.String())
			}
		}
	})
}
