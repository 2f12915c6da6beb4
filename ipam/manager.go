package ipam

import (
	"fmt"
	"net/netip"
	"sync"
	"time"
)

// Manager hands out the addresses of one pool. It keeps a free list of
// addresses claimed in the store between two watermarks, so that the common
// allocation touches memory only, and persists claims and cooldowns in
// batches. Several Managers of one pool, under different holders, share it
// through the store (see docs/design.md, "Several holders"). All methods are
// safe for concurrent use, and every address they take is compared in its
// canonical form (see Canonical).
type Manager struct {
	cfg   Config
	clock Clock

	// mu guards everything below; it is never held during Store I/O.
	mu      sync.Mutex
	ready   bool
	entries map[netip.Addr]*entry
	byToken map[string]*entry
	// ready holds the armed free addresses, in the order they are handed
	// out; free the others, until they are armed.
	readyList, free, pending, cooldown, surplus list
	blocks                                      map[netip.Prefix]*blockState
	// surplusSince is when the surplus last became non-empty (see
	// surplusDueLocked).
	surplusSince time.Time
	// ioSeq numbers the starts of reads and the sends and completions of
	// writes of blocks; forgotAt is its value when a block was last
	// forgotten. Neither is ever reset (see overtakenLocked).
	ioSeq, forgotAt uint64
	// returning counts entries being given back or handed over; elsewhere
	// sums the blocks' elsewhere; pendingNS counts pending reservations per
	// namespace. All are kept as the state changes, so that counting and
	// the exhausted path walk nothing.
	returning, elsewhere, othersFree int
	// asking counts the allocations waiting for an answer to a request
	// for addresses: a request asks for at least as many.
	asking int
	// added counts the entries ever made (addEntry), so that an ask can
	// tell whether addresses came while it waited, even if some were
	// handed on to another holder's request since.
	added     uint64
	pendingNS map[string]int
	// unstored holds the reservations that lapsed without their machine
	// being seen, by address, until Unused or Used settles them.
	unstored map[netip.Addr]Unstored
	// unhanded holds addresses this Manager holds no entry for and has not
	// handed out since it last had one, whose last write (a claim, a
	// give-back, a handover) failed without telling whether it landed. If
	// the store shows them claimed by this holder, in use or armed there,
	// that is stale: they are free, not orphans (see materializeLocked).
	unhanded map[netip.Addr]bool
	// cursor is where the search for never-claimed addresses resumes, so
	// they are handed out in range order.
	cursor netip.Addr
	// noClaimableUntil caches a full scan that found nothing to claim;
	// refreshAfter paces the re-reads of other holders' blocks before an
	// allocation is refused.
	noClaimableUntil, refreshAfter time.Time
	// armMax is the largest arm batch; the batch grows from cfg.ArmBatch
	// to it with the allocations counted in rateCount since rateStart and
	// in lastRate, the second before (see armBatchLocked).
	armMax, rateCount, lastRate int
	rateStart                   time.Time
	// seen holds, per block, the other holders' claims in the last version
	// Observe showed: a hint for where to claim (see pickLocked) and for
	// SeenHolderOf, never a reason to hand out or refuse anything.
	seen map[netip.Prefix]map[string]*Bitmap
	// armedIn marks the blocks where that version showed addresses other
	// holders armed: blocks they hand out from, and so write often.
	armedIn map[netip.Prefix]bool
	// fence, when set, tells whether this holder's lease is still safely
	// held; once not, another holder may take its claims over. Nil means
	// no lease is kept (a test).
	fence func() bool
	// lapses, when set, counts the renewals of this holder's lease that
	// came after it had lapsed; lapsesSeen is the count the Manager last
	// acted on. A lapse nothing here observed (no call came while fenced)
	// still thaws (see advance).
	lapses     func() uint64
	lapsesSeen uint64
	// frozen is set while a Manager that served is fenced: its cooldowns
	// do not end then (see advance and thawLocked).
	frozen bool
	// peers are the live holders of the pool, this one included; nil
	// until SetPeers, when every request is served.
	peers map[string]bool
	// peersSeq counts the lists of live holders (SetPeers); strangers
	// holds, for each holder seen in a block but named by no list yet,
	// peersSeq when it was first seen (see goneLocked).
	peersSeq  uint64
	strangers map[string]uint64
	// persistedSeq counts the versions of blocks recorded; othersCache
	// keeps othersLocked's sum while nothing it depends on changed.
	persistedSeq uint64
	othersCache  othersCache
	// lost: the store shows another holder on an address this Manager
	// holds; its claims were taken over, and it serves nothing until it
	// recovers again.
	lost bool

	// seq numbers changes of owner or state (see entry.changed).
	seq uint64

	// io serialises Store writes (claims, returns, flushes), so one
	// Manager never races itself on a block's version.
	io    sync.Mutex
	kickC chan struct{}
	stats stats
	// denseAt: see the constant.
	denseAt int
}

// reset empties the Manager's state, sized for about n entries.
func (m *Manager) reset(n int) {
	m.entries = make(map[netip.Addr]*entry, n)
	m.byToken = make(map[string]*entry, n)
	m.readyList, m.free, m.pending, m.cooldown, m.surplus = list{}, list{}, list{}, list{}, list{}
	m.blocks = map[netip.Prefix]*blockState{}
	m.returning, m.elsewhere, m.othersFree = 0, 0, 0
	m.pendingNS = map[string]int{}
	m.unstored = map[netip.Addr]Unstored{}
	m.unhanded = map[netip.Addr]bool{}
	m.cursor = m.cfg.Ranges.First()
	m.noClaimableUntil = time.Time{}
	m.lost = false
	m.othersCache = othersCache{}
}

// Pool returns the pool's name.
func (m *Manager) Pool() string { return m.cfg.Pool }

// Holder returns the holder's name.
func (m *Manager) Holder() string { return m.cfg.Holder }

// Ranges returns the pool's ranges.
func (m *Manager) Ranges() *Ranges { return m.cfg.Ranges }

// Close stops the Manager from handing out addresses, as before Recover.
// Call it, and stop Run, before another Manager takes over the same holder's
// claims, so the two never write over each other.
func (m *Manager) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ready = false
}

// Lost reports whether the store showed another holder on an address
// this Manager held: its claims were taken over, it serves and writes
// nothing more, and only a new Manager recovered from the store serves
// the pool again.
func (m *Manager) Lost() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lost
}

// Ready reports whether the Manager has recovered and can allocate: not
// closed, not fenced, its claims not lost.
func (m *Manager) Ready() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.servingLocked(m.clock.Now()) == nil
}

// SetFence gives the Manager the test of its holder's lease: valid reports
// whether the lease is still safely held (renewed recently enough that no
// other holder may take its claims over yet; see docs/design.md,
// "Fencing"). While it reports false, every call that could hand out,
// change or write an address is refused with ErrNotReady. Nil removes the
// fence. The test is called under the Manager's lock, often: it must be
// cheap and must not call the Manager.
//
// lapses, if not nil, counts the renewals that came after the lease had
// lapsed, and must count one before valid reports true again. While
// fenced, the Manager refuses the releases that would lengthen the
// cooldown of a machine still there, so its cooldowns do not end then;
// lapses lets it see a lapse that no call observed while it lasted (see
// advance). Like valid, it is called under the lock.
func (m *Manager) SetFence(valid func() bool, lapses func() uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fence, m.lapses = valid, lapses
	if lapses != nil {
		m.lapsesSeen = lapses()
	}
}

// servingLocked says why the Manager may not serve now, or nil.
func (m *Manager) servingLocked(now time.Time) error {
	switch {
	case !m.ready:
		return ErrNotReady
	case m.lost:
		return fmt.Errorf("%w: another holder has taken this holder's claims over", ErrNotReady)
	case m.fence != nil && !m.fence():
		return fmt.Errorf("%w: this holder's lease has not been renewed in time", ErrNotReady)
	}
	return nil
}
