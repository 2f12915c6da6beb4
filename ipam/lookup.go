package ipam

import (
	"context"
	"net/netip"
	"sync/atomic"
	"time"
)

// Counts is a consistent snapshot of how many addresses are in each state.
type Counts struct {
	// Usable is the number of usable addresses in the ranges (saturated).
	Usable uint64
	// Claimed is every address this Manager holds, in any state.
	Claimed, Free, Pending, Allocated, Cooldown int
	// ClaimedElsewhere counts addresses other holders claim in the blocks
	// this Manager has read.
	ClaimedElsewhere int
}

// Add returns the sum of c and o: the counts of several Managers (the
// families of one pool) as one. Usable saturates, as a Manager's does.
func (c Counts) Add(o Counts) Counts {
	if c.Usable+o.Usable < c.Usable {
		c.Usable = ^uint64(0)
	} else {
		c.Usable += o.Usable
	}
	c.Claimed += o.Claimed
	c.Free += o.Free
	c.Pending += o.Pending
	c.Allocated += o.Allocated
	c.Cooldown += o.Cooldown
	c.ClaimedElsewhere += o.ClaimedElsewhere
	return c
}

// Stats are the Manager's monotonic counters.
type Stats struct {
	Allocations, Releases, Exhausted, Conflicts, ExpiredPendings uint64
	Rebalances, RebalanceFailures, StoreConflicts, StoreWrites   uint64
	// StoreFailures counts block writes that failed for another reason
	// than a lost compare-and-swap (the API server refused or did not
	// answer); they are retried.
	StoreFailures uint64
	// PendingLimited counts reservations refused by the bound per
	// namespace; Unused, lapsed reservations returned without a cooldown
	// because no object was stored with it.
	PendingLimited, Unused uint64
	// Granted and Received count addresses handed over to and from other
	// holders; TakenOver, addresses taken over from holders that left.
	Granted, Received, TakenOver uint64
	// StoreWaits counts allocations that found no armed address and
	// waited for a store write (arming, a claim, a read or a request to
	// another holder) before they were answered.
	StoreWaits uint64
}

// Add returns the sum of s and o: the counters of several Managers (the
// families of one pool) as one.
func (s Stats) Add(o Stats) Stats {
	s.Allocations += o.Allocations
	s.Releases += o.Releases
	s.Exhausted += o.Exhausted
	s.Conflicts += o.Conflicts
	s.ExpiredPendings += o.ExpiredPendings
	s.Rebalances += o.Rebalances
	s.RebalanceFailures += o.RebalanceFailures
	s.StoreConflicts += o.StoreConflicts
	s.StoreWrites += o.StoreWrites
	s.StoreFailures += o.StoreFailures
	s.PendingLimited += o.PendingLimited
	s.Unused += o.Unused
	s.Granted += o.Granted
	s.Received += o.Received
	s.TakenOver += o.TakenOver
	s.StoreWaits += o.StoreWaits
	return s
}

type stats struct {
	allocations, releases, exhausted, conflicts, expired  atomic.Uint64
	rebalances, rebalanceFailures, storeConflicts, writes atomic.Uint64
	storeFailures                                         atomic.Uint64
	pendingLimited, unused                                atomic.Uint64
	granted, received, takenOver                          atomic.Uint64
	storeWaits                                            atomic.Uint64
}

// Holds reports whether this Manager holds addr (claims it, in any state):
// with several holders, the one that holds an address looks after the
// object that carries it.
func (m *Manager) Holds(addr netip.Addr) bool {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.entries[addr] != nil
}

// Refresh reads addr's block from the store again, so that HolderOf and
// Holds answer from what the store holds now rather than from this
// Manager's last read of it. It is for the controller's rare doubts, not
// for the hot path.
func (m *Manager) Refresh(ctx context.Context, addr netip.Addr) error {
	return m.load(ctx, BlockOf(Canonical(addr)))
}

// HolderOf returns the holder that claims addr as far as this Manager knows:
// itself, or the other holder the store showed when the block was last
// read; false when none.
func (m *Manager) HolderOf(addr netip.Addr) (string, bool) {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries[addr] != nil {
		return m.cfg.Holder, true
	}
	if bs := m.blocks[BlockOf(addr)]; bs != nil && bs.loaded {
		return bs.persisted.holderOf(blockOffset(addr))
	}
	return "", false
}

// SeenHolderOf returns the other holder that claims addr in the last
// version of its block that Observe showed (the watch), if any. The watch
// may lag, so it is a hint for work that another holder does, never a
// reason to hand out, adopt or release anything: the controller asks it
// before reading a block again, to learn that a machine is another
// replica's without a read.
func (m *Manager) SeenHolderOf(addr netip.Addr) (string, bool) {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	off := blockOffset(addr)
	for h, bm := range m.seen[BlockOf(addr)] {
		if bm.Has(off) {
			return h, true
		}
	}
	return "", false
}

// Mark returns a point in the Manager's history: pass it to Resync with a
// list of live objects taken after it.
func (m *Manager) Mark() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seq
}

// CooldownLeft reports how long addr still cools down, by the Manager's
// clock, and false when it is not cooling down.
func (m *Manager) CooldownLeft(addr netip.Addr) (time.Duration, bool) {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	m.advance(now)
	e := m.entries[addr]
	if e == nil || e.state != StateCooldown {
		return 0, false
	}
	return e.at.Sub(now), true
}

// Lookup reports the state of addr and its owner or cooldown deadline.
func (m *Manager) Lookup(addr netip.Addr) (State, Owner, time.Time) {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance(m.clock.Now())
	e := m.entries[addr]
	if e == nil {
		return StateUnclaimed, Owner{}, time.Time{}
	}
	if e.state == stateReturning || e.state == stateSurplus {
		return StateFree, Owner{}, time.Time{}
	}
	return e.state, e.owner, e.at
}

// Snapshot returns the counts per state, taken under the lock so they add
// up. It walks nothing: the counts are kept as the state changes.
func (m *Manager) Snapshot() Counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance(m.clock.Now())
	return m.countsLocked()
}

func (m *Manager) countsLocked() Counts {
	c := Counts{
		Usable:   m.cfg.Ranges.Size(),
		Claimed:  len(m.entries),
		Free:     m.readyList.n + m.free.n + m.surplus.n + m.returning,
		Pending:  m.pending.n,
		Cooldown: m.cooldown.n,
	}
	c.Allocated = c.Claimed - c.Free - c.Pending - c.Cooldown
	c.ClaimedElsewhere = m.elsewhere
	return c
}

// Settles returns when the last pending reservation and the last cooldown
// of the moment will have ended at the latest, or zero when there is none.
func (m *Manager) Settles() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance(m.clock.Now())
	var t time.Time
	if e := m.cooldown.tail; e != nil {
		t = e.at
	}
	if e := m.pending.tail; e != nil {
		if u := e.at.Add(m.cfg.PendingTTL + m.cfg.Cooldown); u.After(t) {
			t = u
		}
	}
	return t
}

// Stats returns the Manager's counters.
func (m *Manager) Stats() Stats {
	s := &m.stats
	return Stats{
		Allocations: s.allocations.Load(), Releases: s.releases.Load(), Exhausted: s.exhausted.Load(),
		Conflicts: s.conflicts.Load(), ExpiredPendings: s.expired.Load(), Rebalances: s.rebalances.Load(),
		RebalanceFailures: s.rebalanceFailures.Load(), StoreConflicts: s.storeConflicts.Load(), StoreWrites: s.writes.Load(), StoreFailures: s.storeFailures.Load(),
		PendingLimited: s.pendingLimited.Load(), Unused: s.unused.Load(),
		Granted: s.granted.Load(), Received: s.received.Load(), TakenOver: s.takenOver.Load(),
		StoreWaits: s.storeWaits.Load(),
	}
}
