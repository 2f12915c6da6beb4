package ipam

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"time"
)

// rescanAfter is how long a scan that found nothing to claim is trusted, so
// an exhausted pool does not rescan its whole range on every allocation.
const rescanAfter = time.Second

// Rebalance brings the free list back between the watermarks: below the low
// watermark it claims up to the target; above the high one it returns
// addresses down to the target; and it gives back the surplus, addresses
// out of cooldown that the free list had no room for. Each call makes at
// most one claiming or returning write (plus re-reads on conflict); Run
// calls it again while work is left.
func (m *Manager) Rebalance(ctx context.Context) error {
	m.mu.Lock()
	if !m.ready {
		m.mu.Unlock()
		return nil
	}
	m.advance(m.clock.Now())
	n, surplus := m.free.n, m.surplus.n
	m.mu.Unlock()
	var err error
	switch {
	case n < m.cfg.LowWatermark:
		m.stats.rebalances.Add(1)
		var avail int
		avail, err = m.claim(ctx, m.cfg.TargetFree)
		if err == nil && avail > n && avail < m.cfg.LowWatermark {
			// The block ran out before the target: go on in the next.
			m.Kick()
		}
	case surplus > 0:
		m.stats.rebalances.Add(1)
		err = m.giveBack(ctx, m.pickSurplusLocked)
		m.Kick()
	case n > m.cfg.HighWatermark:
		m.stats.rebalances.Add(1)
		err = m.giveBack(ctx, func() []*entry { return m.pickFreeTailLocked(n - m.cfg.TargetFree) })
	default:
		return nil
	}
	if err != nil {
		m.stats.rebalanceFailures.Add(1)
		return fmt.Errorf("rebalance pool %q: %w", m.cfg.Pool, err)
	}
	return nil
}

// Flush writes every block whose claims or cooldowns changed since it was
// last written: one write per dirty block, however many addresses changed.
func (m *Manager) Flush(ctx context.Context) error {
	m.io.Lock()
	defer m.io.Unlock()
	m.mu.Lock()
	var dirty []netip.Prefix
	for p, b := range m.blocks {
		if b.dirty() {
			dirty = append(dirty, p)
		}
	}
	m.mu.Unlock()
	slices.SortFunc(dirty, netip.Prefix.Compare)
	var errs []error
	for _, p := range dirty {
		var err error
		for range maxStoreRetries {
			if err = m.writeBlock(ctx, p, nil); !errors.Is(err, ErrStoreConflict) {
				break
			}
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Durable reports whether addr's release is already safe from a crash
// without a Flush: the block as last written shows addr claimed by this
// holder, so a restart that finds it on no live machine rests it for the
// pending TTL plus the cooldown (see Recover), longer than the cooldown
// the release started. An address adopted since the last write has no
// stored claim: a restart would find it free, so its release must be
// flushed before the machine that held it may go.
func (m *Manager) Durable(addr netip.Addr) bool {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	bs := m.blocks[BlockOf(addr)]
	if bs == nil || !bs.loaded || bs.returning {
		return false
	}
	h, ok := bs.persisted.holderOf(blockOffset(addr))
	return ok && h == m.cfg.Holder
}

// ReleaseDurable releases addr as Release does and returns once the release
// survives a crash, so that the machine that held addr may go. Usually it
// already does (see Durable) and this costs no write: the release waits for
// the next batched flush. An address adopted since the last write, or one
// whose block a give-back is rewriting, is flushed first.
func (m *Manager) ReleaseDurable(ctx context.Context, addr netip.Addr, owner Owner) error {
	if err := m.Release(addr, owner); err != nil {
		return err
	}
	if m.Durable(addr) {
		return nil
	}
	if err := m.Flush(ctx); err != nil {
		return fmt.Errorf("persist release of %s in pool %q: %w", Canonical(addr), m.cfg.Pool, err)
	}
	return nil
}

// claim fills the free list up to target with never-claimed addresses in
// range order, all from one block so that it is a single write. It returns
// how many addresses the free list then holds: zero means nothing is left.
func (m *Manager) claim(ctx context.Context, target int) (int, error) {
	m.io.Lock()
	defer m.io.Unlock()
	for range maxStoreRetries {
		m.mu.Lock()
		if n := m.free.n; n >= target {
			// Another claim filled the list while this one waited.
			m.mu.Unlock()
			return n, nil
		}
		p, picks, next, load := m.pickLocked(target - m.free.n)
		if len(picks) == 0 && !load {
			n := m.free.n
			m.mu.Unlock()
			return n, nil
		}
		m.mu.Unlock()
		if load {
			if err := m.load(ctx, p); err != nil {
				return 0, err
			}
			continue
		}
		if err := m.writeBlock(ctx, p, picks); err != nil {
			if errors.Is(err, ErrStoreConflict) {
				continue
			}
			return 0, err
		}
		m.mu.Lock()
		m.cursor = next
		for _, a := range picks {
			if m.entries[a] == nil {
				m.free.pushBack(m.addEntry(a, StateFree))
			}
		}
		n := m.free.n
		m.mu.Unlock()
		return n, nil
	}
	return 0, fmt.Errorf("claim addresses: %w after %d attempts", ErrStoreConflict, maxStoreRetries)
}

// claimAddr claims one specific address for Reserve and puts it at the tail
// of the free list, where ordinary allocations reach it last.
func (m *Manager) claimAddr(ctx context.Context, a netip.Addr) error {
	m.io.Lock()
	defer m.io.Unlock()
	p := BlockOf(a)
	for range maxStoreRetries {
		m.mu.Lock()
		if m.entries[a] != nil {
			m.mu.Unlock()
			return nil
		}
		bs := m.blocks[p]
		if bs == nil || !bs.loaded {
			m.mu.Unlock()
			if err := m.load(ctx, p); err != nil {
				return err
			}
			continue
		}
		if h, ok := bs.persisted.holderOf(blockOffset(a)); ok && h != m.cfg.Holder {
			m.mu.Unlock()
			return fmt.Errorf("address %s is claimed by holder %q: %w", a, h, ErrInUse)
		}
		m.mu.Unlock()
		if err := m.writeBlock(ctx, p, []netip.Addr{a}); err != nil {
			if errors.Is(err, ErrStoreConflict) {
				continue
			}
			return err
		}
		m.mu.Lock()
		if m.entries[a] == nil {
			m.free.pushBack(m.addEntry(a, StateFree))
		}
		m.mu.Unlock()
		return nil
	}
	return fmt.Errorf("claim address %s: %w after %d attempts", a, ErrStoreConflict, maxStoreRetries)
}

// pickFreeTailLocked takes up to n free addresses for a give-back: the
// ones freed most recently (those idle the longest stay to be handed out
// first), from the block of the free list's tail, so that it is a single
// write.
func (m *Manager) pickFreeTailLocked(n int) []*entry {
	var picked []*entry
	if t := m.free.tail; t != nil {
		p := BlockOf(t.addr)
		for e := t; e != nil && len(picked) < n; {
			prev := e.prev
			if BlockOf(e.addr) == p {
				m.free.remove(e)
				picked = append(picked, e)
			}
			e = prev
		}
	}
	return picked
}

// pickSurplusLocked takes the surplus addresses of the block of the
// surplus's head, for one give-back write.
func (m *Manager) pickSurplusLocked() []*entry {
	var picked []*entry
	if h := m.surplus.head; h != nil {
		p := BlockOf(h.addr)
		for e := h; e != nil; {
			next := e.next
			if BlockOf(e.addr) == p {
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
		e.state = stateReturning
	}
	m.returning += len(picked)
	p := BlockOf(picked[0].addr)
	bs := m.blocks[p]
	bs.returning = true
	m.mu.Unlock()
	var err error
	for range maxStoreRetries {
		if err = m.writeBlock(ctx, p, nil); !errors.Is(err, ErrStoreConflict) {
			break
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	bs.returning = false
	if err != nil {
		// The write may have landed all the same (a timeout after the
		// commit), so the addresses are given up either way: the next
		// write agrees with the store, and the block is read again
		// before anything trusts what it shows.
		bs.loaded = false
	}
	for _, e := range picked {
		switch {
		case e.state != stateReturning:
			// Adopted or reserved while the write was under way: the
			// write dropped its claim, so claim it again.
			m.markDirty(e.addr)
		case err != nil:
			m.returning--
			m.removeEntry(e)
			m.markDirty(e.addr)
		default:
			m.returning--
			m.removeEntry(e)
		}
	}
	m.forgetIfIdleLocked(p, bs)
	return err
}

// pickLocked finds up to want never-claimed addresses, starting at the
// cursor, inside a single block. It returns the block, the addresses and
// where the cursor goes next; or load=true when the block must first be
// read from the store.
func (m *Manager) pickLocked(want int) (p netip.Prefix, picks []netip.Addr, next netip.Addr, load bool) {
	now := m.clock.Now()
	if now.Before(m.noClaimableUntil) {
		return p, nil, next, false
	}
	r := m.cfg.Ranges
	a, wrapped := m.cursor, false
	for {
		x, ok := r.Next(a)
		if !ok {
			if wrapped {
				break
			}
			wrapped, a = true, r.First()
			continue
		}
		if wrapped && x.Compare(m.cursor) >= 0 {
			break
		}
		p = BlockOf(x)
		bs := m.blocks[p]
		if bs == nil || !bs.loaded {
			return p, nil, next, true
		}
		for ok && BlockOf(x) == p && len(picks) < want {
			if m.entries[x] == nil {
				// Claimed by this holder without an entry: given back by
				// a write that failed, free to take again.
				if h, taken := bs.persisted.holderOf(blockOffset(x)); !taken || h == m.cfg.Holder {
					picks = append(picks, x)
				}
			}
			// After, not Next(x.Next()): it steps from the top of IPv4
			// into the IPv6 ranges and never onto an IPv4-mapped address.
			x, ok = r.After(x)
		}
		if len(picks) > 0 {
			next = x
			if !ok {
				next = r.First()
			}
			return p, picks, next, false
		}
		if a, ok = r.After(lastAddr(p)); !ok {
			// Past the last usable address: wrap around to the start.
			if wrapped {
				break
			}
			wrapped, a = true, r.First()
		}
	}
	m.noClaimableUntil = now.Add(rescanAfter)
	return p, nil, next, false
}

// load reads a block from the store into the cache. Local changes not yet
// written stay marked by the block's generation.
func (m *Manager) load(ctx context.Context, p netip.Prefix) error {
	b, err := m.cfg.Store.Get(ctx, p)
	if err != nil {
		return fmt.Errorf("read block %s of pool %q: %w", p, m.cfg.Pool, err)
	}
	if b.Claims == nil {
		b.Claims = map[string]*Bitmap{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	bs := m.blockFor(p.Addr())
	m.setPersistedLocked(bs, b)
	bs.loaded = true
	// New claims elsewhere may have freed or taken addresses.
	m.noClaimableUntil = time.Time{}
	return nil
}

// setPersistedLocked records b as what the store holds for bs, keeping the
// count of addresses claimed elsewhere current.
func (m *Manager) setPersistedLocked(bs *blockState, b Block) {
	n := 0
	for h, bm := range b.Claims {
		if h == m.cfg.Holder {
			continue
		}
		for _, w := range bm {
			n += bits.OnesCount64(w)
		}
	}
	m.elsewhere += n - bs.elsewhere
	bs.persisted, bs.elsewhere = b, n
}

// forgetIfIdleLocked drops the state of a block that holds nothing and has
// nothing left to write, so that the Manager's map shrinks back as the
// store does.
func (m *Manager) forgetIfIdleLocked(p netip.Prefix, bs *blockState) {
	if bs.ours == 0 && !bs.dirty() && !bs.returning && bs.loaded && bs.persisted.Version == "" &&
		len(bs.persisted.Claims) == 0 && len(bs.persisted.Cooldowns) == 0 && m.blocks[p] == bs {
		delete(m.blocks, p)
	}
}

// writeBlock writes block p as this Manager's state makes it, plus extra
// claims, with compare-and-swap. On a conflict it re-reads the block and
// returns an error matching ErrStoreConflict, for the caller to retry.
func (m *Manager) writeBlock(ctx context.Context, p netip.Prefix, extra []netip.Addr) error {
	m.mu.Lock()
	bs := m.blocks[p]
	if bs == nil || !bs.loaded {
		m.mu.Unlock()
		if err := m.load(ctx, p); err != nil {
			return err
		}
		m.mu.Lock()
		bs = m.blocks[p]
	}
	nb := m.buildLocked(bs, extra)
	gen := bs.gen
	m.mu.Unlock()

	if len(nb.Claims) == 0 && len(nb.Cooldowns) == 0 {
		// Nobody claims anything here: the block goes, and with it the
		// Manager's memory of it.
		var err error
		if nb.Version != "" {
			err = m.cfg.Store.Delete(ctx, p, nb.Version)
			m.stats.writes.Add(1)
		}
		if err != nil {
			return m.writeFailed(ctx, p, fmt.Errorf("delete block %s of pool %q: %w", p, m.cfg.Pool, err))
		}
		m.mu.Lock()
		m.setPersistedLocked(bs, Block{Prefix: p, Claims: map[string]*Bitmap{}})
		bs.written = gen
		m.forgetIfIdleLocked(p, bs)
		m.mu.Unlock()
		return nil
	}
	ver, err := m.cfg.Store.Put(ctx, nb)
	m.stats.writes.Add(1)
	if err != nil {
		return m.writeFailed(ctx, p, fmt.Errorf("write block %s of pool %q: %w", p, m.cfg.Pool, err))
	}
	nb.Version = ver
	m.mu.Lock()
	m.setPersistedLocked(bs, nb)
	bs.written = gen
	m.mu.Unlock()
	return nil
}

// writeFailed re-reads block p after a write lost a compare-and-swap, and
// returns err for the caller to retry.
func (m *Manager) writeFailed(ctx context.Context, p netip.Prefix, err error) error {
	if errors.Is(err, ErrStoreConflict) {
		m.stats.storeConflicts.Add(1)
		if lerr := m.load(ctx, p); lerr != nil {
			return errors.Join(err, lerr)
		}
	}
	return err
}

// buildLocked derives the block to persist from memory: this holder's
// claims are every address it holds in the block (plus extra), its
// cooldowns every address of its cooling down there; other holders' claims
// and cooldowns are kept as read.
func (m *Manager) buildLocked(bs *blockState, extra []netip.Addr) Block {
	nb := bs.persisted.Clone()
	p := nb.Prefix
	if nb.Cooldowns == nil {
		nb.Cooldowns = map[netip.Addr]time.Time{}
	}
	for a := range nb.Cooldowns {
		if h, ok := nb.holderOf(blockOffset(a)); !ok || h == m.cfg.Holder {
			delete(nb.Cooldowns, a)
		}
	}
	ours := new(Bitmap)
	base := toU128(p.Addr())
	is4 := p.Addr().Is4()
	for off := range BlockSize {
		a := fromU128(base.add(uint64(off)), is4)
		e := m.entries[a]
		if e == nil || e.state == stateReturning {
			continue
		}
		ours.Set(off)
		if e.state == StateCooldown {
			nb.Cooldowns[a] = e.at
		}
	}
	for _, a := range extra {
		ours.Set(blockOffset(a))
	}
	if ours.Empty() {
		delete(nb.Claims, m.cfg.Holder)
	} else {
		nb.Claims[m.cfg.Holder] = ours
	}
	return nb
}
