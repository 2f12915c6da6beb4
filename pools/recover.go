package pools

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
)

// Ensure makes the registry's allocator for pool match the pool's current
// generation: it is built and recovered from the cluster on first sight
// and rebuilt when the spec changes. The old allocator stops handing out
// addresses before the new one recovers, so the two never share a moment.
// A pool being deleted keeps its allocator but hands out nothing new.
func (r *Registry) Ensure(ctx context.Context, pool *vmipamv1.IPPool) error {
	mu, _ := r.ensuring.LoadOrStore(pool.Name, new(sync.Mutex))
	mu.(*sync.Mutex).Lock()
	err := r.ensure(ctx, pool)
	mu.(*sync.Mutex).Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		delete(r.problems, pool.Name)
	case ctx.Err() == nil:
		r.problems[pool.Name] = poolProblem{uid: pool.UID, generation: pool.Generation, err: err}
	}
	return err
}

// poolProblem is why an IPPool's version could not be served.
type poolProblem struct {
	uid        types.UID
	generation int64
	err        error
}

func (r *Registry) ensure(ctx context.Context, pool *vmipamv1.IPPool) error {
	select {
	case <-r.started:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-r.leased:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.mu.RLock()
	old := r.pools[pool.Name]
	r.mu.RUnlock()
	if old != nil && old.uid == pool.UID && old.Ready() &&
		(old.observedGeneration() == pool.Generation || sameButPaused(old.spec, pool.Spec)) {
		// Unchanged, only marked for deletion (which bumps the generation
		// too), or only paused or unpaused: a rebuild would park the free
		// list and recover from the store for no gain.
		old.mu.Lock()
		old.generation = pool.Generation
		old.deleting = pool.DeletionTimestamp != nil
		old.mu.Unlock()
		old.paused.Store(pool.Spec.Paused)
		return nil
	}
	p, err := r.build(pool)
	if err != nil {
		return err
	}
	if old != nil && old.uid == p.uid {
		p.trends = old.trends
	}
	if old != nil {
		old.stop()
		// Releases not written yet carry cooldown deadlines that the new
		// allocator's recovery must read: a shortened cooldown only
		// applies to addresses released after the change. An allocator
		// whose claims another holder took over has nothing left to
		// write, and could write nothing: its rebuild (a recovery from
		// the store) is how it serves again, and waiting for its flush
		// kept the pool unserved for good.
		if !old.lost() {
			if err := old.flush(ctx); err != nil {
				return fmt.Errorf("persist pool %s before rebuilding its allocator: %w", pool.Name, err)
			}
		}
	}
	// From here until p is in pools, an object with an address in p's
	// ranges that p's recovery may not read is still handed to the
	// controller (Covers).
	r.mu.Lock()
	r.coming[pool.Name] = p.ranges
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.coming, pool.Name)
		r.mu.Unlock()
	}()
	p.setFence(r.lease.valid, r.lease.lapses.Load)
	// Before this replica's first list of the holder Leases there is no
	// list to give: the allocator then counts every holder as live. Given
	// an empty one, it took every other holder for one not running, and
	// a replacement that recovered its slot a moment before its first
	// list refused creates as exhausted, with most of the pool "held by
	// vmipam replicas that are not running", instead of asking them.
	r.mu.RLock()
	if r.peers != nil {
		p.setPeers(r.peers)
	}
	r.mu.RUnlock()
	rep, live, listed, err := r.recoverPool(ctx, p, old == nil && !r.dropped.Load())
	if err != nil {
		return fmt.Errorf("recover pool %s: %w", pool.Name, err)
	}
	p.noteConflicts(rep.Conflicts)
	logf.FromContext(ctx).Info("Recovered pool", "pool", pool.Name, "listed", listed, "allocated", rep.Allocated, "free", rep.Free,
		"cooldown", rep.Cooldown, "dropped", rep.Dropped, "elsewhere", len(rep.Elsewhere), "conflicts", len(rep.Conflicts), "outOfRange", len(rep.OutOfRange))
	for _, c := range rep.Conflicts {
		r.warn(pool, "DuplicateAddress", c.Error())
	}
	runCtx, cancel := context.WithCancel(r.baseCtx)
	p.cancel, p.done = cancel, make(chan struct{})
	go func() {
		defer close(p.done)
		p.run(runCtx, r.opts.RunInterval, func(err error) {
			logf.FromContext(runCtx).Error(err, "Persisting pool state", "pool", p.name)
			if errors.Is(err, ipam.ErrClaimLost) {
				select {
				case r.lostOne <- struct{}{}:
				default:
				}
			}
		})
	}()
	r.mu.Lock()
	r.pools[pool.Name] = p
	r.mu.Unlock()
	if len(live.elsewhere) > 0 {
		// Objects this replica adopted, or labelled before vmipam had
		// replicas: label them, without holding up the recovery.
		r.tasks.Go(func() { r.relabel(runCtx, p, live.elsewhere) })
	}
	return nil
}

// recoverPool recovers p's allocators from the live objects of its pool,
// and returns what it found with the objects it read, and whether it
// listed every object of the kinds this replica has caches of from the
// API server (a kind not served yet is listed either way: see cachedIn).
//
// With fromCaches, the objects are read from this replica's caches (its
// own objects and the unlabelled ones), where the caches can stand for a
// list and hold every address the store shows this replica's holder may
// have handed out (see ipam.Manager.RecoverCovered): a replacement that
// recovers its slot's claims, which its last process sealed, lists
// nothing from the API server, however large the fleet. Otherwise, or when that falls short
// (an object in use labelled for another replica, a crash's armed
// addresses), every object is listed from the API server, as without.
// The caller asks for the caches only for a pool's first recovery in a
// process that never lost its Lease: a rebuild or a recovery after an
// outage lists, since the caches may lag the API server then.
func (r *Registry) recoverPool(ctx context.Context, p *Pool, fromCaches bool) (ipam.RecoveryReport, live, bool, error) {
	log := logf.FromContext(ctx)
	if fromCaches {
		cctx, cancel := context.WithTimeout(ctx, cachedRecoveryWait)
		c, ok, err := r.cachedIn(cctx, map[string]*ipam.Ranges{p.name: p.ranges})
		cancel()
		switch {
		case ctx.Err() != nil:
			return ipam.RecoveryReport{}, live{}, false, ctx.Err()
		case err != nil:
			log.Info("Recovering the pool from a list of every object: its caches cannot be read", "pool", p.name, "error", err.Error())
		case !ok:
			log.V(1).Info("Recovering the pool from a list of every object: its caches cannot stand for one", "pool", p.name)
		default:
			l := c.out[p.name]
			rep, err := p.recoverCovered(ctx, l.holdings)
			if err == nil || !errors.Is(err, ipam.ErrUncovered) {
				return rep, l, false, err
			}
			log.Info("Recovering the pool from a list of every object: its caches lack an address in use", "pool", p.name, "why", err.Error())
		}
	}
	l, err := r.liveHoldings(ctx, p.name, p.ranges)
	if err != nil {
		return ipam.RecoveryReport{}, l, true, err
	}
	rep, err := p.recover(ctx, l.holdings)
	return rep, l, true, err
}

// cachedRecoveryWait bounds how long a recovery from the caches waits for
// them to fill before it lists every object instead.
const cachedRecoveryWait = 30 * time.Second

// sameButPaused reports whether two versions of a pool's spec differ in
// spec.paused at most: what the allocator applies without a rebuild.
func sameButPaused(a, b vmipamv1.IPPoolSpec) bool {
	a.Paused, b.Paused = false, false
	return equality.Semantic.DeepEqual(a, b)
}

func (r *Registry) build(pool *vmipamv1.IPPool) (*Pool, error) {
	ranges, err := ipam.ParseRanges(RangeSpecs(pool.Spec.Ranges))
	if err != nil {
		return nil, fmt.Errorf("pool %s: spec.%w", pool.Name, err)
	}
	cooldown := cooldownOf(pool.Spec)
	ttl := ipam.DefaultPendingTTL
	if pool.Spec.PendingTTL != nil {
		ttl = pool.Spec.PendingTTL.Duration
	}
	maxPending := ipam.DefaultMaxPendingPerNamespace(ranges.Size())
	if n := pool.Spec.MaxPendingPerNamespace; n != nil {
		maxPending = int(*n)
	}
	p := &Pool{
		name: pool.Name, ranges: ranges, uid: pool.UID, generation: pool.Generation, spec: *pool.Spec.DeepCopy(),
		noteDuplicate: r.opts.NoteDuplicate, deleting: pool.DeletionTimestamp != nil,
	}
	p.paused.Store(pool.Spec.Paused)
	p.trends = &poolTrends{}
	store := kubestore.New(r.opts.Client, r.opts.APIReader, pool, r.opts.Holder)
	v4, v6 := ranges.Family(true), ranges.Family(false)
	for _, f := range []struct {
		ranges *ipam.Ranges
		family vmipamv1.IPFamily
		dst    **ipam.Manager
	}{{v4, vmipamv1.IPv4, &p.v4}, {v6, vmipamv1.IPv6, &p.v6}} {
		if f.ranges == nil {
			continue
		}
		cfg := ipam.Config{
			Pool: pool.Name, Holder: r.opts.Holder, Ranges: f.ranges, Timers: r.opts.Timers,
			Cooldown: cooldown, PendingTTL: ttl, MaxPendingPerNamespace: maxPending,
			Store: store, Clock: r.opts.Clock,
		}
		if v4 != nil && v6 != nil {
			// Each family's allocator sees only its blocks, and says which
			// family it is out of.
			cfg.Store, cfg.Family = familyStore{Store: store, is4: f.family == vmipamv1.IPv4}, string(f.family)
		}
		if obs := r.opts.ObserveAllocation; obs != nil {
			name := pool.Name
			cfg.ObserveAllocation = func(d time.Duration, err error) { obs(name, d, err) }
		}
		if w := pool.Spec.Watermarks; w != nil {
			cfg.LowWatermark, cfg.TargetFree, cfg.HighWatermark = int(w.Low), int(w.Target), int(w.High)
		}
		m, err := ipam.NewManager(cfg)
		if err != nil {
			return nil, err
		}
		*f.dst = m
		p.ms = append(p.ms, m)
	}
	if pool.Spec.NamespaceSelector != nil {
		if p.selector, err = metav1.LabelSelectorAsSelector(pool.Spec.NamespaceSelector); err != nil {
			return nil, fmt.Errorf("pool %s: spec.namespaceSelector: %w", pool.Name, err)
		}
	}
	if a := pool.Spec.AllowedNamespaces; a != nil {
		p.allowed = &allowedNamespaces{names: map[string]bool{}}
		for _, n := range a.Names {
			p.allowed.names[n] = true
		}
		if a.Selector != nil {
			if p.allowed.selector, err = metav1.LabelSelectorAsSelector(a.Selector); err != nil {
				return nil, fmt.Errorf("pool %s: spec.allowedNamespaces.selector: %w", pool.Name, err)
			}
		}
	}
	return p, nil
}
