// Package pools keeps one ipam.Manager per IPPool: it builds and recovers
// them from the cluster's state, runs their background work, picks the
// pool for an object, and keeps each IPPool's status current. The webhook
// and the controller reach the allocators only through a Registry.
package pools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/target"
)

// ErrNotReady means the registry has not loaded every IPPool yet, so it
// cannot tell which pool applies; the caller should retry shortly.
var ErrNotReady = errors.New("vmipam is still recovering its pools")

// Options configure a Registry.
type Options struct {
	// Client reads from the informer cache and writes to the API server.
	Client client.Client
	// APIReader reads from the API server directly (for the blocks).
	APIReader client.Reader
	// Target is the kind given addresses.
	Target target.Target
	// Holder names this replica in the pools' claims; stable across
	// restarts.
	Holder string
	// Clock defaults to the system clock.
	Clock ipam.Clock
	// RunInterval is how often each Manager expires, rebalances and
	// flushes when nothing kicks it. Default 1s.
	RunInterval time.Duration
	// ResyncInterval is how often each pool is reconciled against every
	// live object, catching objects whose finalizer was removed by force.
	// Default 5m.
	ResyncInterval time.Duration
	// StatusInterval is how often pool status is written when it changed.
	// Default 5s.
	StatusInterval time.Duration
	// Recorder records events on pools; optional.
	Recorder events.EventRecorder
	// ObserveAllocation, if set, receives every allocation's latency.
	ObserveAllocation func(pool string, d time.Duration, err error)
	// NoteDuplicate, if set, hears of every duplicate found.
	NoteDuplicate func(pool string)
}

// Pool is one IPPool's allocator.
type Pool struct {
	// Name of the IPPool.
	Name string
	// Manager allocates its addresses.
	Manager *ipam.Manager

	uid        types.UID
	generation int64
	spec       vmipamv1.IPPoolSpec
	selector   labels.Selector
	cancel     context.CancelFunc
	done       chan struct{}

	noteDuplicate func(pool string)

	mu         sync.Mutex
	duplicates []string // the conflicts found by the last resync, for the status
	written    *vmipamv1.IPPoolStatus
}

// Default reports whether the pool is the default pool.
func (p *Pool) Default() bool { return p.spec.Default }

// Registry holds the pools' allocators.
type Registry struct {
	opts    Options
	started chan struct{}
	baseCtx context.Context

	mu    sync.RWMutex
	pools map[string]*Pool
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
	return &Registry{opts: opts, started: make(chan struct{}), pools: map[string]*Pool{}}
}

// Start runs the periodic status and resync loops until ctx ends, then
// stops every pool.
func (r *Registry) Start(ctx context.Context) error {
	r.baseCtx = ctx
	close(r.started)
	status := time.NewTicker(r.opts.StatusInterval)
	defer status.Stop()
	resync := time.NewTicker(r.opts.ResyncInterval)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			// A graceful shutdown persists what is dirty; a crash would
			// not, and recovery is built for that too.
			flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			r.mu.Lock()
			for name, p := range r.pools {
				p.stop()
				if err := p.Manager.Flush(flushCtx); err != nil {
					logf.FromContext(ctx).Error(err, "Flushing pool at shutdown", "pool", name)
				}
				delete(r.pools, name)
			}
			r.mu.Unlock()
			return nil
		case <-status.C:
			for _, p := range r.list() {
				if err := r.writeStatus(ctx, p); err != nil && ctx.Err() == nil {
					logf.FromContext(ctx).Error(err, "Updating pool status", "pool", p.Name)
				}
			}
		case <-resync.C:
			for _, p := range r.list() {
				if err := r.Resync(ctx, p); err != nil && ctx.Err() == nil {
					logf.FromContext(ctx).Error(err, "Resyncing pool", "pool", p.Name)
				}
			}
		}
	}
}

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
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Get returns the named pool, or nil.
func (r *Registry) Get(name string) *Pool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.pools[name]
}

// PoolFor returns the pool whose ranges contain a, or nil.
func (r *Registry) PoolFor(a netip.Addr) *Pool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, p := range r.pools {
		if p.Manager.Ranges().Contains(a) {
			return p
		}
	}
	return nil
}

// Ensure makes the registry's allocator for pool match the pool's current
// generation: it is built and recovered from the cluster on first sight
// and rebuilt when the spec changes. The old allocator stops handing out
// addresses before the new one recovers, so the two never share a moment.
func (r *Registry) Ensure(ctx context.Context, pool *vmipamv1.IPPool) error {
	select {
	case <-r.started:
	case <-ctx.Done():
		return ctx.Err()
	}
	r.mu.RLock()
	old := r.pools[pool.Name]
	r.mu.RUnlock()
	if old != nil && old.uid == pool.UID && old.generation == pool.Generation && old.Manager.Ready() {
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
		// applies to addresses released after the change.
		if err := old.Manager.Flush(ctx); err != nil {
			return fmt.Errorf("persist pool %s before rebuilding its allocator: %w", pool.Name, err)
		}
	}
	live, err := r.liveHoldings(ctx, p.Name, p.Manager.Ranges())
	if err != nil {
		return fmt.Errorf("recover pool %s: %w", pool.Name, err)
	}
	rep, err := p.Manager.Recover(ctx, live)
	if err != nil {
		return fmt.Errorf("recover pool %s: %w", pool.Name, err)
	}
	p.noteConflicts(rep.Conflicts)
	logf.FromContext(ctx).Info("Recovered pool", "pool", pool.Name, "allocated", rep.Allocated,
		"cooldown", rep.Cooldown, "dropped", rep.Dropped, "conflicts", len(rep.Conflicts), "outOfRange", len(rep.OutOfRange))
	for _, c := range rep.Conflicts {
		r.warn(pool, "DuplicateAddress", c.Error())
	}
	runCtx, cancel := context.WithCancel(r.baseCtx)
	p.cancel, p.done = cancel, make(chan struct{})
	go func() {
		defer close(p.done)
		p.Manager.Run(runCtx, r.opts.RunInterval, func(err error) {
			logf.FromContext(runCtx).Error(err, "Persisting pool state", "pool", p.Name)
		})
	}()
	r.mu.Lock()
	r.pools[pool.Name] = p
	r.mu.Unlock()
	return nil
}

// Remove stops and forgets the named pool's allocator.
func (r *Registry) Remove(name string) {
	r.mu.Lock()
	p := r.pools[name]
	delete(r.pools, name)
	r.mu.Unlock()
	if p != nil {
		p.stop()
	}
}

func (p *Pool) stop() {
	p.Manager.Close()
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
}

func (r *Registry) build(pool *vmipamv1.IPPool) (*Pool, error) {
	specs := make([]ipam.RangeSpec, len(pool.Spec.Ranges))
	for i, rg := range pool.Spec.Ranges {
		specs[i] = ipam.RangeSpec{CIDR: rg.CIDR, First: rg.First, Last: rg.Last, Exclude: rg.Exclude}
	}
	ranges, err := ipam.ParseRanges(specs)
	if err != nil {
		return nil, fmt.Errorf("pool %s: spec.%w", pool.Name, err)
	}
	cfg := ipam.Config{
		Pool: pool.Name, Holder: r.opts.Holder, Ranges: ranges,
		Cooldown: pool.Spec.Cooldown.Duration, PendingTTL: pool.Spec.PendingTTL.Duration,
		Store: kubestore.New(r.opts.Client, r.opts.APIReader, pool), Clock: r.opts.Clock,
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
	p := &Pool{Name: pool.Name, Manager: m, uid: pool.UID, generation: pool.Generation, spec: *pool.Spec.DeepCopy(), noteDuplicate: r.opts.NoteDuplicate}
	if pool.Spec.NamespaceSelector != nil {
		if p.selector, err = metav1.LabelSelectorAsSelector(pool.Spec.NamespaceSelector); err != nil {
			return nil, fmt.Errorf("pool %s: spec.namespaceSelector: %w", pool.Name, err)
		}
	}
	return p, nil
}

// Holdings returns the addresses of the pool on live objects, read from
// the informer cache: those stamped with the pool, and unstamped ones
// inside its ranges. Objects being deleted still hold their address until
// the controller releases it.
func (r *Registry) liveHoldings(ctx context.Context, pool string, ranges *ipam.Ranges) ([]ipam.Holding, error) {
	list := r.opts.Target.NewList()
	if err := r.opts.Client.List(ctx, list); err != nil {
		return nil, fmt.Errorf("list %s: %w", r.opts.Target.GVK.Kind, err)
	}
	var out []ipam.Holding
	for i := range list.Items {
		obj := &list.Items[i]
		if obj.GetDeletionTimestamp() != nil && !target.HasFinalizer(obj) {
			continue
		}
		h, stamped, ok := r.holding(obj)
		if !ok {
			continue
		}
		if stamped == pool || stamped == "" && ranges.Contains(h.Addr) {
			out = append(out, h)
		}
	}
	return out, nil
}

// holding reads the address, owner and stamped pool of obj.
func (r *Registry) holding(obj *unstructured.Unstructured) (ipam.Holding, string, bool) {
	addrs, err := r.opts.Target.Addresses(obj)
	if err != nil || len(addrs) == 0 {
		return ipam.Holding{}, "", false
	}
	a, err := netip.ParseAddr(addrs[0])
	if err != nil {
		return ipam.Holding{}, "", false
	}
	ann := obj.GetAnnotations()
	return ipam.Holding{Addr: a, Owner: ipam.Owner{Token: ann[vmipamv1.TokenAnnotation], UID: string(obj.GetUID())}},
		ann[vmipamv1.PoolAnnotation], true
}

// Resync reconciles a pool's allocator with every live object.
func (r *Registry) Resync(ctx context.Context, p *Pool) error {
	if !p.Manager.Ready() {
		return nil
	}
	// Mark before listing: what changes while the list is taken is left
	// for the next resync.
	asOf := p.Manager.Mark()
	live, err := r.liveHoldings(ctx, p.Name, p.Manager.Ranges())
	if err != nil {
		return err
	}
	rep := p.Manager.Resync(live, asOf)
	p.noteConflicts(rep.Conflicts)
	if rep.Released > 0 || rep.Adopted > 0 || len(rep.Conflicts) > 0 {
		logf.FromContext(ctx).Info("Resynced pool", "pool", p.Name, "released", rep.Released, "adopted", rep.Adopted, "conflicts", len(rep.Conflicts))
	}
	for _, c := range rep.Conflicts {
		r.warn(&vmipamv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: p.Name, UID: p.uid}}, "DuplicateAddress", c.Error())
	}
	return nil
}

// NoteConflict records a duplicate the controller found, for the status.
func (p *Pool) NoteConflict(err error) {
	if p.noteDuplicate != nil {
		p.noteDuplicate(p.Name)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.duplicates = append(p.duplicates, err.Error())
}

func (p *Pool) noteConflicts(errs []error) {
	if p.noteDuplicate != nil {
		for range errs {
			p.noteDuplicate(p.Name)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.duplicates = p.duplicates[:0]
	for _, e := range errs {
		p.duplicates = append(p.duplicates, e.Error())
	}
}

func (r *Registry) warn(pool *vmipamv1.IPPool, reason, msg string) {
	if r.opts.Recorder != nil {
		pool.SetGroupVersionKind(vmipamv1.GroupVersion.WithKind("IPPool"))
		r.opts.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, reason, "Reconcile", "%s", msg)
	}
}

// Select picks the pool for an object: the one it names, else the one
// whose namespace selector matches its namespace, else the default pool.
func (r *Registry) Select(ctx context.Context, obj *unstructured.Unstructured) (*Pool, error) {
	name, err := r.opts.Target.Pool(obj)
	if err != nil {
		return nil, err
	}
	if name != "" {
		p := r.Get(name)
		if p == nil {
			if err := r.Ready(ctx); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrNotReady, err)
			}
			return nil, fmt.Errorf("IPPool %q does not exist; create it or name an existing pool", name)
		}
		return p, nil
	}
	if err := r.Ready(ctx); err != nil {
		// A pool that would match may not be loaded yet.
		return nil, fmt.Errorf("%w: %w", ErrNotReady, err)
	}
	var matched []string
	var def *Pool
	for _, p := range r.list() {
		if p.spec.Default {
			def = p
		}
	}
	ns := &corev1.Namespace{}
	if err := r.opts.Client.Get(ctx, client.ObjectKey{Name: obj.GetNamespace()}, ns); err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("read namespace %s: %w", obj.GetNamespace(), err)
	}
	var chosen *Pool
	for _, p := range r.list() {
		if p.selector != nil && !p.selector.Empty() && p.selector.Matches(labels.Set(ns.Labels)) {
			matched = append(matched, p.Name)
			if chosen == nil {
				chosen = p
			}
		}
	}
	switch {
	case len(matched) > 1:
		return nil, fmt.Errorf("namespace %s matches the namespaceSelector of several IPPools (%v); name one in %s",
			obj.GetNamespace(), matched, r.opts.Target.PoolPath())
	case chosen != nil:
		return chosen, nil
	case def != nil:
		return def, nil
	}
	return nil, errors.New("no IPPool applies: name one in " + r.opts.Target.PoolPath() +
		", give a pool a namespaceSelector matching namespace " + obj.GetNamespace() + ", or mark one pool spec.default: true")
}

// Ready reports an error until every IPPool in the cluster has a
// recovered allocator at its current generation.
func (r *Registry) Ready(ctx context.Context) error {
	select {
	case <-r.started:
	default:
		return errors.New("pool registry not started")
	}
	var list vmipamv1.IPPoolList
	if err := r.opts.Client.List(ctx, &list); err != nil {
		return fmt.Errorf("list IPPools: %w", err)
	}
	for _, pool := range list.Items {
		p := r.Get(pool.Name)
		if p == nil || p.generation != pool.Generation || !p.Manager.Ready() {
			return fmt.Errorf("IPPool %s not recovered yet", pool.Name)
		}
	}
	return nil
}

// writeStatus writes a pool's counts and conditions when they changed.
func (r *Registry) writeStatus(ctx context.Context, p *Pool) error {
	if !p.Manager.Ready() {
		return nil
	}
	c := p.Manager.Snapshot()
	st := vmipamv1.IPPoolStatus{
		ObservedGeneration: p.generation,
		Usable:             int64(min(c.Usable, 1<<63-1)),
		Allocated:          int64(c.Allocated),
		Pending:            int64(c.Pending),
		Free:               int64(c.Free),
		Cooldown:           int64(c.Cooldown),
	}
	claimable := c.Usable - uint64(c.Claimed) - uint64(c.ClaimedElsewhere)
	p.mu.Lock()
	dups := append([]string(nil), p.duplicates...)
	written := p.written
	p.mu.Unlock()
	if written != nil {
		st.Conditions = append(st.Conditions, written.Conditions...)
	}
	setCond := func(typ string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: p.generation})
	}
	setCond(vmipamv1.ConditionReady, true, "Recovered", "the allocator has recovered and serves this pool")
	if c.Free == 0 && claimable == 0 {
		setCond(vmipamv1.ConditionExhausted, true, "NoFreeAddress",
			fmt.Sprintf("%d allocated, %d pending, %d cooling down of %d usable", c.Allocated, c.Pending, c.Cooldown, c.Usable))
	} else {
		setCond(vmipamv1.ConditionExhausted, false, "AddressesAvailable", fmt.Sprintf("%d free or unclaimed", uint64(c.Free)+claimable))
	}
	if len(dups) > 0 {
		setCond(vmipamv1.ConditionDuplicateAddress, true, "DuplicateFound", fmt.Sprintf("%d conflicts, first: %s", len(dups), dups[0]))
	} else {
		setCond(vmipamv1.ConditionDuplicateAddress, false, "NoDuplicate", "no two live objects share an address")
	}
	if written != nil && statusEqual(*written, st) {
		return nil
	}
	pool := &vmipamv1.IPPool{}
	if err := r.opts.Client.Get(ctx, client.ObjectKey{Name: p.Name}, pool); err != nil {
		return client.IgnoreNotFound(err)
	}
	if pool.UID != p.uid {
		return nil
	}
	// The whole status as a merge patch, zero counts included, so the
	// printer columns never show an empty cell for 0.
	raw, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		return fmt.Errorf("encode status of IPPool %s: %w", p.Name, err)
	}
	if err := r.opts.Client.Status().Patch(ctx, pool, client.RawPatch(types.MergePatchType, raw)); err != nil {
		return fmt.Errorf("patch status of IPPool %s: %w", p.Name, err)
	}
	p.mu.Lock()
	p.written = &st
	p.mu.Unlock()
	return nil
}

func statusEqual(a, b vmipamv1.IPPoolStatus) bool {
	if a.ObservedGeneration != b.ObservedGeneration || a.Usable != b.Usable || a.Allocated != b.Allocated ||
		a.Pending != b.Pending || a.Free != b.Free || a.Cooldown != b.Cooldown || len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for _, c := range a.Conditions {
		o := meta.FindStatusCondition(b.Conditions, c.Type)
		if o == nil || o.Status != c.Status || o.Reason != c.Reason || o.Message != c.Message {
			return false
		}
	}
	return true
}
