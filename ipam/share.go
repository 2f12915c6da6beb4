package ipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"
)

// grantWait bounds how long a holder waits for another holder to answer
// its request; the caller's context (an admission's deadline) may end the
// wait sooner. Under load, with several holders writing one block, an
// answer can take over a second.
const grantWait = 2500 * time.Millisecond

// answerMargin is how long before its context's deadline a waiting holder
// stops waiting (for a grant, or to try a conflicting write again), so that
// the admission still answers in time: the API server's deadline also
// covers the request's queueing and transfer, and an answer after it is
// lost while its reservation stays pending.
const answerMargin = 1500 * time.Millisecond

// grantPoll is how often a waiting holder reads the block for the answer.
const grantPoll = 25 * time.Millisecond

// SetPeers tells the Manager which holders of the pool are alive, itself
// included: only their requests are answered (a dead holder's are dropped
// with the next write of their block), and with several the watermarks
// shrink so that a small pool is not stranded in their free lists.
//
// A holder that a block names but the list does not may have started
// since the list was taken: it counts as gone only once a list taken after
// this Manager first saw it still leaves it out (see goneLocked).
func (m *Manager) SetPeers(holders []string) {
	m.mu.Lock()
	m.peers = make(map[string]bool, len(holders))
	for _, h := range holders {
		m.peers[h] = true
	}
	m.peers[m.cfg.Holder] = true
	m.peersSeq++
	if len(m.strangers) > maxStrangers {
		m.strangers = nil
	}
	for h := range m.strangers {
		if m.peers[h] {
			delete(m.strangers, h)
		}
	}
	// Requests of holders this list names for the first time wait for
	// an answer.
	kick := false
	for _, bs := range m.blocks {
		for h, r := range bs.persisted.Requests {
			if h != m.cfg.Holder && r.Asks() && bs.ours > 0 {
				bs.requested, kick = true, true
			}
		}
	}
	m.mu.Unlock()
	if kick {
		m.Kick()
	}
}

// listedLocked reports whether the last list of live holders names h (or
// there is none yet).
func (m *Manager) listedLocked(h string) bool { return m.peers == nil || m.peers[h] }

// maxStrangers bounds the holders remembered as seen before a list named
// them; past it they are forgotten, and judged again after the next list.
const maxStrangers = 1024

// goneLocked reports whether holder h, which the list of live holders does
// not name, has left: a list taken after this Manager first saw h left it
// out too. Until then h may be a holder that started after the last list
// (every replica lists the others once per retry period), whose requests
// must not be dropped, nor its addresses taken for a dead holder's.
func (m *Manager) goneLocked(h string) bool {
	if m.peers == nil || m.peers[h] {
		return false
	}
	first, seen := m.strangers[h]
	if !seen {
		if m.strangers == nil {
			m.strangers = map[string]uint64{}
		}
		m.strangers[h] = m.peersSeq
		return false
	}
	return first < m.peersSeq
}

// Observe tells the Manager of a version of one of its pool's blocks seen
// elsewhere (an informer): if another holder asks for addresses there and
// this Manager holds some, the next rebalance reads the block and answers.
// A version other than the one the Manager last read or wrote makes its
// next claim in the block read it first.
//
// Observe keeps the other holders' claims it shows as a hint (see
// SeenHolderOf); a block that was deleted is observed as one without
// claims.
//
// It also notices addresses handed over to this holder that it holds no
// entry for (a grant it stopped waiting for): the next rebalance reads the
// block, and they join the free list.
func (m *Manager) Observe(b Block) {
	asks := false
	for h, r := range b.Requests {
		asks = asks || h != m.cfg.Holder && r.Asks()
	}
	var others map[string]*Bitmap
	for h, bm := range b.Claims {
		if h != m.cfg.Holder && !bm.Empty() {
			if others == nil {
				others = map[string]*Bitmap{}
			}
			cp := *bm
			others[h] = &cp
		}
	}
	m.mu.Lock()
	if bs := m.blocks[b.Prefix]; bs != nil && bs.loaded && b.Version != bs.persisted.Version {
		bs.moved = true
	}
	if others != nil {
		m.seen[b.Prefix] = others
	} else {
		delete(m.seen, b.Prefix)
	}
	if m.othersArmIn(&b) {
		m.armedIn[b.Prefix] = true
	} else {
		delete(m.armedIn, b.Prefix)
	}
	bs := m.blocks[b.Prefix]
	kick := false
	if asks && bs != nil && bs.ours > 0 && b.Version != bs.served {
		bs.requested, bs.markedFor, kick = true, b.Version, true
	}
	if bm := b.Claims[m.cfg.Holder]; bm != nil && (bs == nil || !bs.returning) {
		var unheld Bitmap
		if bs != nil {
			unheld = bs.unheld(bm)
		} else {
			unheld = *bm
		}
		if !unheld.Empty() {
			bs = m.blockFor(b.Prefix.Addr())
			bs.requested, kick = true, true
		}
	}
	m.mu.Unlock()
	if kick {
		m.Kick()
	}
}

// requestedLocked returns the blocks where another holder may ask for
// addresses, in order: marked, or with a count this holder could not
// meet while it held fewer free addresses than now.
func (m *Manager) requestedLocked() []netip.Prefix {
	var out []netip.Prefix
	free := m.givableLocked()
	for p, bs := range m.blocks {
		if bs.requested || bs.unmet && m.asking == 0 && free > bs.unmetFree {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// askFor asks the other holders for addresses: the specific a when valid
// (a static request), else any free ones, written as a request into a
// block where they claim addresses. It waits for their answer, up to
// grantWait or ctx's deadline, and takes what they hand over into the free
// list, armed.
func (m *Manager) askFor(ctx context.Context, a netip.Addr) error {
	_, err := m.askIn(ctx, a, nil)
	return err
}

// askIn is askFor, asking for any free addresses in a block not in
// skip; it returns the block asked in, or the zero prefix when none was
// left to ask.
func (m *Manager) askIn(ctx context.Context, a netip.Addr, skip map[netip.Prefix]bool) (netip.Prefix, error) {
	m.mu.Lock()
	var p netip.Prefix
	var unread []netip.Prefix
	if a.IsValid() {
		p = BlockOf(a)
	} else if p = m.askWhereLocked(skip); !p.IsValid() {
		unread = m.unreadElsewhereLocked(skip)
	}
	m.mu.Unlock()
	if len(unread) > 0 {
		// Blocks where others claim addresses are marked unread, most
		// likely by a concurrent write that lost a compare-and-swap:
		// read them and pick again, rather than find nothing to ask and
		// refuse the allocation with the others' free addresses in them.
		for _, q := range unread {
			if err := m.load(ctx, q); err != nil {
				return netip.Prefix{}, err
			}
		}
		m.mu.Lock()
		p = m.askWhereLocked(skip)
		m.mu.Unlock()
	}
	if !p.IsValid() {
		return p, nil
	}
	return p, m.askAt(ctx, p, a)
}

// askAt asks in block p (see askFor).
func (m *Manager) askAt(ctx context.Context, p netip.Prefix, a netip.Addr) error {
	want := func() Request {
		m.mu.Lock()
		defer m.mu.Unlock()
		r := m.blockFor(p.Addr()).persisted.Requests[m.cfg.Holder]
		if a.IsValid() {
			if r.Addrs == nil {
				r.Addrs = new(Bitmap)
			} else {
				cp := *r.Addrs
				r.Addrs = &cp
			}
			r.Addrs.Set(blockOffset(a))
			// A reason left from an earlier ask of a (one that gave up
			// before it came) is not this ask's answer.
			if _, ok := r.Refused[blockOffset(a)]; ok {
				r.Refused = maps.Clone(r.Refused)
				delete(r.Refused, blockOffset(a))
			}
		} else {
			r.Count = max(r.Count, m.cfg.ArmBatch, m.asking)
		}
		return r
	}
	m.io.Lock()
	err := m.retry(ctx, func() error {
		r := want()
		return m.writeBlock(ctx, p, writePlan{request: &r})
	})
	m.io.Unlock()
	if err != nil {
		return fmt.Errorf("ask for addresses in block %s: %w", p, err)
	}
	deadline := m.clock.Now().Add(grantWait)
	if d, ok := ctx.Deadline(); ok && d.Add(-answerMargin).Before(deadline) {
		// Leave the caller time to answer its own caller.
		deadline = d.Add(-answerMargin)
	}
	answered := false
	var refusal *Refusal
	for polls := 0; ; polls++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.cfg.Timers.After(grantPoll):
		}
		if err := m.load(ctx, p); err != nil {
			return err
		}
		var got int
		got, answered = m.received(p, a)
		if got > 0 {
			return m.absorb(ctx, p)
		}
		if answered {
			if f, ok := m.refusalOf(p, a); ok {
				// Keep the why, then take it out of the block.
				refusal = &f
				m.io.Lock()
				_ = m.retry(ctx, func() error {
					r := withdrawn(want(), a)
					return m.writeBlock(ctx, p, writePlan{request: &r})
				})
				m.io.Unlock()
			}
			break
		}
		if a.IsValid() && m.mineOrUnclaimed(a) || !a.IsValid() && m.holdsFree() ||
			!m.clock.Now().Before(deadline) || polls >= int(grantWait/grantPoll) {
			// Given back meanwhile; or free addresses came here another
			// way (a read took in what was handed over, or a cooldown
			// ended), which the caller takes; or nobody could hand
			// anything over: withdraw the request, so that nobody hands
			// it over later.
			m.io.Lock()
			_ = m.retry(ctx, func() error {
				r := withdrawn(want(), a)
				return m.writeBlock(ctx, p, writePlan{request: &r})
			})
			m.io.Unlock()
			break
		}
	}
	if a.IsValid() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.entries[a] != nil {
			// Handed over, and taken into the free list meanwhile by the
			// background work that the watch woke: the caller takes it.
			return nil
		}
		b := &m.blockFor(a).persisted
		h, claimed := b.holderOf(blockOffset(a))
		if !claimed || h == m.cfg.Holder {
			// Given back meanwhile, or handed over with no entry yet:
			// the caller claims it.
			return nil
		}
		if err := m.elsewhereLocked(b, a); !errors.Is(err, errAskHolder) {
			return err
		}
		if !answered {
			return &HolderError{Addr: a, Holder: h, Live: true}
		}
		// The holder answered without handing it over, and said why
		// (unless its answer was lost, or the request held as many
		// refusals as it may), in a write that also shows its cooldowns
		// as they are.
		if f := refusal; f != nil {
			reason := ErrInUse
			if f.State == StateCooldown {
				reason = ErrCoolingDown
			}
			return &AddressError{Addr: a, Reason: reason, State: f.State, Owner: Owner{Ref: f.Ref}, Until: f.Until, Holder: h}
		}
		if err := storedCooldown(b, a, h, m.clock.Now()); err != nil {
			return err
		}
		return &AddressError{Addr: a, Reason: ErrInUse, State: StatePending, Holder: h}
	}
	return nil
}

// askWhereLocked returns the block to ask other live holders for any free
// addresses in: the one where the last read showed the live ones the most
// free,
// else (all of those reads showed none, and may be stale) the one where
// they claim the most. Asking where they claim the most alone asked, in a
// pool filled to the last address, a block whose holder had every address
// in use, while another holder's block had some free: they were out of
// reach, and creates were refused with addresses left.
func (m *Manager) askWhereLocked(skip map[netip.Prefix]bool) netip.Prefix {
	var p netip.Prefix
	bestFree, best := 0, 0
	for q, bs := range m.blocks {
		if !bs.loaded || skip[q] || !m.livePeersIn(bs) {
			continue
		}
		// Free there as of now: a cooldown the store shows may have
		// ended since.
		var o Others
		o.add(&bs.persisted, m.cfg.Holder, m.listedLocked, m.clock.Now(), nil)
		free := o.Free
		if free > bestFree || bestFree == 0 && free == 0 && bs.elsewhere > best {
			p, bestFree, best = q, free, bs.elsewhere
		}
	}
	return p
}

// livePeersIn reports whether a block holds claims of another live holder.
func (m *Manager) livePeersIn(bs *blockState) bool {
	for h := range bs.persisted.Claims {
		if h != m.cfg.Holder && (m.peers == nil || m.peers[h]) {
			return true
		}
	}
	return false
}

// withdrawn is request r without what askFor(a) added to it: the static
// request of a, or the count of any.
func withdrawn(r Request, a netip.Addr) Request {
	if !a.IsValid() {
		r.Count = 0
		return r
	}
	if r.Addrs != nil {
		r.Addrs.Clear(blockOffset(a))
		if r.Addrs.Empty() {
			r.Addrs = nil
		}
	}
	if _, ok := r.Refused[blockOffset(a)]; ok {
		r.Refused = maps.Clone(r.Refused)
		delete(r.Refused, blockOffset(a))
	}
	return r
}

// refusalOf returns why the holder of a, in block p as last read,
// refused to hand it over to this holder, if it said.
func (m *Manager) refusalOf(p netip.Prefix, a netip.Addr) (Refusal, bool) {
	if !a.IsValid() {
		return Refusal{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.blockFor(p.Addr()).persisted.Requests[m.cfg.Holder].Refused[blockOffset(a)]
	return f, ok
}

// mineOrUnclaimed reports whether this Manager holds a, or the store as
// last read shows it claimed by nobody or by this holder: a static request
// then needs no answer from another holder.
func (m *Manager) mineOrUnclaimed(a netip.Addr) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries[a] != nil {
		return true
	}
	h, claimed := m.blockFor(a).persisted.holderOf(blockOffset(a))
	return !claimed || h == m.cfg.Holder
}

// holdsFree reports whether this Manager holds free addresses, armed or
// not, that an allocation may take.
func (m *Manager) holdsFree() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.givableLocked() > 0
}

// givableLocked counts the free addresses, armed or not: those an
// allocation may take, or an answer hand over.
func (m *Manager) givableLocked() int { return m.readyList.n + m.free.n + m.surplus.n }

// received counts the addresses of block p the store shows claimed by
// this holder without an entry here (handed over), and reports whether the
// request was answered: gone, or no longer asking for a.
func (m *Manager) received(p netip.Prefix, a netip.Addr) (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	bs := m.blockFor(p.Addr())
	got := 0
	if bm := bs.persisted.Claims[m.cfg.Holder]; bm != nil {
		unheld := bs.unheld(bm)
		got = unheld.Count()
	}
	r, asking := bs.persisted.Requests[m.cfg.Holder]
	answered := !asking
	if a.IsValid() && asking {
		answered = r.Addrs == nil || !r.Addrs.Has(blockOffset(a))
	} else if asking {
		answered = r.Count == 0
	}
	return got, answered
}

// absorb takes the addresses of block p handed over to this holder into
// the free list, armed, and withdraws its request, in one write.
func (m *Manager) absorb(ctx context.Context, p netip.Prefix) error {
	m.io.Lock()
	defer m.io.Unlock()
	var got []netip.Addr
	err := m.retry(ctx, func() error {
		m.mu.Lock()
		got = got[:0]
		bs := m.blockFor(p.Addr())
		if bm := bs.persisted.Claims[m.cfg.Holder]; bm != nil {
			unheld := bs.unheld(bm)
			unheld.Each(func(off int) { got = append(got, blockAddr(p, off)) })
		}
		m.mu.Unlock()
		return m.writeBlock(ctx, p, writePlan{claim: got, arm: got, request: &Request{}})
	})
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range got {
		if m.takeWrittenLocked(a) {
			e := m.addEntry(a, StateFree)
			e.armed = true
			m.readyList.pushBack(e)
		}
	}
	m.stats.received.Add(uint64(len(got)))
	return nil
}

// serveRequests answers the requests of other holders in block p: a
// specific address is handed over if it is free here and refused
// otherwise; a count of any is met with up to half of this holder's free
// addresses in the block. The answer and the addresses go in one write.
func (m *Manager) serveRequests(ctx context.Context, p netip.Prefix) error {
	// Clear the mark before the read, not after it: a request whose event
	// comes while the read is on its way back (the read may predate it)
	// marks the block again, and the next rebalance reads it. Cleared
	// after the read, that request waited unanswered until its requester
	// gave up.
	m.mu.Lock()
	m.blockFor(p.Addr()).requested = false
	m.mu.Unlock()
	if err := m.load(ctx, p); err != nil {
		m.mu.Lock()
		m.blockFor(p.Addr()).requested = true
		m.mu.Unlock()
		return err
	}
	m.io.Lock()
	defer m.io.Unlock()
	m.mu.Lock()
	bs := m.blockFor(p.Addr())
	bs.served, bs.unmet = bs.persisted.Version, false
	if bs.markedFor == bs.served {
		// Marked by the read above, or by an event of the version it
		// read: answered now. A newer version's event keeps its mark.
		bs.requested = false
	}
	give := map[string][]netip.Addr{}
	answers := map[string]answer{}
	var picked []*entry
	take := func(e *entry) {
		switch e.state {
		case StateFree:
			m.listOf(e).remove(e)
		case stateSurplus:
			m.surplus.remove(e)
		}
		e.state, e.armed = stateReturning, false
		picked = append(picked, e)
	}
	for h, r := range bs.persisted.Requests {
		if h == m.cfg.Holder || !r.Asks() {
			continue
		}
		if m.peers != nil && !m.peers[h] {
			if m.goneLocked(h) {
				answers[h] = answer{drop: true} // a holder that left
			}
			// Else a holder started since the live ones were last listed:
			// answered once the next list names it.
			continue
		}
		var out answer
		if r.Addrs != nil {
			for off := range BlockSize {
				if !r.Addrs.Has(off) {
					continue
				}
				e := m.entries[blockAddr(p, off)]
				if e == nil || e.arming || e.state == stateReturning {
					// Not ours to answer; or ours but in a write under way
					// (being armed, given back or handed over): answered
					// once it lands, or by the store showing it unclaimed.
					continue
				}
				out.resolved.Set(off)
				switch e.state {
				case StateFree, stateSurplus:
					take(e)
					give[h] = append(give[h], e.addr)
				default:
					// Say why, so that the requester can name the object.
					if out.refused == nil {
						out.refused = map[int]Refusal{}
					}
					out.refused[off] = Refusal{State: e.state, Ref: e.owner.Ref, Until: e.at}
				}
			}
		}
		// A count is not met while allocations of this holder wait for
		// answers of their own: what it holds free is theirs. Met, an
		// address handed over to this holder, read in as free by the
		// read above, went straight on to the next holder asking; with
		// three holders asking in a full pool, one free address passed
		// from one to the next for seconds while each refused its
		// creates as exhausted.
		if r.Count > 0 && m.asking > 0 {
			bs.unmet, bs.unmetFree = true, -1
		}
		if r.Count > 0 && m.asking == 0 {
			n := 0
			for off := range BlockSize {
				e := m.entries[blockAddr(p, off)]
				if e != nil && (e.state == StateFree || e.state == stateSurplus) && !e.arming {
					n++
				}
			}
			// With nothing to give, the count is left to the block's other
			// holders.
			n = min(r.Count, (n+1)/2)
			out.countMet = n > 0
			if !out.countMet {
				bs.unmet, bs.unmetFree = true, m.givableLocked()
			}
			for off := 0; off < BlockSize && n > 0; off++ {
				e := m.entries[blockAddr(p, off)]
				if e != nil && (e.state == StateFree || e.state == stateSurplus) && !e.arming {
					take(e)
					give[h] = append(give[h], e.addr)
					n--
				}
			}
		}
		if out.countMet || !out.resolved.Empty() {
			answers[h] = out
		}
	}
	if len(answers) == 0 {
		m.mu.Unlock()
		return nil
	}
	m.returning += len(picked)
	bs.returning = len(picked) > 0
	m.mu.Unlock()
	err := m.retry(ctx, func() error { return m.writeBlock(ctx, p, writePlan{give: give, answer: answers}) })
	m.mu.Lock()
	m.settleReturningLocked(p, bs, picked, err)
	m.mu.Unlock()
	if err != nil {
		// The write may have landed: what it handed over is the
		// receiver's, the rest is read back as ours.
		m.reload(ctx, p)
		return err
	}
	m.stats.granted.Add(uint64(len(picked)))
	return nil
}
