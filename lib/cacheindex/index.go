// Package cacheindex reads objects of a controller-runtime cache straight
// from its informer's index: a map lookup, without the copy, the kind
// resolution and the not-found error of each read through the cache's
// client. vmipam reads two objects of the cache on every admission (the
// namespace, and the name the create asks for), where those costs were a
// tenth of its CPU per create, and every object of its caches in each
// resync, where a List through the client copied each into a typed list.
// What it returns are the cache's own objects: read them, never change
// them.
package cacheindex

import (
	"context"
	"fmt"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Informers is the part of a controller-runtime cache an Index needs.
type Informers interface {
	GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error)
}

// Index reads one kind's objects from a cache's informer.
type Index struct {
	inf toolscache.SharedIndexInformer
}

// For returns the Index of obj's kind in c, making its informer if c has
// none yet; it does not wait for the informer to sync.
func For(ctx context.Context, c Informers, obj client.Object) (*Index, error) {
	inf, err := c.GetInformer(ctx, obj, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("informer of %T: %w", obj, err)
	}
	si, ok := inf.(toolscache.SharedIndexInformer)
	if !ok {
		return nil, fmt.Errorf("informer of %T is a %T, which has no index", obj, inf)
	}
	return &Index{inf: si}, nil
}

// Get returns the object namespace/name (name alone for a cluster-scoped
// kind), whether it is there, and whether the informer has synced: before
// that, an object not found may exist all the same.
func (i *Index) Get(namespace, name string) (obj any, found, synced bool) {
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	obj, found, err := i.inf.GetIndexer().GetByKey(key)
	return obj, found && err == nil, i.inf.HasSynced()
}

// List returns every object in the index, and whether the informer had
// synced before they were read: before that, some may be missing. It
// copies no object, only the pointers to them.
func (i *Index) List() (objs []any, synced bool) {
	synced = i.inf.HasSynced()
	return i.inf.GetIndexer().List(), synced
}
