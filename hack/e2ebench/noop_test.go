package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	jsonpatchapply "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestNoopPatch answers reviews of objects with and without annotations
// and labels, applies each answer's patch as the API server does, and
// checks what the object then carries.
func TestNoopPatch(t *testing.T) {
	objects := map[string]string{
		"neither":     `{"metadata":{"name":"a"},"spec":{}}`,
		"annotations": `{"metadata":{"name":"a","annotations":{"x":"1"}},"spec":{}}`,
		"labels":      `{"metadata":{"name":"a","labels":{"app.kubernetes.io/name":"e2ebench"}},"spec":{}}`,
		"both":        `{"metadata":{"name":"a","annotations":{"x":"1"},"labels":{"y":"2"}},"spec":{}}`,
	}
	for _, stamp := range []bool{false, true} {
		s, err := startNoopServer(stamp)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.stop)
		for name, obj := range objects {
			t.Run(map[bool]string{false: "plain/", true: "stamp/"}[stamp]+name, func(t *testing.T) {
				review, err := json.Marshal(admissionv1.AdmissionReview{Request: &admissionv1.AdmissionRequest{UID: "u", Object: runtime.RawExtension{Raw: []byte(obj)}}})
				if err != nil {
					t.Fatal(err)
				}
				rec := httptest.NewRecorder()
				s.mutate(rec, httptest.NewRequest(http.MethodPost, noopMutatePath, bytes.NewReader(review)))
				var out admissionv1.AdmissionReview
				if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil || !out.Response.Allowed {
					t.Fatalf("answer %s: %v", rec.Body, err)
				}
				p, err := jsonpatchapply.DecodePatch(out.Response.Patch)
				if err != nil {
					t.Fatal(err)
				}
				patched, err := p.Apply([]byte(obj))
				if err != nil {
					t.Fatalf("apply %s to %s: %v", out.Response.Patch, obj, err)
				}
				var before, after struct {
					Metadata struct {
						Annotations, Labels map[string]string
						Finalizers          []string
					}
				}
				if err := json.Unmarshal([]byte(obj), &before); err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(patched, &after); err != nil {
					t.Fatal(err)
				}
				wantAnn := maps.Clone(before.Metadata.Annotations)
				if wantAnn == nil {
					wantAnn = map[string]string{}
				}
				wantAnn[noopAnnotation] = noopAnnotationValue
				wantLabels := maps.Clone(before.Metadata.Labels)
				if stamp {
					maps.Copy(wantAnn, noopStamp.annotations)
					if wantLabels == nil {
						wantLabels = map[string]string{}
					}
					maps.Copy(wantLabels, noopStamp.labels)
				}
				if !maps.Equal(after.Metadata.Annotations, wantAnn) {
					t.Errorf("annotations %v, want %v", after.Metadata.Annotations, wantAnn)
				}
				if !maps.Equal(after.Metadata.Labels, wantLabels) {
					t.Errorf("labels %v, want %v", after.Metadata.Labels, wantLabels)
				}
				if !slices.Equal(after.Metadata.Finalizers, []string{noopFinalizer}) {
					t.Errorf("finalizers %v, want [%s]", after.Metadata.Finalizers, noopFinalizer)
				}
			})
		}
	}
}
