package pools

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
)

// sealTimeout bounds the final writes of a planned shutdown.
const sealTimeout = 10 * time.Second

// keepLease renews this replica's Lease, tells the allocators who the live
// holders are, and takes over the claims of holders that left. A Lease
// lost to another holder (this one was taken over while it could not
// renew) drops every allocator: they recover anew once the Lease is held
// again. A holder slot another process took (ErrSlotTaken) is returned:
// the process must stop.
func (r *Registry) keepLease(ctx context.Context) error {
	log := logf.FromContext(ctx)
	lapsed := r.lease.lapsed()
	switch err := r.lease.renew(ctx); {
	case errors.Is(err, errLost):
		log.Info("The holder lease was taken over: recovering every pool anew", "holder", r.opts.Holder)
		r.dropAll()
		if err := r.lease.acquire(ctx); err != nil {
			if errors.Is(err, ErrSlotTaken) {
				return fmt.Errorf("holder %s: %w; restart to take a slot anew", r.opts.Holder, err)
			}
			return nil
		}
		r.ensureAll(ctx)
		return nil
	case err != nil && ctx.Err() == nil:
		log.Error(err, "Renewing the holder lease", "holder", r.opts.Holder, "stillValid", r.lease.valid())
		return nil
	case lapsed > 0:
		// Fenced meanwhile: the allocators handed out nothing, and their
		// cooldowns waited (see ipam.Manager.SetFence).
		log.Info("Renewed the holder lease after it lapsed", "holder", r.opts.Holder, "lapsedFor", lapsed.Round(time.Millisecond).String())
	}
	r.listPeers(ctx)
	// A lost allocator whose write went unheard (one that found the
	// takeover while it had nothing to write) is rebuilt here at the
	// latest.
	r.rebuildLost(ctx)
	return nil
}

// rebuildLost rebuilds, off the renewal loop, the allocator of every pool
// whose claims another holder took over (see ipam.Manager.Lost): it can
// write nothing more, and nothing else would rebuild it until the IPPool
// changed. The rebuild recovers the pool from the store and the objects,
// as a restart would.
func (r *Registry) rebuildLost(ctx context.Context) {
	var lost []string
	for _, p := range r.list() {
		if p.lost() {
			lost = append(lost, p.name)
		}
	}
	if len(lost) == 0 || !r.rebuilding.CompareAndSwap(false, true) {
		return
	}
	r.tasks.Go(func() {
		defer r.rebuilding.Store(false)
		log := logf.FromContext(ctx)
		for _, name := range lost {
			pool := &vmipamv1.IPPool{}
			if err := r.opts.Client.Get(ctx, client.ObjectKey{Name: name}, pool); err != nil {
				log.Error(err, "Reading a pool to rebuild its allocator", "pool", name)
				continue
			}
			log.Info("Another holder took over claims this replica held: rebuilding the pool's allocator", "pool", name)
			if err := r.Ensure(ctx, pool); err != nil && ctx.Err() == nil {
				log.Error(err, "Rebuilding a pool's allocator", "pool", name)
			}
		}
	})
}

// listPeers lists the holder Leases, tells the allocators who the live
// holders are, and takes over the claims of holders that left.
func (r *Registry) listPeers(ctx context.Context) {
	log := logf.FromContext(ctx)
	select {
	case <-r.leased:
	default:
		return // not one of them yet
	}
	peers, err := r.lease.peers(ctx)
	if err != nil {
		// A list cut short by the shutdown is no error.
		if ctx.Err() == nil {
			log.Error(err, "Listing the holder leases")
		}
		return
	}
	var live []string
	counts := map[string]map[string]holderCounts{}
	for _, p := range peers {
		if p.live {
			live = append(live, p.holder)
			if p.holder != r.opts.Holder && p.counts != nil {
				counts[p.holder] = p.counts
			}
		}
	}
	r.mu.Lock()
	changed := !slices.Equal(live, r.peers)
	r.peers, r.peerCounts = live, counts
	r.mu.Unlock()
	if changed {
		log.Info("Live holders", "holders", live)
	}
	// Every list, changed or not: an allocator judges a holder it saw in
	// a block, but no list named, gone only after a list taken since.
	for _, p := range r.list() {
		p.setPeers(live)
	}
	// Take others over only once this holder has renewed in time for a
	// whole lease duration: after an outage every holder first gets the
	// time to renew its own Lease.
	if r.lease.heldFor() < r.lease.opts.Duration || r.Ready(ctx) != nil {
		return
	}
	for _, p := range peers {
		if !p.leaving || p.holder == r.opts.Holder {
			continue
		}
		// Off the renewal loop: a takeover of many pools can outlast the
		// renew deadline, and this holder must keep its own Lease
		// meanwhile.
		r.mu.Lock()
		busy := r.takingOver[p.holder]
		if !busy {
			r.takingOver[p.holder] = true
		}
		r.mu.Unlock()
		if busy {
			continue
		}
		r.tasks.Add(1)
		go func() {
			defer r.tasks.Done()
			defer func() {
				r.mu.Lock()
				delete(r.takingOver, p.holder)
				r.mu.Unlock()
			}()
			// One takeover at a time: each stages its writes from the
			// blocks it listed, and a second one under way would find
			// the first's claims in them and take this holder for lost.
			r.takeoverMu.Lock()
			defer r.takeoverMu.Unlock()
			r.takeover(ctx, p)
		}()
	}
}

// takeover moves the claims of a holder that left to this one, in every
// pool, and deletes its Lease once all of them moved.
func (r *Registry) takeover(ctx context.Context, p peer) {
	log := logf.FromContext(ctx)
	mark, err := r.lease.claimTakeover(ctx, p)
	if err != nil {
		log.V(1).Info("Another holder takes it over", "holder", p.holder, "reason", err.Error())
		return
	}
	// Every write of the takeover stops once the mark is not held.
	markCtx, stop := context.WithCancelCause(ctx)
	held := make(chan *coordinationv1.Lease, 1)
	go func() { held <- r.lease.holdTakeover(markCtx, mark, stop) }()
	release := func() *coordinationv1.Lease {
		stop(nil)
		return <-held
	}
	log.Info("Taking over a holder that left", "holder", p.holder)
	all := r.list()
	ranges := make(map[string]*ipam.Ranges, len(all))
	for _, pool := range all {
		ranges[pool.name] = pool.ranges
	}
	by, err := r.liveIn(markCtx, ranges)
	if err != nil {
		release()
		log.Error(err, "Taking over a holder's claims", "holder", p.holder)
		return
	}
	done := true
	var moved []*Pool
	for _, pool := range all {
		rep, err := pool.takeover(markCtx, p.holder, by[pool.name].holdings)
		if rep.Blocks > 0 {
			log.Info("Took over a holder's claims", "holder", p.holder, "pool", pool.name,
				"allocated", rep.Allocated, "free", rep.Free, "cooldown", rep.Cooldown, "blocks", rep.Blocks)
		}
		if err != nil {
			done = false
			if cause := context.Cause(markCtx); cause != nil && ctx.Err() == nil {
				err = fmt.Errorf("%w (stopped: %w)", err, cause)
			}
			log.Error(err, "Taking over a holder's claims", "holder", p.holder, "pool", pool.name)
			continue
		}
		moved = append(moved, pool)
	}
	last := release()
	if done && errors.Is(context.Cause(markCtx), context.Canceled) {
		if err := r.lease.finishTakeover(ctx, last); err != nil {
			log.Error(err, "Deleting the lease of a holder taken over", "holder", p.holder)
		}
	}
	// The objects it looked after are this replica's now, but only once
	// labelled does this replica's watch see them. A deletion of one waits
	// for its finalizer until then. A pool not taken over whole is left to
	// the next try, or to the holder if it came back.
	for _, pool := range moved {
		r.relabel(ctx, pool, by[pool.name].elsewhere)
	}
}

// dropAll stops every allocator and forgets it.
func (r *Registry) dropAll() {
	r.dropped.Store(true)
	r.recovered.Store(false)
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, p := range r.pools {
		p.stop()
		delete(r.pools, name)
	}
}

// ensureAll builds and recovers an allocator for every IPPool.
func (r *Registry) ensureAll(ctx context.Context) {
	var list vmipamv1.IPPoolList
	if err := r.opts.Client.List(ctx, &list); err != nil {
		logf.FromContext(ctx).Error(err, "Listing IPPools to recover them")
		return
	}
	for i := range list.Items {
		if err := r.Ensure(ctx, &list.Items[i]); err != nil {
			logf.FromContext(ctx).Error(err, "Recovering pool", "pool", list.Items[i].Name)
		}
	}
}

// shutdown seals every pool (its free addresses given back to the pool,
// its exact state written, nothing armed) and releases the Lease, so that
// whoever takes the claims over rests nothing that was free, and the other
// replicas can claim the free addresses meanwhile. A crash skips this;
// recovery is built for that too.
func (r *Registry) shutdown(ctx context.Context) {
	log := logf.FromContext(ctx)
	sealCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sealTimeout)
	defer cancel()
	sealed := true
	r.mu.Lock()
	for name, p := range r.pools {
		p.stop()
		if err := p.seal(sealCtx); err != nil {
			sealed = false
			log.Error(err, "Sealing pool at shutdown", "pool", name)
		}
		delete(r.pools, name)
	}
	r.mu.Unlock()
	if !sealed {
		// Leave the Lease to lapse: the holder taking over then rests
		// what may be in use, as after a crash.
		return
	}
	if err := r.lease.release(sealCtx); err != nil {
		log.Error(err, "Releasing the holder lease")
		return
	}
	log.Info("Sealed every pool and released the holder lease", "holder", r.opts.Holder)
}

// watchBlocks has the allocators observe every IPBlock change, so that they
// answer other holders' requests for addresses at once.
func (r *Registry) watchBlocks(ctx context.Context) {
	if r.opts.Informers == nil {
		return
	}
	inf, err := r.opts.Informers.GetInformer(ctx, &vmipamv1.IPBlock{})
	if err != nil {
		logf.FromContext(ctx).Error(err, "Watching IPBlocks; requests for addresses are answered only when blocks are read")
		return
	}
	observe := func(obj any, deleted bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		blk, ok := obj.(*vmipamv1.IPBlock)
		if !ok {
			return
		}
		p := r.Get(blk.Spec.Pool)
		if p == nil {
			return
		}
		b, err := kubestore.EncodedOf(blk).Decode(blk.ResourceVersion)
		if err != nil {
			return
		}
		if deleted {
			// Gone: nobody claims anything there any more.
			b = ipam.Block{Prefix: b.Prefix}
		}
		r.noteAskers(b)
		p.observe(b)
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { observe(obj, false) },
		UpdateFunc: func(_, obj any) { observe(obj, false) },
		DeleteFunc: func(obj any) { observe(obj, true) },
	})
}

// noteAskers lists the live holders again soon when a block shows a
// request of a holder the last list did not name: one that started since
// (its request is answered only once a list names it, and it waits for
// the answer for a few seconds at most), or one that left.
func (r *Registry) noteAskers(b ipam.Block) {
	if len(b.Requests) == 0 {
		return
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	for h := range b.Requests {
		if h != r.opts.Holder && !slices.Contains(r.peers, h) {
			select {
			case r.relist <- struct{}{}:
			default:
			}
			return
		}
	}
}

// Holder returns this replica's holder.
func (r *Registry) Holder() string { return r.opts.Holder }

// Live reports whether holder is a live holder, this one included.
func (r *Registry) Live(holder string) bool {
	if holder == r.opts.Holder {
		return true
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Contains(r.peers, holder)
}

// Chosen reports whether this replica is the one, of the live holders, to
// look after work no holder owns yet, keyed by key (an object's UID): the
// one with the highest rendezvous hash of key and its name, so that the
// choice moves only for the keys of a holder that comes or goes.
func (r *Registry) Chosen(key string) bool {
	r.mu.RLock()
	peers := r.peers
	r.mu.RUnlock()
	if len(peers) == 0 {
		return true
	}
	best, bestScore := "", uint64(0)
	for _, h := range peers {
		f := fnv.New64a()
		_, _ = f.Write([]byte(h + "\x00" + key))
		if s := f.Sum64(); best == "" || s > bestScore {
			best, bestScore = h, s
		}
	}
	return best == r.opts.Holder
}
