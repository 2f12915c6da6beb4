package kinds

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Trim is a cache transform (controller-runtime's cache.ByObject
// Transform): it keeps of an object only what vmipam reads, its identity,
// resourceVersion, deletion timestamp, finalizers, vmipam's annotations and
// holder label, and the address and pool fields (and, for a kind with a
// condition, what the condition may read: the spec, the labels and the
// annotations), so that the informer cache of a fleet of
// large objects costs what vmipam needs and no more. Patches computed from
// a trimmed object name only the fields they change, so nothing else is
// lost when the controller writes.
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
	for _, k := range []string{"name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp", "finalizers"} {
		if v, ok := src[k]; ok {
			md[k] = v
		}
	}
	if ann, ok := src["annotations"].(map[string]any); ok {
		keep := map[string]any{}
		for _, k := range []string{vmipamv1.TokenAnnotation, vmipamv1.PoolAnnotation, vmipamv1.AddressAnnotation, vmipamv1.SingleStackAnnotation, t.PoolAnnotation, t.metadataAddressKey()} {
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
	loc, _ := t.location()
	// The family fields: the controller assigns addresses to an object that
	// bypassed the webhook as its family policy asks.
	paths := [][]string{t.PoolField, t.FamilyPolicyField, t.FamiliesField}
	if !t.onMetadata() {
		paths = append(paths, loc)
	}
	if t.Status != nil {
		paths = append(paths, t.Status.Address, t.Status.Mask)
	}
	for _, path := range paths {
		if len(path) == 0 {
			continue
		}
		if v, found, err := unstructured.NestedFieldNoCopy(u.Object, path...); err == nil && found {
			_ = unstructured.SetNestedField(out.Object, v, path...)
		}
	}
	return out, nil
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
