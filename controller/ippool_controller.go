package controller

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crcontroller "sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/pools"
)

// +kubebuilder:rbac:groups=vmipam.io,resources=ippools,verbs=get;list;watch
// +kubebuilder:rbac:groups=vmipam.io,resources=ippools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=vmipam.io,resources=ipblocks,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=vmipam.io,resources=ippools/finalizers,verbs=update

// IPPoolReconciler keeps an allocator in the Registry for every IPPool, at
// the pool's current generation.
type IPPoolReconciler struct {
	Client   client.Client
	Registry *pools.Registry
}

// SetupWithManager registers the reconciler. Every replica runs it, since
// every replica serves the webhook from its own allocators.
func (r *IPPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	needLeader := false
	return ctrl.NewControllerManagedBy(mgr).
		For(&vmipamv1.IPPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Named("ippool-allocators").
		WithOptions(crcontroller.Options{NeedLeaderElection: &needLeader}).
		Complete(r)
}

// Reconcile builds, rebuilds or drops the pool's allocator.
func (r *IPPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pool := &vmipamv1.IPPool{}
	if err := r.Client.Get(ctx, req.NamespacedName, pool); err != nil {
		if client.IgnoreNotFound(err) == nil {
			r.Registry.Remove(req.Name)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pool.DeletionTimestamp != nil {
		r.Registry.Remove(pool.Name)
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, r.Registry.Ensure(ctx, pool)
}
