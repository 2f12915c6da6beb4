package app

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// shardReader reads objects of the target kind from the two caches that
// hold what a replica sees of them: its own (labelled with its holder),
// then the unlabelled ones. An object labelled for another replica is in
// neither, and reads as not found.
type shardReader struct {
	own, unlabeled client.Reader
}

// Get reads key from the replica's own cache, then from the unlabelled one.
func (r shardReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := r.own.Get(ctx, key, obj, opts...)
	if apierrors.IsNotFound(err) {
		return r.unlabeled.Get(ctx, key, obj, opts...)
	}
	return err
}

// List lists the replica's own objects and the unlabelled ones into list.
func (r shardReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	more, ok := list.DeepCopyObject().(client.ObjectList)
	if !ok {
		return fmt.Errorf("list %T: not a list", list)
	}
	if err := r.own.List(ctx, list, opts...); err != nil {
		return err
	}
	if err := r.unlabeled.List(ctx, more, opts...); err != nil {
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
