package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"time"
)

// Adopt makes addr allocated to owner whatever its state, because a live
// virtual machine carries it: the cluster's objects are the truth. An
// address another UID holds is a conflict, reported and left as it is. A
// pending reservation of another token is displaced: if its machine ever
// appears, adopting it reports the conflict. An address no holder claims is
// claimed first, in the store; one another holder claims is refused with
// ErrHeldElsewhere: that holder adopts it.
func (m *Manager) Adopt(ctx context.Context, addr netip.Addr, owner Owner) error {
	addr = Canonical(addr)
	if !m.cfg.Ranges.Contains(addr) {
		return fmt.Errorf("adopt %s in pool %q (usable: %s): %w", addr, m.cfg.Pool, m.cfg.Ranges, ErrOutOfRange)
	}
	for attempt := 0; ; attempt++ {
		m.mu.Lock()
		if err := m.servingLocked(m.clock.Now()); err != nil {
			m.mu.Unlock()
			return fmt.Errorf("adopt %s in pool %q: %w", addr, m.cfg.Pool, err)
		}
		m.advance(m.clock.Now())
		e := m.entries[addr]
		switch {
		case e != nil && e.state != stateReturning:
			err := m.adoptLocked(addr, owner)
			m.mu.Unlock()
			return err
		case attempt > 4:
			m.mu.Unlock()
			return fmt.Errorf("adopt %s in pool %q: %w", addr, m.cfg.Pool, ErrConflict)
		case e != nil:
			// Being given back or handed over: wait for that write.
			m.mu.Unlock()
			m.io.Lock()
			m.io.Unlock() //nolint:staticcheck // an empty critical section: waiting for the write in flight
			continue
		}
		m.mu.Unlock()
		// Claimed in the store before it is ours: no other holder may hold
		// it at the same time.
		if err := m.claimAddr(ctx, addr); err != nil {
			return fmt.Errorf("adopt %s in pool %q: %w", addr, m.cfg.Pool, err)
		}
	}
}

func (m *Manager) adoptLocked(addr netip.Addr, owner Owner) error {
	e := m.entries[addr]
	switch {
	case e == nil:
		e = m.addEntry(addr, StateAllocated)
		// Claimed without a write of its own (only Recover, which writes
		// before it serves, does this).
		m.markDirty(addr)
	case e.state == StateAllocated:
		if e.owner.UID == owner.UID {
			return nil
		}
		m.stats.conflicts.Add(1)
		return fmt.Errorf("adopt in pool %q: %w", m.cfg.Pool, &AddressError{Addr: addr, Reason: ErrConflict, State: e.state, Owner: e.owner})
	case e.state == StatePending:
		m.leavePending(e)
		if e.owner.Token != owner.Token {
			delete(m.byToken, e.owner.Token)
		}
	case e.state == StateFree:
		m.listOf(e).remove(e)
	case e.state == stateSurplus:
		m.surplus.remove(e)
	case e.state == StateCooldown:
		m.cooldown.remove(e)
	}
	m.touch(e)
	// The store must show it in use before the machine may go: the next
	// write says so (ReleaseDurable flushes until it does).
	m.markDirty(addr)
	e.state = StateAllocated
	e.armed, e.arming = false, false
	e.owner = owner
	e.at = time.Time{}
	if owner.Token != "" {
		if other := m.byToken[owner.Token]; other != nil && other != e {
			// The token's reservation went elsewhere; the live machine wins.
			m.dropToken(other)
		}
		m.byToken[owner.Token] = e
	}
	return nil
}

// dropToken forgets the token of a pending reservation displaced by a live
// machine, sending the address to cooldown since it was handed out.
func (m *Manager) dropToken(e *entry) {
	if e.state == StatePending {
		m.toCooldown(e, m.clock.Now())
	}
}
