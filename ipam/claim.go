package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// rescanAfter is how long a scan that found nothing to claim is trusted, so
// an exhausted pool does not rescan its whole range on every allocation.
const rescanAfter = time.Second

func (m *Manager) claimable() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.claimableLocked()
}

// claimableLocked is how many addresses no holder has claimed, as far as
// the blocks read so far tell: zero means a claim would find nothing.
func (m *Manager) claimableLocked() uint64 {
	taken := uint64(len(m.entries)) + uint64(m.elsewhere)
	if taken >= m.cfg.Ranges.Size() {
		return 0
	}
	return m.cfg.Ranges.Size() - taken
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
