package app

import (
	"context"
	"fmt"
	"sync/atomic"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// shardReader reads objects of one kind from the two caches that hold what
// a replica sees of them: its own (labelled with its holder), then the
// unlabelled ones. An object labelled for another replica is in neither,
// and reads as not found, as does every object before the caches are set
// (the kind's CRD is not installed yet, so none exists).
type shardReader struct {
	caches atomic.Pointer[[2]client.Reader]
}

// set gives r the caches, once the kind is served.
func (r *shardReader) set(own, unlabeled client.Reader) {
	r.caches.Store(&[2]client.Reader{own, unlabeled})
}

// Get reads key from the replica's own cache, then from the unlabelled one.
func (r *shardReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	c := r.caches.Load()
	if c == nil {
		return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
	}
	err := c[0].Get(ctx, key, obj, opts...)
	if apierrors.IsNotFound(err) {
		return c[1].Get(ctx, key, obj, opts...)
	}
	return err
}

// List lists the replica's own objects and the unlabelled ones into list.
func (r *shardReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	c := r.caches.Load()
	if c == nil {
		return nil
	}
	more, ok := list.DeepCopyObject().(client.ObjectList)
	if !ok {
		return fmt.Errorf("list %T: not a list", list)
	}
	if err := c[0].List(ctx, list, opts...); err != nil {
		return err
	}
	if err := c[1].List(ctx, more, opts...); err != nil {
		return err
	}
	a, err := apimeta.ExtractList(list)
	if err != nil {
		return fmt.Errorf("list %T: %w", list, err)
	}
	b, err := apimeta.ExtractList(more)
	if err != nil {
		return fmt.Errorf("list %T: %w", list, err)
	}
	return apimeta.SetList(list, append(a, b...))
}
