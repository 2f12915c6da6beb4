// Package controller holds vmipam's controllers: the garbage collector that
// binds reservations to stored objects, releases addresses into cooldown
// when objects are deleted, and repairs objects that bypassed the webhook;
// and the IPPool controller that keeps an allocator per pool.
package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
)

// The kinds' own RBAC comes from the kinds configuration (vmipam
// manifests), not from markers.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// AddressGC is the garbage collector of addresses on the objects of one
// configured kind: it binds, releases into cooldown and repairs them.
type AddressGC struct {
	// Client writes; it also reads unless Reader is set.
	Client client.Client
	// Reader reads the objects reconciled: the caches the controller's own
	// watches fill, so that a reconcile costs no request.
	// Reads from it may lag the API server, which is safe here: a key is
	// never reconciled concurrently, every write is an optimistically
	// locked patch, and a deletion timestamp never goes away.
	Reader Getter
	// Own and Unlabeled, if set, are the caches of the objects labelled for
	// this replica and of those with no holder label (see
	// vmipamv1.HolderLabel), which the controller watches; without Own it
	// watches the manager's cache.
	Own, Unlabeled cache.Cache
	// APIReader reads from the API server, for the rare read that must
	// not lag: whether an object whose address was released already still
	// waits for its finalizer's removal. Nil reads through Client.
	APIReader client.Reader
	Registry  *pools.Registry
	Kind      kinds.Kind
	Recorder  events.EventRecorder
	// Clock defaults to the system clock; it tells an object's age.
	Clock ipam.Clock
	// MaxConcurrentReconciles defaults to 16: a reconcile mostly waits for
	// its finalizer patch, so more in flight keep mass deletions moving,
	// and the releases that must be flushed share their pool's flush.
	MaxConcurrentReconciles int

	// gone holds, by key, the objects seen deleted from the watch while
	// their address was still allocated to them here (see noteGone), for
	// their next reconcile.
	gone sync.Map
}

// finalized reports whether obj, as the API server has it now, is gone or
// no longer carries vmipam's finalizer.
func (r *AddressGC) finalized(ctx context.Context, obj client.Object) (bool, error) {
	cur := r.Kind.New()
	if err := readerOr(r.APIReader, r.Client).Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("read %s again: %w", client.ObjectKeyFromObject(obj), err)
	}
	return cur.GetUID() != obj.GetUID() || !controllerutil.ContainsFinalizer(cur, vmipamv1.Finalizer), nil
}

// Getter reads one object; a client.Reader is one.
type Getter interface {
	Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error
}

// readerOr returns reader, or c when reader is not set.
func readerOr(reader Getter, c client.Client) Getter {
	if reader == nil {
		return c
	}
	return reader
}

// SetupWithManager registers the reconciler, on every replica.
func (r *AddressGC) SetupWithManager(mgr ctrl.Manager) error {
	n := r.MaxConcurrentReconciles
	if n == 0 {
		n = 16
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named(Name(r.Kind)).
		// Every replica runs it: each looks after the objects whose
		// addresses it holds.
		WithOptions(crcontroller.Options{MaxConcurrentReconciles: n, NeedLeaderElection: ptr.To(false)})
	switch {
	case r.Own != nil && r.Kind.MetadataSuffices():
		// The objects vmipam stamped, as metadata: Reader rebuilds them.
		b = b.WatchesRawSource(source.Kind(r.Own, r.Kind.NewMetadata(), &bindOnCreate{bind: r.bindCreated, gone: r.noteGone}))
	case r.Own != nil:
		b = b.WatchesRawSource(source.Kind(r.Own, r.Kind.New(), &handler.TypedEnqueueRequestForObject[*unstructured.Unstructured]{}))
	default:
		b = b.For(r.Kind.New())
	}
	if r.Unlabeled != nil {
		b = b.WatchesRawSource(source.Kind(r.Unlabeled, r.Kind.New(), &handler.TypedEnqueueRequestForObject[*unstructured.Unstructured]{},
			predicate.NewTypedPredicateFuncs(func(obj *unstructured.Unstructured) bool { return !r.unmanaged(obj) })))
	}
	return b.Complete(r)
}

// unmanaged reports whether obj, an object without vmipam's holder label,
// is plainly not vmipam's, so that its reconcile would do nothing and its
// events can stay out of the queue: vmipam never stamped it (no token,
// no pool annotation, no finalizer), and either every address it carries
// is outside the pools (pools.Registry.Covers), or it carries none and
// its kind's condition leaves it out. In a cluster where vmipam looks
// after some of a kind's objects, these are all the others: every
// replica reads each of their events, and until this filter it
// reconciled each (a read of the cache, a deep copy, the pools' lookups).
//
// Where a reconcile would do something (an address that does not parse,
// an object vmipam stamped, one in a pool or without an address), the
// event goes to the queue as before. An event left out for an address a
// pool being added covers is not lost: that pool's recovery reads the
// cache, which holds the object, after Covers counts the pool.
func (r *AddressGC) unmanaged(obj *unstructured.Unstructured) bool {
	ann := obj.GetAnnotations()
	if ann[vmipamv1.TokenAnnotation] != "" || ann[vmipamv1.PoolAnnotation] != "" || controllerutil.ContainsFinalizer(obj, vmipamv1.Finalizer) {
		return false
	}
	addrs, err := r.addresses(obj)
	switch {
	case err != nil:
		return false
	case len(addrs) > 0:
		return !r.Registry.Covers(addrs...)
	}
	return obj.GetDeletionTimestamp() == nil && !r.Kind.InScope(obj)
}

// bindOnCreate enqueues every event of the objects it watches, as
// controller-runtime's handler for an object does, but for the create of
// an object whose reservation bind settles at once (bindCreated): the
// create of every VM, which then costs no trip through the work queue and
// no reconcile. An object that leaves the watch is told to gone first
// (noteGone).
type bindOnCreate struct {
	handler.TypedEnqueueRequestForObject[*metav1.PartialObjectMetadata]
	bind func(*metav1.PartialObjectMetadata) bool
	// gone hears of every object that leaves the watch.
	gone func(*metav1.PartialObjectMetadata)
}

// Create implements handler.TypedEventHandler.
func (h *bindOnCreate) Create(ctx context.Context, e event.TypedCreateEvent[*metav1.PartialObjectMetadata], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	// The initial list after a start is left to the reconciles: recovery
	// settled what it holds.
	if !e.IsInInitialList && e.Object != nil && h.bind(e.Object) {
		return
	}
	h.TypedEnqueueRequestForObject.Create(ctx, e, q)
}

// Delete implements handler.TypedEventHandler.
func (h *bindOnCreate) Delete(ctx context.Context, e event.TypedDeleteEvent[*metav1.PartialObjectMetadata], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	if e.Object != nil {
		h.gone(e.Object)
	}
	h.TypedEnqueueRequestForObject.Delete(ctx, e, q)
}

// goneObject is an object that left this replica's watch while its
// addresses were allocated to it in pool.
type goneObject struct {
	meta  *metav1.PartialObjectMetadata
	pool  *pools.Pool
	addrs []netip.Addr
}

// noteGone remembers m, which left the watch of this replica's objects,
// for its reconcile if an address it carries is still allocated to it:
// its finalizer was removed by someone else, so the controller never
// released it (or it was relabelled, or its label removed, which a
// filtered watch reports as a deletion too; the reconcile asks the API
// server which). Without this the address would wait for the next resync.
// An object deleted the usual way had its addresses released already.
func (r *AddressGC) noteGone(m *metav1.PartialObjectMetadata) {
	pool := r.Registry.Get(m.Annotations[vmipamv1.PoolAnnotation])
	if pool == nil {
		return
	}
	var addrs []netip.Addr
	stamped, _ := stampedAddrs(m)
	for _, a := range stamped {
		if st, o, _ := pool.Lookup(a); st == ipam.StateAllocated && o.UID == string(m.UID) {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) > 0 {
		r.gone.Store(types.NamespacedName{Namespace: m.Namespace, Name: m.Name}, goneObject{meta: m, pool: pool, addrs: addrs})
	}
}

// releaseGone releases the addresses of the object noteGone remembered
// under key, if the API server confirms that it is gone (or that key now
// names another object): into their cooldown, recorded in the address
// history as vanished, as a resync would. An object still there (moved
// to another replica's watch by its label) keeps them.
func (r *AddressGC) releaseGone(ctx context.Context, key types.NamespacedName) error {
	v, ok := r.gone.LoadAndDelete(key)
	if !ok {
		return nil
	}
	g := v.(goneObject)
	if gone, err := r.goneFromAPI(ctx, key, g.meta.UID); err != nil {
		r.gone.LoadOrStore(key, g)
		return err
	} else if !gone {
		return nil
	}
	log := logf.FromContext(ctx)
	owner := ipam.Owner{UID: string(g.meta.UID), Ref: pools.Ref(key.Namespace, key.Name)}
	var recs []vmipamv1.AddressRecord
	for _, a := range g.addrs {
		if err := g.pool.Release(ctx, a, owner); err != nil {
			// The resync releases it, or reports who holds it now.
			log.Info("Releasing the address of an object gone without its finalizer's removal", "address", a, "error", err.Error())
			continue
		}
		rec := r.tenure(g.meta, g.pool.Name(), a)
		rec.Ended = vmipamv1.EndedVanished
		recs = append(recs, rec)
	}
	if err := r.Registry.Record(ctx, recs...); err != nil {
		log.Error(err, "Recording the history of addresses whose objects vanished")
	}
	for _, rec := range recs {
		r.Registry.LogReleased(log, rec)
	}
	return nil
}

// goneFromAPI reports whether the API server has no object under key with
// uid.
func (r *AddressGC) goneFromAPI(ctx context.Context, key types.NamespacedName, uid types.UID) (bool, error) {
	cur := r.Kind.NewMetadata()
	if err := readerOr(r.APIReader, r.Client).Get(ctx, key, cur); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("read %s again: %w", key, err)
	}
	return cur.GetUID() != uid, nil
}

// stampedAddrs returns, in their canonical form, the addresses that
// vmipam's address annotation on m records, and false when one of them
// does not parse (those that do are returned all the same).
func stampedAddrs(m *metav1.PartialObjectMetadata) ([]netip.Addr, bool) {
	stamped := kinds.StampedAddresses(m.Annotations[vmipamv1.AddressAnnotation])
	addrs := make([]netip.Addr, 0, len(stamped))
	ok := true
	for _, s := range stamped {
		a, err := netip.ParseAddr(s)
		if err != nil {
			ok = false
			continue
		}
		addrs = append(addrs, ipam.Canonical(a))
	}
	return addrs, ok
}

// bindCreated binds the reservation of m, an object this replica stamped
// and sees stored for the first time, and reports whether that was all
// its reconcile would do: it carries vmipam's stamp, finalizer and this
// replica's holder label, is not being deleted, and its address is
// pending in a ready pool under its token. Anything else (or a bind that
// fails) is left to the reconcile. A reconcile of the same object running
// meanwhile finds the address bound to it, as after its own bind.
func (r *AddressGC) bindCreated(m *metav1.PartialObjectMetadata) bool {
	ann := m.Annotations
	token, poolName := ann[vmipamv1.TokenAnnotation], ann[vmipamv1.PoolAnnotation]
	// The own cache drops the holder label, which all its objects carry
	// (kinds.Kind.TrimOwn).
	if h, ok := m.Labels[vmipamv1.HolderLabel]; m.DeletionTimestamp != nil || token == "" || poolName == "" || ok && h != r.Registry.HolderLabel() ||
		!slices.Contains(m.Finalizers, vmipamv1.Finalizer) {
		return false
	}
	pool := r.Registry.Get(poolName)
	addrs, ok := stampedAddrs(m)
	if pool == nil || !pool.Ready() || !ok || len(addrs) == 0 {
		return false
	}
	for _, a := range addrs {
		if st, o, _ := pool.Lookup(a); st != ipam.StatePending || o.Token != token {
			return false
		}
	}
	owner := ipam.Owner{Token: token, UID: string(m.UID), Ref: pools.Ref(m.Namespace, m.Name)}
	for _, a := range addrs {
		if bound, err := pool.Bind(a, owner); err != nil || bound != a {
			// The reconcile binds what is left.
			return false
		}
	}
	if note := ann[vmipamv1.SingleStackAnnotation]; note != "" && r.Recorder != nil {
		r.Recorder.Eventf(m, nil, corev1.EventTypeNormal, "SingleStack", "Assign", "Got %s only (PreferDualStack): %s", kinds.StampedAddresses(ann[vmipamv1.AddressAnnotation])[0], note)
	}
	for _, a := range addrs {
		r.logAssigned(logf.Log.WithName(Name(r.Kind)), m, pool, a)
	}
	return true
}

// Name names the garbage collector of kind t, in logs and
// metrics: address-gc for vmipam's own kind, address-gc-<resource>.<group>
// for the others.
func Name(t kinds.Kind) string {
	if t.GVR() == kinds.VirtualMachine.GVR() {
		return "address-gc"
	}
	return "address-gc-" + t.Resource + "." + t.GVK.Group
}

// Reconcile binds, releases or repairs the address of one object: it
// reads the object and what the pools know of it (gather), decides what
// to do (decide, pure), and does it (act).
func (r *AddressGC) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if err := r.releaseGone(ctx, req.NamespacedName); err != nil {
		return ctrl.Result{}, err
	}
	obj := r.Kind.New()
	if err := readerOr(r.Reader, r.Client).Get(ctx, req.NamespacedName, obj); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	f, err := r.gather(ctx, obj)
	if err != nil {
		return ctrl.Result{}, err
	}
	do, after := decide(f)
	return r.act(ctx, obj, f, do, after)
}

// gather reads what decide needs to know of obj, in the order decide
// looks at it: nothing it would not look at (a pool selection, a read of
// the address's block) is read.
func (r *AddressGC) gather(ctx context.Context, obj *unstructured.Unstructured) (facts, error) {
	ann := obj.GetAnnotations()
	f := facts{
		deleted:   obj.GetDeletionTimestamp() != nil,
		finalizer: controllerutil.ContainsFinalizer(obj, vmipamv1.Finalizer),
	}
	f.addrs, f.addrErr = r.addresses(obj)
	if f.addrErr != nil {
		return f, nil
	}
	if ann[vmipamv1.TokenAnnotation] == "" && !f.deleted && !f.finalizer && !r.Kind.InScope(obj) {
		f.notOurs = true
		return f, nil
	}
	switch {
	case ann[vmipamv1.PoolAnnotation] != "":
		f.pool = r.Registry.Get(ann[vmipamv1.PoolAnnotation])
	case f.hasAddr():
		f.pool = r.Registry.PoolFor(f.addrs[0])
		f.poolComing = f.pool == nil && r.Registry.Covers(f.addrs[0])
	case !f.deleted:
		if !r.Kind.InScope(obj) {
			f.notOurs = true
			return f, nil
		}
		named, err := r.Kind.Pool(obj)
		if err == nil {
			f.pool, err = r.Registry.Select(ctx, r.Kind, obj.GetNamespace(), named)
		}
		if err != nil {
			f.noPool = err
			// Quietly, and soon, while the object is young: a pool
			// created a moment before it, not seen yet, or one still
			// recovering. Past that, the same refusal may last (a
			// recovery that keeps failing, the holder lease lost in an
			// API server outage), and the object's owner, who may not
			// read IPPools, hears why from the warning.
			f.retry = errors.Is(err, pools.ErrNotReady) && now(r.Clock).Sub(obj.GetCreationTimestamp().Time) < retryGrace
			return f, nil
		}
	}
	if f.pool == nil {
		if f.deleted && f.finalizer {
			f.poolsUnknown = r.Registry.Ready(ctx) != nil
		}
		return f, nil
	}
	if f.poolReady = f.pool.Ready(); !f.poolReady {
		return f, nil
	}
	f.second = len(f.addrs) > 1 && !f.pool.Held(f.addrs[0])
	if f.hasAddr() {
		var err error
		if f.keeper, err = r.Registry.KeeperOf(ctx, f.pool, f.addrs[0], string(obj.GetUID())); err != nil {
			return f, err
		}
	} else if !f.deleted {
		f.chosen = r.Registry.Chosen(string(obj.GetUID()))
	}
	return f, nil
}

// retryGrace is how long after an object's creation a refusal of its
// pool that a retry may end (pools.ErrNotReady) is retried every second
// without a warning.
const retryGrace = time.Minute

// act does what decide chose for obj.
func (r *AddressGC) act(ctx context.Context, obj *unstructured.Unstructured, f facts, do action, after time.Duration) (ctrl.Result, error) {
	owner := ipam.Owner{Token: obj.GetAnnotations()[vmipamv1.TokenAnnotation], UID: string(obj.GetUID()), Ref: pools.Ref(obj.GetNamespace(), obj.GetName())}
	if f.second {
		r.holdSecond(ctx, obj, f.pool, f.addrs[1:], owner)
	}
	switch do {
	case actInvalidAddress:
		r.event(obj, corev1.EventTypeWarning, "InvalidAddress", "Reconcile", "%v", f.addrErr)
	case actNoPool:
		r.event(obj, corev1.EventTypeWarning, "NoPool", "Assign", "%v", f.noPool)
	case actRemoveFinalizer:
		// Rare: its pool is gone, or no replica claims its address.
		why := "no replica claims its address"
		if f.pool == nil {
			why = "its pool is gone"
		}
		log := logf.FromContext(ctx)
		log.Info("Letting an object go with nothing to release", "reason", why, "addresses", f.addrs)
		// Nothing to release, but the object held its addresses until
		// now all the same: its tenures go into the history before it
		// goes, as a release's do.
		pool := obj.GetAnnotations()[vmipamv1.PoolAnnotation]
		if f.pool != nil {
			pool = f.pool.Name()
		}
		recs := make([]vmipamv1.AddressRecord, 0, len(f.addrs))
		for _, a := range f.addrs {
			recs = append(recs, r.tenure(obj, pool, a))
		}
		if err := r.Registry.Record(ctx, recs...); err != nil {
			return ctrl.Result{}, fmt.Errorf("record the tenure of %s: %w", client.ObjectKeyFromObject(obj), err)
		}
		if err := r.removeFinalizer(ctx, obj); err != nil {
			return ctrl.Result{}, err
		}
		for _, rec := range recs {
			r.Registry.LogReleased(log, rec)
		}
		return ctrl.Result{}, nil
	case actRelease:
		return r.release(ctx, obj, f.pool, f.addrs, owner)
	case actAssign:
		return r.assign(ctx, obj, f.pool)
	case actKeep:
		return r.keep(ctx, obj, f.pool, f.addrs, owner)
	}
	return ctrl.Result{RequeueAfter: after}, nil
}

// release returns every address of obj, which is being deleted, into its
// cooldown, then removes the finalizer.
func (r *AddressGC) release(ctx context.Context, obj *unstructured.Unstructured, pool *pools.Pool, addrs []netip.Addr, owner ipam.Owner) (ctrl.Result, error) {
	log := logf.FromContext(ctx)
	if len(addrs) > 0 {
		if st, _, _ := pool.Lookup(addrs[0]); st == ipam.StateCooldown {
			// Released before: the finalizer's removal failed, or the
			// cache has not seen it yet. Only the first releases again,
			// which starts the cooldown again (the object is still
			// there), so ask the API server which. When it cannot say,
			// the object may still be there: release again all the
			// same, which only lengthens the cooldown.
			gone, err := r.finalized(ctx, obj)
			if gone {
				return ctrl.Result{}, nil
			}
			if err != nil {
				log.V(1).Info("Releasing again: the API server cannot say whether the object is gone", "error", err.Error())
			}
		}
	}
	// Every address together, into its cooldown: the object may go
	// only once a crash could no longer free one early; the pool
	// returns when that holds, usually without a write of its own.
	var recs []vmipamv1.AddressRecord
	for _, a := range addrs {
		switch err := pool.Release(ctx, a, owner); {
		case errors.Is(err, ipam.ErrNotReady):
			// The pool's allocator was rebuilt meanwhile: release
			// into the new one.
			return ctrl.Result{RequeueAfter: time.Second}, nil
		case errors.Is(err, ipam.ErrConflict):
			// Someone else holds it: releasing would take it from them.
			r.event(obj, corev1.EventTypeWarning, "ReleaseSkipped", "Release", "%v", err)
		case err != nil:
			return r.retryCooling(ctx, pool, addrs, err)
		default:
			recs = append(recs, r.tenure(obj, pool.Name(), a))
		}
	}
	// The tenures, stored before the finalizer goes: a crash between the
	// two releases and records again, which reads as once.
	if err := r.Registry.Record(ctx, recs...); err != nil {
		return r.retryCooling(ctx, pool, addrs, fmt.Errorf("record the release of %s: %w", client.ObjectKeyFromObject(obj), err))
	}
	if err := r.removeFinalizer(ctx, obj); err != nil {
		return r.retryCooling(ctx, pool, addrs, err)
	}
	// The cooldown runs from the object's going, not from the release:
	// under load the record and the removal take a second or more. Log
	// lines, not Events: an Event per object lifetime would double the
	// API writes of a fleet of short-lived machines.
	for _, rec := range recs {
		a, _ := netip.ParseAddr(rec.Address)
		if until, cooling := pool.Gone(a, owner); cooling {
			r.Registry.LogReleased(log, rec, "coolsDownUntil", until)
		} else {
			r.Registry.LogReleased(log, rec)
		}
	}
	return ctrl.Result{}, nil
}

// minCoolingRetry is the shortest wait of retryCooling.
const minCoolingRetry = 100 * time.Millisecond

// retryCooling is the outcome of a release that failed after it put some
// of addrs into cooldown, with the object still there: the retry must come
// before that cooldown ends, since it releases again and so starts the
// cooldown again, and an address must not be free while an object still
// carries it. The error backoff grows past any cooldown while the API
// server is away, so retryCooling logs err and retries within half of the
// shortest cooldown left; with none left, it returns err to the backoff.
func (r *AddressGC) retryCooling(ctx context.Context, pool *pools.Pool, addrs []netip.Addr, err error) (ctrl.Result, error) {
	if ctx.Err() != nil {
		// Stopping: the next holder of the addresses releases again.
		return ctrl.Result{}, err
	}
	left, cooling := time.Duration(0), false
	for _, a := range addrs {
		if d, ok := pool.CooldownLeft(a); ok && (!cooling || d < left) {
			left, cooling = d, true
		}
	}
	if !cooling {
		return ctrl.Result{}, err
	}
	after := max(left/2, minCoolingRetry)
	logf.FromContext(ctx).Error(err, "Releasing; retrying before the cooldown ends", "retryIn", after)
	return ctrl.Result{RequeueAfter: after}, nil
}

// tenure is the history record of obj's tenure of addr, which its
// deletion ends: from its create to its deletion, both as the API server
// stamped them, so that a release made again records the same.
func (r *AddressGC) tenure(obj metav1.Object, pool string, addr netip.Addr) vmipamv1.AddressRecord {
	rec := vmipamv1.AddressRecord{
		Address: addr.String(), Pool: pool, Kind: KindName(r.Kind),
		Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: string(obj.GetUID()),
		Ended: vmipamv1.EndedAllocated,
	}
	if c := obj.GetCreationTimestamp(); !c.IsZero() {
		rec.From = &c
	}
	if d := obj.GetDeletionTimestamp(); d != nil {
		rec.To = *d
	} else {
		rec.To = metav1.Now()
	}
	return rec
}

// KindName names kind t in the address history and logs: Kind.group, as
// VirtualMachine.vmipam.io.
func KindName(t kinds.Kind) string { return t.GVK.Kind + "." + t.GVK.Group }

// keep makes the addresses obj carries its own: the finalizer, then each
// address bound or adopted, in order.
func (r *AddressGC) keep(ctx context.Context, obj *unstructured.Unstructured, pool *pools.Pool, addrs []netip.Addr, owner ipam.Owner) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(obj, vmipamv1.Finalizer) {
		controllerutil.AddFinalizer(obj, vmipamv1.Finalizer)
		if err := r.patchFinalizers(ctx, obj); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}
	for i, a := range addrs {
		res, done, err := r.hold(ctx, obj, pool, a, owner)
		if !done || err != nil || i == len(addrs)-1 {
			return res, err
		}
	}
	return ctrl.Result{}, nil
}

// holdSecond looks after the addresses of obj after its first that this
// replica holds while another replica holds the first (the object bypassed
// the webhook, or a takeover moved one family only): it adopts them, so
// that it does not hand them out again, and releases them once the object
// goes; the holder of the first looks after the rest, and the finalizer.
// Its resync does the same for the objects whose events it does not see.
func (r *AddressGC) holdSecond(ctx context.Context, obj *unstructured.Unstructured, pool *pools.Pool, addrs []netip.Addr, owner ipam.Owner) {
	for _, a := range addrs {
		if !pool.Held(a) {
			continue
		}
		var err error
		switch st, o, _ := pool.Lookup(a); {
		case obj.GetDeletionTimestamp() != nil:
			if controllerutil.ContainsFinalizer(obj, vmipamv1.Finalizer) {
				err = pool.Release(ctx, a, owner)
			}
		case st != ipam.StateAllocated || o.UID != owner.UID:
			err = pool.Adopt(ctx, a, owner)
		}
		if err != nil {
			logf.FromContext(ctx).V(1).Info("Holding an address of an object another replica looks after", "address", a, "pool", pool.Name(), "error", err.Error())
		}
	}
}

// hold makes addr allocated to obj, which carries it: bound under its
// token, or adopted. done reports that it is, so that the object's next
// address may be looked at.
func (r *AddressGC) hold(ctx context.Context, obj *unstructured.Unstructured, pool *pools.Pool, addr netip.Addr, owner ipam.Owner) (ctrl.Result, bool, error) {
	log := logf.FromContext(ctx)
	if st, o, _ := pool.Lookup(addr); st == ipam.StateAllocated && o.UID == owner.UID {
		return ctrl.Result{}, true, r.settle(ctx, obj, pool, addr)
	}
	if owner.Token != "" {
		if _, err := pool.Bind(addr, owner); err == nil {
			r.logAssigned(log, obj, pool, addr)
			return ctrl.Result{}, true, r.settle(ctx, obj, pool, addr)
		} else if errors.Is(err, ipam.ErrNotReady) {
			return ctrl.Result{RequeueAfter: time.Second}, false, nil
		} else if errors.Is(err, ipam.ErrConflict) {
			// The token is bound to another object: this one carries a
			// copy of its stamp. It must not inherit the reservation.
			owner.Token = ""
		}
	}
	switch err := pool.Adopt(ctx, addr, owner); {
	case err == nil:
		// Rare (an object that bypassed the webhook, or a lost
		// reservation), so worth an Event.
		r.event(obj, corev1.EventTypeNormal, "AddressAdopted", "Assign", "Adopted %s into IPPool %s", addr, pool.Name())
		r.logAssigned(log, obj, pool, addr)
		return ctrl.Result{}, true, r.settle(ctx, obj, pool, addr)
	case errors.Is(err, ipam.ErrNotReady):
		// The pool's allocator was rebuilt meanwhile.
		return ctrl.Result{RequeueAfter: time.Second}, false, nil
	case errors.Is(err, ipam.ErrConflict):
		log.Error(err, "Duplicate address", "address", addr, "pool", pool.Name())
		pool.NoteConflict(err)
		r.event(obj, corev1.EventTypeWarning, "DuplicateAddress", "Assign", "%v", err)
	case errors.Is(err, ipam.ErrInUse), errors.Is(err, ipam.ErrCoolingDown):
		// Another replica claimed it meanwhile: it adopts the object.
		return ctrl.Result{RequeueAfter: time.Minute}, false, nil
	case errors.Is(err, ipam.ErrNoAnswer):
		// Another replica claims it and did not answer, or is gone and
		// its claims are taken over within the lease duration: look again
		// soon, the takeover may adopt the object meanwhile.
		return ctrl.Result{RequeueAfter: 5 * time.Second}, false, nil
	default:
		r.event(obj, corev1.EventTypeWarning, "AddressNotManaged", "Assign", "%v", err)
	}
	// Reported: nothing more to do for this address.
	return ctrl.Result{}, true, nil
}

// assign gives an address to an object that has none: it was created while
// the webhook was bypassed. The token derives from the UID, so a retry after
// a failed patch reserves the same address again.
func (r *AddressGC) assign(ctx context.Context, obj *unstructured.Unstructured, pool *pools.Pool) (ctrl.Result, error) {
	token := "uid-" + string(obj.GetUID())
	res := ipam.Reservation{Token: token, Namespace: obj.GetNamespace(), Ref: pools.Ref(obj.GetNamespace(), obj.GetName())}
	// The families it asks for, planned as the webhook would have, but
	// leniently: the object is stored already.
	var ask pools.Ask
	if p := r.Kind.FamilyPolicyField; len(p) > 0 {
		ask.Policy, _, _ = unstructured.NestedString(obj.Object, p...)
	}
	if p := r.Kind.FamiliesField; len(p) > 0 {
		ask.Families, _, _ = unstructured.NestedStringSlice(obj.Object, p...)
	}
	plan, _ := pools.PlanFamilies(r.Kind, ask, pool, false)
	got, err := pool.Assign(ctx, res, plan)
	var paused *pools.PausedError
	if errors.As(err, &paused) {
		// No address from a paused pool, for this object either: it waits
		// for the pool to be unpaused, or for its pool field to change.
		r.event(obj, corev1.EventTypeWarning, "PoolPaused", "Assign", "%v", err)
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	}
	if err != nil {
		r.event(obj, corev1.EventTypeWarning, "NoAddress", "Assign", "%v", err)
		if errors.Is(err, ipam.ErrExhausted) {
			return ctrl.Result{RequeueAfter: 30 * time.Second}, nil
		}
		return ctrl.Result{}, fmt.Errorf("allocate for %s: %w", client.ObjectKeyFromObject(obj), err)
	}
	addrs := got.Addrs
	strs := make([]string, len(addrs))
	for i, a := range addrs {
		strs[i] = a.String()
	}
	base := obj.DeepCopy()
	if err := r.Kind.Stamp(obj, kinds.Stamp{Addrs: strs, Pool: pool.Name(), Token: token, Holder: r.Registry.HolderLabel(), Network: pool.Network(addrs...)}); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.Client.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
		}
		return ctrl.Result{}, fmt.Errorf("stamp address: %w", err)
	}
	return ctrl.Result{}, nil
}

// settle finishes an object whose address this replica holds allocated to
// it: its holder label, and for a kind whose address goes into status, the
// status fields. Those are filled as soon as the address is bound, before
// the kind's own controller may fill them another way (NeonVM allocates an
// address of its own when status.extraNetIP is empty).
func (r *AddressGC) settle(ctx context.Context, obj *unstructured.Unstructured, pool *pools.Pool, addr netip.Addr) error {
	if err := r.label(ctx, obj); err != nil {
		return err
	}
	sub, _ := pool.Subnet(addr)
	fill := r.Kind.StatusFill(obj, addr, sub.Prefix)
	if fill == nil {
		return nil
	}
	raw, err := json.Marshal(map[string]any{"status": fill["status"]})
	if err != nil {
		return fmt.Errorf("encode the status fill: %w", err)
	}
	err = r.Client.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, raw))
	if apierrors.IsNotFound(err) {
		// Gone, or its kind has no status subresource: then the kind's
		// consumer reads an address vmipam cannot fill, and must be told.
		if gone, ferr := r.finalized(ctx, obj); ferr != nil || gone {
			return ferr
		}
		r.event(obj, corev1.EventTypeWarning, "NoStatusSubresource", "FillStatus",
			"%s has no status subresource: vmipam cannot fill %s; configure the address elsewhere, or give the CRD a status subresource",
			r.Kind.GVR().GroupResource(), strings.Join(r.Kind.Status.Address, "."))
		return fmt.Errorf("fill %s: %s has no status subresource: %w", strings.Join(r.Kind.Status.Address, "."), r.Kind.GVR().GroupResource(), err)
	}
	if err != nil {
		return fmt.Errorf("fill %s: %w", strings.Join(r.Kind.Status.Address, "."), err)
	}
	return nil
}

// label puts this replica's holder label on obj, whose address it looks
// after, if obj lacks it: an object that bypassed the webhook, labelled
// before vmipam had replicas, or whose label was changed. Without it, a
// change of the object reaches this replica only while no replica's label
// is on it.
func (r *AddressGC) label(ctx context.Context, obj *unstructured.Unstructured) error {
	if _, err := r.Registry.LabelHolder(ctx, obj); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("set the holder label: %w", err))
	}
	return nil
}

func (r *AddressGC) removeFinalizer(ctx context.Context, obj *unstructured.Unstructured) error {
	controllerutil.RemoveFinalizer(obj, vmipamv1.Finalizer)
	if err := r.patchFinalizers(ctx, obj); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("remove finalizer: %w", err))
	}
	return nil
}

// patchFinalizers writes obj's finalizers, locked to its resourceVersion
// (see kinds.PatchMetadata); obj takes the resourceVersion the write made,
// so that a later patch in the same reconcile is locked to it.
func (r *AddressGC) patchFinalizers(ctx context.Context, obj *unstructured.Unstructured) error {
	rv, err := kinds.PatchMetadata(ctx, r.Client, r.Kind.GVK, client.ObjectKeyFromObject(obj),
		map[string]any{"finalizers": obj.GetFinalizers(), "resourceVersion": obj.GetResourceVersion()})
	if err != nil {
		return err
	}
	obj.SetResourceVersion(rv)
	return nil
}

// addresses returns the addresses obj carries: at most one per family,
// the first the one whose holder looks after the object.
func (r *AddressGC) addresses(obj *unstructured.Unstructured) ([]netip.Addr, error) {
	ss, err := r.Kind.Addresses(obj)
	if err != nil || len(ss) == 0 {
		return nil, err
	}
	var out []netip.Addr
	for i, s := range ss[:min(len(ss), 2)] {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %q is not an IP address", r.Kind.AddressesPath(), ss[i])
		}
		// However the object spells it (it may have bypassed the webhook),
		// it holds this address.
		a = ipam.Canonical(a)
		if len(out) == 1 && out[0].Is4() == a.Is4() {
			return nil, fmt.Errorf("%s holds two addresses of one family (%s, %s): vmipam looks after one per family", r.Kind.AddressesPath(), out[0], a)
		}
		out = append(out, a)
	}
	return out, nil
}

// logAssigned writes the info line of addr's assignment to obj (see
// pools.Registry.LogAssigned).
func (r *AddressGC) logAssigned(log logr.Logger, obj metav1.Object, pool *pools.Pool, addr netip.Addr) {
	rec := vmipamv1.AddressRecord{Address: addr.String(), Pool: pool.Name(), Kind: KindName(r.Kind),
		Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: string(obj.GetUID())}
	r.Registry.LogAssigned(log, rec)
}

func (r *AddressGC) event(obj *unstructured.Unstructured, typ, reason, action, note string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(obj, nil, typ, reason, action, note, args...)
	}
}
