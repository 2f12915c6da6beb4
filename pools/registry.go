// Package pools keeps one allocator per IPPool: it builds and recovers
// them from the cluster's state, runs their background work, picks the
// pool for an object, proves lapsed reservations unused, and keeps each
// IPPool's status current. The webhook and the controller reach the
// allocators only through a Registry and the methods of its Pools.
//
// The files split by role: registry.go is the lifecycle (build, recover,
// rebuild, stop), select.go the choice of a pool, holdings.go the live
// objects' addresses (recovery and resync), unstored.go the proof that a
// lapsed reservation was never stored, status.go the IPPool status.
package pools

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/lib/cacheindex"
)

// ErrNotReady means the registry has not loaded every IPPool yet, so it
// cannot tell which pool applies; the caller should retry shortly.
var ErrNotReady = errors.New("vmipam is still recovering its pools")

// Options configure a Registry.
type Options struct {
	// Client reads from the informer cache and writes to the API server.
	Client client.Client
	// APIReader reads from the API server directly: the blocks, and the
	// quorum reads that prove a lapsed reservation unused.
	APIReader client.Reader
	// Kinds are the kinds given addresses; a kind whose CRD is not
	// installed has no objects.
	Kinds []kinds.Kind
	// Holder names this replica in the pools' claims; stable across
	// restarts.
	Holder string
	// Clock defaults to the system clock.
	Clock ipam.Clock
	// RunInterval is how often each Manager expires, rebalances and
	// flushes when nothing kicks it. Default 1s.
	RunInterval time.Duration
	// Timers, if set, are the allocators' timers (tests).
	Timers ipam.Timers
	// ResyncInterval is how often each pool is reconciled against every
	// live object, catching objects whose finalizer was removed by force.
	// Default 5m.
	ResyncInterval time.Duration
	// StatusInterval is how often pool status is written when it changed.
	// Default 5s.
	StatusInterval time.Duration
	// ProveInterval is how often lapsed reservations are checked against
	// the API server, to return those never stored without a cooldown.
	// Default 10s.
	ProveInterval time.Duration
	// Recorder records events on pools; optional.
	Recorder events.EventRecorder
	// ObserveAllocation, if set, receives every allocation's latency.
	ObserveAllocation func(pool string, d time.Duration, err error)
	// NoteDuplicate, if set, hears of every duplicate found.
	NoteDuplicate func(pool string)
	// Lease configures this replica's holder Lease (its Holder is the
	// Holder above). Every allocator of this replica serves only while
	// the Lease is held.
	Lease LeaseOptions
	// Informers, if set, deliver the IPBlocks as they change, so that an
	// allocator answers another holder's request for addresses at once
	// (pass mgr.GetCache()); without, requests are noticed when blocks are
	// read.
	Informers Informers
}

// Informers is the part of controller-runtime's cache the registry uses.
type Informers interface {
	GetInformer(ctx context.Context, obj client.Object, opts ...cache.InformerGetOption) (cache.Informer, error)
}

// Registry holds the pools' allocators.
type Registry struct {
	opts Options
	// namespaces, once Start set it, reads namespaces from the cache's
	// index (see namespace).
	namespaces atomic.Pointer[cacheindex.Index]
	// holderLabel is HolderLabelValue(opts.Holder), worked out once: every
	// admission stamps it.
	holderLabel string
	clock       ipam.Clock
	started     chan struct{}
	baseCtx     context.Context
	lease       *lease
	// leased is closed once the holder Lease was first acquired.
	leased chan struct{}
	// relist asks for the live holders to be listed again before the
	// next renewal (see noteAskers).
	relist chan struct{}
	// lostOne says that a write found an allocator's claims taken over
	// (see rebuildLost); rebuilding is set while a rebuild runs.
	lostOne    chan struct{}
	rebuilding atomic.Bool
	// ensuring serializes the Ensures of one pool (by name): the pool
	// controller, the recovery after a lost Lease and the rebuild of a
	// lost allocator may each ask at once.
	ensuring sync.Map

	// servedKinds are the kinds the API server served since the start
	// (MarkServed).
	servedMu    sync.Mutex
	servedKinds map[schema.GroupVersionKind]bool

	mu    sync.RWMutex
	pools map[string]*Pool
	// problems are, by IPPool name, why the last Ensure of the pool's
	// current version failed: a spec that cannot be applied, or a
	// recovery that failed. Only the creates that draw from that pool
	// are refused for it (see serving).
	problems map[string]poolProblem
	// peers are the live holders, as last listed; peerCounts, what the
	// others among them published of their pools.
	peers      []string
	peerCounts map[string]map[string]holderCounts
	// takingOver are the holders whose claims a goroutine of tasks is
	// taking over.
	takingOver map[string]bool
	tasks      sync.WaitGroup
	takeoverMu sync.Mutex
	// recovered: every pool was recovered once since the start or the
	// last loss of the Lease (see Serving).
	recovered atomic.Bool
}

// NewRegistry returns a Registry; add it to the controller manager so that
// it runs (it implements manager.Runnable).
func NewRegistry(opts Options) *Registry {
	if opts.RunInterval == 0 {
		opts.RunInterval = time.Second
	}
	if opts.ResyncInterval == 0 {
		opts.ResyncInterval = 5 * time.Minute
	}
	if opts.StatusInterval == 0 {
		opts.StatusInterval = 5 * time.Second
	}
	if opts.ProveInterval == 0 {
		opts.ProveInterval = 10 * time.Second
	}
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	opts.Lease.Holder = opts.Holder
	r := &Registry{
		opts: opts, holderLabel: HolderLabelValue(opts.Holder), clock: clk, started: make(chan struct{}), leased: make(chan struct{}), relist: make(chan struct{}, 1), lostOne: make(chan struct{}, 1), pools: map[string]*Pool{}, problems: map[string]poolProblem{}, takingOver: map[string]bool{},
		lease: newLease(opts.Client, opts.APIReader, opts.Lease),
	}
	r.lease.counts = r.publishedCounts
	return r
}

// Start acquires this replica's holder Lease, then keeps it and runs the
// periodic status, proof, resync and takeover loops until ctx ends; then it
// seals every pool and releases the Lease, so that another holder takes
// the claims over without resting them.
func (r *Registry) Start(ctx context.Context) error {
	r.baseCtx = ctx
	log := logf.FromContext(ctx)
	if r.opts.Informers != nil {
		// Every admission reads its namespace: straight from the index.
		if idx, err := cacheindex.For(ctx, r.opts.Informers, &corev1.Namespace{}); err != nil {
			log.Error(err, "Reading namespaces through the cache's client instead of its index")
		} else {
			r.namespaces.Store(idx)
		}
	}
	close(r.started)
	if err := r.lease.acquire(ctx); err != nil {
		return nil // stopped before it held the Lease
	}
	close(r.leased)
	log.Info("Holding the holder lease", "holder", r.opts.Holder)
	r.watchBlocks(ctx)
	status := time.NewTicker(r.opts.StatusInterval)
	defer status.Stop()
	prove := time.NewTicker(r.opts.ProveInterval)
	defer prove.Stop()
	// Resyncs list every VM of each pool: on a loop of their own, so that
	// many pools or a slow API server delay neither the renewals nor the
	// status.
	r.tasks.Add(1)
	go func() {
		defer r.tasks.Done()
		r.resyncLoop(ctx)
	}()
	renew := time.NewTicker(r.lease.opts.RetryPeriod)
	defer renew.Stop()
	var relisted time.Time
	for {
		select {
		case <-ctx.Done():
			// A takeover under way ends with ctx; what it moved is sealed.
			r.tasks.Wait()
			r.shutdown(ctx)
			return nil
		case <-renew.C:
			r.keepLease(ctx)
		case <-r.lostOne:
			r.rebuildLost(ctx)
		case <-r.relist:
			// At most one list in relistPace, whatever the blocks show.
			if time.Since(relisted) >= relistPace {
				relisted = time.Now()
				r.listPeers(ctx)
			}
		case <-status.C:
			for _, p := range r.list() {
				if err := r.writeStatus(ctx, p); err != nil && ctx.Err() == nil {
					log.Error(err, "Updating pool status", "pool", p.name)
				}
			}
		case <-prove.C:
			for _, p := range r.list() {
				if err := r.proveUnused(ctx, p); err != nil && ctx.Err() == nil {
					log.Error(err, "Checking lapsed reservations", "pool", p.name)
				}
			}
		}
	}
}

// resyncLoop resyncs every pool each resync interval until ctx ends.
func (r *Registry) resyncLoop(ctx context.Context) {
	log := logf.FromContext(ctx)
	resync := time.NewTicker(r.opts.ResyncInterval)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-resync.C:
			if err := r.resync(ctx, r.list()); err != nil && ctx.Err() == nil {
				log.Error(err, "Resyncing pools")
			}
		}
	}
}

// relistPace bounds how often the live holders are listed between
// renewals, on a block that shows a request of a holder no list named.
const relistPace = 250 * time.Millisecond

// NeedLeaderElection returns false: every replica serves the webhook, so
// every replica keeps its allocators.
func (r *Registry) NeedLeaderElection() bool { return false }

// Pools returns the pools, sorted by name.
func (r *Registry) Pools() []*Pool { return r.list() }

func (r *Registry) list() []*Pool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]*Pool, 0, len(r.pools))
	for _, p := range r.pools {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// Get returns the named pool, or nil.
func (r *Registry) Get(name string) *Pool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.pools[name]
}

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
		(old.observedGeneration() == pool.Generation || equality.Semantic.DeepEqual(old.spec, pool.Spec)) {
		// Unchanged, or only marked for deletion (which bumps the
		// generation too): a rebuild would park the free list for no gain.
		old.mu.Lock()
		old.generation = pool.Generation
		old.deleting = pool.DeletionTimestamp != nil
		old.mu.Unlock()
		return nil
	}
	p, err := r.build(pool)
	if err != nil {
		return err
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
	live, err := r.liveHoldings(ctx, p.name, p.ranges)
	if err != nil {
		return fmt.Errorf("recover pool %s: %w", pool.Name, err)
	}
	p.setFence(r.lease.valid)
	r.mu.RLock()
	p.setPeers(r.peers)
	r.mu.RUnlock()
	rep, err := p.recover(ctx, live.holdings)
	if err != nil {
		return fmt.Errorf("recover pool %s: %w", pool.Name, err)
	}
	p.noteConflicts(rep.Conflicts)
	logf.FromContext(ctx).Info("Recovered pool", "pool", pool.Name, "allocated", rep.Allocated, "free", rep.Free,
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

// Remove stops the named pool's allocator, writes what it has not written
// yet, and forgets it.
func (r *Registry) Remove(ctx context.Context, name string) error {
	r.mu.Lock()
	p := r.pools[name]
	delete(r.pools, name)
	delete(r.problems, name)
	r.mu.Unlock()
	if p == nil {
		return nil
	}
	p.stop()
	if err := p.flush(ctx); err != nil {
		return fmt.Errorf("persist pool %s before removing its allocator: %w", name, err)
	}
	return nil
}

func (r *Registry) build(pool *vmipamv1.IPPool) (*Pool, error) {
	ranges, err := ipam.ParseRanges(RangeSpecs(pool.Spec.Ranges))
	if err != nil {
		return nil, fmt.Errorf("pool %s: spec.%w", pool.Name, err)
	}
	cooldown := ipam.DefaultCooldown
	if pool.Spec.Cooldown != nil {
		cooldown = pool.Spec.Cooldown.Duration
	}
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

func (r *Registry) warn(pool *vmipamv1.IPPool, reason, msg string) {
	if r.opts.Recorder != nil {
		pool.SetGroupVersionKind(vmipamv1.GroupVersion.WithKind("IPPool"))
		r.opts.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, reason, "Reconcile", "%s", msg)
	}
}

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
