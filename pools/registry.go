package pools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
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
	// FullResyncInterval is how often a resync lists every object from the
	// API server. The resyncs between read this replica's caches (see
	// SetCached), and from the API server only the objects that an
	// allocator holds addresses for and the caches lack, and those whose
	// addresses a resync would adopt. Default 1h; at or
	// below ResyncInterval, every resync lists every object.
	FullResyncInterval time.Duration
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
	// ObserveResync, if set, receives every resync's duration: listed says
	// whether it listed the objects from the API server (or read the
	// caches), err whether it failed.
	ObserveResync func(listed bool, d time.Duration, err error)
	// Lease configures this replica's holder Lease (its Holder is the
	// Holder above). Every allocator of this replica serves only while
	// the Lease is held.
	Lease LeaseOptions
	// Slot, if set, is the holder slot this process took (TakeSlot): its
	// Holder is the Holder above, and Lease.Process names this process.
	// Start takes the slot's renewals over.
	Slot *Slot
	// History, if set, stores the history of addresses (see Record).
	History Recorder
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
	// ippools, once Start set it, reads the IPPools an admission names
	// from the cache's index (see pool).
	ippools atomic.Pointer[cacheindex.Index]
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
	// held is how many holdings the last collection of each pool found
	// (by name): the next one's capacity, so that a resync does not grow
	// tens of thousands of holdings a doubling at a time.
	held sync.Map

	// servedKinds are the kinds the API server served since the start
	// (MarkServed).
	servedMu    sync.Mutex
	servedKinds map[schema.GroupVersionKind]bool
	// cached are the caches of the kinds, by kind (SetCached).
	cached map[schema.GroupVersionKind]Cached

	mu    sync.RWMutex
	pools map[string]*Pool
	// coming are, by IPPool name, the ranges of the allocators being
	// built (see ensure), from before their recovery reads the objects
	// until they are in pools: see Covers.
	coming map[string]*ipam.Ranges
	// problems are, by IPPool name, why the last Ensure of the pool's
	// current version failed: a spec that cannot be applied, or a
	// recovery that failed. Only the creates that draw from that pool
	// are refused for it (see serving).
	problems map[string]poolProblem
	// peers are the live holders, as last listed (nil before the first
	// list); peerCounts, what the others among them published of their
	// pools.
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
	// dropped: the Lease was lost once, and the allocators dropped; the
	// caches may lag the API server since (see recoverPool).
	dropped atomic.Bool
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
	if opts.FullResyncInterval == 0 {
		opts.FullResyncInterval = time.Hour
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
		opts: opts, holderLabel: HolderLabelValue(opts.Holder), clock: clk, started: make(chan struct{}), leased: make(chan struct{}), relist: make(chan struct{}, 1), lostOne: make(chan struct{}, 1), pools: map[string]*Pool{}, coming: map[string]*ipam.Ranges{}, problems: map[string]poolProblem{}, takingOver: map[string]bool{},
		lease: newLease(opts.Client, opts.APIReader, opts.Lease),
	}
	r.lease.counts = r.publishedCounts
	if raw, err := json.Marshal(kinds.OrDefault(opts.Kinds)); err == nil {
		r.lease.kinds = string(raw)
	}
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
		// Every admission reads its namespace, and the pool it names:
		// straight from the index.
		if idx, err := cacheindex.For(ctx, r.opts.Informers, &corev1.Namespace{}); err != nil {
			log.Error(err, "Reading namespaces through the cache's client instead of its index")
		} else {
			r.namespaces.Store(idx)
		}
		if idx, err := cacheindex.For(ctx, r.opts.Informers, &vmipamv1.IPPool{}); err != nil {
			log.Error(err, "Reading IPPools through the cache's client instead of its index")
		} else {
			r.ippools.Store(idx)
		}
	}
	close(r.started)
	r.opts.Slot.handOff()
	if err := r.lease.acquire(ctx); err != nil {
		if errors.Is(err, ErrSlotTaken) {
			return fmt.Errorf("holder %s: %w; restart to take a slot anew", r.opts.Holder, err)
		}
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
	// A slot's Lease says that its process drains at once, not at the next
	// renewal: a replacement that looks before then opens no slot, but it
	// settles for a while before it looks again (see TakeSlot).
	var drains <-chan time.Time
	if r.lease.opts.Draining != nil && r.lease.opts.Process != "" {
		t := time.NewTicker(drainPoll)
		defer t.Stop()
		drains = t.C
	}
	var relisted time.Time
	for {
		select {
		case <-drains:
			if !r.lease.opts.Draining() || ctx.Err() != nil {
				continue
			}
			drains = nil
			if err := r.keepLease(ctx); err != nil {
				r.tasks.Wait()
				return err
			}
		case <-ctx.Done():
			// A takeover under way ends with ctx; what it moved is sealed.
			r.tasks.Wait()
			r.shutdown(ctx)
			return nil
		case <-renew.C:
			if err := r.keepLease(ctx); err != nil {
				r.tasks.Wait()
				return err
			}
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

// drainPoll is how often a slot's process looks whether it drains, to say
// so on its Lease at once.
const drainPoll = 100 * time.Millisecond

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

func (r *Registry) warn(pool *vmipamv1.IPPool, reason, msg string) {
	if r.opts.Recorder != nil {
		pool.SetGroupVersionKind(vmipamv1.GroupVersion.WithKind("IPPool"))
		r.opts.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, reason, "Reconcile", "%s", msg)
	}
}
