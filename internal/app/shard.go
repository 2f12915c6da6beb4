package app

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

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
// server. The unlabelled cache holds metadata only: an object found there
// is read whole from the API server, at least as new as the cache's copy
// (served from the API server's watch cache, not from etcd). Objects are
// read into *unstructured.Unstructured. It reads one
// object at a time (controller.Getter) and tells whether a name is taken
// (pools.Names); nothing lists the caches.
type shardReader struct {
	kind kinds.Kind
	// api reads an object whole from the API server.
	api    client.Reader
	caches atomic.Pointer[[2]client.Reader]
	// indexes are the caches' indexes, in the same order, for Has.
	indexes atomic.Pointer[[2]*cacheindex.Index]

	// primed holds, by key, the unlabelled objects one list read whole at
	// the first read of one (see prime), each until it is read.
	primeOnce sync.Once
	primed    sync.Map
}

// primedFor bounds how long the objects prime read are kept unread.
const primedFor = time.Minute

// prime lists the unlabelled objects whole, for the reads that follow:
// the first read of one comes as the controller starts, with a reconcile
// of every unlabelled object to follow, which one list serves at a
// fraction of the cost of a read each. An object changed since is read
// again. What is left unread after primedFor is dropped. If the list
// fails, each object is read on its own.
func (r *shardReader) prime(ctx context.Context) {
	sel, err := pools.Unlabelled()
	if err != nil {
		return
	}
	for cont := ""; ; {
		l := r.kind.NewList()
		if err := r.api.List(ctx, l, client.MatchingLabelsSelector{Selector: sel}, client.Limit(primePage), client.Continue(cont)); err != nil {
			logf.FromContext(ctx).Info("Listing the objects with no holder label; reading each on its own", "error", err.Error())
			return
		}
		for i := range l.Items {
			o, err := r.kind.Trim(&l.Items[i])
			if err != nil {
				continue
			}
			u := o.(*unstructured.Unstructured)
			r.primed.Store(client.ObjectKeyFromObject(u), u)
		}
		if cont = l.GetContinue(); cont == "" {
			break
		}
	}
	time.AfterFunc(primedFor, r.primed.Clear)
}

// primePage is the page size of prime's list.
const primePage = 500

// set gives r the caches, once the kind is served.
func (r *shardReader) set(own, unlabeled client.Reader) {
	r.caches.Store(&[2]client.Reader{own, unlabeled})
}

// setIndexes gives r the caches' indexes, for Has: own's holds metadata
// where that suffices for the kind, unlabeled's metadata.
func (r *shardReader) setIndexes(ctx context.Context, own, unlabeled cacheindex.Informers) error {
	ownObj := client.Object(r.kind.New())
	if r.kind.MetadataSuffices() {
		ownObj = r.kind.NewMetadata()
	}
	o, err := cacheindex.For(ctx, own, ownObj)
	if err != nil {
		return err
	}
	u, err := cacheindex.For(ctx, unlabeled, r.kind.NewMetadata())
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
			return r.cached(ctx, client.ObjectKey{Namespace: namespace, Name: name})
		}
		if found {
			return true
		}
	}
	return false
}

// cached reports whether either cache holds key, reading them as they hold
// it: no object is read whole.
func (r *shardReader) cached(ctx context.Context, key client.ObjectKey) bool {
	c := r.caches.Load()
	if c == nil {
		return false
	}
	own := client.Object(r.kind.New())
	if r.kind.MetadataSuffices() {
		own = r.kind.NewMetadata()
	}
	for i, obj := range []client.Object{own, r.kind.NewMetadata()} {
		if c[i].Get(ctx, key, obj, &client.GetOptions{UnsafeDisableDeepCopy: ptr.To(true)}) == nil {
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
		return r.getUnlabelled(ctx, c[1], key, obj)
	}
	return err
}

// getUnlabelled reads key whole from the API server if the unlabelled
// cache holds it, at the resourceVersion the cache has or a later one,
// which the API server serves from its watch cache; or from what prime
// read, at the cache's resourceVersion.
func (r *shardReader) getUnlabelled(ctx context.Context, unlabelled client.Reader, key client.ObjectKey, obj client.Object) error {
	m := r.kind.NewMetadata()
	if err := unlabelled.Get(ctx, key, m, &client.GetOptions{UnsafeDisableDeepCopy: ptr.To(true)}); err != nil {
		return err
	}
	r.primeOnce.Do(func() { r.prime(ctx) })
	if v, ok := r.primed.LoadAndDelete(key); ok {
		if p := v.(*unstructured.Unstructured); p.GetResourceVersion() == m.ResourceVersion {
			if u, ok := obj.(*unstructured.Unstructured); ok {
				u.Object = p.Object
				return nil
			}
		}
	}
	if err := r.api.Get(ctx, key, obj, &client.GetOptions{Raw: &metav1.GetOptions{ResourceVersion: m.ResourceVersion}}); err != nil {
		return fmt.Errorf("read %s, which carries no holder label: %w", key, err)
	}
	return nil
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
	if whole, ok := r.kind.FromMetadata(m); ok {
		u.Object = whole.Object
		return nil
	}
	if err := r.api.Get(ctx, key, obj, opts...); err != nil {
		return fmt.Errorf("read %s, which carries no stamp of vmipam's: %w", key, err)
	}
	return nil
}
