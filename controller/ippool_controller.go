package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/pools"
)

// +kubebuilder:rbac:groups=vmipam.io,resources=ippools,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=vmipam.io,resources=ippools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=vmipam.io,resources=ipblocks,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=vmipam.io,resources=ipblockshares,verbs=get;list;watch;create;update;delete;deletecollection
// +kubebuilder:rbac:groups=vmipam.io,resources=ippools/finalizers,verbs=update

// maxNamedHolders bounds the objects an event about a pool being deleted
// names.
const maxNamedHolders = 5

// IPPoolReconciler keeps an allocator in the Registry for every IPPool, at
// the pool's current generation, and protects a pool being deleted: it
// keeps the pool (its finalizer) until no object holds or waits for one of
// its addresses and its last cooldown has ended, so that deleting a pool
// strands no VirtualMachine and a pool created again over the same ranges
// cannot hand out an address inside its cooldown.
type IPPoolReconciler struct {
	Client client.Client
	// APIReader lists a released pool's IPBlocks from the API server, so
	// that no informer holds them all.
	APIReader client.Reader
	Registry  *pools.Registry
	Recorder  events.EventRecorder
	// Clock defaults to the system clock; the cooldown wait reads it.
	Clock ipam.Clock
}

// SetupWithManager registers the reconciler. Every replica runs it, since
// every replica serves the webhook from its own allocators.
func (r *IPPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	needLeader := false
	return ctrl.NewControllerManagedBy(mgr).
		For(&vmipamv1.IPPool{}, builder.WithPredicates(predicate.Or[client.Object](
			predicate.GenerationChangedPredicate{},
			predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
				// Deletion and finalizer changes, not status writes.
				return e.ObjectOld.GetDeletionTimestamp().IsZero() != e.ObjectNew.GetDeletionTimestamp().IsZero() ||
					len(e.ObjectOld.GetFinalizers()) != len(e.ObjectNew.GetFinalizers())
			}},
		))).
		Named("ippool-allocators").
		WithOptions(crcontroller.Options{NeedLeaderElection: &needLeader}).
		Complete(r)
}

// Reconcile builds, rebuilds or drops the pool's allocator.
func (r *IPPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pool := &vmipamv1.IPPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return ctrl.Result{}, r.Registry.Remove(ctx, req.Name)
		}
		return ctrl.Result{}, err
	}
	if pool.DeletionTimestamp != nil {
		return r.deleting(ctx, pool)
	}
	if !controllerutil.ContainsFinalizer(pool, vmipamv1.PoolFinalizer) {
		base := pool.DeepCopy()
		controllerutil.AddFinalizer(pool, vmipamv1.PoolFinalizer)
		if err := r.Client.Patch(ctx, pool, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); apierrors.IsConflict(err) {
			// Every replica adds it at once and all but one lose; the
			// newer version's event brings the pool back here.
			return ctrl.Result{}, nil
		} else if err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer to IPPool %s: %w", pool.Name, err)
		}
	}
	if err := r.Registry.Ensure(ctx, pool); err != nil {
		if ctx.Err() == nil {
			r.notReady(ctx, pool, err)
		}
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// notReady shows on the pool why this replica cannot serve it: Ready=False
// with InvalidSpec (a spec that bypassed the webhook, or one this version
// cannot apply) or RecoveryFailed, and the error. Once the allocator
// recovers, the pool's status writer sets Ready=True again.
func (r *IPPoolReconciler) notReady(ctx context.Context, pool *vmipamv1.IPPool, cause error) {
	reason := "RecoveryFailed"
	if errors.Is(cause, ipam.ErrInvalid) {
		reason = "InvalidSpec"
	}
	msg := fmt.Sprintf("replica %s: %v", r.Registry.Holder(), cause)
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	if c := meta.FindStatusCondition(pool.Status.Conditions, vmipamv1.ConditionReady); c != nil &&
		c.Status == metav1.ConditionFalse && c.Reason == reason && c.Message == msg && c.ObservedGeneration == pool.Generation {
		return
	}
	base := pool.DeepCopy()
	meta.SetStatusCondition(&pool.Status.Conditions, metav1.Condition{
		Type: vmipamv1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: msg, ObservedGeneration: pool.Generation,
	})
	if err := r.Client.Status().Patch(ctx, pool, client.MergeFrom(base)); err != nil {
		logf.FromContext(ctx).Error(err, "Setting Ready=False on IPPool", "ippool", pool.Name, "cause", cause.Error())
	}
	if r.Recorder != nil {
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, reason, "Recover", "%s", msg)
	}
}

// deleting waits, for a pool being deleted, until nothing holds or waits
// for its addresses, then lets it go.
func (r *IPPoolReconciler) deleting(ctx context.Context, pool *vmipamv1.IPPool) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(pool, vmipamv1.PoolFinalizer) {
		return ctrl.Result{}, r.Registry.Remove(ctx, pool.Name)
	}
	// Keep serving releases, but hand out nothing new. A spec the
	// allocator cannot build (it bypassed the webhook) must not keep the
	// pool forever: it is judged by the objects stamped with it alone.
	if err := r.Registry.Ensure(ctx, pool); errors.Is(err, ipam.ErrInvalid) {
		logf.FromContext(ctx).Error(err, "Releasing a deleted IPPool whose spec vmipam cannot serve", "ippool", pool.Name)
	} else if err != nil {
		return ctrl.Result{}, err
	}
	holders, err := r.Registry.Occupants(ctx, pool.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(holders) > 0 {
		names := make([]string, 0, maxNamedHolders)
		for _, h := range holders[:min(len(holders), maxNamedHolders)] {
			names = append(names, pools.Ref(h.Namespace, h.Name))
		}
		more := ""
		if len(holders) > maxNamedHolders {
			more = fmt.Sprintf(" and %d more", len(holders)-maxNamedHolders)
		}
		r.event(pool, corev1.EventTypeNormal, "WaitingForHolders",
			"Waiting for %d objects holding addresses of this pool to be deleted: %s%s", len(holders), strings.Join(names, ", "), more)
		return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
	}
	p := r.Registry.Get(pool.Name)
	if p != nil {
		c := p.Snapshot()
		if c.Pending > 0 || c.Cooldown > 0 || c.Allocated > 0 {
			until := ""
			wait := 10 * time.Second
			if next := p.Settles(); !next.IsZero() {
				until = " (the last ends at " + next.UTC().Format(time.RFC3339) + ")"
				wait = min(max(next.Sub(now(r.Clock)), time.Second), wait)
			}
			r.event(pool, corev1.EventTypeNormal, "WaitingForCooldown",
				"No object holds an address of this pool; waiting for %d pending reservations and %d cooling-down addresses%s",
				c.Pending, c.Cooldown, until)
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}
	if err := r.Registry.Remove(ctx, pool.Name); err != nil {
		return ctrl.Result{}, err
	}
	// Nothing is claimed or cooling down any more: the blocks go now, not
	// whenever the garbage collector gets to them, so that a pool created
	// again under this name starts from nothing.
	if err := r.deleteBlocks(ctx, pool); err != nil {
		return ctrl.Result{}, err
	}
	logf.FromContext(ctx).Info("Releasing deleted IPPool", "ippool", pool.Name)
	base := pool.DeepCopy()
	controllerutil.RemoveFinalizer(pool, vmipamv1.PoolFinalizer)
	if err := r.Client.Patch(ctx, pool, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(fmt.Errorf("remove finalizer of IPPool %s: %w", pool.Name, err))
	}
	return ctrl.Result{}, nil
}

// deleteBlocks deletes the IPBlocks of a pool being released, and their
// holders' IPBlockShares.
func (r *IPPoolReconciler) deleteBlocks(ctx context.Context, pool *vmipamv1.IPPool) error {
	var blocks vmipamv1.IPBlockList
	if err := r.APIReader.List(ctx, &blocks, client.MatchingLabels{vmipamv1.PoolLabel: kubestore.PoolLabelValue(pool.Name)}); err != nil {
		return fmt.Errorf("list IPBlocks of IPPool %s: %w", pool.Name, err)
	}
	for i := range blocks.Items {
		b := &blocks.Items[i]
		if b.Spec.Pool != pool.Name {
			continue
		}
		if err := r.Client.Delete(ctx, b); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete IPBlock %s of IPPool %s: %w", b.Name, pool.Name, err)
		}
	}
	var shares vmipamv1.IPBlockShareList
	if err := r.APIReader.List(ctx, &shares, client.MatchingLabels{vmipamv1.PoolLabel: kubestore.PoolLabelValue(pool.Name)}); err != nil {
		return fmt.Errorf("list IPBlockShares of IPPool %s: %w", pool.Name, err)
	}
	for i := range shares.Items {
		sh := &shares.Items[i]
		if sh.Spec.Pool != pool.Name {
			continue
		}
		if err := r.Client.Delete(ctx, sh); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete IPBlockShare %s of IPPool %s: %w", sh.Name, pool.Name, err)
		}
	}
	return nil
}

// now reads clk, or the system clock when clk is nil: the controllers'
// Clock fields default to it.
func now(clk ipam.Clock) time.Time {
	if clk != nil {
		return clk.Now()
	}
	return time.Now()
}

func (r *IPPoolReconciler) event(pool *vmipamv1.IPPool, typ, reason, note string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(pool, nil, typ, reason, "Delete", note, args...)
	}
}
