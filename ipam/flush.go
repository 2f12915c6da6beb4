package ipam

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"
)

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
		if err := m.retry(ctx, func() error { return m.writeBlock(ctx, p, writePlan{}) }); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Seal prepares a planned handover: the Manager stops serving, gives its
// free addresses (those whose cooldown has ended included) back to the
// pool and writes its exact state, so that whoever recovers its claims
// next (itself after a restart, or another holder taking them over) finds
// only addresses in use or cooling down, and rests none that was free.
// The free addresses are given back rather than kept for the claims' next
// holder: until that holder has recovered (a replacement waits for the
// drain and the seal, then starts), no other replica may touch them, and
// a pool kept busy by cooldowns ran out with a third of its addresses
// free at a replica that was gone. Given back, the other replicas claim
// them at once; the next holder claims what it needs. Each block is
// written once, as a flush would. Call it once no admission can reach
// this Manager any more.
func (m *Manager) Seal(ctx context.Context) error {
	m.mu.Lock()
	// Cooldowns that ended since anything last looked are free, and go
	// back too (unless the fence holds them frozen: then nothing ends).
	m.advance(m.clock.Now())
	m.ready = false
	for e := m.readyList.head; e != nil; e = m.readyList.head {
		m.readyList.remove(e)
		e.armed = false
		m.free.pushBack(e)
		m.markDirty(e.addr)
	}
	m.mu.Unlock()
	// Writes go on whatever the Manager's state is, closed or not; they
	// are refused only when fenced, or when the claims were lost. Each
	// give-back takes one block's free addresses out of the lists; one
	// that failed reads the block back, and what it still shows claimed
	// returns to the free list, free in the store too, as the next
	// holder will read it. The loop stops once a round leaves as many
	// free addresses as before it.
	var errs []error
	for left := -1; ; {
		m.mu.Lock()
		was := left
		left = m.free.n + m.surplus.n
		m.mu.Unlock()
		if left == 0 || left == was {
			break
		}
		// Every free address of one block, surplus too (none is armed
		// any more).
		errs = append(errs, m.giveBack(ctx, func() []*entry {
			return m.pickTailLocked(math.MaxInt, &m.free, &m.surplus)
		}))
	}
	errs = append(errs, m.Flush(ctx))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("seal pool %q: %w", m.cfg.Pool, err)
	}
	return nil
}

// Durable reports whether addr's release is already safe from a crash
// without a Flush: the block as last written shows addr claimed by this
// holder and in use or armed (so a restart, or a holder taking the claims
// over, rests it), or cooling down until no earlier than it does now.
func (m *Manager) Durable(addr netip.Addr) bool {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.entries[addr]
	return e != nil && m.durableLocked(e)
}

func (m *Manager) durableLocked(e *entry) bool {
	bs := m.blocks[BlockOf(e.addr)]
	if bs == nil || !bs.loaded || bs.returning {
		return false
	}
	off, b, h := blockOffset(e.addr), &bs.persisted, m.cfg.Holder
	if !has(b.Claims, h, off) {
		return false
	}
	if !b.Exact || has(b.InUse, h, off) || has(b.Armed, h, off) {
		return true
	}
	d, ok := b.Cooldowns[e.addr]
	return ok && e.state == StateCooldown && !d.Before(e.at.Truncate(time.Second))
}

// flushFor writes addr's block, unless the release of addr became durable
// while this waited for the writes before it (one of them wrote the
// block). Only that block: the others' changes are safe already or wait
// for the next flush, and writing every dirty block for each release that
// needs one made a mass deletion write each block many times over.
func (m *Manager) flushFor(ctx context.Context, addr netip.Addr) error {
	m.io.Lock()
	defer m.io.Unlock()
	if !m.Holds(addr) || m.Durable(addr) {
		return nil
	}
	p := BlockOf(Canonical(addr))
	return m.retry(ctx, func() error { return m.writeBlock(ctx, p, writePlan{}) })
}

// releaseSlack is how long making a release durable may take before its
// cooldown starts again (see ReleaseDurable).
const releaseSlack = 500 * time.Millisecond

// ReleaseDurable releases addr as Release does and returns once the release
// survives a crash, so that the machine that held addr may go. Usually it
// already does (see Durable) and this costs no write. An address adopted
// since the last write, or one whose block a give-back is rewriting, is
// flushed first; should that flush take longer than releaseSlack (writes
// contended, the store slow), the cooldown starts again once it is done,
// and is flushed again, so that it still ends a whole cooldown after the
// machine can go.
func (m *Manager) ReleaseDurable(ctx context.Context, addr netip.Addr, owner Owner) error {
	if err := m.Release(addr, owner); err != nil {
		return err
	}
	for restarts := 0; ; restarts++ {
		if !m.Holds(addr) || m.Durable(addr) {
			return nil
		}
		start := m.clock.Now()
		if err := m.flushFor(ctx, addr); err != nil {
			return fmt.Errorf("persist release of %s in pool %q: %w", Canonical(addr), m.cfg.Pool, err)
		}
		if restarts == 2 || m.clock.Now().Sub(start) < releaseSlack {
			return nil
		}
		if err := m.Release(addr, owner); err != nil {
			return err
		}
	}
}
