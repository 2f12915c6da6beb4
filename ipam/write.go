package ipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"time"
)

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

// maxStoreRetries bounds the re-reads after store conflicts of one write:
// sized for several holders writing one block at once (a small pool has a
// single block), with a backoff between tries of up to 128ms. A caller
// with a deadline (an admission) stops sooner: see backoff.
const maxStoreRetries = 48

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
	gen, base := bs.gen, nb.Version
	bs.issued = m.nextSeqLocked()
	sent := bs.issued
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
		m.recordWrittenLocked(bs, sent, base, Block{Prefix: p, Claims: map[string]*Bitmap{}})
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
	m.recordWrittenLocked(bs, sent, base, nb)
	bs.written, bs.bound = gen, m.nextSeqLocked()
	m.mu.Unlock()
	return nil
}

// recordWrittenLocked records nb, which a write sent at sequence number
// sent has just put over version base, as what the store holds for bs,
// unless a read applied since shows a newer version. Such a read started
// after the write was sent (see overtakenLocked), so it shows base (the
// write had not landed yet), or the write's version or a later one: the
// write is a compare-and-swap that landed on base. A later one, most
// likely another holder's answer to a request this write made, was
// taken in by that read: the addresses it handed over are held here now.
// Recorded over it, the write's older version showed them as still the
// giver's, and the next write of the block stopped the Manager as if it
// had been taken over (ErrClaimLost). A later version shows this holder
// on every address the write claimed for it (only a takeover takes them
// away); one that does not is older, a block another holder created and
// deleted again before this write created it, and is not kept.
func (m *Manager) recordWrittenLocked(bs *blockState, sent uint64, base string, nb Block) {
	if bs.loaded && bs.bound > sent && bs.persisted.Version != base &&
		covers(bs.persisted.Claims[m.cfg.Holder], nb.Claims[m.cfg.Holder]) {
		return
	}
	m.setPersistedLocked(bs, nb)
}

// covers reports whether every bit of sub is set in super (nil is empty).
func covers(super, sub *Bitmap) bool {
	if sub == nil {
		return true
	}
	if super == nil {
		return sub.Empty()
	}
	for w := range sub {
		if sub[w]&^super[w] != 0 {
			return false
		}
	}
	return true
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
	// The persisted cooldowns are copied below, other holders' only: this
	// holder's come from its entries.
	src := bs.persisted
	src.Cooldowns = nil
	nb := src.Clone()
	nb.Exact = true
	self := m.cfg.Holder
	p := nb.Prefix
	if plan.takeFrom != "" {
		delete(nb.Claims, plan.takeFrom)
		delete(nb.InUse, plan.takeFrom)
		delete(nb.Armed, plan.takeFrom)
		delete(nb.Requests, plan.takeFrom)
	}
	var others Bitmap
	for h, bm := range nb.Claims {
		if h != self {
			for w := range others {
				others[w] |= bm[w]
			}
		}
	}
	// A cooldown only an unclaimed offset or this holder's had is dropped
	// (an entry of this holder's puts its own back).
	nb.Cooldowns = make(map[netip.Addr]time.Time, len(bs.persisted.Cooldowns))
	for a, t := range bs.persisted.Cooldowns {
		if others.Has(blockOffset(a)) {
			nb.Cooldowns[a] = t
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
	bs.held.Each(func(off int) {
		var e *entry
		if bs.index != nil {
			e = bs.index[off]
		} else {
			e = m.entries[fromU128(base.add(uint64(off)), is4)]
		}
		if e != nil && e.state != stateReturning {
			add(e)
		}
	})
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
