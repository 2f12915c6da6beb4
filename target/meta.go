package target

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// MetadataSuffices reports whether vmipam reads all it needs of an object
// it stamped from the object's metadata: the address is in vmipam's
// address annotation (vmipamv1.AddressAnnotation), which the kind's
// admission policies keep equal to the address location, and nothing else
// of the object is read. That holds for every kind but one whose address
// goes into status, whose status vmipam must see to fill it.
//
// A replica then watches the objects it looks after as metadata only
// (PartialObjectMetadata, which the API server encodes as protobuf even for
// a custom resource, where a whole object comes as JSON): decoding the VM
// watch's JSON was a fifth of vmipam's CPU per create.
func (t Target) MetadataSuffices() bool { return t.Status == nil }

// NewMetadata returns an empty PartialObjectMetadata of the kind.
func (t Target) NewMetadata() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(t.GVK)
	return m
}

// FromMetadata returns the object m is the metadata of, as far as vmipam
// reads it (as Trim keeps it, the address written at its location from
// vmipam's address annotation), if m carries that annotation. Without it
// (an object that bypassed the webhook and was adopted, whose address only
// its own location holds) it reports false: read the whole object.
func (t Target) FromMetadata(m *metav1.PartialObjectMetadata) (*unstructured.Unstructured, bool) {
	addr := m.Annotations[vmipamv1.AddressAnnotation]
	if addr == "" {
		return nil, false
	}
	u := t.New()
	u.SetNamespace(m.Namespace)
	u.SetName(m.Name)
	u.SetUID(m.UID)
	u.SetResourceVersion(m.ResourceVersion)
	u.SetGeneration(m.Generation)
	u.SetCreationTimestamp(m.CreationTimestamp)
	u.SetDeletionTimestamp(m.DeletionTimestamp)
	if len(m.Finalizers) > 0 {
		u.SetFinalizers(m.Finalizers)
	}
	if len(m.Annotations) > 0 {
		u.SetAnnotations(m.Annotations)
	}
	if len(m.Labels) > 0 {
		u.SetLabels(m.Labels)
	}
	if err := t.SetAddresses(u, []string{addr}); err != nil {
		return nil, false
	}
	return u, true
}

// TrimMetadata is the cache transform (controller-runtime's
// cache.ByObject Transform) of a kind watched as metadata: it keeps what
// FromMetadata reads, and drops the managed fields and the labels and
// annotations that are not vmipam's.
func (t Target) TrimMetadata(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	out := &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, Generation: m.Generation,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp, Finalizers: m.Finalizers,
	}}
	out.Annotations = keep(m.Annotations, vmipamv1.TokenAnnotation, vmipamv1.PoolAnnotation, vmipamv1.AddressAnnotation)
	out.Labels = keep(m.Labels, vmipamv1.HolderLabel)
	return out, nil
}

// keep returns the entries of m under keys, or nil if none.
func keep(m map[string]string, keys ...string) map[string]string {
	var out map[string]string
	for _, k := range keys {
		if v, ok := m[k]; ok {
			if out == nil {
				out = make(map[string]string, len(keys))
			}
			out[k] = v
		}
	}
	return out
}
