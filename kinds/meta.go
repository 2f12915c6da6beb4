package kinds

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unique"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
func (t Kind) MetadataSuffices() bool { return t.Status == nil }

// NewMetadata returns an empty PartialObjectMetadata of the kind.
func (t Kind) NewMetadata() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(t.GVK)
	return m
}

// FromMetadata returns the object m is the metadata of, as far as vmipam
// reads it (as Trim keeps it, the address written at its location from
// vmipam's address annotation), if m carries that annotation. Without it
// (an object that bypassed the webhook and was adopted, whose address only
// its own location holds) it reports false: read the whole object.
func (t Kind) FromMetadata(m *metav1.PartialObjectMetadata) (*unstructured.Unstructured, bool) {
	return t.fromMetadata(m, "")
}

// fromMetadata is FromMetadata, with the holder label set to holder when m
// has no labels (what TrimOwn leaves) and holder is not empty.
func (t Kind) fromMetadata(m *metav1.PartialObjectMetadata, holder string) (*unstructured.Unstructured, bool) {
	addr := m.Annotations[vmipamv1.AddressAnnotation]
	if addr == "" {
		return nil, false
	}
	// The maps are built here, sized for what goes in, not with
	// unstructured's setters, which walk and allocate a path per field:
	// this runs for every read of an object a replica looks after, and for
	// each of them in every resync from the caches.
	md := make(map[string]any, 9)
	md["name"], md["uid"], md["resourceVersion"] = m.Name, string(m.UID), m.ResourceVersion
	if m.Namespace != "" {
		md["namespace"] = m.Namespace
	}
	if m.Generation != 0 {
		md["generation"] = m.Generation
	}
	if !m.CreationTimestamp.IsZero() {
		md["creationTimestamp"] = m.CreationTimestamp.UTC().Format(time.RFC3339)
	}
	if m.DeletionTimestamp != nil {
		md["deletionTimestamp"] = m.DeletionTimestamp.UTC().Format(time.RFC3339)
	}
	if len(m.Finalizers) > 0 {
		fins := make([]any, len(m.Finalizers))
		for i, f := range m.Finalizers {
			fins[i] = f
		}
		md["finalizers"] = fins
	}
	if len(m.Annotations) > 0 {
		md["annotations"] = anyValues(m.Annotations)
	}
	switch {
	case len(m.Labels) > 0:
		md["labels"] = anyValues(m.Labels)
	case m.Labels == nil && holder != "":
		md["labels"] = map[string]any{vmipamv1.HolderLabel: holder}
	}
	apiVersion, kind := m.APIVersion, m.Kind
	if apiVersion == "" || kind == "" {
		apiVersion, kind = t.GVK.GroupVersion().String(), t.GVK.Kind
	}
	u := &unstructured.Unstructured{Object: make(map[string]any, 4)}
	u.Object["apiVersion"], u.Object["kind"], u.Object["metadata"] = apiVersion, kind, md
	if err := t.SetAddresses(u, StampedAddresses(addr)); err != nil {
		return nil, false
	}
	return u, true
}

// MetadataAddresses returns the addresses of the object m is the metadata
// of, as Addresses reads them from what FromMetadata rebuilds, without
// rebuilding it; false where FromMetadata reports false (no address
// annotation: read the whole object). Addresses that the kind's location
// would not read back (Addresses's error) come back as none. A resync of a
// replica's own objects reads every one of them this way.
func (t Kind) MetadataAddresses(m *metav1.PartialObjectMetadata) ([]string, bool) {
	addr := m.Annotations[vmipamv1.AddressAnnotation]
	if addr == "" {
		return nil, false
	}
	addrs := StampedAddresses(addr)
	if t.Status != nil {
		// SetAddresses writes the annotation, which Addresses reads first.
		return addrs, true
	}
	// What SetAddresses writes at the location, read back as Addresses
	// reads it.
	switch _, k := t.location(); k {
	case locList:
		return addrs, true
	case locString:
		return []string{strings.Join(addrs, ",")}, true
	}
	out, err := t.parse(t.Render(addrs))
	if err != nil {
		return nil, true
	}
	return out, true
}

// anyValues returns a copy of m with values of type any, as unstructured
// objects hold them.
func anyValues(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// ReadUnstamped calls fn with each object of the kind at keys, read whole
// from r (the API server): objects whose metadata carries no stamp of
// vmipam's (FromMetadata reports false), so that their address is only at
// its location. One gone since its key was taken is skipped.
func (t Kind) ReadUnstamped(ctx context.Context, r client.Reader, keys []client.ObjectKey, fn func(obj *unstructured.Unstructured)) error {
	for _, key := range keys {
		obj := t.New()
		if err := r.Get(ctx, key, obj); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("read %s %s, which carries no stamp of vmipam's: %w", t.GVR().GroupResource(), key, err)
		}
		fn(obj)
	}
	return nil
}

// TrimMetadata is the cache transform (controller-runtime's
// cache.ByObject Transform) of a kind watched as metadata: it keeps what
// FromMetadata reads, and drops the managed fields and the labels and
// annotations that are not vmipam's.
func (t Kind) TrimMetadata(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	// In place: the object is the decoder's, seen by nothing else yet.
	// The strings every object shares (the keys, the namespace, the pool,
	// the holder, the finalizers) are interned: the decoder makes a copy of
	// each for each object.
	fins := m.Finalizers
	for i, f := range fins {
		fins[i] = unique.Make(f).Value()
	}
	m.ObjectMeta = metav1.ObjectMeta{
		Name: m.Name, Namespace: unique.Make(m.Namespace).Value(), UID: m.UID, ResourceVersion: m.ResourceVersion, Generation: m.Generation,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp, Finalizers: fins,
		Annotations: interned(keep(m.Annotations, vmipamv1.TokenAnnotation, vmipamv1.PoolAnnotation, vmipamv1.AddressAnnotation, vmipamv1.SingleStackAnnotation),
			vmipamv1.PoolAnnotation, vmipamv1.SingleStackAnnotation),
		Labels: interned(keep(m.Labels, vmipamv1.HolderLabel), vmipamv1.HolderLabel),
	}
	return m, nil
}

// TrimOwn is the cache transform of a replica's own objects, watched as
// metadata and selected by its holder label value holder: TrimMetadata,
// and then that label dropped, which every object in the cache carries
// (its selector) and which would cost each a map. Whoever reads the cache
// puts it back (OwnFromMetadata).
func (t Kind) TrimOwn(holder string) func(any) (any, error) {
	return func(obj any) (any, error) {
		out, err := t.TrimMetadata(obj)
		if m, ok := out.(*metav1.PartialObjectMetadata); ok && err == nil && m.Labels[vmipamv1.HolderLabel] == holder {
			m.Labels = nil
		}
		return out, err
	}
}

// OwnFromMetadata is FromMetadata for an object of a replica's own cache,
// trimmed by TrimOwn(holder): its holder label is put back.
func (t Kind) OwnFromMetadata(m *metav1.PartialObjectMetadata, holder string) (*unstructured.Unstructured, bool) {
	return t.fromMetadata(m, holder)
}

// interned rewrites, in place, m's keys and its values under shared to
// their canonical copies (unique.Make), and returns m.
func interned(m map[string]string, shared ...string) map[string]string {
	for k, v := range m {
		if slices.Contains(shared, k) {
			v = unique.Make(v).Value()
		}
		// Assigning an existing string key replaces the key's string too.
		m[unique.Make(k).Value()] = v
	}
	return m
}

// keep drops from m every entry but those under keys, in place, and
// returns it, or nil if none is left.
func keep(m map[string]string, keys ...string) map[string]string {
	for k := range m {
		if !slices.Contains(keys, k) {
			delete(m, k)
		}
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// PatchMetadata sets fields of the metadata of the object of kind gvk at
// key (a "uid" or "resourceVersion" among them makes the write
// conditional on it) with a merge patch through the API's metadata view of
// the kind: the answer is the object's metadata, in protobuf, not the whole
// object in JSON. The patch is written directly, not computed from a copy
// of the object as client.MergeFrom does (that diff was a tenth of
// vmipam's CPU per delete). It returns the resourceVersion the write made,
// so that a later patch of the same object can be locked to it.
func PatchMetadata(ctx context.Context, c client.Writer, gvk schema.GroupVersionKind, key client.ObjectKey, fields map[string]any) (string, error) {
	data, err := json.Marshal(map[string]any{"metadata": fields})
	if err != nil {
		return "", fmt.Errorf("encode the patch of %s's metadata: %w", key, err)
	}
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(gvk)
	m.Namespace, m.Name = key.Namespace, key.Name
	if err := c.Patch(ctx, m, client.RawPatch(types.MergePatchType, data)); err != nil {
		return "", err
	}
	return m.ResourceVersion, nil
}
