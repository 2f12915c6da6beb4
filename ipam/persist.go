package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// rescanAfter is how long a scan that found nothing to claim is trusted, so
// an exhausted pool does not rescan its whole range on every allocation.
const rescanAfter = time.Second

// Rebalance brings the free list back between the watermarks: below the low
// watermark it claims up to the target, above the high one it returns
// addresses down to the target. Each call makes at most one claiming or
// returning write (plus re-reads on conflict); Run calls it again while the
// free list stays out of bounds.
func (m *Manager) Rebalance(ctx context.Context) error {
	m.mu.Lock()
	if !m.ready {
		m.mu.Unlock()
		return nil
	}
	m.advance(m.clock.Now())
	n := m.free.n
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
	case n > m.cfg.HighWatermark:
		m.stats.rebalances.Add(1)
		err = m.giveBack(ctx, n-m.cfg.TargetFree)
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
	m.mu.Lock()
	defer m.mu.Unlock()
	bs := m.blocks[BlockOf(addr)]
	if bs == nil || !bs.loaded || bs.returning {
		return false
	}
	h, ok := bs.persisted.holderOf(blockOffset(addr))
	return ok && h == m.cfg.Holder
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
				e := &entry{addr: a, state: StateFree}
				m.entries[a] = e
				m.free.pushBack(e)
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
			e := &entry{addr: a, state: StateFree}
			m.entries[a] = e
			m.free.pushBack(e)
		}
		m.mu.Unlock()
		return nil
	}
	return fmt.Errorf("claim address %s: %w after %d attempts", a, ErrStoreConflict, maxStoreRetries)
}

// giveBack returns up to n free addresses to the store, the ones freed most
// recently (those idle the longest stay to be handed out first), taken from
// one block so that it is a single write.
func (m *Manager) giveBack(ctx context.Context, n int) error {
	m.io.Lock()
	defer m.io.Unlock()
	m.mu.Lock()
	var picked []*entry
	if t := m.free.tail; t != nil {
		p := BlockOf(t.addr)
		for e := t; e != nil && len(picked) < n; {
			prev := e.prev
			if BlockOf(e.addr) == p {
				m.free.remove(e)
				e.state = stateReturning
				picked = append(picked, e)
			}
			e = prev
		}
	}
	if len(picked) == 0 {
		m.mu.Unlock()
		return nil
	}
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
			delete(m.entries, e.addr)
			m.markDirty(e.addr)
		default:
			delete(m.entries, e.addr)
		}
	}
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
			next = x.Next()
			if !next.IsValid() {
				break
			}
			x, ok = r.Next(next)
		}
		if len(picks) > 0 {
			if !next.IsValid() {
				next = afterTop(p.Addr())
			}
			return p, picks, next, false
		}
		if a = lastAddr(p).Next(); !a.IsValid() {
			// Past the top of the family: IPv4 goes on into the IPv6
			// ranges, IPv6 wraps around to the start.
			if p.Addr().Is4() {
				a = netip.IPv6Unspecified()
			} else {
				if wrapped {
					break
				}
				wrapped, a = true, r.First()
			}
		}
	}
	m.noClaimableUntil = now.Add(rescanAfter)
	return p, nil, next, false
}

// afterTop is where the cursor goes after the highest address of a's
// family: on into the IPv6 ranges after IPv4, back to the start after IPv6.
func afterTop(a netip.Addr) netip.Addr {
	if a.Is4() {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
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
	bs := m.blocks[p]
	if bs == nil {
		bs = &blockState{}
		m.blocks[p] = bs
	}
	bs.persisted, bs.loaded = b, true
	// New claims elsewhere may have freed or taken addresses.
	m.noClaimableUntil = time.Time{}
	return nil
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

	ver, err := m.cfg.Store.Put(ctx, nb)
	m.stats.writes.Add(1)
	if err != nil {
		err = fmt.Errorf("write block %s of pool %q: %w", p, m.cfg.Pool, err)
		if errors.Is(err, ErrStoreConflict) {
			m.stats.storeConflicts.Add(1)
			if lerr := m.load(ctx, p); lerr != nil {
				return errors.Join(err, lerr)
			}
		}
		return err
	}
	nb.Version = ver
	m.mu.Lock()
	bs.persisted = nb
	bs.written = gen
	m.mu.Unlock()
	return nil
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
