package pools

import (
	"context"
	"errors"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Serving is this replica's readiness: it holds its Lease, renewed in
// time, and it has tried every IPPool once since it started (or since it
// last lost its Lease): recovered it, or found why it cannot (a spec it
// cannot apply, a recovery that failed and is retried). A pool's trouble
// stays in that pool: only the creates that draw from it are refused,
// with its own reason (see Select), while the replica serves every other
// pool. Nor does a pool created or changed later make it unready: every
// replica recovers that pool at about the same moment, and a readiness
// tied to it would take every replica out of the Service at once.
func (r *Registry) Serving(ctx context.Context) error {
	if r.recovered.Load() {
		return r.leaseReady()
	}
	if err := r.tried(ctx); err != nil {
		return err
	}
	r.recovered.Store(true)
	return nil
}

// tried reports an error until this replica holds its Lease and has
// recovered, or failed to recover, every IPPool at its current version.
func (r *Registry) tried(ctx context.Context) error { return r.everyPool(ctx, true) }

// everyPool reports an error until this replica holds its Lease and has
// recovered every IPPool in the cluster at its current version, or, with
// triedIsEnough, failed to (see problems).
func (r *Registry) everyPool(ctx context.Context, triedIsEnough bool) error {
	if err := r.leaseReady(); err != nil {
		return err
	}
	// Read the cache's objects in place (only names, UIDs and
	// generations), not a copy of each.
	var list vmipamv1.IPPoolList
	if err := r.opts.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("list IPPools: %w", err)
	}
	for i := range list.Items {
		pool := &list.Items[i]
		p, problem := r.stateOf(pool)
		if p != nil && p.observedGeneration() == pool.Generation || triedIsEnough && problem != nil {
			continue
		}
		return fmt.Errorf("IPPool %s not recovered yet", pool.Name)
	}
	return nil
}

// leaseReady reports an error unless this replica holds its Lease,
// renewed in time.
func (r *Registry) leaseReady() error {
	select {
	case <-r.leased:
	default:
		if err := r.lease.waitingFor(); err != nil {
			return fmt.Errorf("the holder lease is not held yet: %w", err)
		}
		return errors.New("the holder lease is not held yet")
	}
	if !r.lease.valid() {
		return errors.New("the holder lease has not been renewed in time")
	}
	return nil
}

// Ready reports an error until this replica holds its Lease and every
// IPPool in the cluster has a recovered allocator at its current
// generation.
func (r *Registry) Ready(ctx context.Context) error { return r.everyPool(ctx, false) }
