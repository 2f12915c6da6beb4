package app

import (
	"context"
	"fmt"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/lib/cacheindex"
	"github.com/vmipam/vmipam/pools"
)

// shardReader reads objects of one kind from the two caches that hold what
// a replica sees of them: its own (labelled with its holder), then the
// unlabelled ones. An object labelled for another replica is in neither,
// and reads as not found, as does every object before the caches are set
// (the kind's CRD is not installed yet, so none exists).
//
// Where the own cache holds metadata only (kinds.Kind.MetadataSuffices),
// an object read from it is rebuilt from its metadata and vmipam's stamp
// (kinds.Kind.FromMetadata); one labelled for this replica without a
// stamp (adopted after it bypassed the webhook) is read whole from the API
// server. Objects are read into *unstructured.Unstructured. It reads one
// object at a time (controller.Getter) and tells whether a name is taken
// (pools.Names), and lists both for a resync (pools.Cached).
type shardReader struct {
	kind kinds.Kind
	// api reads an object whole from the API server.
	api client.Reader
	// holder is the value of the holder label that selects the own cache,
	// which its objects are read with (see kinds.Kind.TrimOwn).
	holder string
	caches atomic.Pointer[[2]client.Reader]
	// indexes are the caches' indexes, in the same order, for Has.
	indexes atomic.Pointer[[2]*cacheindex.Index]
}

// set gives r the caches, once the kind is served.
func (r *shardReader) set(own, unlabeled client.Reader) {
	r.caches.Store(&[2]client.Reader{own, unlabeled})
}

// setIndexes gives r the caches' indexes, for Has: own's holds metadata
// where that suffices for the kind, unlabeled's whole objects.
func (r *shardReader) setIndexes(ctx context.Context, own, unlabeled cacheindex.Informers) error {
	ownObj := client.Object(r.kind.New())
	if r.kind.MetadataSuffices() {
		ownObj = r.kind.NewMetadata()
	}
	o, err := cacheindex.For(ctx, own, ownObj)
	if err != nil {
		return err
	}
	u, err := cacheindex.For(ctx, unlabeled, r.kind.New())
	if err != nil {
		return err
	}
	r.indexes.Store(&[2]*cacheindex.Index{o, u})
	return nil
}

// Has reports whether either cache holds namespace/name, from their
// indexes (pools.Names): every create asks, for the name it wants. An
// index not synced yet answers through the cache's reader, which waits
// for it.
func (r *shardReader) Has(ctx context.Context, namespace, name string) bool {
	idx := r.indexes.Load()
	if idx == nil {
		return false
	}
	for _, i := range idx {
		_, found, synced := i.Get(namespace, name)
		if !synced {
			return r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, r.kind.New()) == nil
		}
		if found {
			return true
		}
	}
	return false
}

// Get reads key from the replica's own cache, then from the unlabelled one.
func (r *shardReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c := r.caches.Load()
	if c == nil {
		return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
	}
	err := r.getOwn(ctx, c[0], key, obj, opts...)
	if apierrors.IsNotFound(err) {
		return c[1].Get(ctx, key, obj, opts...)
	}
	return err
}

func (r *shardReader) getOwn(ctx context.Context, own client.Reader, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if !r.kind.MetadataSuffices() {
		return own.Get(ctx, key, obj, opts...)
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return fmt.Errorf("read %s: into a %T, not an unstructured object", key, obj)
	}
	m := r.kind.NewMetadata()
	// FromMetadata copies what it reads, so the cache's own copy will do.
	if err := own.Get(ctx, key, m, &client.GetOptions{UnsafeDisableDeepCopy: ptr.To(true)}); err != nil {
		return err
	}
	if whole, ok := r.kind.OwnFromMetadata(m, r.holder); ok {
		u.Object = whole.Object
		return nil
	}
	if err := r.api.Get(ctx, key, obj, opts...); err != nil {
		return fmt.Errorf("read %s, which carries no stamp of vmipam's: %w", key, err)
	}
	return nil
}

// maxUnstamped bounds the objects of the own cache without vmipam's stamp
// that EachCached reads whole from the API server; with more (a fleet
// adopted whole), the caches cannot stand for a list.
const maxUnstamped = 100

// EachCached calls fn with what a resync reads of every object of the
// kind in the replica's two caches (pools.Cached): from the resync, which
// reads the caches instead of listing every object from the API server.
// An object of the own cache held as metadata is read from its metadata
// (pools.MetadataObject), without rebuilding it whole as Get does: a
// resync reads every object the replica looks after. The objects come
// from the caches' indexes (see cached), not copied.
func (r *shardReader) EachCached(ctx context.Context, fn func(o *pools.Object)) (bool, error) {
	c := r.caches.Load()
	if c == nil {
		return false, nil
	}
	if !r.kind.MetadataSuffices() {
		if err := r.eachWhole(ctx, 0, c[0], fn); err != nil {
			return false, err
		}
		return true, r.eachWhole(ctx, 1, c[1], fn)
	}
	l := &metav1.PartialObjectMetadataList{}
	l.SetGroupVersionKind(r.kind.GVK.GroupVersion().WithKind(r.kind.GVK.Kind + "List"))
	objs, err := r.cached(ctx, 0, c[0], l)
	if err != nil {
		return false, err
	}
	var unstamped []client.ObjectKey
	for _, obj := range objs {
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return false, fmt.Errorf("the cache of %s as metadata holds a %T", r.kind.GVR().GroupResource(), obj)
		}
		if o, ok := pools.MetadataObject(r.kind, m, r.holder); ok {
			fn(&o)
		} else {
			unstamped = append(unstamped, client.ObjectKey{Namespace: m.Namespace, Name: m.Name})
		}
	}
	if len(unstamped) > maxUnstamped {
		return false, nil
	}
	if err := r.kind.ReadUnstamped(ctx, r.api, unstamped, func(obj *unstructured.Unstructured) {
		o := pools.ObjectOf(r.kind, obj)
		fn(&o)
	}); err != nil {
		return false, err
	}
	return true, r.eachWhole(ctx, 1, c[1], fn)
}

// eachWhole calls fn with what a resync reads of every object of the kind
// in cache c, the i-th of r's (0 own, 1 unlabelled), which holds them
// whole.
func (r *shardReader) eachWhole(ctx context.Context, i int, c client.Reader, fn func(o *pools.Object)) error {
	objs, err := r.cached(ctx, i, c, r.kind.NewList())
	if err != nil {
		return err
	}
	for _, obj := range objs {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return fmt.Errorf("the cache of %s holds a %T", r.kind.GVR().GroupResource(), obj)
		}
		o := pools.ObjectOf(r.kind, u)
		fn(&o)
	}
	return nil
}

// cached returns the objects of cache c, the i-th of r's: the cache's own,
// from its informer's index (cacheindex.Index.List) once that has synced,
// a slice of pointers and no copy; before that (or with no index), from a
// List through c into list, which waits for the sync and copies each
// object into list.
func (r *shardReader) cached(ctx context.Context, i int, c client.Reader, list client.ObjectList) ([]any, error) {
	if idx := r.indexes.Load(); idx != nil {
		if objs, synced := idx[i].List(); synced {
			return objs, nil
		}
	}
	if err := c.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list %s from the cache: %w", r.kind.GVR().GroupResource(), err)
	}
	objs := make([]any, 0, meta.LenList(list))
	if err := meta.EachListItem(list, func(o runtime.Object) error {
		objs = append(objs, o)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read a list of %s from the cache: %w", r.kind.GVR().GroupResource(), err)
	}
	return objs, nil
}
