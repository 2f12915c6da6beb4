package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Holding is an address found on a live virtual machine.
type Holding struct {
	Addr  netip.Addr
	Owner Owner
	// Going says that the machine is being deleted: its address, once
	// cooling down, was released for it, and is not adopted back.
	Going bool
}

// RecoveryReport says what Recover found.
type RecoveryReport struct {
	// Allocated counts live addresses now allocated; Cooldown, claimed
	// addresses on no live machine, now cooling down (some of them only
	// resting, because a crash may have left them in use); Free, claimed
	// addresses the store shows free, free again at once.
	Allocated, Cooldown, Free int
	// Dropped counts claims outside the pool's current ranges, released.
	Dropped int
	// OutOfRange lists live addresses outside the pool's ranges.
	OutOfRange []Holding
	// Elsewhere lists live addresses another holder claims: that holder
	// looks after them.
	Elsewhere []Holding
	// Conflicts lists live addresses held by two machines: the first one
	// keeps it, each later one is here.
	Conflicts []error
}

// Tenure is an address and the machine it was allocated to.
type Tenure struct {
	Addr  netip.Addr
	Owner Owner
}

// Add returns r and o together: the reports of several Managers (the
// families of one pool) as one.
func (r RecoveryReport) Add(o RecoveryReport) RecoveryReport {
	r.Allocated += o.Allocated
	r.Cooldown += o.Cooldown
	r.Free += o.Free
	r.Dropped += o.Dropped
	r.OutOfRange = append(r.OutOfRange, o.OutOfRange...)
	r.Elsewhere = append(r.Elsewhere, o.Elsewhere...)
	r.Conflicts = append(r.Conflicts, o.Conflicts...)
	return r
}

// rest is how long an address a crash may have left in use rests: it may
// have been handed out to a machine not stored yet (which can appear for
// the pending TTL, and never ran), or released since the last write (which
// needs the cooldown); not both, so the longer of the two.
func (m *Manager) restAfterCrash() time.Duration { return max(m.cfg.PendingTTL, m.cfg.Cooldown) }

// Recover rebuilds the Manager's state from the store and the addresses on
// live virtual machines, then marks it ready.
//
//   - A live address this holder claims, or that no holder claims, becomes
//     allocated to its machine; one another holder claims is left to it.
//   - A claimed address on no live machine that the store shows cooling
//     down keeps its deadline; one it shows in use or armed rests for the
//     longer of the pending TTL and the cooldown (a crash may have left it
//     handed out, or released since the last write); every other one is
//     free at once.
//   - A block written before vmipam recorded what is in use rests all of
//     its claimed addresses on no live machine for the pending TTL plus the
//     cooldown, as before.
//
// Claims of addresses no holder had are written before the Manager serves.
func (m *Manager) Recover(ctx context.Context, live []Holding) (RecoveryReport, error) {
	return m.recover(ctx, live, false)
}

// RecoverCovered is Recover from live machines that may be only some of
// them: those of one holder and those of none, as a replica's caches hold
// them, without the machines labelled for other holders. It recovers only
// when live holds every address that the store shows this holder may have
// handed out (in use or armed, or any claim of a block written before
// vmipam recorded those): the machines it lacks then hold none of this
// holder's addresses as far as the store knows, and Recover from every
// machine would come to the same state. Otherwise it returns an error
// that wraps ErrUncovered and leaves the Manager as it was.
//
// What it cannot see that Recover can: a machine of another holder's
// that holds an address this holder claims and the store shows free or
// cooling down (vmipam labels a machine for the holder that claims its
// address, so only a label changed by hand makes one), and the conflicts
// such machines would be part of. A resync that lists every machine
// finds both. Nor does it claim an address no holder claims that such a
// machine holds, as Recover would: the machine's own holder does, when
// it next looks at the machine.
func (m *Manager) RecoverCovered(ctx context.Context, live []Holding) (RecoveryReport, error) {
	return m.recover(ctx, live, true)
}

// ErrUncovered is returned by RecoverCovered when the machines it was
// given do not hold every address the store shows this holder using.
var ErrUncovered = errors.New("the machines given do not hold every address the store shows in use")

func (m *Manager) recover(ctx context.Context, live []Holding, covered bool) (RecoveryReport, error) {
	var rep RecoveryReport
	m.mu.Lock()
	since := m.nextSeqLocked()
	m.mu.Unlock()
	blocks, err := m.cfg.Store.List(ctx)
	if err != nil {
		return rep, fmt.Errorf("recover pool %q: list blocks: %w", m.cfg.Pool, err)
	}
	if covered {
		if err := uncovered(blocks, m.cfg.Holder, live); err != nil {
			return rep, fmt.Errorf("recover pool %q: %w", m.cfg.Pool, err)
		}
	}
	m.io.Lock()
	defer m.io.Unlock()
	m.mu.Lock()
	now := m.clock.Now()
	m.ready = false
	m.reset(len(live))
	// A read still on its way predates this state.
	m.forgotAt = m.nextSeqLocked()
	for _, b := range blocks {
		if b.Claims == nil {
			b.Claims = map[string]*Bitmap{}
		}
		bs := m.blockFor(b.Prefix.Addr())
		m.setPersistedLocked(bs, b)
		bs.loaded, bs.bound = true, since
		if len(b.Claims) == 0 && len(b.Cooldowns) == 0 {
			// Left empty by an older version: the next flush deletes it.
			bs.gen++
		}
	}
	var fresh []netip.Prefix // blocks with claims no holder had
	for _, h := range live {
		h.Addr = Canonical(h.Addr)
		if !m.cfg.Ranges.Contains(h.Addr) {
			rep.OutOfRange = append(rep.OutOfRange, h)
			continue
		}
		bs := m.blockFor(h.Addr)
		if owner, ok := bs.persisted.holderOf(blockOffset(h.Addr)); ok && owner != m.cfg.Holder {
			rep.Elsewhere = append(rep.Elsewhere, h)
			continue
		} else if !ok {
			fresh = append(fresh, BlockOf(h.Addr))
		}
		if err := m.adoptLocked(h.Addr, h.Owner); err != nil {
			rep.Conflicts = append(rep.Conflicts, err)
			continue
		}
		rep.Allocated++
	}
	var cooling []*entry
	for p, bs := range m.blocks {
		b := &bs.persisted
		bm := b.Claims[m.cfg.Holder]
		if bm == nil {
			continue
		}
		unheld := bs.unheld(bm)
		unheld.Each(func(off int) {
			a := blockAddr(p, off)
			if !m.cfg.Ranges.Contains(a) {
				bs.gen++
				rep.Dropped++
				return
			}
			until, free := m.restUntil(b, m.cfg.Holder, a, off, now)
			if free {
				e := m.addEntry(a, StateFree)
				m.free.pushBack(e)
				rep.Free++
				return
			}
			if d := b.Cooldowns[a]; !until.Equal(d) {
				bs.gen++
			}
			e := m.addEntry(a, StateCooldown)
			e.at = until
			cooling = append(cooling, e)
		})
	}
	m.pushCoolingLocked(cooling)
	rep.Cooldown = len(cooling)
	m.mu.Unlock()
	// An address no holder claimed is ours only once the store says so:
	// write it before serving, and yield it to a holder that claimed it
	// meanwhile.
	slices.SortFunc(fresh, netip.Prefix.Compare)
	for _, p := range slices.Compact(fresh) {
		if err := m.retry(ctx, func() error { return m.writeFresh(ctx, p, &rep) }); err != nil {
			return rep, fmt.Errorf("recover pool %q: %w", m.cfg.Pool, err)
		}
	}
	m.mu.Lock()
	m.ready = true
	m.mu.Unlock()
	m.Kick()
	return rep, nil
}

// uncovered returns an error wrapping ErrUncovered when live lacks an
// address that blocks show holder h may have handed out: in use or armed,
// or any claim of a block that does not record those.
func uncovered(blocks []Block, h string, live []Holding) error {
	held := make(map[netip.Addr]bool, len(live))
	for _, l := range live {
		held[Canonical(l.Addr)] = true
	}
	for i := range blocks {
		b := &blocks[i]
		bm := b.Claims[h]
		if bm == nil || bm.Empty() {
			continue
		}
		if !b.Exact {
			return fmt.Errorf("block %s does not record which of its addresses are in use: %w", b.Prefix, ErrUncovered)
		}
		for off := range BlockSize {
			if !bm.Has(off) || !has(b.InUse, h, off) && !has(b.Armed, h, off) {
				continue
			}
			if a := blockAddr(b.Prefix, off); !held[a] {
				return fmt.Errorf("%s, which the store shows in use or armed, is on none of them: %w", a, ErrUncovered)
			}
		}
	}
	return nil
}

// restUntil decides what a claimed address of holder h on no live machine
// becomes after a crash: free at once, or resting until the time returned.
func (m *Manager) restUntil(b *Block, h string, a netip.Addr, off int, now time.Time) (time.Time, bool) {
	d, cooling := b.Cooldowns[a]
	switch {
	case !b.Exact:
		// An older block says nothing of what was in use: rest it all.
		until := now.Add(m.cfg.PendingTTL + m.cfg.Cooldown)
		if d.After(until) {
			until = d
		}
		return until, false
	case has(b.InUse, h, off) || has(b.Armed, h, off):
		until := now.Add(m.restAfterCrash())
		if d.After(until) {
			until = d
		}
		return until, false
	case cooling && d.After(now):
		return d, false
	}
	return time.Time{}, true
}

// pushCoolingLocked queues recovered cooling entries in deadline order.
func (m *Manager) pushCoolingLocked(cooling []*entry) {
	slices.SortFunc(cooling, func(a, b *entry) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.addr.Compare(b.addr)
	})
	for _, e := range cooling {
		m.cooldown.insertByAt(e)
	}
}

// writeFresh writes block p with the claims Recover made of addresses no
// holder claimed; an address another holder claimed meanwhile is dropped
// from this Manager and reported as held elsewhere.
func (m *Manager) writeFresh(ctx context.Context, p netip.Prefix, rep *RecoveryReport) error {
	m.mu.Lock()
	bs := m.blocks[p]
	for a, e := range m.entries {
		if BlockOf(a) != p {
			continue
		}
		if h, ok := bs.persisted.holderOf(blockOffset(a)); ok && h != m.cfg.Holder {
			if e.owner.Token != "" && m.byToken[e.owner.Token] == e {
				delete(m.byToken, e.owner.Token)
			}
			m.removeEntry(e)
			rep.Allocated--
			rep.Elsewhere = append(rep.Elsewhere, Holding{Addr: a, Owner: e.owner})
		}
	}
	m.mu.Unlock()
	return m.writeBlock(ctx, p, writePlan{})
}

// TakeoverReport says what Takeover moved.
type TakeoverReport struct {
	// Allocated, Cooldown and Free count the addresses taken over, by what
	// they became; Dropped, claims outside the current ranges.
	Allocated, Cooldown, Free, Dropped int
	// Blocks counts the blocks rewritten.
	Blocks int
}

// Add returns the sum of r and o: the takeovers of several Managers (the
// families of one pool), or of several blocks, as one.
func (r TakeoverReport) Add(o TakeoverReport) TakeoverReport {
	r.Allocated += o.Allocated
	r.Cooldown += o.Cooldown
	r.Free += o.Free
	r.Dropped += o.Dropped
	r.Blocks += o.Blocks
	return r
}

// Takeover moves the claims of holder from, which has left (its lease
// lapsed, or it released it after sealing), to this Manager, block by
// block, each a compare-and-swap that clears the other holder's claims as
// it sets these: live addresses become allocated to their machines,
// cooling ones keep their deadline, those the store shows in use or armed
// rest as after a crash, and the rest are free. A holder that sealed its
// blocks left nothing in use but what was pending, so its free addresses
// are free here at once. The caller must be sure that from no longer writes:
// see docs/design.md, "Fencing".
func (m *Manager) Takeover(ctx context.Context, from string, live []Holding) (TakeoverReport, error) {
	var rep TakeoverReport
	if from == m.cfg.Holder {
		return rep, fmt.Errorf("take over pool %q: holder %q cannot take over itself; recover instead", m.cfg.Pool, from)
	}
	m.mu.Lock()
	since := m.nextSeqLocked()
	m.mu.Unlock()
	blocks, err := m.cfg.Store.List(ctx)
	if err != nil {
		return rep, fmt.Errorf("take over holder %q in pool %q: list blocks: %w", from, m.cfg.Pool, err)
	}
	owners := make(map[netip.Addr]Owner, len(live))
	for _, h := range live {
		owners[Canonical(h.Addr)] = h.Owner
	}
	m.io.Lock()
	defer m.io.Unlock()
	for _, b := range blocks {
		if bm := b.Claims[from]; bm == nil || bm.Empty() {
			continue
		}
		p := b.Prefix
		m.mu.Lock()
		if err := m.servingLocked(m.clock.Now()); err != nil {
			m.mu.Unlock()
			return rep, fmt.Errorf("take over holder %q in pool %q: %w", from, m.cfg.Pool, err)
		}
		if !m.overtakenLocked(p, since) {
			// Else this Manager wrote the block, or read it, since the
			// list: what it holds is newer, and the list may predate its
			// own last write.
			bs := m.blockFor(p.Addr())
			m.setPersistedLocked(bs, b)
			bs.loaded, bs.bound = true, since
		}
		m.mu.Unlock()
		var moved TakeoverReport
		var staged []*entry
		err := m.retry(ctx, func() error {
			m.mu.Lock()
			bs := m.blocks[p]
			if bs == nil || !bs.loaded {
				// Staged from an empty block, the write would drop the
				// claims it takes over: read the block first.
				m.mu.Unlock()
				if err := m.load(ctx, p); err != nil {
					return err
				}
				return fmt.Errorf("block %s of pool %q was not read yet: %w", p, m.cfg.Pool, ErrStoreConflict)
			}
			staged, moved = m.stageTakeoverLocked(bs, from, owners)
			m.mu.Unlock()
			return m.writeBlock(ctx, p, writePlan{takeFrom: from, adopt: staged})
		})
		if err != nil {
			// The write may have landed (a reply lost after the commit):
			// the block was read again, and what it shows ours became
			// orphans; those on live machines are theirs now.
			m.mu.Lock()
			for _, e := range staged {
				if e.state == StateAllocated && m.entries[e.addr] != nil && m.entries[e.addr].orphan {
					_ = m.adoptLocked(e.addr, e.owner)
				}
			}
			m.mu.Unlock()
			return rep, fmt.Errorf("take over holder %q in pool %q: %w", from, m.cfg.Pool, err)
		}
		m.mu.Lock()
		var cooling []*entry
		for _, e := range staged {
			if !m.takeWrittenLocked(e.addr) {
				continue
			}
			m.putEntryLocked(e)
			switch e.state {
			case StateAllocated:
				if e.owner.Token != "" {
					m.byToken[e.owner.Token] = e
				}
			case StateCooldown:
				cooling = append(cooling, e)
			default:
				m.rest(e)
			}
		}
		m.pushCoolingLocked(cooling)
		m.mu.Unlock()
		moved.Blocks = 1 // this one, rewritten
		rep = rep.Add(moved)
		m.stats.takenOver.Add(uint64(moved.Allocated + moved.Cooldown + moved.Free))
	}
	m.Kick()
	return rep, nil
}

// stageTakeoverLocked makes, without adding them, the entries this Manager
// takes over from holder from in a block.
func (m *Manager) stageTakeoverLocked(bs *blockState, from string, owners map[netip.Addr]Owner) ([]*entry, TakeoverReport) {
	var rep TakeoverReport
	b := &bs.persisted
	bm := b.Claims[from]
	if bm == nil {
		return nil, rep
	}
	now := m.clock.Now()
	var staged []*entry
	for off := range BlockSize {
		if !bm.Has(off) {
			continue
		}
		a := blockAddr(b.Prefix, off)
		if !m.cfg.Ranges.Contains(a) {
			rep.Dropped++
			continue
		}
		e := &entry{addr: a}
		if o, ok := owners[a]; ok {
			e.state, e.owner = StateAllocated, o
			rep.Allocated++
		} else if until, free := m.restUntil(b, from, a, off, now); free {
			e.state = StateFree
			rep.Free++
		} else {
			e.state, e.at = StateCooldown, until
			rep.Cooldown++
		}
		staged = append(staged, e)
	}
	return staged, rep
}

// ResyncReport says what Resync changed.
type ResyncReport struct {
	// Released counts addresses allocated to machines no longer live
	// (their finalizer was removed by force), now cooling down; Vanished
	// lists them with the machines they were allocated to.
	Released int
	Vanished []Tenure
	// Adopted counts live addresses that were not allocated to their
	// machine, now allocated; Adoptions lists the first maxAdoptions of
	// them with their machines.
	Adopted   int
	Adoptions []Tenure
	// Deferred counts releases left for the next resync, because the store
	// does not show the address in use yet (it was adopted since the last
	// write): a crash before that write would otherwise free it early.
	Deferred int
	// Settled counts orphans (see materializeLocked) on no live machine,
	// now resting as after a crash.
	Settled int
	// Conflicts lists live addresses held by two machines.
	Conflicts []error
}

// maxAdoptions bounds ResyncReport.Adoptions: a resync after a lost
// watch may adopt thousands, and the list is for a log line.
const maxAdoptions = 10

// Add returns r and o together: the resyncs of several Managers (the
// families of one pool) as one.
func (r ResyncReport) Add(o ResyncReport) ResyncReport {
	r.Released += o.Released
	r.Vanished = append(r.Vanished, o.Vanished...)
	r.Adopted += o.Adopted
	if n := maxAdoptions - len(r.Adoptions); n > 0 {
		r.Adoptions = append(r.Adoptions, o.Adoptions[:min(n, len(o.Adoptions))]...)
	}
	r.Deferred += o.Deferred
	r.Settled += o.Settled
	r.Conflicts = append(r.Conflicts, o.Conflicts...)
	return r
}

// Unseen tells what a Resync with live and asOf would take from machines
// missing from live, so that a caller holding only part of the live
// machines (a replica's informer caches) can read those few from the
// source instead of listing every machine: missing are the addresses
// allocated, before asOf, to machines with no holding in live; orphans,
// whether an orphan (see materializeLocked) waits for a Resync, which
// only a full list can give, since nothing says which machine may hold
// it.
func (m *Manager) Unseen(live []Holding, asOf uint64) (missing []Tenure, orphans bool) {
	uids := make(map[string]bool, len(live))
	for _, h := range live {
		uids[h.Owner.UID] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.entries {
		if e.changed > asOf {
			continue
		}
		switch {
		case e.orphan && e.state == StateCooldown:
			orphans = true
		case e.state == StateAllocated && !uids[e.owner.UID]:
			missing = append(missing, Tenure{Addr: e.addr, Owner: e.owner})
		}
	}
	return missing, orphans
}

// Adopting names every holding of live that a Resync with asOf would
// adopt: holdings whose address this Manager holds, as of asOf, in another
// state or for another machine. It may name a few more, that Resync then
// leaves alone (a cooldown that ended since, which Resync sees changed
// after asOf). A caller whose live may be older than asOf (a replica's
// informer caches, which lag the API server, by many seconds after its
// outage) reads those few machines again from the source before the
// Resync: from an old view, Resync would give an address that cooled down
// since to a machine that is gone.
//
// It takes the lock for a few holdings at a time, not for all of them:
// allocations go on meanwhile, and Resync decides again.
func (m *Manager) Adopting(live []Holding, asOf uint64) []Holding {
	var out []Holding
	for chunk := range slices.Chunk(live, adoptingChunk) {
		m.mu.Lock()
		for _, h := range chunk {
			if adopts(m.entries[Canonical(h.Addr)], h, asOf) {
				out = append(out, h)
			}
		}
		m.mu.Unlock()
	}
	return out
}

// adoptingChunk is how many holdings Adopting looks at per taking of the
// lock.
const adoptingChunk = 1024

// adopts reports whether Resync, as of asOf, adopts live holding h into e,
// the entry of its address: one this Manager holds, that did not change
// since asOf (the list may not show that change yet), is not allocated to
// h's machine already, and is not the cooldown that h's machine, going,
// was released into.
//
// That Adopting names no fewer rests on touch: every change that could
// make an entry adoptable (a cooldown's end, a release, a new entry, a
// reservation or its end) records a change after asOf, and a changed
// entry is not adopted.
func adopts(e *entry, h Holding, asOf uint64) bool {
	return e != nil && e.state != stateReturning && e.changed <= asOf &&
		(e.state != StateAllocated || e.owner.UID != h.Owner.UID) && (!h.Going || e.state != StateCooldown)
}

// Resync reconciles the Manager with a full list of the live machines, taken
// after Mark returned asOf: an address allocated to a UID missing from live
// goes into cooldown, and a live address this Manager holds but not for its
// machine is adopted. Entries that changed after asOf are left alone, since
// the list may not show that change yet (a machine bound, or released, while
// it was being taken); so are pending reservations, whose machines may not
// be stored yet, and addresses this Manager does not hold (their holder, or
// the controller, sees to them).
func (m *Manager) Resync(live []Holding, asOf uint64) ResyncReport {
	var rep ResyncReport
	// Before the lock, which allocations wait for: a replica's share of a
	// large fleet is tens of thousands of machines.
	uids := make(map[string]bool, len(live))
	for _, h := range live {
		uids[h.Owner.UID] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.servingLocked(m.clock.Now()) != nil {
		return rep
	}
	now := m.clock.Now()
	m.advance(now)
	for _, h := range live {
		h.Addr = Canonical(h.Addr)
		e := m.entries[h.Addr]
		if !adopts(e, h, asOf) {
			continue
		}
		if err := m.adoptLocked(h.Addr, h.Owner); err != nil {
			rep.Conflicts = append(rep.Conflicts, err)
			continue
		}
		rep.Adopted++
		if len(rep.Adoptions) < maxAdoptions {
			rep.Adoptions = append(rep.Adoptions, Tenure{Addr: h.Addr, Owner: h.Owner})
		}
	}
	var settled []*entry
	for _, e := range m.entries {
		if e.orphan && e.state == StateCooldown && e.changed <= asOf {
			settled = append(settled, e)
			continue
		}
		if e.state == StateAllocated && e.changed <= asOf && !uids[e.owner.UID] {
			if !m.durableLocked(e) {
				rep.Deferred++
				continue
			}
			rep.Vanished = append(rep.Vanished, Tenure{Addr: e.addr, Owner: e.owner})
			m.toCooldown(e, now)
			rep.Released++
		}
	}
	for _, e := range settled {
		// On no live machine: the rest a crash would give it, from now.
		m.cooldown.remove(e)
		e.orphan = false
		e.at = now.Add(m.restAfterCrash())
		m.cooldown.insertByAt(e)
		rep.Settled++
	}
	if rep.Released > 0 {
		m.stats.releases.Add(uint64(rep.Released))
	}
	return rep
}
