package jsonscan

import (
	"bytes"
	"fmt"
	"strings"
)

// review is a CREATE AdmissionReview for a VirtualMachine, about 2 KiB, as
// the API server sends it to the mutating webhook.
const review = `{
  "kind": "AdmissionReview",
  "apiVersion": "admission.k8s.io/v1",
  "request": {
    "uid": "0df28fbd-5f5f-11e8-bc74-36e6bb280816",
    "kind": {"group": "vmipam.io", "version": "v1alpha1", "kind": "VirtualMachine"},
    "resource": {"group": "vmipam.io", "version": "v1alpha1", "resource": "virtualmachines"},
    "requestKind": {"group": "vmipam.io", "version": "v1alpha1", "kind": "VirtualMachine"},
    "requestResource": {"group": "vmipam.io", "version": "v1alpha1", "resource": "virtualmachines"},
    "name": "web-0",
    "namespace": "team-a",
    "operation": "CREATE",
    "userInfo": {
      "username": "system:serviceaccount:team-a:deployer",
      "uid": "3f9d4c1e-2b7a-4d8e-9c61-5a0e7b2f8d13",
      "groups": ["system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"],
      "extra": {"authentication.kubernetes.io/pod-name": ["deployer-7c9f8b6d5-xk2lp"]}
    },
    "object": {
      "apiVersion": "vmipam.io/v1alpha1",
      "kind": "VirtualMachine",
      "metadata": {
        "name": "web-0",
        "namespace": "team-a",
        "uid": "8a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",
        "generation": 1,
        "creationTimestamp": "2024-05-01T10:00:00Z",
        "labels": {"app": "web", "tier": "frontend", "app.kubernetes.io/managed-by": "helm"},
        "annotations": {
          "kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"vmipam.io/v1alpha1\",\"kind\":\"VirtualMachine\",\"metadata\":{\"annotations\":{},\"name\":\"web-0\",\"namespace\":\"team-a\"},\"spec\":{\"image\":\"debian-12\",\"ipPool\":\"frontend\"}}\n",
          "vmipam.io/pool": "frontend",
          "vmipam.io/token": "c2VjcmV0LXRva2VuLWZvci13ZWItMA"
        },
        "managedFields": [
          {
            "manager": "kubectl-client-side-apply",
            "operation": "Update",
            "apiVersion": "vmipam.io/v1alpha1",
            "time": "2024-05-01T10:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}}, "f:labels": {".": {}, "f:app": {}, "f:tier": {}}}, "f:spec": {".": {}, "f:cpus": {}, "f:image": {}, "f:ipPool": {}, "f:memory": {}}}
          }
        ]
      },
      "spec": {
        "ipPool": "frontend",
        "addresses": ["10.20.0.17"],
        "image": "debian-12",
        "cpus": 2,
        "memory": "4Gi"
      }
    },
    "oldObject": null,
    "dryRun": false,
    "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-client-side-apply", "fieldValidation": "Strict"}
  }
}`

// reviewPaths are the values the VirtualMachine webhook reads from a review.
var reviewPaths = [][]string{
	{"request", "object", "metadata", "name"},
	{"request", "object", "metadata", "namespace"},
	{"request", "object", "metadata", "uid"},
	{"request", "object", "metadata", "annotations", "vmipam.io/token"},
	{"request", "object", "metadata", "annotations", "vmipam.io/pool"},
	{"request", "object", "spec", "ipPool"},
	{"request", "object", "spec", "addresses"},
	{"request", "dryRun"},
}

// objectPaths are the values the webhook reads from a VirtualMachine.
var objectPaths = [][]string{
	{"metadata", "name"},
	{"metadata", "namespace"},
	{"metadata", "uid"},
	{"metadata", "resourceVersion"},
	{"metadata", "annotations", "vmipam.io/token"},
	{"metadata", "annotations", "vmipam.io/pool"},
	{"spec", "ipPool"},
	{"spec", "addresses"},
}

// hostileVM returns a VirtualMachine of about 3 MiB whose status.conditions
// holds n small entries, placed between metadata and spec so that the
// wanted values lie on both sides of it.
func hostileVM(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine",` +
		`"metadata":{"name":"web-0","namespace":"team-a","uid":"8a1b2c3d","resourceVersion":"123",` +
		`"annotations":{"vmipam.io/pool":"frontend","vmipam.io/token":"tok"}},` +
		`"status":{"conditions":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"type":"%c"}`, 'A'+i%26)
	}
	b.WriteString(`]},"spec":{"ipPool":"frontend","addresses":["10.20.0.17"]}}`)
	return b.Bytes()
}

// escapedAnnotations returns a VirtualMachine of about size bytes, nearly
// all of it annotations whose keys start with an escape, so that every key
// in the walked map needs unescaping to be compared.
func escapedAnnotations(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"metadata":{"name":"web-0","annotations":{`)
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, `"\u003c%d":"",`, i)
	}
	b.WriteString(`"vmipam.io/token":"tok"}},"spec":{"ipPool":"frontend"}}`)
	return b.Bytes()
}

// nested returns n opening brackets followed by n closing ones.
func nested(n int) string {
	return strings.Repeat("[", n) + strings.Repeat("]", n)
}
