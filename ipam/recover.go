package ipam

import (
	"context"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
)

// Holding is an address found on a live virtual machine.
type Holding struct {
	Addr  netip.Addr
	Owner Owner
}

// RecoveryReport says what Recover found.
type RecoveryReport struct {
	// Allocated counts live addresses now allocated; Cooldown, claimed
	// addresses on no live machine, now cooling down.
	Allocated, Cooldown int
	// Dropped counts claims outside the pool's current ranges, released.
	Dropped int
	// OutOfRange lists live addresses outside the pool's ranges.
	OutOfRange []Holding
	// Conflicts lists live addresses held by two machines: the first one
	// keeps it, each later one is here.
	Conflicts []error
}

// Recover rebuilds the Manager's state from the store's claims and
// cooldowns and the addresses on live virtual machines, then marks it
// ready. Live addresses become allocated, whoever claimed them. Addresses
// this holder claimed that no live machine carries go into cooldown: they
// may have been handed out just before a crash, to a machine the cluster
// has not stored yet. They rest for the pending TTL plus the cooldown, or
// until their persisted deadline if that is later (say, the cooldown was
// shortened since).
func (m *Manager) Recover(ctx context.Context, live []Holding) (RecoveryReport, error) {
	var rep RecoveryReport
	blocks, err := m.cfg.Store.List(ctx)
	if err != nil {
		return rep, fmt.Errorf("recover pool %q: list blocks: %w", m.cfg.Pool, err)
	}
	m.io.Lock()
	defer m.io.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	m.reset(len(live))
	for _, b := range blocks {
		if b.Claims == nil {
			b.Claims = map[string]*Bitmap{}
		}
		bs := m.blockFor(b.Prefix.Addr())
		m.setPersistedLocked(bs, b)
		bs.loaded = true
		if len(b.Claims) == 0 && len(b.Cooldowns) == 0 {
			// Left empty by an older version: the next flush deletes it.
			bs.gen++
		}
	}
	for _, h := range live {
		h.Addr = Canonical(h.Addr)
		if !m.cfg.Ranges.Contains(h.Addr) {
			rep.OutOfRange = append(rep.OutOfRange, h)
			continue
		}
		if err := m.adoptLocked(h.Addr, h.Owner); err != nil {
			rep.Conflicts = append(rep.Conflicts, err)
			continue
		}
		rep.Allocated++
	}
	// A reservation handed out just before the crash may still see its
	// machine stored for up to the pending TTL, and the cooldown runs from
	// then.
	rest := m.cfg.PendingTTL + m.cfg.Cooldown
	var cooling []*entry
	for p, bs := range m.blocks {
		bm := bs.persisted.Claims[m.cfg.Holder]
		if bm == nil {
			continue
		}
		for w, word := range bm {
			for word != 0 {
				off := w*64 + bits.TrailingZeros64(word)
				word &= word - 1
				a := blockAddr(p, off)
				if m.entries[a] != nil {
					continue
				}
				if !m.cfg.Ranges.Contains(a) {
					bs.gen++
					rep.Dropped++
					continue
				}
				// A persisted deadline only ever lengthens the rest: one
				// that looks shorter may be stale, since an adopted
				// address leaves cooldown early and may be released again
				// before the next flush.
				until := now.Add(rest)
				if d := bs.persisted.Cooldowns[a]; d.After(until) {
					until = d
				} else {
					bs.gen++
				}
				e := m.addEntry(a, StateCooldown)
				e.at = until
				cooling = append(cooling, e)
			}
		}
	}
	slices.SortFunc(cooling, func(a, b *entry) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.addr.Compare(b.addr)
	})
	for _, e := range cooling {
		m.cooldown.pushBack(e)
	}
	rep.Cooldown = len(cooling)
	m.ready = true
	m.Kick()
	return rep, nil
}

// ResyncReport says what Resync changed.
type ResyncReport struct {
	// Released counts addresses allocated to machines no longer live
	// (their finalizer was removed by force), now cooling down.
	Released int
	// Adopted counts live addresses that were not allocated to their
	// machine, now allocated.
	Adopted int
	// Conflicts lists live addresses held by two machines.
	Conflicts []error
}

// Resync reconciles the Manager with a full list of the live machines, taken
// after Mark returned asOf: an address allocated to a UID missing from live
// goes into cooldown, and a live address not allocated to its machine is
// adopted. Entries that changed after asOf are left alone, since the list
// may not show that change yet (a machine bound, or released, while it was
// being taken); so are pending reservations, whose machines may not be
// stored yet.
func (m *Manager) Resync(live []Holding, asOf uint64) ResyncReport {
	var rep ResyncReport
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	m.advance(now)
	uids := make(map[string]bool, len(live))
	for _, h := range live {
		h.Addr = Canonical(h.Addr)
		uids[h.Owner.UID] = true
		if !m.cfg.Ranges.Contains(h.Addr) {
			continue
		}
		e := m.entries[h.Addr]
		if e != nil && (e.changed > asOf || e.state == StateAllocated && e.owner.UID == h.Owner.UID) {
			continue
		}
		if err := m.adoptLocked(h.Addr, h.Owner); err != nil {
			rep.Conflicts = append(rep.Conflicts, err)
			continue
		}
		rep.Adopted++
	}
	for _, e := range m.entries {
		if e.state == StateAllocated && e.changed <= asOf && !uids[e.owner.UID] {
			m.toCooldown(e, now)
			rep.Released++
		}
	}
	if rep.Released > 0 {
		m.stats.releases.Add(uint64(rep.Released))
	}
	return rep
}
