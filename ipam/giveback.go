package ipam

import (
	"context"
	"net/netip"
	"time"
)

// pickFreeTailLocked takes up to n free addresses for a give-back: the
// ones freed most recently (those idle the longest stay to be handed out
// first), unarmed ones first, from one block, so that it is a single
// write.
func (m *Manager) pickFreeTailLocked(n int) []*entry {
	return m.pickTailLocked(n, &m.free, &m.readyList)
}

// pickTailLocked takes up to n addresses from the tails of lists, in
// order, all of the block of the first one it finds, none being armed.
func (m *Manager) pickTailLocked(n int, lists ...*list) []*entry {
	var picked []*entry
	var p netip.Prefix
	for _, l := range lists {
		for e := l.tail; e != nil && len(picked) < n; {
			prev := e.prev
			if !p.IsValid() {
				p = BlockOf(e.addr)
			}
			if BlockOf(e.addr) == p && !e.arming {
				l.remove(e)
				picked = append(picked, e)
			}
			e = prev
		}
	}
	return picked
}

// surplusDelay is how long a surplus smaller than a batch waits to be
// given back (see surplusDue).
const surplusDelay = 10 * time.Second

// surplusDue reports whether the surplus is to be given back now: once it
// holds batch addresses, or some of it has waited surplusDelay. Addresses
// leave their cooldowns a few at a time, and each give-back is a write of
// the whole block, its cooldowns included: giving each few back at once
// made a mass deletion cost a block write every few releases (262 writes
// for 3,000 machines in make bench). The surplus is free to hand out
// meanwhile, and another holder's request takes from it, so the wait
// costs no one an address.
func (m *Manager) surplusDue(batch int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.surplus.n >= max(batch, 1) || !m.clock.Now().Before(m.surplusSince.Add(surplusDelay))
}

// pickSurplusLocked takes the surplus addresses of the block of the
// surplus's head, for one give-back write.
func (m *Manager) pickSurplusLocked() []*entry {
	var picked []*entry
	if h := m.surplus.head; h != nil {
		p := BlockOf(h.addr)
		for e := h; e != nil; {
			next := e.next
			if BlockOf(e.addr) == p && !e.arming {
				m.surplus.remove(e)
				picked = append(picked, e)
			}
			e = next
		}
	}
	return picked
}

// giveBack returns addresses to the store in one write: pick, called under
// the lock, takes them (all of one block) out of their list.
func (m *Manager) giveBack(ctx context.Context, pick func() []*entry) error {
	m.io.Lock()
	defer m.io.Unlock()
	m.mu.Lock()
	picked := pick()
	if len(picked) == 0 {
		m.mu.Unlock()
		return nil
	}
	for _, e := range picked {
		e.state, e.armed = stateReturning, false
	}
	m.returning += len(picked)
	p := BlockOf(picked[0].addr)
	bs := m.blocks[p]
	bs.returning = true
	m.mu.Unlock()
	err := m.retry(ctx, func() error { return m.writeBlock(ctx, p, writePlan{}) })
	m.mu.Lock()
	m.settleReturningLocked(p, bs, picked, err)
	m.mu.Unlock()
	if err != nil {
		m.reload(ctx, p)
	}
	return err
}

// settleReturningLocked ends a write that gave picked away. A write that
// failed may have landed all the same (a timeout after the commit), so the
// addresses are given up either way, and the block is read again before
// anything trusts what it shows.
func (m *Manager) settleReturningLocked(p netip.Prefix, bs *blockState, picked []*entry, err error) {
	bs.returning = false
	if err != nil {
		bs.loaded = false
	}
	for _, e := range picked {
		m.returning--
		m.removeEntry(e)
		if err != nil {
			m.markDirty(e.addr)
			m.unhanded[e.addr] = true
		}
	}
	m.forgetIfIdleLocked(p, bs)
}
