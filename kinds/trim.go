package kinds

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Trim is what a replica keeps of an object it watches whole: its
// identity, resourceVersion, deletion timestamp, finalizers, vmipam's
// annotations and holder label, and the address and pool fields (and, for
// a kind with a condition, what the condition may read: the spec, the
// labels and the annotations), so that the informer cache of a fleet of
// large objects costs what vmipam needs and no more. Patches computed from
// a trimmed object name only the fields they change, so nothing else is
// lost when the controller writes.
//
// The caches decode objects straight from the API server's JSON into
// this with DecodeTrimmed, which is checked against Trim. Trim also works
// as a controller-runtime cache.ByObject Transform.
func (t Kind) Trim(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	out := &unstructured.Unstructured{Object: map[string]any{}}
	out.SetAPIVersion(u.GetAPIVersion())
	out.SetKind(u.GetKind())
	md := map[string]any{}
	src, _ := u.Object["metadata"].(map[string]any)
	for _, k := range trimMetadata {
		if v, ok := src[k]; ok {
			md[k] = v
		}
	}
	if ann, ok := src["annotations"].(map[string]any); ok {
		keep := map[string]any{}
		for _, k := range t.trimAnnotations() {
			if v, ok := ann[k]; ok && k != "" {
				keep[k] = v
			}
		}
		if len(keep) > 0 {
			md["annotations"] = keep
		}
	}
	if l, ok := src["labels"].(map[string]any); ok {
		if v, ok := l[vmipamv1.HolderLabel]; ok {
			md["labels"] = map[string]any{vmipamv1.HolderLabel: v}
		}
	}
	if t.Condition != "" {
		// The condition may read any of the spec, the labels and the
		// annotations: keep them (not status, which the API server drops
		// on create and no condition of a create can see, nor
		// managedFields).
		for k, v := range u.Object {
			if k != "metadata" && k != "status" {
				out.Object[k] = v
			}
		}
		for _, k := range []string{"labels", "annotations"} {
			if v, ok := src[k]; ok {
				md[k] = v
			}
		}
	}
	out.Object["metadata"] = md
	for _, path := range t.trimPaths() {
		if v, found, err := unstructured.NestedFieldNoCopy(u.Object, path...); err == nil && found {
			_ = unstructured.SetNestedField(out.Object, v, path...)
		}
	}
	return out, nil
}

// trimMetadata are the metadata fields Trim keeps.
var trimMetadata = []string{"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp", "finalizers"}

// trimAnnotations are the annotations Trim keeps (an empty key is none).
func (t Kind) trimAnnotations() []string {
	return []string{vmipamv1.TokenAnnotation, vmipamv1.PoolAnnotation, vmipamv1.AddressAnnotation, vmipamv1.SingleStackAnnotation, t.PoolAnnotation, t.metadataAddressKey()}
}

// trimPaths are the fields outside metadata's own that Trim keeps: the
// pool, the family fields (the controller assigns addresses to an object
// that bypassed the webhook as its family policy asks), the address
// location and the status fields.
func (t Kind) trimPaths() [][]string {
	loc, _ := t.location()
	paths := make([][]string, 0, 6)
	for _, p := range [][]string{t.PoolField, t.FamilyPolicyField, t.FamiliesField} {
		if len(p) > 0 {
			paths = append(paths, p)
		}
	}
	if !t.onMetadata() && len(loc) > 0 {
		paths = append(paths, loc)
	}
	if t.Status != nil {
		for _, p := range [][]string{t.Status.Address, t.Status.Mask} {
			if len(p) > 0 {
				paths = append(paths, p)
			}
		}
	}
	return paths
}

// metadataAddressKey is the annotation of the object's own metadata the
// address (or a static request) is read from, if any.
func (t Kind) metadataAddressKey() string {
	if !t.onMetadata() {
		return ""
	}
	loc, _ := t.location()
	return loc[2]
}
