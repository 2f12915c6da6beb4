package ipam

import (
	"fmt"
	"net/netip"
	"time"
)

// leavePending takes e out of the pending list and its namespace's count.
func (m *Manager) leavePending(e *entry) {
	m.pending.remove(e)
	if n := m.pendingNS[e.ns] - 1; n > 0 {
		m.pendingNS[e.ns] = n
	} else {
		delete(m.pendingNS, e.ns)
	}
	e.ns = ""
}

// Cancel takes back the pending reservation of token at once, without a
// cooldown, for an admission that made it and is then refused before it
// answers (a dual-stack create that got one family's address and not the
// other's): no object can carry the address, since the only answer that
// could stamp it was never sent. It reports the address, and false when
// the token holds no pending reservation here. The address is free again
// but unarmed: handing it out again first writes its block, as for any
// address that the store may show in use.
func (m *Manager) Cancel(token string) (netip.Addr, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.byToken[token]
	if e == nil || e.state != StatePending {
		return netip.Addr{}, false
	}
	m.leavePending(e)
	delete(m.byToken, token)
	m.touch(e)
	e.owner = Owner{}
	e.at = time.Time{}
	if m.rest(e) {
		m.Kick()
	}
	// A flush since the reservation shows it in use; the next write
	// drops that.
	m.markDirty(e.addr)
	return e.addr, true
}

// Bind binds the pending reservation of o.Token to the machine the cluster
// stored for it, o.UID (o.Ref names it in messages). Binding again to the
// same UID is a no-op.
func (m *Manager) Bind(o Owner) (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.servingLocked(m.clock.Now()); err != nil {
		return netip.Addr{}, fmt.Errorf("bind token %s in pool %q: %w", o.Token, m.cfg.Pool, err)
	}
	m.advance(m.clock.Now())
	e := m.byToken[o.Token]
	if e == nil {
		return netip.Addr{}, fmt.Errorf("bind token %s to %s in pool %q: %w", o.Token, o.UID, m.cfg.Pool, ErrUnknownToken)
	}
	switch {
	case e.state == StatePending:
		m.leavePending(e)
		m.touch(e)
		e.state = StateAllocated
		e.owner.UID = o.UID
		if o.Ref != "" {
			e.owner.Ref = o.Ref
		}
		e.at = time.Time{}
	case e.owner.UID != o.UID:
		m.stats.conflicts.Add(1)
		return netip.Addr{}, fmt.Errorf("bind token %s in pool %q: %w", o.Token, m.cfg.Pool,
			&AddressError{Addr: e.addr, Reason: ErrConflict, State: e.state, Owner: e.owner})
	}
	return e.addr, nil
}

// Release puts an address into cooldown. The owner must match: the UID of
// the virtual machine it is allocated to, or the token of a pending
// reservation. Releasing an address that is free or not held is a no-op,
// so a retried release is harmless. Releasing, for a machine, an address
// already cooling down starts the cooldown again from now: that machine
// still carries it (its finalizer was not removed yet: a retry, or the
// address was taken over or recovered with its release already made), and
// the cooldown must end no earlier than that long after it goes. It only
// ever lengthens a cooldown. A Manager not recovered
// yet, closed or fenced refuses with ErrNotReady: nobody would persist it.
// Bind and Adopt refuse the same way, so that nothing changes a closed
// Manager and a late Flush of it writes nothing stale.
func (m *Manager) Release(addr netip.Addr, owner Owner) error {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	if err := m.servingLocked(now); err != nil {
		// A release here would be lost.
		return fmt.Errorf("release %s in pool %q: %w", addr, m.cfg.Pool, err)
	}
	m.advance(now)
	e := m.entries[addr]
	if e != nil && e.state == StateCooldown && owner.UID != "" {
		if owner.Token != "" {
			// As below: the machine of a lapsed reservation was stored.
			m.usedLocked(addr, owner.Token)
		}
		// A change all the same: a resync whose list was taken before it
		// shows the machine, which is going, and must not adopt its
		// address back.
		m.touch(e)
		if until := now.Add(m.cfg.Cooldown); until.After(e.at) {
			m.cooldown.remove(e)
			e.at = until
			m.cooldown.insertByAt(e)
			m.markDirty(e.addr)
		}
		return nil
	}
	if e == nil || (e.state != StatePending && e.state != StateAllocated) {
		if e != nil && owner.Token != "" {
			// The machine of a lapsed reservation was stored after all:
			// its address keeps the whole cooldown.
			m.usedLocked(addr, owner.Token)
		}
		return nil
	}
	if !owns(e, owner) {
		m.stats.conflicts.Add(1)
		return fmt.Errorf("release in pool %q: %w", m.cfg.Pool, &AddressError{Addr: addr, Reason: ErrConflict, State: e.state, Owner: e.owner})
	}
	m.toCooldown(e, now)
	m.stats.releases.Add(1)
	return nil
}

func owns(e *entry, o Owner) bool {
	if e.state == StateAllocated && o.UID != "" {
		return e.owner.UID == o.UID
	}
	return o.Token != "" && e.owner.Token == o.Token
}
