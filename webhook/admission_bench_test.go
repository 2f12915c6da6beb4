package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/webhook/transport"
)

// admissionBody is an AdmissionReview of a VirtualMachine CREATE whose
// status holds conditions entries of about 12 bytes each.
func admissionBody(tb testing.TB, conditions int) []byte {
	tb.Helper()
	var status strings.Builder
	status.WriteString(`{"conditions":[`)
	for i := range conditions {
		if i > 0 {
			status.WriteByte(',')
		}
		status.WriteString(`{"type":"x"}`)
	}
	status.WriteString(`]}`)
	obj := fmt.Sprintf(`{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine",`+
		`"metadata":{"generateName":"bench-","namespace":"default","labels":{"app":"db"},"annotations":{"note":"%s"}},`+
		`"spec":{"image":"debian-13","cpus":2,"memory":"4Gi"},"status":%s}`, strings.Repeat("n", 512), status.String())
	review := fmt.Sprintf(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u",`+
		`"kind":{"group":"vmipam.io","version":"v1alpha1","kind":"VirtualMachine"},`+
		`"resource":{"group":"vmipam.io","version":"v1alpha1","resource":"virtualmachines"},`+
		`"namespace":"default","operation":"CREATE","userInfo":{"username":"bench"},"object":%s}}`, obj)
	return []byte(review)
}

// BenchmarkAdmissionHeap measures what one mutating admission allocates,
// through transport.Reviews as the API server calls it, for a small
// VirtualMachine and for a 3 MiB one whose status holds a quarter of a
// million conditions. beyond-body-B/op is what it allocates beyond the
// body's own bytes: it must not grow with the object.
func BenchmarkAdmissionHeap(b *testing.B) {
	for _, tc := range []struct {
		name       string
		conditions int
	}{{"small", 0}, {"3MiB-250k-conditions", 250_000}} {
		b.Run(tc.name, func(b *testing.B) {
			body := admissionBody(b, tc.conditions)
			reg, _, _ := newTestRegistry(b, "10.0.0.0/8")
			h := transport.NewReviews(transport.Limits{}).Handler(&Assigner{Registry: reg, Kind: kinds.VirtualMachine})
			serve := func() {
				req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				var out admissionv1.AdmissionReview
				if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil || out.Response == nil || !out.Response.Allowed {
					b.Fatalf("admission failed: %d %s", rec.Code, rec.Body.String())
				}
			}
			serve() // the first claim
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			var before, after runtimeMem
			before.read()
			b.ResetTimer()
			for range b.N {
				serve()
			}
			b.StopTimer()
			after.read()
			perOp := float64(after.total-before.total) / float64(b.N)
			b.ReportMetric(float64(len(body)), "body-B")
			b.ReportMetric(perOp-float64(len(body)), "beyond-body-B/op")
		})
	}
}

// runtimeMem reads the bytes allocated so far.
type runtimeMem struct{ total uint64 }

func (m *runtimeMem) read() {
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.total = s.TotalAlloc
}
