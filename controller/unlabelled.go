package controller

import (
	"context"
	"hash/maphash"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// The objects with no holder label are watched as metadata (see
// AddressGC.Unlabeled): most are objects vmipam does not manage (out of
// the kind's scope, or with an address outside every pool), and the rest
// bypassed the webhook. Reading one whole costs a request, so the
// controller remembers, by UID, each such object it found nothing to do
// for (a settled object) and the metadata it had then; an event whose
// metadata shows no change that could alter that is not reconciled.
//
// What could alter it: the object's spec (its generation), the labels or
// annotations vmipam may read (kinds.Kind.Reads: the kind's condition and
// pool annotation), or any of vmipam's marks on it. Its deletion alone
// cannot: it bumps the generation by one, and vmipam has nothing to
// release for an object it does not manage. A pool created later around
// such an object's address is for the resync, which lists the unlabelled
// objects whole, to find, as it was before.

// settled is what the controller remembers of an object it found nothing
// to do for.
type settled struct {
	generation int64
	print      uint64
	deleting   bool
}

// printSeed seeds the hash of labels and annotations for this process.
var printSeed = maphash.MakeSeed()

// metaPrint hashes the labels and annotations of m that vmipam may read
// (kinds.Kind.Reads, which the unlabelled cache keeps), whatever their
// order.
func (r *AddressGC) metaPrint(m metav1.Object) uint64 {
	var h uint64
	for i, kv := range [2]map[string]string{m.GetLabels(), m.GetAnnotations()} {
		for k, v := range kv {
			if !r.Kind.Reads(k) {
				continue
			}
			var mh maphash.Hash
			mh.SetSeed(printSeed)
			_ = mh.WriteByte(byte(i))
			_, _ = mh.WriteString(k)
			_ = mh.WriteByte(0)
			_, _ = mh.WriteString(v)
			// Summing each entry's hash keeps the result independent of
			// the maps' order.
			h += mh.Sum64()
		}
	}
	return h
}

// marked reports whether m carries a mark of vmipam's: its holder label,
// finalizer, or one of the annotations it stamps.
func marked(m metav1.Object) bool {
	ann := m.GetAnnotations()
	return m.GetLabels()[vmipamv1.HolderLabel] != "" || slices.Contains(m.GetFinalizers(), vmipamv1.Finalizer) ||
		ann[vmipamv1.TokenAnnotation] != "" || ann[vmipamv1.PoolAnnotation] != "" || ann[vmipamv1.AddressAnnotation] != ""
}

// unchanged reports whether m, an unlabelled object's metadata from the
// watch, is still settled: nothing the controller found for it can have
// changed. It remembers a deletion that changed nothing else.
func (r *AddressGC) unchanged(m *metav1.PartialObjectMetadata) bool {
	v, ok := r.settled.Load(m.UID)
	if !ok || marked(m) {
		return false
	}
	s := v.(settled)
	if s.print != r.metaPrint(m) {
		return false
	}
	deleting := m.DeletionTimestamp != nil
	switch {
	case m.Generation == s.generation && deleting == s.deleting:
		return true
	case deleting && !s.deleting && m.Generation == s.generation+1:
		// Its deletion, and nothing else.
		s.generation, s.deleting = m.Generation, true
		r.settled.Store(m.UID, s)
		return true
	}
	return false
}

// noteSettled remembers obj, read whole, if it carries no holder label and
// the controller found nothing to do for it that anything but a change to
// it could alter; else it forgets it.
func (r *AddressGC) noteSettled(ctx context.Context, obj *unstructured.Unstructured, f facts, do action, after time.Duration) {
	if obj.GetLabels()[vmipamv1.HolderLabel] != "" {
		// Watched as this replica's own: never remembered.
		return
	}
	quiet := !marked(obj) && after == 0 && (do == actInvalidAddress || do == actWait && (f.notOurs || f.pool == nil))
	// An address outside every known pool is outside every pool only
	// once every pool is known.
	if quiet && !f.notOurs && do != actInvalidAddress && r.Registry.Ready(ctx) != nil {
		quiet = false
	}
	if !quiet {
		r.settled.Delete(obj.GetUID())
		return
	}
	r.settled.Store(obj.GetUID(), settled{generation: obj.GetGeneration(), print: r.metaPrint(obj), deleting: obj.GetDeletionTimestamp() != nil})
}

// skipSettled enqueues the events of the unlabelled objects, as
// controller-runtime's handler for an object does, but for those of a
// settled object that changed nothing that matters (AddressGC.unchanged),
// and forgets an object that leaves the watch.
type skipSettled struct {
	handler.TypedEnqueueRequestForObject[*metav1.PartialObjectMetadata]
	r *AddressGC
}

// Create implements handler.TypedEventHandler.
func (h *skipSettled) Create(ctx context.Context, e event.TypedCreateEvent[*metav1.PartialObjectMetadata], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if e.Object != nil && h.r.unchanged(e.Object) {
		return
	}
	h.TypedEnqueueRequestForObject.Create(ctx, e, q)
}

// Update implements handler.TypedEventHandler.
func (h *skipSettled) Update(ctx context.Context, e event.TypedUpdateEvent[*metav1.PartialObjectMetadata], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if e.ObjectNew != nil && h.r.unchanged(e.ObjectNew) {
		return
	}
	h.TypedEnqueueRequestForObject.Update(ctx, e, q)
}

// Delete implements handler.TypedEventHandler.
func (h *skipSettled) Delete(ctx context.Context, e event.TypedDeleteEvent[*metav1.PartialObjectMetadata], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if e.Object != nil {
		h.r.settled.Delete(e.Object.UID)
	}
	h.TypedEnqueueRequestForObject.Delete(ctx, e, q)
}

var _ handler.TypedEventHandler[*metav1.PartialObjectMetadata, reconcile.Request] = &skipSettled{}
