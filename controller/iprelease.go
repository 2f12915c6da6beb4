package controller

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/pools"
)

// +kubebuilder:rbac:groups=vmipam.io,resources=ipreleases,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=vmipam.io,resources=ipreleases/status,verbs=get;update;patch

// ReleaseTTL is how long an answered IPRelease stays, for its creator to
// read; then vmipam deletes it. The address history keeps what it did.
const ReleaseTTL = time.Hour

// IPReleaseReconciler answers IPReleases (kubectl vmipam release): the
// replica whose claim holds the address carries it out (see
// pools.Registry.ReleaseEarly) and writes the outcome into the status.
// It runs on every replica.
type IPReleaseReconciler struct {
	Client   client.Client
	Registry *pools.Registry
	Clock    clock.PassiveClock

	// done keeps, by UID, the outcomes this replica carried out whose
	// status write may have failed, so that a retry reports what was
	// done rather than that nothing is left to do.
	done sync.Map
}

// SetupWithManager registers the reconciler.
func (r *IPReleaseReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("iprelease").
		WithOptions(crcontroller.Options{NeedLeaderElection: ptr.To(false)}).
		For(&vmipamv1.IPRelease{}).
		Complete(r)
}

// Reconcile answers one IPRelease, or deletes it once it has stayed
// ReleaseTTL answered.
func (r *IPReleaseReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	rel := &vmipamv1.IPRelease{}
	if err := r.Client.Get(ctx, req.NamespacedName, rel); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	now := r.Clock.Now()
	if rel.Status.Phase != "" {
		r.done.Delete(rel.UID)
		if t := rel.Status.CompletionTime; t != nil {
			if left := t.Add(ReleaseTTL).Sub(now); left > 0 {
				return ctrl.Result{RequeueAfter: left}, nil
			}
			return ctrl.Result{}, client.IgnoreNotFound(r.Client.Delete(ctx, rel, client.Preconditions{UID: &rel.UID}))
		}
		return ctrl.Result{}, nil
	}
	if st, ok := r.done.Load(rel.UID); ok {
		return ctrl.Result{}, r.answer(ctx, rel, st.(vmipamv1.IPReleaseStatus))
	}
	addr, err := netip.ParseAddr(rel.Spec.Address)
	if err != nil {
		// The CRD's validation refuses it; an older CRD may not.
		return ctrl.Result{}, r.answer(ctx, rel, vmipamv1.IPReleaseStatus{Phase: vmipamv1.ReleaseRefused,
			Message: "spec.address: " + rel.Spec.Address + " is not an IP address; write one in canonical form, such as 10.0.0.5"})
	}
	out, err := r.Registry.ReleaseEarly(ctx, pools.EarlyRelease{
		Addr: addr, SkipCooldown: rel.Spec.SkipCooldown, By: rel.Spec.RequestedBy, Reason: rel.Spec.Reason, Key: string(rel.UID),
	})
	st := vmipamv1.IPReleaseStatus{Pool: out.Pool, Holder: r.Registry.Holder(), Previous: out.Was.String()}
	var refused *pools.RefusedError
	switch {
	case errors.Is(err, pools.ErrNotMine):
		// Its replica answers; should it leave before, this one may be
		// the one to, after the takeover.
		return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
	case errors.Is(err, pools.ErrWaitTakeover), errors.Is(err, pools.ErrNotReady):
		return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	case errors.As(err, &refused):
		st.Phase, st.Message = vmipamv1.ReleaseRefused, refused.Msg
	case err != nil:
		return ctrl.Result{}, err
	default:
		st.Phase, st.Message = vmipamv1.ReleaseDone, out.Message
		r.done.Store(rel.UID, st)
	}
	logf.FromContext(ctx).Info("Answered an IPRelease", "address", rel.Spec.Address, "phase", st.Phase, "message", st.Message, "requestedBy", rel.Spec.RequestedBy)
	return ctrl.Result{RequeueAfter: ReleaseTTL}, r.answer(ctx, rel, st)
}

// answer writes st into rel's status, stamped now.
func (r *IPReleaseReconciler) answer(ctx context.Context, rel *vmipamv1.IPRelease, st vmipamv1.IPReleaseStatus) error {
	st.CompletionTime = ptr.To(metav1.NewTime(r.Clock.Now()))
	rel = rel.DeepCopy()
	rel.Status = st
	if err := r.Client.Status().Update(ctx, rel); err != nil {
		if apierrors.IsNotFound(err) {
			r.done.Delete(rel.UID)
			return nil
		}
		return err
	}
	r.done.Delete(rel.UID)
	return nil
}
