package ipam

import (
	"time"
)

// Expire moves pending reservations older than the TTL into cooldown and
// cooled-down addresses back to the free list, returning how many pendings
// expired. Allocation does the same lazily; call Expire periodically so the
// counts stay current when nothing allocates.
func (m *Manager) Expire() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.advance(m.clock.Now())
}

// advance applies the passage of time. Pendings expire in reservation order
// and cooldowns end in deadline order, so both walks stop at the first
// entry still in its time.
func (m *Manager) advance(now time.Time) int {
	expired := 0
	for e := m.pending.head; e != nil && !now.Before(e.at.Add(m.cfg.PendingTTL)); e = m.pending.head {
		// The cooldown runs from the moment the reservation lapsed, not
		// from when this walk noticed, so expiry does not depend on load.
		deadline := e.at.Add(m.cfg.PendingTTL)
		u := Unstored{Addr: e.addr, Token: e.owner.Token, Namespace: e.ns, Deadline: deadline}
		m.toCooldown(e, deadline)
		// Kept until the caller proves that no machine was stored with
		// the reservation, or finds one: see Unused.
		m.unstored[u.Addr] = u
		expired++
	}
	if expired > 0 {
		m.stats.expired.Add(uint64(expired))
	}
	if m.fence != nil && m.ready && !m.lost {
		if !m.fence() {
			m.frozen = true
			return expired
		}
		// Renewed after a lapse that no call saw while it lasted: its
		// cooldowns were frozen all the same.
		if m.lapses != nil {
			if n := m.lapses(); n != m.lapsesSeen {
				m.lapsesSeen, m.frozen = n, true
			}
		}
	}
	if m.frozen {
		m.frozen = false
		m.thawLocked(now)
	}
	kick := false
	for e := m.cooldown.head; e != nil && !now.Before(e.at); e = m.cooldown.head {
		m.cooldown.remove(e)
		m.touch(e)
		e.at = time.Time{}
		kick = m.rest(e) || kick
	}
	if _, _, high := m.marksLocked(); kick || m.freeLocked() > high {
		m.Kick()
	}
	return expired
}

// thawLocked ends a time of being fenced: every cooldown that would end
// within a cooldown from now ends a whole cooldown from now instead. While
// fenced (its lease not renewed in time, as in an outage of the API
// server), the Manager refuses releases, so a machine still carrying an
// address could not lengthen its cooldown (see Release), and the cooldown
// could end before the machine goes: the release made again after the
// thaw finds it still cooling down. The cooldowns do not end while fenced
// (advance), and this only ever lengthens one.
func (m *Manager) thawLocked(now time.Time) {
	until := now.Add(m.cfg.Cooldown)
	// The list is sorted by deadline: the entries changed are its head,
	// all given one deadline no later than the rest's.
	for e := m.cooldown.head; e != nil && e.at.Before(until); e = e.next {
		e.at = until
		m.markDirty(e.addr)
	}
}

// rest puts an address that left its cooldown, or was never used, where it
// waits for its next owner: the free list (unarmed), or, when the free list
// already holds its target or the address is alone in its block (a static
// request in a large pool), the surplus that Rebalance gives back to the
// store, so that scattered claims and their blocks do not linger: the free
// list is refilled densely, in range order, instead. It reports whether
// the surplus grew.
func (m *Manager) rest(e *entry) bool {
	e.armed, e.arming = false, false
	if _, target, _ := m.marksLocked(); m.freeLocked() >= target || m.blocks[BlockOf(e.addr)].ours == 1 {
		if m.surplus.n == 0 {
			m.surplusSince = m.clock.Now()
		}
		e.state = stateSurplus
		m.surplus.pushBack(e)
		return true
	}
	e.state = StateFree
	m.free.pushBack(e)
	return false
}

func (m *Manager) toCooldown(e *entry, now time.Time) {
	m.touch(e)
	if e.state == StatePending {
		m.leavePending(e)
	}
	if e.owner.Token != "" && m.byToken[e.owner.Token] == e {
		delete(m.byToken, e.owner.Token)
	}
	e.state = StateCooldown
	e.armed, e.arming = false, false
	e.owner = Owner{}
	e.at = now.Add(m.cfg.Cooldown)
	m.cooldown.insertByAt(e)
	m.markDirty(e.addr)
}
