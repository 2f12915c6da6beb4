package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// maxClaimRounds bounds how often one allocation claims for an empty free
// list that concurrent allocations keep emptying.
const maxClaimRounds = 64

// Allocate hands out an address for a reservation. It is idempotent: the
// same token gets the same address while its reservation or allocation
// lasts. It writes to the store synchronously only when no armed address is
// left (a burst faster than the background arms them), when the free list
// is empty, or when the pool's free addresses are all another holder's;
// ctx bounds that wait.
func (m *Manager) Allocate(ctx context.Context, r Reservation) (netip.Addr, error) {
	start := m.clock.Now()
	a, err := m.allocate(ctx, r, start)
	if m.cfg.ObserveAllocation != nil {
		m.cfg.ObserveAllocation(m.clock.Now().Sub(start), err)
	}
	return a, err
}

func (m *Manager) allocate(ctx context.Context, r Reservation, now time.Time) (netip.Addr, error) {
	if r.Token == "" {
		return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, errTokenRequired)
	}
	// asked are the blocks asked for addresses: each at most once, and
	// another only while the store shows other holders free addresses
	// (the first asked may have had none to give by the time it read the
	// request).
	var asked map[netip.Prefix]bool
	refreshed, askedAll, readUnread := false, false, false
	// claimedOut: a claim found nothing left to claim. What the view
	// still counts as unclaimed is not tried again until an ask or a read
	// has passed, but other holders are still asked (and blocks read
	// again) before a refusal: the claim's read may just have shown them
	// arming what was unclaimed.
	claimedOut := false
	for attempt := 0; ; attempt++ {
		m.mu.Lock()
		if err := m.servingLocked(now); err != nil {
			m.mu.Unlock()
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, err)
		}
		m.advance(now)
		if e := m.byToken[r.Token]; e != nil {
			m.mu.Unlock()
			return e.addr, nil
		}
		if err := m.pendingLimitLocked(r.Namespace); err != nil {
			m.mu.Unlock()
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, err)
		}
		if e := m.readyList.head; e != nil {
			m.readyList.remove(e)
			m.setPending(e, r, now)
			m.countAllocationLocked(now)
			low, _, _ := m.marksLocked()
			kick := m.readyList.n < (m.armBatchLocked(now)+1)/2 || m.freeLocked() < low
			m.mu.Unlock()
			m.stats.allocations.Add(1)
			if kick {
				m.Kick()
			}
			return e.addr, nil
		}
		unarmed := m.free.n + m.surplus.n
		var claimable uint64
		if !claimedOut {
			claimable = m.claimableLocked()
		}
		// Other holders may hold free addresses: the store showed some
		// that were neither in use nor cooling down there.
		askable := !askedAll && asked == nil && m.othersFree > 0 ||
			// Cooldowns that the store shows at other holders may have
			// ended since it was read: those addresses are free there.
			!askedAll && len(asked) < maxAsks && unarmed == 0 && claimable == 0 && m.elsewhere > 0 && m.othersLocked(now).Free > 0
		// What other holders claim is known from blocks read earlier: before
		// calling the pool exhausted, read those again (at most once a
		// second), since they may have given addresses back since.
		refresh := !refreshed && m.elsewhere > 0 && !now.Before(m.refreshAfter)
		// A block marked unread (a write to it failed or lost a
		// compare-and-swap) is read before any refusal, paced or not: what
		// it shows of others is unknown.
		unread := !readUnread && unarmed == 0 && claimable == 0 && !askable && m.elsewhere > 0 && len(m.unreadElsewhereLocked(nil)) > 0
		if attempt == maxClaimRounds || unarmed == 0 && claimable == 0 && !askable && !refresh && !unread {
			// Nothing is left to claim: say so without scanning, however
			// large the pool.
			err := m.exhaustedLocked()
			m.mu.Unlock()
			m.stats.exhausted.Add(1)
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, err)
		}
		if attempt == 0 {
			m.stats.storeWaits.Add(1)
		}
		var stale []netip.Prefix
		if unarmed == 0 && claimable == 0 && !askable {
			if refresh {
				refreshed, m.refreshAfter = true, now.Add(rescanAfter)
			}
			readUnread = true
			for p, bs := range m.blocks {
				if bs.elsewhere > 0 && (refresh || !bs.loaded) {
					stale = append(stale, p)
				}
			}
		}
		m.mu.Unlock()
		var err error
		switch {
		case len(stale) > 0:
			for _, p := range stale {
				if err = m.load(ctx, p); err != nil {
					break
				}
			}
			// A new view: holders it shows with free addresses are
			// asked, even in blocks asked before (a holder hands over
			// half of what it holds free at a time), and what it shows
			// unclaimed is claimed. There are at most two new views
			// (one refresh, one read of unread blocks).
			asked, askedAll, claimedOut = nil, false, false
		case unarmed > 0:
			// Free addresses, none armed: arm a batch, synchronously.
			err = m.arm(ctx)
		case claimable > 0:
			// The free list is empty: claim synchronously, outside the
			// lock. Whether this claim or a concurrent one refilled the
			// list, try again. A claim that finds nothing leaves only
			// what other holders have.
			var avail int
			_, target, _ := m.targets()
			avail, err = m.claim(ctx, target)
			if err == nil && avail == 0 {
				claimedOut = true
			}
		default:
			// Every address is claimed, some by other holders: ask them.
			if asked == nil {
				asked = map[netip.Prefix]bool{}
			}
			m.mu.Lock()
			before := m.added
			m.asking++
			m.mu.Unlock()
			var p netip.Prefix
			p, err = m.askIn(ctx, netip.Addr{}, asked)
			m.mu.Lock()
			m.asking--
			// Concurrent allocations share one request per block, and
			// the first to see the answer takes it in for all: one whose
			// share was taken by the others asks again, while asks keep
			// bringing addresses. Counting the block as asked refused
			// creates with addresses left at the answering holder.
			// What came is counted as it came, not by the entries held
			// after: the read that takes an answer in leaves it free and
			// unarmed, and this holder's answer to another holder's
			// request may hand it on before an allocation here arms it.
			// The entries were then as many as before, and in a full pool
			// the last free address went from holder to holder, each
			// refusing a create because of it.
			came := m.added > before
			m.mu.Unlock()
			if !came {
				asked[p] = true
				askedAll = askedAll || !p.IsValid()
			}
			// Addresses may have been given back meanwhile.
			claimedOut = false
		}
		if err != nil {
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, err)
		}
	}
}

// unreadElsewhereLocked returns the blocks not in skip where other holders
// claim addresses that are marked to be read again before they are
// trusted, in order.
func (m *Manager) unreadElsewhereLocked(skip map[netip.Prefix]bool) []netip.Prefix {
	var out []netip.Prefix
	for p, bs := range m.blocks {
		if !bs.loaded && bs.elsewhere > 0 && !skip[p] {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// maxAsks bounds the blocks one allocation asks other holders in.
const maxAsks = 3

// Reserve hands out a specific address for a reservation, as for a virtual
// machine that asks for a static address. It is refused while the address
// is pending, allocated or cooling down, with an AddressError that says who
// holds it or until when it cools down. An address this Manager has not
// claimed yet is claimed synchronously; one that another holder holds free
// is asked for, and handed over within ctx's deadline if that holder can.
func (m *Manager) Reserve(ctx context.Context, r Reservation, addr netip.Addr) error {
	now := m.clock.Now()
	addr = Canonical(addr)
	if r.Token == "" {
		return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, errTokenRequired)
	}
	if !m.cfg.Ranges.Contains(addr) {
		return fmt.Errorf("reserve %s in pool %q (usable: %s): %w", addr, m.cfg.Pool, m.cfg.Ranges, ErrOutOfRange)
	}
	for attempt := 0; ; attempt++ {
		if attempt > 4 {
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, ErrConflict)
		}
		m.mu.Lock()
		if err := m.servingLocked(now); err != nil {
			m.mu.Unlock()
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
		}
		m.advance(now)
		if e := m.byToken[r.Token]; e != nil {
			m.mu.Unlock()
			if e.addr == addr {
				return nil
			}
			return fmt.Errorf("reserve %s in pool %q: token %s already holds %s: %w", addr, m.cfg.Pool, r.Token, e.addr, ErrConflict)
		}
		if err := m.pendingLimitLocked(r.Namespace); err != nil {
			m.mu.Unlock()
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
		}
		e := m.entries[addr]
		switch {
		case e == nil:
			m.mu.Unlock()
			if err := m.claimAddr(ctx, addr); err != nil {
				return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
			}
			continue
		case e.state == StateCooldown:
			err := &AddressError{Addr: addr, Reason: ErrCoolingDown, State: e.state, Until: e.at}
			m.mu.Unlock()
			return fmt.Errorf("reserve in pool %q: %w", m.cfg.Pool, err)
		case e.state == StatePending || e.state == StateAllocated:
			err := &AddressError{Addr: addr, Reason: ErrInUse, State: e.state, Owner: e.owner}
			m.mu.Unlock()
			return fmt.Errorf("reserve in pool %q: %w", m.cfg.Pool, err)
		case e.state == stateReturning:
			// Being given back or handed over: wait for that write (it
			// holds io), then look again.
			m.mu.Unlock()
			m.io.Lock()
			m.io.Unlock() //nolint:staticcheck // an empty critical section: waiting for the write in flight
			continue
		case !e.armed:
			// Free, but the store does not show it armed: a crash after
			// handing it out would free it. Arm it first.
			m.mu.Unlock()
			if err := m.armEntries(ctx, addr); err != nil {
				return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
			}
			continue
		}
		m.readyList.remove(e)
		m.setPending(e, r, now)
		m.countAllocationLocked(now)
		m.mu.Unlock()
		m.stats.allocations.Add(1)
		return nil
	}
}

// CanReserve says, without changing anything, whether Reserve of addr
// would be refused because of the address's state: for a dry run. An
// address another holder claims is judged by what the store last showed.
func (m *Manager) CanReserve(addr netip.Addr) error {
	addr = Canonical(addr)
	if !m.cfg.Ranges.Contains(addr) {
		return fmt.Errorf("reserve %s in pool %q (usable: %s): %w", addr, m.cfg.Pool, m.cfg.Ranges, ErrOutOfRange)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.servingLocked(m.clock.Now()); err != nil {
		return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
	}
	m.advance(m.clock.Now())
	e := m.entries[addr]
	if e == nil {
		if bs := m.blocks[BlockOf(addr)]; bs != nil && bs.loaded {
			// Another holder's: a real request asks it, and only it knows.
			// A dry run goes by the cooldown the store shows, which only a
			// proof of an unused reservation can have cut short.
			h, _ := bs.persisted.holderOf(blockOffset(addr))
			if err := storedCooldown(&bs.persisted, addr, h, m.clock.Now()); err != nil {
				return err
			}
			if err := m.elsewhereLocked(&bs.persisted, addr); !errors.Is(err, errAskHolder) {
				return err
			}
		}
		return nil
	}
	switch e.state {
	case StateCooldown:
		return &AddressError{Addr: e.addr, Reason: ErrCoolingDown, State: e.state, Until: e.at}
	case StatePending, StateAllocated:
		return &AddressError{Addr: e.addr, Reason: ErrInUse, State: e.state, Owner: e.owner}
	}
	return nil
}

func (m *Manager) setPending(e *entry, r Reservation, now time.Time) {
	m.touch(e)
	e.state = StatePending
	e.armed, e.arming = false, false
	e.owner = Owner{Token: r.Token, Ref: r.Ref}
	e.ns = r.Namespace
	e.at = now
	m.pending.pushBack(e)
	m.pendingNS[e.ns]++
	m.byToken[r.Token] = e
}

func (m *Manager) exhaustedLocked() error {
	now := m.clock.Now()
	err := &ExhaustedError{Pool: m.cfg.Pool, Family: m.cfg.Family, Counts: m.countsLocked()}
	if e := m.cooldown.head; e != nil {
		err.NextFree = e.at
	} else if e := m.pending.head; e != nil {
		err.NextFree = e.at.Add(m.cfg.PendingTTL + m.cfg.Cooldown)
	}
	if m.elsewhere > 0 {
		// Only when refusing: it walks the blocks read.
		o := m.othersLocked(now)
		err.Others = &o
		if !o.NextFree.IsZero() && (err.NextFree.IsZero() || o.NextFree.Before(err.NextFree)) {
			err.NextFree = o.NextFree
		}
	}
	return err
}

// othersLocked sums what the blocks read show of the other holders'
// addresses at now. The sum walks the blocks, so it is kept until a block
// read or written, a list of live holders, or the end of a cooldown it
// counted changes it: a storm of creates refused in a full pool walks
// them once.
func (m *Manager) othersLocked(now time.Time) Others {
	c := &m.othersCache
	if c.valid && c.persisted == m.persistedSeq && c.peers == m.peersSeq && (c.o.NextFree.IsZero() || now.Before(c.o.NextFree)) {
		return c.o
	}
	o := m.sumOthersLocked(now)
	*c = othersCache{valid: true, persisted: m.persistedSeq, peers: m.peersSeq, o: o}
	return o
}

// othersCache is the last sum of othersLocked, and what it depends on.
type othersCache struct {
	valid            bool
	persisted, peers uint64
	o                Others
}

func (m *Manager) sumOthersLocked(now time.Time) Others {
	var o Others
	holders := map[string]bool{}
	for _, bs := range m.blocks {
		if !bs.loaded || bs.elsewhere == 0 {
			continue
		}
		o.add(&bs.persisted, m.cfg.Holder, m.listedLocked, now, holders)
	}
	return o
}
