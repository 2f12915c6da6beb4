package transport

import (
	"bytes"
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// FuzzDecodeReview: for every body encoding/json reads as an
// AdmissionReview, decodeReview reads the same fields the handlers use (or
// refuses the body).
func FuzzDecodeReview(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"group":"vmipam.io","version":"v1alpha1","kind":"VirtualMachine"},` +
			`"resource":{"group":"vmipam.io","version":"v1alpha1","resource":"virtualmachines"},"name":"a","namespace":"n","operation":"CREATE",` +
			`"userInfo":{"username":"alice","groups":["g"]},"object":{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine"},"dryRun":true}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u2","kind":{"group":"","version":"v1","kind":"Pod"},"subResource":"status",` +
			`"operation":"UPDATE","object":{"a":1},"oldObject":{"a":2},"dryRun":false}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u3","dryRun": true ,"kind":null}}`,
		`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u\u0034","name":"\u0061"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var want admissionv1.AdmissionReview
		if json.Unmarshal(body, &want) != nil || want.Request == nil {
			return
		}
		got, err := decodeReview(body)
		if err != nil {
			return
		}
		w, g := want.Request, got.AdmissionRequest
		if g.UID != w.UID || g.Kind != w.Kind || g.Resource != w.Resource || g.SubResource != w.SubResource ||
			g.Name != w.Name || g.Namespace != w.Namespace || g.Operation != w.Operation {
			t.Fatalf("%s: decoded %+v, encoding/json %+v", body, g, *w)
		}
		if (g.DryRun == nil) != (w.DryRun == nil) || g.DryRun != nil && *g.DryRun != *w.DryRun {
			t.Fatalf("%s: dryRun %v, encoding/json %v", body, g.DryRun, w.DryRun)
		}
		for _, o := range []struct{ got, want []byte }{{g.Object.Raw, w.Object.Raw}, {g.OldObject.Raw, w.OldObject.Raw}} {
			if !bytes.Equal(bytes.TrimSpace(o.got), bytes.TrimSpace(o.want)) && len(o.want) != 0 && string(o.want) != "null" {
				t.Fatalf("%s: object %q, encoding/json %q", body, o.got, o.want)
			}
		}
	})
}

func BenchmarkDecodeReview(b *testing.B) {
	body := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002",` +
		`"kind":{"group":"vmipam.io","version":"v1alpha1","kind":"VirtualMachine"},"resource":{"group":"vmipam.io","version":"v1alpha1","resource":"virtualmachines"},` +
		`"requestKind":{"group":"vmipam.io","version":"v1alpha1","kind":"VirtualMachine"},"requestResource":{"group":"vmipam.io","version":"v1alpha1","resource":"virtualmachines"},` +
		`"name":"db-1","namespace":"team-a","operation":"CREATE","userInfo":{"username":"system:serviceaccount:ci:deployer","uid":"u","groups":["system:serviceaccounts","system:serviceaccounts:ci","system:authenticated"]},` +
		`"object":{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"db-1","namespace":"team-a"},"spec":{"image":"debian-13","cpus":1,"memory":"512Mi"}},` +
		`"oldObject":null,"dryRun":false,"options":{"apiVersion":"meta.k8s.io/v1","kind":"CreateOptions"}}}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := decodeReview(body); err != nil {
			b.Fatal(err)
		}
	}
}
