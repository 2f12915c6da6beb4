package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"time"
)

// load reads a block from the store into the cache. Local changes not yet
// written stay marked by the block's generation.
func (m *Manager) load(ctx context.Context, p netip.Prefix) error {
	for attempt := 1; ; attempt++ {
		m.mu.Lock()
		since := m.nextSeqLocked()
		m.mu.Unlock()
		b, err := m.cfg.Store.Get(ctx, p)
		if err != nil {
			return fmt.Errorf("read block %s of pool %q: %w", p, m.cfg.Pool, err)
		}
		if b.Claims == nil {
			b.Claims = map[string]*Bitmap{}
		}
		m.mu.Lock()
		if m.overtakenLocked(p, since) {
			// The Manager sent or recorded a write of the block while
			// this read was on its way, or read it since: this read may
			// predate what the Manager knows. Keep that, if it has it;
			// else read again, so that the caller never takes a block
			// it has not read for one nobody claims anything in.
			// Under the lock: a failed write elsewhere may mark it
			// unloaded meanwhile (reload).
			bs := m.blocks[p]
			loaded := bs != nil && bs.loaded
			m.mu.Unlock()
			if loaded {
				return nil
			}
			if attempt == 3 {
				return fmt.Errorf("read block %s of pool %q: overtaken by writes %d times: %w", p, m.cfg.Pool, attempt, ErrStoreConflict)
			}
			continue
		}
		bs := m.blockFor(p.Addr())
		m.setPersistedLocked(bs, b)
		bs.loaded, bs.bound, bs.moved = true, since, false
		m.materializeLocked(bs)
		// New claims elsewhere may have freed or taken addresses.
		m.noClaimableUntil = time.Time{}
		m.mu.Unlock()
		return nil
	}
}

// orphanRest is how long an orphan waits for a resync: as good as forever.
const orphanRest = 100 * 365 * 24 * time.Hour

// materializeLocked makes entries of the addresses the store shows claimed
// by this holder that it holds no entry for: handed over by another holder,
// taken over by a write whose reply was lost, or kept by a give-back that
// failed. One the store shows free is free; one cooling down keeps its
// deadline; one it shows in use or armed may be on a live machine that
// nothing will tell this Manager of again, so it is an orphan: it cools
// down until the next Resync, with every live machine in hand, adopts it
// or starts its rest.
func (m *Manager) materializeLocked(bs *blockState) {
	b := &bs.persisted
	bm := b.Claims[m.cfg.Holder]
	if bm == nil || bs.returning {
		return
	}
	now := m.clock.Now()
	var cooling []*entry
	unheld := bs.unheld(bm)
	unheld.Each(func(off int) {
		a := blockAddr(b.Prefix, off)
		if !m.cfg.Ranges.Contains(a) {
			return
		}
		until, free := m.restUntil(b, m.cfg.Holder, a, off, now)
		if m.unhanded[a] && !b.Cooldowns[a].After(now) {
			// Its claim or give-back failed without an answer and nothing
			// handed it out since: whatever the store shows in use or
			// armed of it is older than that.
			free = true
		}
		e := m.addEntry(a, StateFree)
		if free {
			m.rest(e)
			return
		}
		e.state, e.at = StateCooldown, until
		if has(b.InUse, m.cfg.Holder, off) || has(b.Armed, m.cfg.Holder, off) || !b.Exact {
			e.at, e.orphan = now.Add(orphanRest), true
		}
		cooling = append(cooling, e)
	})
	m.pushCoolingLocked(cooling)
}

// takeWrittenLocked reports whether a, which a write of this Manager has
// just claimed, armed or taken over, is the writer's to record now: held
// by nothing yet, or only as an orphan. A read that lands between the
// write and now (a Refresh, or the read before answering requests that
// the watch's view of the write starts) finds a claimed by this holder,
// armed or in use, with no entry: it makes an orphan, which would wait
// for the next Resync. The writer knows better; the orphan goes. Anything
// else was handed out or given back since, which is newer than the write.
func (m *Manager) takeWrittenLocked(a netip.Addr) bool {
	e := m.entries[a]
	if e == nil {
		return true
	}
	if !e.orphan || e.state != StateCooldown {
		return false
	}
	m.cooldown.remove(e)
	m.removeEntry(e)
	return true
}

// setPersistedLocked records b as what the store holds for bs, keeping the
// count of addresses claimed elsewhere current, and notes requests of
// other holders to answer.
func (m *Manager) setPersistedLocked(bs *blockState, b Block) {
	if b.Version != bs.persisted.Version {
		// A read, or a write of the shared block. A write that kept
		// the version (a store that writes the holder's own part
		// apart) says nothing of what others wrote since.
		bs.moved = false
	}
	n := 0
	for h, bm := range b.Claims {
		if h != m.cfg.Holder {
			n += bm.Count()
		}
	}
	// The free addresses of the other holders, as a hint of where to ask:
	// every cooldown the store shows counts, ended or not (the zero time),
	// since the hint is kept until the block is read again.
	var o Others
	o.add(&b, m.cfg.Holder, func(string) bool { return true }, time.Time{}, nil)
	free := o.Free
	m.elsewhere += n - bs.elsewhere
	m.othersFree += free - bs.othersFree
	bs.persisted, bs.elsewhere, bs.othersFree = b, n, free
	m.persistedSeq++
	// An unhanded address the store shows not claimed by this holder: the
	// write that failed did not land, or was undone since. Whatever the
	// store later shows of it at this holder (taken over, handed over)
	// came after, from a holder that may have handed it out: it is no
	// longer the failed write's echo, to be freed on sight.
	if len(m.unhanded) > 0 {
		mine := b.Claims[m.cfg.Holder]
		for a := range m.unhanded {
			if b.Prefix.Contains(a) && (mine == nil || !mine.Has(blockOffset(a))) {
				delete(m.unhanded, a)
			}
		}
	}
	if b.Version == bs.served {
		return
	}
	for h, r := range b.Requests {
		if h != m.cfg.Holder && r.Asks() && bs.ours > 0 {
			bs.requested, bs.markedFor = true, b.Version
		}
	}
}

// forgetIfIdleLocked drops the state of a block that holds nothing and has
// nothing left to write, so that the Manager's map shrinks back as the
// store does.
func (m *Manager) forgetIfIdleLocked(p netip.Prefix, bs *blockState) {
	if bs.ours == 0 && !bs.dirty() && !bs.returning && bs.loaded && bs.persisted.Version == "" &&
		len(bs.persisted.Claims) == 0 && len(bs.persisted.Cooldowns) == 0 && m.blocks[p] == bs {
		delete(m.blocks, p)
		m.forgotAt = m.nextSeqLocked()
	}
}

// nextSeqLocked numbers a read's start or a write's send or completion.
func (m *Manager) nextSeqLocked() uint64 {
	m.ioSeq++
	return m.ioSeq
}

// overtakenLocked reports whether a read of block p that started at
// sequence number since must not replace what the Manager holds of it.
// Versions of a block cannot be ordered by their resourceVersions, which
// are opaque; but every read goes to the store, so a read shows at least
// the version current when it started. The Manager keeps the sequence
// number its version of the block is known to be as new as (bound), and
// refuses a read that started before it: one older than its own last
// write, or than a read it applied. It also refuses a read that started
// before its last write of the block was sent (issued): that write may
// have landed, or be landing, and such a read would show addresses
// handed over by it as still this holder's. And one that started before a
// block was forgotten, whose state is gone.
func (m *Manager) overtakenLocked(p netip.Prefix, since uint64) bool {
	if bs := m.blocks[p]; bs != nil && (bs.bound > since || bs.issued > since) {
		return true
	}
	return m.forgotAt > since
}
