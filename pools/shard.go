package pools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
)

// relabelWorkers bounds the label patches in flight at once; relabelRounds
// is how many times one relabel tries a failed patch.
const (
	relabelWorkers = 8
	relabelRounds  = 3
)

// HolderLabelValue is the value of vmipam's holder label that names
// holder: the holder itself when it is a valid label value (a pod's name
// is), else a digest of it.
func HolderLabelValue(holder string) string {
	if len(validation.IsValidLabelValue(holder)) == 0 {
		return holder
	}
	sum := sha256.Sum256([]byte(holder))
	return "h-" + hex.EncodeToString(sum[:15])
}

// Unlabelled selects the objects without vmipam's holder label: those no
// replica looks after yet (they bypassed the webhook, or vmipam does not
// manage them).
func Unlabelled() (labels.Selector, error) {
	none, err := labels.NewRequirement(vmipamv1.HolderLabel, selection.DoesNotExist, nil)
	if err != nil {
		return nil, fmt.Errorf("select unlabelled objects: %w", err)
	}
	return labels.NewSelector().Add(*none), nil
}

// HolderLabel is the holder label value of this replica: the objects
// labelled with it are the ones it looks after.
func (r *Registry) HolderLabel() string { return r.holderLabel }

// relabel moves vmipam's holder label to this replica on the objects of
// objs whose address this replica's allocator of p holds allocated to
// them: taken over from a replica that left, adopted, or labelled
// otherwise by hand. Until then no replica's watch delivers them, and a
// deletion waits for its finalizer. The patch carries the object's UID,
// so a new object of the same name is left alone.
func (r *Registry) relabel(ctx context.Context, p *Pool, objs []labelled) {
	var todo []labelled
	seen := map[types.UID]bool{} // an object of two addresses comes twice
	for _, o := range objs {
		if st, owner, _ := p.Lookup(o.addr); st == ipam.StateAllocated && owner.UID == string(o.uid) && !seen[o.uid] {
			seen[o.uid] = true
			todo = append(todo, o)
		}
	}
	if len(todo) == 0 {
		return
	}
	log := logf.FromContext(ctx)
	mine := r.HolderLabel()
	moved := 0
	for round := 1; ; round++ {
		failed := r.patchHolders(ctx, todo, mine)
		moved += len(todo) - len(failed)
		if len(failed) == 0 || round == relabelRounds || ctx.Err() != nil {
			// What is left is tried again by the next resync.
			log.Info("Moved the holder label to this replica", "pool", p.name, "objects", moved, "failed", len(failed))
			return
		}
		todo = failed
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(round) * time.Second):
		}
	}
}

// patchHolders sets the holder label of objs to value, relabelWorkers at a
// time, and returns those whose patch failed.
func (r *Registry) patchHolders(ctx context.Context, objs []labelled, value string) []labelled {
	work := make(chan labelled)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failed []labelled
	for range min(relabelWorkers, len(objs)) {
		wg.Go(func() {
			for o := range work {
				if err := r.patchHolder(ctx, o, value); err != nil {
					logf.FromContext(ctx).V(1).Info("Moving the holder label", "object", o.key.String(), "error", err.Error())
					mu.Lock()
					failed = append(failed, o)
					mu.Unlock()
				}
			}
		})
	}
	for _, o := range objs {
		work <- o
	}
	close(work)
	wg.Wait()
	return failed
}

// patchHolder sets the holder label of the object key with UID uid.
func (r *Registry) patchHolder(ctx context.Context, o labelled, value string) error {
	_, err := r.writeHolderLabel(ctx, o.gvk, o.key, o.uid, "", value)
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Gone, or another object by that name now.
		return nil
	}
	if err != nil {
		return fmt.Errorf("label %s with %s=%s: %w", o.key, vmipamv1.HolderLabel, value, err)
	}
	return nil
}

// LabelHolder puts this replica's holder label on obj, whose address it
// looks after, if obj lacks it (an object that bypassed the webhook, or
// whose label was changed), locked to obj's resourceVersion; obj takes
// the resourceVersion the write made. It reports whether it wrote.
func (r *Registry) LabelHolder(ctx context.Context, obj *unstructured.Unstructured) (bool, error) {
	if !kinds.SetHolder(obj, r.HolderLabel()) {
		return false, nil
	}
	rv, err := r.writeHolderLabel(ctx, obj.GroupVersionKind(), client.ObjectKeyFromObject(obj), obj.GetUID(), obj.GetResourceVersion(), r.HolderLabel())
	if err != nil {
		return false, err
	}
	obj.SetResourceVersion(rv)
	return true, nil
}

// writeHolderLabel is the one writer of vmipam's holder label: it sets
// the label of the object of kind gvk at key to value, with a merge patch
// (kinds.PatchMetadata) that carries the object's UID (a new object of the
// same name is left alone) and, if set, the resourceVersion it is locked
// to. It returns the resourceVersion the write made.
func (r *Registry) writeHolderLabel(ctx context.Context, gvk schema.GroupVersionKind, key client.ObjectKey, uid types.UID, resourceVersion, value string) (string, error) {
	fields := map[string]any{"uid": uid, "labels": map[string]string{vmipamv1.HolderLabel: value}}
	if resourceVersion != "" {
		fields["resourceVersion"] = resourceVersion
	}
	return kinds.PatchMetadata(ctx, r.opts.Client, gvk, key, fields)
}
