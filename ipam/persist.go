package ipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"
)

// rescanAfter is how long a scan that found nothing to claim is trusted, so
// an exhausted pool does not rescan its whole range on every allocation.
const rescanAfter = time.Second

// ErrClaimLost means the store shows another holder on an address this
// Manager holds: its claims were taken over while it could not tell (see
// SetFence). The Manager serves nothing until it recovers again.
var ErrClaimLost = errors.New("claims taken over by another holder")

// writePlan says what a block write changes beyond what the Manager's
// entries make of the block.
type writePlan struct {
	// claim are addresses to claim for this holder; arm, those of them to
	// arm at once.
	claim, arm []netip.Addr
	// give are addresses handed over to other holders (entries in
	// stateReturning): their bits go to the receiver.
	give map[string][]netip.Addr
	// takeFrom is a holder whose claims in the block this write takes
	// over: adopt are the entries made of them, not yet in the Manager.
	takeFrom string
	adopt    []*entry
	// request replaces this holder's request; answer changes other
	// holders' requests (deleting those left empty).
	request *Request
	answer  map[string]answer
}

// answer is what one holder's answer changes in another holder's request,
// applied to the request as the block shows it at the write: the specific
// addresses it resolved (handed over or refused, with why in refused),
// whether it met the count, or that the requester left (drop). Applied as
// a change, not a whole new request, two holders answering one request
// from versions of the block one behind the other cannot undo each
// other's answer.
type answer struct {
	resolved Bitmap
	refused  map[int]Refusal
	countMet bool
	drop     bool
}

// apply returns r with a applied.
func (a answer) apply(r Request) (Request, bool) {
	if a.drop {
		return Request{}, false
	}
	if r.Addrs != nil {
		left := *r.Addrs
		for w := range left {
			left[w] &^= a.resolved[w]
		}
		r.Addrs = &left
		if left.Empty() {
			r.Addrs = nil
		}
	}
	for off, f := range a.refused {
		if len(r.Refused) >= maxRefusals {
			break // the requester says "in use" without why
		}
		if r.Refused == nil {
			r.Refused = map[int]Refusal{}
		} else {
			r.Refused = maps.Clone(r.Refused)
		}
		r.Refused[off] = f
	}
	if a.countMet {
		r.Count = 0
	}
	return r, true
}

// retry runs write until it succeeds, fails with something other than a
// store conflict, or has conflicted maxStoreRetries times, backing off with
// jitter between attempts so that several holders writing one block spread
// out instead of colliding again.
func (m *Manager) retry(ctx context.Context, write func() error) error {
	var err error
	for i := range maxStoreRetries {
		if err = write(); !errors.Is(err, ErrStoreConflict) {
			return err
		}
		if werr := m.backoff(ctx, i); werr != nil {
			return errors.Join(err, werr)
		}
	}
	return fmt.Errorf("%w after %d attempts", err, maxStoreRetries)
}

// backoff waits before attempt i+1 after a store conflict: exponentially
// from 1ms up to 128ms, with jitter. It gives up at once when the wait
// would end within answerMargin of ctx's deadline, so that an admission
// still answers in time, and when ctx ends.
func (m *Manager) backoff(ctx context.Context, i int) error {
	d := time.Millisecond << min(i, 7)
	d = d/2 + rand.N(d)                                                  //nolint:gosec // jitter, not a secret
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d+answerMargin { //nolint:forbidigo // a context's deadline is real time
		return fmt.Errorf("%w: no time left to try again before the deadline", context.DeadlineExceeded)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-m.cfg.Timers.After(d):
		return nil
	}
}

// Rebalance brings the free list back between the watermarks: below the
// low watermark it claims up to the target; with few armed addresses left
// it arms a batch; it answers other holders' requests, gives back the
// surplus, and above the high watermark returns addresses down to the
// target. Each call makes at most one such write (plus re-reads on
// conflict); Run calls it again while work is left.
func (m *Manager) Rebalance(ctx context.Context) error {
	m.mu.Lock()
	if m.servingLocked(m.clock.Now()) != nil {
		m.mu.Unlock()
		return nil
	}
	m.advance(m.clock.Now())
	low, target, high := m.marksLocked()
	batch := m.armBatchLocked(m.clock.Now())
	n, ready, unarmed, surplus := m.freeLocked(), m.readyList.n, m.free.n+m.surplus.n, m.surplus.n
	requested := m.requestedLocked()
	m.mu.Unlock()
	var err error
	switch {
	case len(requested) > 0:
		// Every block asked in, not one a round: a request nothing can
		// meet stays in its block, and picking one block a round could
		// pick it again and again while another block's request waited.
		m.stats.rebalances.Add(1)
		for _, p := range requested {
			err = errors.Join(err, m.serveRequests(ctx, p))
		}
		m.Kick()
	case n < low && m.claimable() > 0:
		m.stats.rebalances.Add(1)
		var avail int
		avail, err = m.claim(ctx, target)
		if err == nil && avail > n && avail < low {
			// The block ran out before the target: go on in the next.
			m.Kick()
		}
	case ready < (batch+1)/2 && unarmed > 0:
		m.stats.rebalances.Add(1)
		err = m.arm(ctx)
		m.Kick()
	case surplus > 0 && m.surplusDue(high-target):
		m.stats.rebalances.Add(1)
		err = m.giveBack(ctx, m.pickSurplusLocked)
		m.Kick()
	case n > high:
		m.stats.rebalances.Add(1)
		err = m.giveBack(ctx, func() []*entry { return m.pickFreeTailLocked(n - target) })
	default:
		return nil
	}
	if err != nil {
		m.stats.rebalanceFailures.Add(1)
		return fmt.Errorf("rebalance pool %q: %w", m.cfg.Pool, err)
	}
	return nil
}

func (m *Manager) claimable() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.claimableLocked()
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
		if err := m.retry(ctx, func() error { return m.writeBlock(ctx, p, writePlan{}) }); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Seal prepares a planned handover: the Manager stops serving, disarms its
// free addresses and writes its exact state, so that whoever recovers its
// claims next (itself after a restart, or another holder taking them
// over) frees every free address at once instead of resting it. Call it
// once no admission can reach this Manager any more.
func (m *Manager) Seal(ctx context.Context) error {
	m.mu.Lock()
	m.ready = false
	for e := m.readyList.head; e != nil; e = m.readyList.head {
		m.readyList.remove(e)
		e.armed = false
		m.free.pushBack(e)
		m.markDirty(e.addr)
	}
	m.mu.Unlock()
	// Flush writes whatever the Manager's state is, closed or not; it
	// refuses only when fenced, or when the claims were lost.
	if err := m.Flush(ctx); err != nil {
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

// claim fills the free list up to target with never-claimed addresses in
// range order, all from one block so that it is a single write, arming as
// many as the armed batch lacks, unless the list holds the low watermark
// by then. It returns how many addresses the free list then holds: zero
// means nothing is left.
func (m *Manager) claim(ctx context.Context, target int) (int, error) {
	m.io.Lock()
	defer m.io.Unlock()
	m.mu.Lock()
	low, _, _ := m.marksLocked()
	m.mu.Unlock()
	conflicts, refreshed := 0, false
	for range maxStoreRetries {
		m.mu.Lock()
		if err := m.servingLocked(m.clock.Now()); err != nil {
			m.mu.Unlock()
			return 0, err
		}
		if n := m.freeLocked(); n >= target || n > 0 && n >= low {
			// Another claim filled the list while this one waited: a
			// top-up of a few addresses would cost a write of the
			// block, which the block's other holders write too.
			m.mu.Unlock()
			return n, nil
		}
		p, picks, next, load := m.pickLocked(target - m.freeLocked())
		if len(picks) == 0 && !load {
			n := m.freeLocked()
			m.mu.Unlock()
			return n, nil
		}
		if bs := m.blocks[p]; !refreshed && !load && bs != nil && bs.moved {
			// Another holder wrote the block since: a write now would
			// lose its compare-and-swap. Read it first, once.
			refreshed, picks, load = true, nil, true
		}
		armN := min(len(picks), max(m.armBatchLocked(m.clock.Now())-m.readyList.n, 0))
		// Should the write fail, it may have landed all the same; if the
		// store then shows these as ours, nothing handed them out. A
		// successful claim makes entries of them, which clears this.
		for _, a := range picks {
			if m.entries[a] == nil {
				m.unhanded[a] = true
			}
		}
		m.mu.Unlock()
		if load {
			if err := m.load(ctx, p); err != nil {
				return 0, err
			}
			continue
		}
		if err := m.writeBlock(ctx, p, writePlan{claim: picks, arm: picks[:armN]}); err != nil {
			if errors.Is(err, ErrStoreConflict) {
				conflicts++
				// Not landed: they are not ours.
				m.mu.Lock()
				for _, a := range picks {
					if m.entries[a] == nil {
						delete(m.unhanded, a)
					}
				}
				m.mu.Unlock()
				// Another holder wrote the block since it was read: let the
				// holders that collided spread out, then read it and write
				// at once (a wait between the read and the write would
				// only let others in).
				if err := m.backoff(ctx, conflicts-1); err != nil {
					return 0, fmt.Errorf("claim addresses: %w after %d attempts: %w", ErrStoreConflict, conflicts, err)
				}
				continue
			}
			return 0, err
		}
		m.mu.Lock()
		m.cursor = next
		for i, a := range picks {
			if !m.takeWrittenLocked(a) {
				continue
			}
			e := m.addEntry(a, StateFree)
			if i < armN {
				e.armed = true
				m.readyList.pushBack(e)
			} else {
				m.free.pushBack(e)
			}
		}
		n := m.freeLocked()
		m.mu.Unlock()
		return n, nil
	}
	return 0, fmt.Errorf("claim addresses: %w after %d attempts", ErrStoreConflict, maxStoreRetries)
}

// claimAddr claims one specific address, armed, for Reserve or Adopt. An
// address another holder claims is refused if the store shows it in use or
// cooling down there, and asked for otherwise.
func (m *Manager) claimAddr(ctx context.Context, a netip.Addr) error {
	p := BlockOf(a)
	err := func() error {
		m.io.Lock()
		defer m.io.Unlock()
		return m.retry(ctx, func() error {
			m.mu.Lock()
			if bs := m.blocks[p]; m.entries[a] == nil && (bs == nil || !bs.loaded) {
				// Read it and go on at once: a backoff between the read
				// and the write would only let other writers in.
				m.mu.Unlock()
				if err := m.load(ctx, p); err != nil {
					return err
				}
				m.mu.Lock()
			}
			if m.entries[a] != nil {
				m.mu.Unlock()
				return nil
			}
			bs := m.blocks[p]
			if bs == nil || !bs.loaded {
				m.mu.Unlock()
				return fmt.Errorf("block %s of pool %q changed while it was read: %w", p, m.cfg.Pool, ErrStoreConflict)
			}
			if err := m.elsewhereLocked(&bs.persisted, a); err != nil {
				m.mu.Unlock()
				return err
			}
			m.mu.Unlock()
			if err := m.writeBlock(ctx, p, writePlan{claim: []netip.Addr{a}, arm: []netip.Addr{a}}); err != nil {
				return err
			}
			m.mu.Lock()
			// A read between the write and now may have made an orphan of
			// it (claimed and armed, no entry): it is this write's.
			if m.takeWrittenLocked(a) {
				e := m.addEntry(a, StateFree)
				e.armed = true
				m.readyList.pushBack(e)
			}
			m.mu.Unlock()
			return nil
		})
	}()
	if errors.Is(err, errAskHolder) {
		return m.askFor(ctx, a)
	}
	return err
}

// errAskHolder: another live holder claims the address; ask that holder
// for it.
var errAskHolder = errors.New("ask the holder")

// elsewhereLocked says whether an address that the store, as last read,
// shows claimed by another holder can be asked for: errAskHolder when that
// holder is live, whatever the store shows of the address there (its in-use
// bits and cooldowns are as of that holder's last write, which a release or
// a proof of an unused reservation has overtaken since: only the holder
// knows); when it is not live, its cooldown if the store shows one, else a
// HolderError. nil when no other holder claims it.
func (m *Manager) elsewhereLocked(b *Block, a netip.Addr) error {
	h, ok := b.holderOf(blockOffset(a))
	if !ok || h == m.cfg.Holder {
		return nil
	}
	if !m.goneLocked(h) {
		return errAskHolder
	}
	if err := storedCooldown(b, a, h, m.clock.Now()); err != nil {
		return err
	}
	return &HolderError{Addr: a, Holder: h}
}

// storedCooldown is the cooldown of a, claimed by holder h, that block b
// shows at now, or nil.
func storedCooldown(b *Block, a netip.Addr, h string, now time.Time) error {
	if d, ok := b.Cooldowns[a]; ok && d.After(now) {
		return &AddressError{Addr: a, Reason: ErrCoolingDown, State: StateCooldown, Until: d, Holder: h}
	}
	return nil
}

// arm writes the next batch of unarmed free addresses as armed, from the
// block of the first of them, so that they may be handed out.
func (m *Manager) arm(ctx context.Context) error {
	m.io.Lock()
	defer m.io.Unlock()
	m.mu.Lock()
	// Concurrent callers each found the ready list short; the first one
	// refilled it. Arm only up to the batch, so that a crash rests no more.
	batch := m.armBatchLocked(m.clock.Now())
	want := batch - m.readyList.n
	var p netip.Prefix
	var picked []*entry
	for _, l := range []*list{&m.free, &m.surplus} {
		for e, seen := l.head, 0; e != nil && len(picked) < want && seen < 8*batch; e, seen = e.next, seen+1 {
			if !p.IsValid() {
				p = BlockOf(e.addr)
			}
			if BlockOf(e.addr) == p && !e.arming {
				picked = append(picked, e)
			}
		}
	}
	m.mu.Unlock()
	if len(picked) == 0 {
		return nil
	}
	return m.armPicked(ctx, p, picked)
}

// armEntries arms the one free address a, for Reserve.
func (m *Manager) armEntries(ctx context.Context, a netip.Addr) error {
	m.io.Lock()
	defer m.io.Unlock()
	m.mu.Lock()
	e := m.entries[a]
	m.mu.Unlock()
	if e == nil {
		return nil
	}
	return m.armPicked(ctx, BlockOf(a), []*entry{e})
}

// armPicked writes the picked entries of block p armed and, on success,
// moves those still free to the ready list. The caller holds io.
func (m *Manager) armPicked(ctx context.Context, p netip.Prefix, picked []*entry) error {
	m.mu.Lock()
	for _, e := range picked {
		e.arming = true
	}
	m.mu.Unlock()
	err := m.retry(ctx, func() error { return m.writeBlock(ctx, p, writePlan{}) })
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range picked {
		if !e.arming {
			continue // handed out or changed meanwhile
		}
		e.arming = false
		if err != nil || e.armed || m.entries[e.addr] != e {
			continue
		}
		switch e.state {
		case StateFree:
			m.free.remove(e)
		case stateSurplus:
			m.surplus.remove(e)
		default:
			continue
		}
		e.state, e.armed = StateFree, true
		m.readyList.pushBack(e)
	}
	return err
}

// pickFreeTailLocked takes up to n free addresses for a give-back: the
// ones freed most recently (those idle the longest stay to be handed out
// first), unarmed ones first, from one block, so that it is a single
// write.
func (m *Manager) pickFreeTailLocked(n int) []*entry {
	var picked []*entry
	var p netip.Prefix
	for _, l := range []*list{&m.free, &m.readyList} {
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

// pickLocked finds up to want never-claimed addresses, starting at the
// cursor, inside a single block. It returns the block, the addresses and
// where the cursor goes next; or load=true when the block must first be
// read from the store.
//
// With other live holders it looks first in blocks where no other holder
// claims anything, then in blocks that no other holder hands out from (has
// armed addresses in), as far as this Manager knows (its reads of the
// block, and the versions Observe showed it), and only then beside other
// holders. Each holder's claims, arming and flushes then mostly go to
// blocks of its own, and several holders seldom write one block at once.
// The second pass is for pools where every block holds some other
// holder's addresses that it only keeps there (in use on long-lived
// machines, cooling down, or taken over from a replica that left). What
// it knows may be stale either way: a claim in a block another holder
// wrote since fails its compare-and-swap, the block is read, and the next
// pick skips it.
func (m *Manager) pickLocked(want int) (p netip.Prefix, picks []netip.Addr, next netip.Addr, load bool) {
	now := m.clock.Now()
	if now.Before(m.noClaimableUntil) {
		return p, nil, next, false
	}
	passes := []scanPass{anyBlock}
	if len(m.peers) > 1 {
		passes = []scanPass{unclaimedByOthers, unarmedByOthers, anyBlock}
	}
	for _, pass := range passes {
		if p, picks, next, load = m.scanLocked(want, pass); load || len(picks) > 0 {
			return p, picks, next, load
		}
	}
	m.noClaimableUntil = now.Add(rescanAfter)
	return p, nil, next, false
}

// othersArmIn reports whether b shows addresses armed by other holders; a
// block of the old format, which does not say, whether it shows any of
// theirs.
func (m *Manager) othersArmIn(b *Block) bool {
	bms := b.Armed
	if !b.Exact {
		bms = b.Claims
	}
	for h, bm := range bms {
		if h != m.cfg.Holder && !bm.Empty() {
			return true
		}
	}
	return false
}

// scanPass says which blocks a pass of pickLocked may claim in.
type scanPass int

const (
	// unclaimedByOthers: blocks where no other holder claims anything.
	unclaimedByOthers scanPass = iota
	// unarmedByOthers: blocks where no other holder has armed addresses.
	unarmedByOthers
	// anyBlock: every block.
	anyBlock
)

// skipsLocked reports whether pass leaves block p (bs, if loaded) out.
func (m *Manager) skipsLocked(pass scanPass, p netip.Prefix, bs *blockState, loaded bool) bool {
	switch pass {
	case unclaimedByOthers:
		return len(m.seen[p]) > 0 || loaded && bs.elsewhere > 0
	case unarmedByOthers:
		return m.armedIn[p] || loaded && m.othersArmIn(&bs.persisted)
	default:
		return false
	}
}

// scanLocked is one pass of pickLocked.
func (m *Manager) scanLocked(want int, pass scanPass) (p netip.Prefix, picks []netip.Addr, next netip.Addr, load bool) {
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
		loaded := bs != nil && bs.loaded
		skip := m.skipsLocked(pass, p, bs, loaded)
		if !skip && !loaded {
			return p, nil, next, true
		}
		if !skip {
			for ok && BlockOf(x) == p && len(picks) < want {
				if m.entries[x] == nil {
					if _, taken := bs.persisted.holderOf(blockOffset(x)); !taken {
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
		}
		if a, ok = r.After(lastAddr(p)); !ok {
			// Past the last usable address: wrap around to the start.
			if wrapped {
				break
			}
			wrapped, a = true, r.First()
		}
	}
	return netip.Prefix{}, nil, next, false
}

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
	for off := range BlockSize {
		if !bm.Has(off) {
			continue
		}
		a := blockAddr(b.Prefix, off)
		if m.entries[a] != nil || !m.cfg.Ranges.Contains(a) {
			continue
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
			continue
		}
		e.state, e.at = StateCooldown, until
		if has(b.InUse, m.cfg.Holder, off) || has(b.Armed, m.cfg.Holder, off) || !b.Exact {
			e.at, e.orphan = now.Add(orphanRest), true
		}
		cooling = append(cooling, e)
	}
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
	for h, r := range b.Requests {
		if h != m.cfg.Holder && r.Asks() && bs.ours > 0 {
			bs.requested = true
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

// writeBlock writes block p as this Manager's state makes it, changed as
// plan says, with compare-and-swap. On a conflict it re-reads the block and
// returns an error matching ErrStoreConflict, for the caller to retry. A
// fenced Manager writes nothing.
func (m *Manager) writeBlock(ctx context.Context, p netip.Prefix, plan writePlan) error {
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
	if m.fence != nil && !m.fence() || m.lost {
		m.mu.Unlock()
		return fmt.Errorf("write block %s of pool %q: %w", p, m.cfg.Pool, ErrNotReady)
	}
	if bs == nil || !bs.loaded {
		// Forgotten, or read again meanwhile by a read that writes had
		// overtaken: read it again before the next attempt.
		m.mu.Unlock()
		return fmt.Errorf("block %s of pool %q changed while it was read: %w", p, m.cfg.Pool, ErrStoreConflict)
	}
	nb, err := m.buildLocked(bs, plan)
	if errors.Is(err, ErrStoreConflict) {
		m.mu.Unlock()
		return fmt.Errorf("write block %s of pool %q: %w", p, m.cfg.Pool, err)
	}
	if err != nil {
		m.lost = true
		m.mu.Unlock()
		return fmt.Errorf("write block %s of pool %q: %w", p, m.cfg.Pool, err)
	}
	gen := bs.gen
	bs.issued = m.nextSeqLocked()
	m.mu.Unlock()

	if len(nb.Claims) == 0 && len(nb.Cooldowns) == 0 && len(nb.Requests) == 0 {
		// Nobody claims anything here: the block goes, and with it the
		// Manager's memory of it.
		if nb.Version != "" {
			err = m.cfg.Store.Delete(ctx, p, nb.Version)
			m.stats.writes.Add(1)
		}
		if err != nil {
			return m.writeFailed(ctx, p, fmt.Errorf("delete block %s of pool %q: %w", p, m.cfg.Pool, err))
		}
		m.mu.Lock()
		m.setPersistedLocked(bs, Block{Prefix: p, Claims: map[string]*Bitmap{}})
		bs.written, bs.bound = gen, m.nextSeqLocked()
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
	bs.written, bs.bound = gen, m.nextSeqLocked()
	m.mu.Unlock()
	return nil
}

// writeFailed marks block p to be read again after a write lost a
// compare-and-swap, or reads it again after any other failure, and returns
// err for the caller to retry.
func (m *Manager) writeFailed(ctx context.Context, p netip.Prefix, err error) error {
	if errors.Is(err, ErrStoreConflict) {
		// Read it again just before the next attempt, after the backoff,
		// not now: the writers it lost to may write again meanwhile.
		m.stats.storeConflicts.Add(1)
		m.mu.Lock()
		if bs := m.blocks[p]; bs != nil {
			bs.loaded = false
		}
		m.mu.Unlock()
		return err
	}
	// Any other failure may have landed all the same (a reply lost after
	// the commit): read the block again before trusting what it shows, at
	// once if the store answers, so that what landed is known.
	m.stats.storeFailures.Add(1)
	m.mu.Lock()
	bs := m.blocks[p]
	returning := bs != nil && bs.returning
	m.mu.Unlock()
	if !returning {
		m.reload(ctx, p)
	}
	return err
}

// reload reads block p again, or marks it to be read before it is trusted
// when the store does not answer.
func (m *Manager) reload(ctx context.Context, p netip.Prefix) {
	if err := m.load(ctx, p); err != nil {
		m.mu.Lock()
		if bs := m.blocks[p]; bs != nil {
			bs.loaded = false
		}
		m.mu.Unlock()
	}
}

// buildLocked derives the block to persist from memory: this holder's
// claims are every address it holds in the block (plus plan.claim), in use
// those pending or allocated, armed those free and armed (or being armed),
// and its cooldowns every address of its cooling down there. Other holders'
// claims and cooldowns are kept as read, but for what the plan hands over
// or takes over. It refuses, with ErrClaimLost, to write an address another
// holder claims: then this holder's claims were taken over.
func (m *Manager) buildLocked(bs *blockState, plan writePlan) (Block, error) {
	nb := bs.persisted.Clone()
	nb.Exact = true
	self := m.cfg.Holder
	p := nb.Prefix
	if nb.Cooldowns == nil {
		nb.Cooldowns = map[netip.Addr]time.Time{}
	}
	if plan.takeFrom != "" {
		delete(nb.Claims, plan.takeFrom)
		delete(nb.InUse, plan.takeFrom)
		delete(nb.Armed, plan.takeFrom)
		delete(nb.Requests, plan.takeFrom)
	}
	for a := range nb.Cooldowns {
		if h, ok := nb.holderOf(blockOffset(a)); !ok || h == self {
			delete(nb.Cooldowns, a)
		}
	}
	ours, inUse, armed := new(Bitmap), new(Bitmap), new(Bitmap)
	base := toU128(p.Addr())
	is4 := p.Addr().Is4()
	add := func(e *entry) {
		off := blockOffset(e.addr)
		ours.Set(off)
		switch {
		case e.state == StatePending, e.state == StateAllocated, e.orphan:
			// An orphan's deadline is a placeholder: the store goes on
			// saying it may be in use.
			inUse.Set(off)
		case e.state == StateCooldown:
			nb.Cooldowns[e.addr] = e.at
		case e.state == StateFree, e.state == stateSurplus:
			if e.armed || e.arming {
				armed.Set(off)
			}
		}
	}
	for off := range BlockSize {
		if bs.ours == 0 {
			break
		}
		a := fromU128(base.add(uint64(off)), is4)
		if e := m.entries[a]; e != nil && e.state != stateReturning {
			add(e)
		}
	}
	// What this holder holds was its own in a version of the block it
	// wrote or read; another holder on it means a takeover. What it is
	// about to claim or adopt was picked from a version the store may have
	// moved on from: another holder on it means the pick was stale.
	held := *ours
	for _, e := range plan.adopt {
		add(e)
	}
	for _, a := range plan.claim {
		ours.Set(blockOffset(a))
	}
	for _, a := range plan.arm {
		armed.Set(blockOffset(a))
	}
	for w := range ours {
		for h, bm := range nb.Claims {
			if h == self || bm[w]&ours[w] == 0 {
				continue
			}
			if bm[w]&held[w] != 0 {
				return Block{}, fmt.Errorf("holder %q claims addresses this holder holds: %w", h, ErrClaimLost)
			}
			return Block{}, fmt.Errorf("holder %q claimed addresses this holder was about to claim: %w", h, ErrStoreConflict)
		}
	}
	for h, addrs := range plan.give {
		bm := nb.Claims[h]
		if bm == nil {
			bm = new(Bitmap)
			nb.Claims[h] = bm
		}
		for _, a := range addrs {
			bm.Set(blockOffset(a))
		}
	}
	setBitmap(nb.Claims, self, ours)
	if nb.InUse == nil {
		nb.InUse = map[string]*Bitmap{}
	}
	if nb.Armed == nil {
		nb.Armed = map[string]*Bitmap{}
	}
	setBitmap(nb.InUse, self, inUse)
	setBitmap(nb.Armed, self, armed)
	if plan.request != nil {
		if nb.Requests == nil {
			nb.Requests = map[string]Request{}
		}
		nb.Requests[self] = *plan.request
	}
	for h, a := range plan.answer {
		// Answered only while still asked: the block read for this
		// attempt may show the request withdrawn, or already answered.
		if r, asked := nb.Requests[h]; asked {
			if r, keep := a.apply(r); keep {
				nb.Requests[h] = r
			} else {
				delete(nb.Requests, h)
			}
		}
	}
	for h, r := range nb.Requests {
		if r.empty() || h != self && m.goneLocked(h) {
			delete(nb.Requests, h)
		}
	}
	return nb, nil
}

func setBitmap(m map[string]*Bitmap, h string, bm *Bitmap) {
	if bm.Empty() {
		delete(m, h)
	} else {
		m[h] = bm
	}
}
