package ipam

import (
	"maps"
	"net/netip"
	"slices"
	"time"
)

// errTokenRequired refuses a reservation without a token.
var errTokenRequired = &FieldError{Path: Path{{Field: "token"}}, Type: ErrorTypeRequired, Detail: "a reservation token is required"}

// pendingLimitLocked refuses a new reservation for a namespace that holds
// as many pending reservations as the pool allows.
func (m *Manager) pendingLimitLocked(ns string) error {
	limit := m.cfg.MaxPendingPerNamespace
	if limit == 0 || m.pendingNS[ns] < limit {
		return nil
	}
	m.stats.pendingLimited.Add(1)
	return &PendingLimitError{Pool: m.cfg.Pool, Namespace: ns, Limit: limit}
}

// Reserved returns the address pending or allocated for token, if any.
func (m *Manager) Reserved(token string) (netip.Addr, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance(m.clock.Now())
	if e := m.byToken[token]; e != nil && (e.state == StatePending || e.state == StateAllocated) {
		return e.addr, true
	}
	return netip.Addr{}, false
}

// Unstored is a reservation that lapsed (its pending TTL passed) without
// its machine being seen. Its address cools down as any handed-out address
// does, unless the caller proves that no object was ever stored with it:
// see Unused.
type Unstored struct {
	Addr      netip.Addr
	Token     string
	Namespace string
	// Deadline is when the reservation lapsed: the create that used it has
	// been stored, or failed, by then, since the pending TTL is longer than
	// the API server's request timeout.
	Deadline time.Time
}

// Unstored returns the lapsed reservations that wait for a proof, in
// address order.
func (m *Manager) Unstored() []Unstored {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance(m.clock.Now())
	out := make([]Unstored, 0, len(m.unstored))
	for _, a := range slices.SortedFunc(maps.Keys(m.unstored), netip.Addr.Compare) {
		out = append(out, m.unstored[a])
	}
	return out
}

// Unused returns the address of a lapsed reservation to the free list at
// once, skipping its cooldown, on the caller's proof that no object carries
// its token or its address: a read of the store of record (a quorum read of
// the API server, not a cache, which may lag) that began at readAt, after
// u.Deadline. Nothing was handed to a machine, so no route, ARP or
// conntrack entry can name the address. It reports false and changes
// nothing when readAt is not after the deadline, or when the address has
// changed since it lapsed (a machine with it was seen, or it was adopted,
// reserved or restarted away).
func (m *Manager) Unused(u Unstored, readAt time.Time) bool {
	u.Addr = Canonical(u.Addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ready {
		return false
	}
	m.advance(m.clock.Now())
	cur, ok := m.unstored[u.Addr]
	e := m.entries[u.Addr]
	if !ok || cur != u || !readAt.After(cur.Deadline) || e == nil || e.state != StateCooldown {
		return false
	}
	m.cooldown.remove(e)
	m.touch(e)
	e.at = time.Time{}
	if m.rest(e) {
		m.Kick()
	}
	// The stored block may show the deadline; the next write drops it.
	m.markDirty(e.addr)
	m.stats.unused.Add(1)
	return true
}

// Used settles a lapsed reservation whose machine was found after all: its
// address keeps the whole cooldown.
func (m *Manager) Used(u Unstored) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.usedLocked(Canonical(u.Addr), u.Token)
}

func (m *Manager) usedLocked(addr netip.Addr, token string) {
	if u, ok := m.unstored[addr]; ok && u.Token == token {
		delete(m.unstored, addr)
	}
}
