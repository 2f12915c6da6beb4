package pools

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
)

// resyncLoop resyncs every pool each resync interval until ctx ends: from
// the caches, and from a list of every object once per full resync
// interval.
func (r *Registry) resyncLoop(ctx context.Context) {
	log := logf.FromContext(ctx)
	resync := time.NewTicker(r.opts.ResyncInterval)
	defer resync.Stop()
	// The recovery at the start listed every object.
	lastFull := r.clock.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-resync.C:
			now := r.clock.Now()
			full := r.opts.FullResyncInterval <= r.opts.ResyncInterval || !now.Before(lastFull.Add(r.opts.FullResyncInterval))
			listed, err := r.resync(ctx, r.list(), full)
			if err != nil && ctx.Err() == nil {
				log.Error(err, "Resyncing pools")
			}
			if listed {
				lastFull = now
			}
		}
	}
}

// Resync reconciles a pool's allocator with every live object, listed
// from the API server.
func (r *Registry) Resync(ctx context.Context, p *Pool) error {
	_, err := r.resync(ctx, []*Pool{p}, true)
	return err
}

// resync reconciles the allocators of ps with every live object, and moves
// the holder label of the objects whose addresses they hold to this
// replica. The objects are listed from the API server when full is set, or
// when the caches cannot stand for a list (see liveCached); listed says
// whether they were.
func (r *Registry) resync(ctx context.Context, ps []*Pool, full bool) (listed bool, err error) {
	start := r.clock.Now()
	listed, did, err := r.resyncPools(ctx, ps, full)
	if did && r.opts.ObserveResync != nil {
		r.opts.ObserveResync(listed, r.clock.Now().Sub(start), err)
	}
	return listed && err == nil, err
}

// resyncPools is resync, but listed says whether it listed or tried to,
// and did whether any pool was ready to resync.
func (r *Registry) resyncPools(ctx context.Context, ps []*Pool, full bool) (listed, did bool, err error) {
	// Mark before listing: what changes while the list is taken is left
	// for the next resync.
	asOf := map[string][]uint64{}
	ranges := map[string]*ipam.Ranges{}
	for _, p := range ps {
		if p.Ready() {
			asOf[p.name], ranges[p.name] = p.mark(), p.ranges
		}
	}
	if len(ranges) == 0 {
		return false, false, nil
	}
	var by map[string]live
	cached := false
	if !full {
		if by, cached, err = r.liveCached(ctx, ps, ranges, asOf); err != nil {
			return false, true, err
		}
	}
	if !cached {
		if by, err = r.liveIn(ctx, ranges); err != nil {
			return true, true, err
		}
	}
	logf.FromContext(ctx).V(1).Info("Resyncing pools", "pools", len(ranges), "listed", !cached)
	for _, p := range ps {
		mark, ok := asOf[p.name]
		if !ok {
			continue
		}
		live := by[p.name]
		rep := p.resync(live.holdings, mark)
		p.noteConflicts(rep.Conflicts)
		if rep.Released > 0 || rep.Adopted > 0 || rep.Settled > 0 || len(rep.Conflicts) > 0 {
			// settled: orphans, addresses the store showed in use without
			// saying on which machine, that are on none and now rest.
			logf.FromContext(ctx).Info("Resynced pool", "pool", p.name, "released", rep.Released, "adopted", rep.Adopted, "adoptedFirst", adoptions(rep.Adoptions),
				"settled", rep.Settled, "deferred", rep.Deferred, "conflicts", len(rep.Conflicts))
		} else if rep.Deferred > 0 {
			logf.FromContext(ctx).V(1).Info("Resync deferred releases until their blocks are written", "pool", p.name, "deferred", rep.Deferred)
		}
		r.recordVanished(ctx, p, rep.Vanished)
		for _, c := range rep.Conflicts {
			r.warn(&vmipamv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: p.name, UID: p.uid}}, "DuplicateAddress", c.Error())
		}
		r.relabel(ctx, p, live.elsewhere)
	}
	return !cached, true, nil
}

// adoptions names, for a log line, the addresses a resync adopted and the
// objects it adopted them for: "10.0.0.5 ns/name" each.
func adoptions(ts []ipam.Tenure) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Addr.String() + " " + t.Owner.Ref
	}
	return out
}

// recordVanished records in the address history the tenures that a resync
// ended because their objects were gone (their finalizer was removed by
// force), and logs each. No finalizer waits for these records: a crash
// before they are stored loses them, and the address rests as after any
// crash.
func (r *Registry) recordVanished(ctx context.Context, p *Pool, ts []ipam.Tenure) {
	if len(ts) == 0 {
		return
	}
	log := logf.FromContext(ctx)
	now := metav1.NewTime(r.clock.Now())
	recs := make([]vmipamv1.AddressRecord, len(ts))
	for i, t := range ts {
		ns, name := splitRef(t.Owner.Ref)
		recs[i] = vmipamv1.AddressRecord{Address: t.Addr.String(), Pool: p.name, Namespace: ns, Name: name,
			UID: t.Owner.UID, To: now, Ended: vmipamv1.EndedVanished}
		r.LogReleased(log, recs[i])
	}
	if err := r.Record(ctx, recs...); err != nil {
		log.Error(err, "Recording the history of addresses whose objects vanished", "pool", p.name)
	}
}
