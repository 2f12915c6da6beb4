package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Clock tells the time. The Manager reads time only through it, so tests
// can drive cooldowns and expiries with a fake one.
type Clock interface {
	Now() time.Time
}

// Timers makes the tickers and timers Run waits on. The default is the real
// ones; a test injects fakes to drive Run without waiting for real time.
type Timers interface {
	// NewTicker returns a channel that ticks every d, and how to stop it.
	NewTicker(d time.Duration) (<-chan time.Time, func())
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

// State is the state of an address in a Manager.
type State uint8

// The states of an address. An address moves
// unclaimed -> free -> pending -> allocated -> cooldown -> free, with
// shortcuts described in docs/design.md.
const (
	// StateUnclaimed: not claimed by this Manager.
	StateUnclaimed State = iota
	// StateFree: claimed by this Manager and ready to hand out.
	StateFree
	// StatePending: handed out for a reservation token, not yet bound to a
	// virtual machine the cluster has stored.
	StatePending
	// StateAllocated: bound to a virtual machine's UID.
	StateAllocated
	// StateCooldown: released; not handed out before its deadline.
	StateCooldown
	// stateReturning: being given back to the store, or handed over to
	// another holder, by a write in flight.
	stateReturning
	// stateSurplus: out of cooldown while the free list is full, waiting
	// to be given back to the store; free to hand out until then.
	stateSurplus
)

var stateNames = [...]string{"unclaimed", "free", "pending", "allocated", "cooldown", "returning", "surplus"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", s)
}

// Owner identifies who holds an address: the reservation token stamped at
// admission (the object has no UID and perhaps no name yet), and the
// virtual machine's UID once the cluster has stored it.
type Owner struct {
	Token string
	UID   string
	// Ref names the holder in messages, such as "team-a/db-1"; optional.
	Ref string
}

// Reservation describes who asks for an address at admission.
type Reservation struct {
	// Token is fresh for every admission; it keys the reservation until
	// the machine is stored and bound.
	Token string
	// Namespace is where the machine will be stored: pending reservations
	// are bounded per namespace, and the proof that a lapsed reservation
	// was never stored (see Unused) looks there.
	Namespace string
	// Ref names the machine in messages: namespace/name, or the
	// generateName prefix when the name is not known yet.
	Ref string
}

// Config configures a Manager.
type Config struct {
	// Pool names the pool, for errors and metrics.
	Pool string
	// Family, if set, names the address family of Ranges ("IPv4" or
	// "IPv6") in messages: for one of the Managers of a pool of both
	// families.
	Family string
	// Holder names this Manager in the store's claims. It must be stable
	// across restarts of the same replica and unique among the replicas
	// running at any moment.
	Holder string
	// Ranges are the pool's usable addresses.
	Ranges *Ranges
	// Cooldown is how long a released address rests before reuse; zero
	// means no rest at all.
	Cooldown time.Duration
	// PendingTTL bounds how long a reservation may wait for its virtual
	// machine to appear before it is expired into cooldown. It must exceed
	// the API server's request timeout. Zero means DefaultPendingTTL.
	PendingTTL time.Duration
	// MaxPendingPerNamespace bounds the pending reservations of one
	// namespace; zero means no bound.
	MaxPendingPerNamespace int
	// LowWatermark, TargetFree and HighWatermark bound the local free list:
	// below low the Manager claims up to target; above high it returns
	// addresses down to target. With several holders, each keeps a smaller
	// share of a small pool (see SetPeers).
	LowWatermark, TargetFree, HighWatermark int
	// ArmBatch is how many free addresses are armed at a time: written to
	// the store as "may be handed out" before they are, so that a crash
	// rests those few and frees the rest of the free list. Zero picks one
	// from the pool's size, between 4 and 32, which then grows with the
	// rate of allocations to about a second's worth, up to a 32nd of the
	// pool (see armBatchLocked).
	ArmBatch int
	// Store persists claims and cooldowns.
	Store Store
	// Clock defaults to the system clock.
	Clock Clock
	// Timers default to the real ones.
	Timers Timers
	// ObserveAllocation, if set, receives the latency of every Allocate.
	ObserveAllocation func(d time.Duration, err error)
}

// Defaults for Config fields left zero, and for the pools that leave them
// unset.
const (
	DefaultCooldown      = 5 * time.Minute
	DefaultPendingTTL    = 2 * time.Minute
	DefaultLowWatermark  = 32
	DefaultTargetFree    = 128
	DefaultHighWatermark = 512
)

// DefaultMaxPendingPerNamespace is the bound on one namespace's pending
// reservations for a pool of usable addresses that sets none: an eighth of
// the pool, and at least 64, so that one namespace's failing creates
// cannot drain a small pool while bursts in a large one are not refused.
func DefaultMaxPendingPerNamespace(usable uint64) int {
	return int(min(max(usable/8, 64), 1<<30))
}

// defaultArmBatch arms a thirty-second of the pool at a time, between 4
// and 32: after a crash, at most that many free addresses rest.
func defaultArmBatch(usable uint64) int {
	return int(min(max(usable/32, 4), 32))
}

// maxArmBatch bounds the arm batch that grows with the rate: a 32nd of the
// pool, as the default batch is, but up to 512 (a /18 in IPv4 at 200
// allocations a second then arms about twice a second instead of every 16
// allocations).
func maxArmBatch(usable uint64) int {
	return int(min(max(usable/32, 4), 512))
}

// maxStoreRetries bounds the re-reads after store conflicts of one write:
// sized for several holders writing one block at once (a small pool has a
// single block), with a backoff between tries of up to 128ms. A caller
// with a deadline (an admission) stops sooner: see backoff.
const maxStoreRetries = 48

// maxClaimRounds bounds how often one allocation claims for an empty free
// list that concurrent allocations keep emptying.
const maxClaimRounds = 64

// entry is one address this Manager has claimed.
type entry struct {
	addr  netip.Addr
	state State
	owner Owner
	// at is when a pending reservation was made, or when a cooldown ends.
	at time.Time
	// ns is a pending reservation's namespace.
	ns string
	// armed: a free address that the store, as last written, shows armed,
	// so that it may be handed out; arming: a write in flight arms it.
	armed, arming bool
	// orphan: found claimed by this holder in the store, in use or armed
	// there, without knowing which machine holds it: it cools down until
	// a resync with the live machines settles it (see materializeLocked).
	orphan bool
	// changed is the Manager's sequence number at the entry's last change
	// of owner or state, so Resync can tell changes newer than its list.
	changed    uint64
	prev, next *entry
}

// blockState is the Manager's view of one persisted block.
type blockState struct {
	persisted Block
	loaded    bool
	// returning: a write that gives addresses back, or hands them over, is
	// in flight; once it lands the store may no longer claim what
	// persisted shows claimed.
	returning bool
	// gen counts local changes that the persisted block does not reflect;
	// written is the gen of the last successful write.
	gen, written uint64
	// ours counts this Manager's entries in the block; elsewhere, the
	// addresses other holders claim in persisted; othersFree, those of
	// them persisted shows neither in use nor cooling down.
	ours, elsewhere, othersFree int
	// requested: another holder may ask for addresses here; the next
	// rebalance reads the block and answers.
	requested bool
	// bound is the Manager's I/O sequence number that persisted is known
	// to be at least as new as: a read's start, a write's completion.
	// issued is the sequence number of the last write sent (see
	// overtakenLocked).
	bound, issued uint64
	// moved: the store showed (Observe) a version of the block other than
	// persisted's since it was read or written, most likely another
	// holder's write. A claim reads the block first, rather than lose a
	// compare-and-swap.
	moved bool
}

func (b *blockState) dirty() bool { return b.gen != b.written }

// Counts is a consistent snapshot of how many addresses are in each state.
type Counts struct {
	// Usable is the number of usable addresses in the ranges (saturated).
	Usable uint64
	// Claimed is every address this Manager holds, in any state.
	Claimed, Free, Pending, Allocated, Cooldown int
	// ClaimedElsewhere counts addresses other holders claim in the blocks
	// this Manager has read.
	ClaimedElsewhere int
}

// Add returns the sum of c and o: the counts of several Managers (the
// families of one pool) as one. Usable saturates, as a Manager's does.
func (c Counts) Add(o Counts) Counts {
	if c.Usable+o.Usable < c.Usable {
		c.Usable = ^uint64(0)
	} else {
		c.Usable += o.Usable
	}
	c.Claimed += o.Claimed
	c.Free += o.Free
	c.Pending += o.Pending
	c.Allocated += o.Allocated
	c.Cooldown += o.Cooldown
	c.ClaimedElsewhere += o.ClaimedElsewhere
	return c
}

// Stats are the Manager's monotonic counters.
type Stats struct {
	Allocations, Releases, Exhausted, Conflicts, ExpiredPendings uint64
	Rebalances, RebalanceFailures, StoreConflicts, StoreWrites   uint64
	// StoreFailures counts block writes that failed for another reason
	// than a lost compare-and-swap (the API server refused or did not
	// answer); they are retried.
	StoreFailures uint64
	// PendingLimited counts reservations refused by the bound per
	// namespace; Unused, lapsed reservations returned without a cooldown
	// because no object was stored with it.
	PendingLimited, Unused uint64
	// Granted and Received count addresses handed over to and from other
	// holders; TakenOver, addresses taken over from holders that left.
	Granted, Received, TakenOver uint64
}

// Add returns the sum of s and o: the counters of several Managers (the
// families of one pool) as one.
func (s Stats) Add(o Stats) Stats {
	s.Allocations += o.Allocations
	s.Releases += o.Releases
	s.Exhausted += o.Exhausted
	s.Conflicts += o.Conflicts
	s.ExpiredPendings += o.ExpiredPendings
	s.Rebalances += o.Rebalances
	s.RebalanceFailures += o.RebalanceFailures
	s.StoreConflicts += o.StoreConflicts
	s.StoreWrites += o.StoreWrites
	s.StoreFailures += o.StoreFailures
	s.PendingLimited += o.PendingLimited
	s.Unused += o.Unused
	s.Granted += o.Granted
	s.Received += o.Received
	s.TakenOver += o.TakenOver
	return s
}

type stats struct {
	allocations, releases, exhausted, conflicts, expired  atomic.Uint64
	rebalances, rebalanceFailures, storeConflicts, writes atomic.Uint64
	storeFailures                                         atomic.Uint64
	pendingLimited, unused                                atomic.Uint64
	granted, received, takenOver                          atomic.Uint64
}

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
	pendingNS                        map[string]int
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
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() } //nolint:forbidigo // the one place the real clock is read

type realTimers struct{}

func (realTimers) NewTicker(d time.Duration) (<-chan time.Time, func()) {
	t := time.NewTicker(d)
	return t.C, t.Stop
}

func (realTimers) After(d time.Duration) <-chan time.Time { return time.After(d) }

// NewManager validates cfg, fills in defaults and returns a Manager that is
// not ready until Recover has run.
func NewManager(cfg Config) (*Manager, error) {
	var errs FieldErrors
	bad := func(field, value, detail string) {
		errs = append(errs, &FieldError{Path: Path{{Field: field}}, Value: value, Detail: detail})
	}
	if cfg.Pool == "" {
		bad("pool", "", "a pool name is required")
	}
	if cfg.Holder == "" {
		bad("holder", "", "a holder name is required")
	}
	if cfg.Ranges == nil {
		bad("ranges", "", "ranges are required; build them with ParseRanges")
	}
	if cfg.Store == nil {
		bad("store", "", "a store is required")
	}
	if cfg.PendingTTL == 0 {
		cfg.PendingTTL = DefaultPendingTTL
	}
	if cfg.Cooldown < 0 {
		bad("cooldown", cfg.Cooldown.String(), "must not be negative; zero means no cooldown")
	}
	if cfg.PendingTTL < 0 {
		bad("pendingTTL", cfg.PendingTTL.String(), "must not be negative")
	}
	if cfg.MaxPendingPerNamespace < 0 {
		bad("maxPendingPerNamespace", fmt.Sprint(cfg.MaxPendingPerNamespace), "must not be negative; zero means no bound")
	}
	if cfg.ArmBatch < 0 {
		bad("armBatch", fmt.Sprint(cfg.ArmBatch), "must not be negative; zero picks one from the pool's size")
	}
	if cfg.LowWatermark == 0 && cfg.TargetFree == 0 && cfg.HighWatermark == 0 {
		cfg.LowWatermark, cfg.TargetFree, cfg.HighWatermark = DefaultLowWatermark, DefaultTargetFree, DefaultHighWatermark
	}
	if cfg.LowWatermark < 0 || cfg.TargetFree < 1 || cfg.LowWatermark > cfg.TargetFree || cfg.TargetFree > cfg.HighWatermark {
		bad("watermarks", fmt.Sprintf("low=%d target=%d high=%d", cfg.LowWatermark, cfg.TargetFree, cfg.HighWatermark),
			"need 0 <= low <= target <= high and target >= 1")
	}
	if cfg.TargetFree > BlockSize {
		bad("watermarks", fmt.Sprintf("target=%d", cfg.TargetFree), fmt.Sprintf("target must be at most %d, the size of a block", BlockSize))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("configure pool %q: %w", cfg.Pool, errs)
	}
	armMax := cfg.ArmBatch
	if cfg.ArmBatch == 0 {
		cfg.ArmBatch = defaultArmBatch(cfg.Ranges.Size())
		armMax = max(cfg.ArmBatch, maxArmBatch(cfg.Ranges.Size()))
	}
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	if cfg.Timers == nil {
		cfg.Timers = realTimers{}
	}
	m := &Manager{cfg: cfg, clock: cfg.Clock, kickC: make(chan struct{}, 1), seen: map[netip.Prefix]map[string]*Bitmap{}, armedIn: map[netip.Prefix]bool{}, armMax: armMax}
	m.reset(0)
	return m, nil
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
func (m *Manager) SetFence(valid func() bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fence = valid
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

// marksLocked returns the watermarks in force: the configured ones, or,
// with several live holders, smaller ones, so that their free lists
// together hold at most half the pool and no holder strands a small pool's
// addresses out of the others' reach.
func (m *Manager) marksLocked() (low, target, high int) {
	low, target, high = m.cfg.LowWatermark, m.cfg.TargetFree, m.cfg.HighWatermark
	// A stream of allocations claims about four seconds of it at a time,
	// up to the high watermark, and claims again while half a second of
	// it is left: each claim writes a block that other holders may be
	// writing too, and one that comes too late makes allocations wait.
	m.rollRateLocked(m.clock.Now())
	if rate := max(m.lastRate, m.rateCount); rate > 0 {
		target = max(target, min(4*rate, high))
		low = max(low, min(rate/2, target/2))
	}
	if n := len(m.peers); n > 1 {
		share := int(min(m.cfg.Ranges.Size()/uint64(2*n), uint64(target)))
		if share < target {
			target = max(share, 1)
			low = min(low, target/2)
			high = max(target, min(high, 2*target))
		}
	}
	return low, target, high
}

// freeLocked is how many addresses the Manager holds free, ready or not.
func (m *Manager) freeLocked() int { return m.readyList.n + m.free.n }

// Allocate hands out an address for a reservation. It is idempotent: the
// same token gets the same address while its reservation or allocation
// lasts. It writes to the store synchronously only when no armed address is
// left (a burst faster than the background arms them), when the free list
// is empty, or when the pool's free addresses are all another holder's;
// ctx bounds that wait.
func (m *Manager) Allocate(ctx context.Context, r Reservation) (netip.Addr, error) {
	start := m.clock.Now()
	a, err := m.allocate(ctx, r, start)
	if m.cfg.ObserveAllocation != nil {
		m.cfg.ObserveAllocation(m.clock.Now().Sub(start), err)
	}
	return a, err
}

func (m *Manager) allocate(ctx context.Context, r Reservation, now time.Time) (netip.Addr, error) {
	if r.Token == "" {
		return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, errTokenRequired)
	}
	// asked are the blocks asked for addresses: each at most once, and
	// another only while the store shows other holders free addresses
	// (the first asked may have had none to give by the time it read the
	// request).
	var asked map[netip.Prefix]bool
	refreshed, askedAll, readUnread := false, false, false
	// claimedOut: a claim found nothing left to claim. What the view
	// still counts as unclaimed is not tried again until an ask or a read
	// has passed, but other holders are still asked (and blocks read
	// again) before a refusal: the claim's read may just have shown them
	// arming what was unclaimed.
	claimedOut := false
	for attempt := 0; ; attempt++ {
		m.mu.Lock()
		if err := m.servingLocked(now); err != nil {
			m.mu.Unlock()
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, err)
		}
		m.advance(now)
		if e := m.byToken[r.Token]; e != nil {
			m.mu.Unlock()
			return e.addr, nil
		}
		if err := m.pendingLimitLocked(r.Namespace); err != nil {
			m.mu.Unlock()
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, err)
		}
		if e := m.readyList.head; e != nil {
			m.readyList.remove(e)
			m.setPending(e, r, now)
			m.countAllocationLocked(now)
			low, _, _ := m.marksLocked()
			kick := m.readyList.n < (m.armBatchLocked(now)+1)/2 || m.freeLocked() < low
			m.mu.Unlock()
			m.stats.allocations.Add(1)
			if kick {
				m.Kick()
			}
			return e.addr, nil
		}
		unarmed := m.free.n + m.surplus.n
		var claimable uint64
		if !claimedOut {
			claimable = m.claimableLocked()
		}
		// Other holders may hold free addresses: the store showed some
		// that were neither in use nor cooling down there.
		askable := !askedAll && asked == nil && m.othersFree > 0 ||
			// Cooldowns that the store shows at other holders may have
			// ended since it was read: those addresses are free there.
			!askedAll && len(asked) < maxAsks && unarmed == 0 && claimable == 0 && m.elsewhere > 0 && m.othersLocked(now).Free > 0
		// What other holders claim is known from blocks read earlier: before
		// calling the pool exhausted, read those again (at most once a
		// second), since they may have given addresses back since.
		refresh := !refreshed && m.elsewhere > 0 && !now.Before(m.refreshAfter)
		// A block marked unread (a write to it failed or lost a
		// compare-and-swap) is read before any refusal, paced or not: what
		// it shows of others is unknown.
		unread := !readUnread && unarmed == 0 && claimable == 0 && !askable && m.elsewhere > 0 && m.unreadElsewhereLocked()
		if attempt == maxClaimRounds || unarmed == 0 && claimable == 0 && !askable && !refresh && !unread {
			// Nothing is left to claim: say so without scanning, however
			// large the pool.
			err := m.exhaustedLocked()
			m.mu.Unlock()
			m.stats.exhausted.Add(1)
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, err)
		}
		var stale []netip.Prefix
		if unarmed == 0 && claimable == 0 && !askable {
			if refresh {
				refreshed, m.refreshAfter = true, now.Add(rescanAfter)
			}
			readUnread = true
			for p, bs := range m.blocks {
				if bs.elsewhere > 0 && (refresh || !bs.loaded) {
					stale = append(stale, p)
				}
			}
		}
		m.mu.Unlock()
		var err error
		switch {
		case len(stale) > 0:
			for _, p := range stale {
				if err = m.load(ctx, p); err != nil {
					break
				}
			}
			// A new view: holders it shows with free addresses are
			// asked, even in blocks asked before (a holder hands over
			// half of what it holds free at a time), and what it shows
			// unclaimed is claimed. There are at most two new views
			// (one refresh, one read of unread blocks).
			asked, askedAll, claimedOut = nil, false, false
		case unarmed > 0:
			// Free addresses, none armed: arm a batch, synchronously.
			err = m.arm(ctx)
		case claimable > 0:
			// The free list is empty: claim synchronously, outside the
			// lock. Whether this claim or a concurrent one refilled the
			// list, try again. A claim that finds nothing leaves only
			// what other holders have.
			var avail int
			_, target, _ := m.targets()
			avail, err = m.claim(ctx, target)
			if err == nil && avail == 0 {
				claimedOut = true
			}
		default:
			// Every address is claimed, some by other holders: ask them.
			if asked == nil {
				asked = map[netip.Prefix]bool{}
			}
			var p netip.Prefix
			p, err = m.askIn(ctx, netip.Addr{}, asked)
			asked[p] = true
			askedAll = askedAll || !p.IsValid()
			// Addresses may have been given back meanwhile.
			claimedOut = false
		}
		if err != nil {
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, err)
		}
	}
}

// unreadElsewhereLocked reports whether a block where other holders claim
// addresses is marked to be read again before it is trusted.
func (m *Manager) unreadElsewhereLocked() bool {
	for _, bs := range m.blocks {
		if !bs.loaded && bs.elsewhere > 0 {
			return true
		}
	}
	return false
}

// maxAsks bounds the blocks one allocation asks other holders in.
const maxAsks = 3

// targets returns the watermarks in force.
func (m *Manager) targets() (low, target, high int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.marksLocked()
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

// Reserve hands out a specific address for a reservation, as for a virtual
// machine that asks for a static address. It is refused while the address
// is pending, allocated or cooling down, with an AddressError that says who
// holds it or until when it cools down. An address this Manager has not
// claimed yet is claimed synchronously; one that another holder holds free
// is asked for, and handed over within ctx's deadline if that holder can.
func (m *Manager) Reserve(ctx context.Context, r Reservation, addr netip.Addr) error {
	now := m.clock.Now()
	addr = Canonical(addr)
	if r.Token == "" {
		return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, errTokenRequired)
	}
	if !m.cfg.Ranges.Contains(addr) {
		return fmt.Errorf("reserve %s in pool %q (usable: %s): %w", addr, m.cfg.Pool, m.cfg.Ranges, ErrOutOfRange)
	}
	for attempt := 0; ; attempt++ {
		if attempt > 4 {
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, ErrConflict)
		}
		m.mu.Lock()
		if err := m.servingLocked(now); err != nil {
			m.mu.Unlock()
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
		}
		m.advance(now)
		if e := m.byToken[r.Token]; e != nil {
			m.mu.Unlock()
			if e.addr == addr {
				return nil
			}
			return fmt.Errorf("reserve %s in pool %q: token %s already holds %s: %w", addr, m.cfg.Pool, r.Token, e.addr, ErrConflict)
		}
		if err := m.pendingLimitLocked(r.Namespace); err != nil {
			m.mu.Unlock()
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
		}
		e := m.entries[addr]
		switch {
		case e == nil:
			m.mu.Unlock()
			if err := m.claimAddr(ctx, addr); err != nil {
				return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
			}
			continue
		case e.state == StateCooldown:
			err := &AddressError{Addr: addr, Reason: ErrCoolingDown, State: e.state, Until: e.at}
			m.mu.Unlock()
			return fmt.Errorf("reserve in pool %q: %w", m.cfg.Pool, err)
		case e.state == StatePending || e.state == StateAllocated:
			err := &AddressError{Addr: addr, Reason: ErrInUse, State: e.state, Owner: e.owner}
			m.mu.Unlock()
			return fmt.Errorf("reserve in pool %q: %w", m.cfg.Pool, err)
		case e.state == stateReturning:
			// Being given back or handed over: wait for that write (it
			// holds io), then look again.
			m.mu.Unlock()
			m.io.Lock()
			m.io.Unlock() //nolint:staticcheck // an empty critical section: waiting for the write in flight
			continue
		case !e.armed:
			// Free, but the store does not show it armed: a crash after
			// handing it out would free it. Arm it first.
			m.mu.Unlock()
			if err := m.armEntries(ctx, addr); err != nil {
				return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
			}
			continue
		}
		m.readyList.remove(e)
		m.setPending(e, r, now)
		m.countAllocationLocked(now)
		m.mu.Unlock()
		m.stats.allocations.Add(1)
		return nil
	}
}

// countAllocationLocked counts an allocation at now for the arm batch.
func (m *Manager) countAllocationLocked(now time.Time) {
	m.rollRateLocked(now)
	m.rateCount++
}

// rollRateLocked starts a new second of counting once the current one is
// over; a gap of more than a second leaves no rate behind.
func (m *Manager) rollRateLocked(now time.Time) {
	switch el := now.Sub(m.rateStart); {
	case el < time.Second && el >= 0:
		return
	case el < 2*time.Second && el >= 0:
		m.lastRate = m.rateCount
	default:
		m.lastRate = 0
	}
	m.rateStart, m.rateCount = now, 0
}

// armBatchLocked is how many free addresses to keep armed: cfg.ArmBatch,
// or the allocations of the last full second or of the current one when
// that is more, up to armMax. A crash rests no more than that: about a
// second's allocations beyond the configured batch at most. In exchange,
// a fast stream of allocations arms (writes its block) about twice a
// second, not every ArmBatch/2 allocations.
func (m *Manager) armBatchLocked(now time.Time) int {
	m.rollRateLocked(now)
	return min(max(m.cfg.ArmBatch, m.lastRate, m.rateCount), m.armMax)
}

// CanReserve says, without changing anything, whether Reserve of addr
// would be refused because of the address's state: for a dry run. An
// address another holder claims is judged by what the store last showed.
func (m *Manager) CanReserve(addr netip.Addr) error {
	addr = Canonical(addr)
	if !m.cfg.Ranges.Contains(addr) {
		return fmt.Errorf("reserve %s in pool %q (usable: %s): %w", addr, m.cfg.Pool, m.cfg.Ranges, ErrOutOfRange)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.servingLocked(m.clock.Now()); err != nil {
		return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
	}
	m.advance(m.clock.Now())
	e := m.entries[addr]
	if e == nil {
		if bs := m.blocks[BlockOf(addr)]; bs != nil && bs.loaded {
			// Another holder's: a real request asks it, and only it knows.
			// A dry run goes by the cooldown the store shows, which only a
			// proof of an unused reservation can have cut short.
			h, _ := bs.persisted.holderOf(blockOffset(addr))
			if err := storedCooldown(&bs.persisted, addr, h, m.clock.Now()); err != nil {
				return err
			}
			if err := m.elsewhereLocked(&bs.persisted, addr); !errors.Is(err, errAskHolder) {
				return err
			}
		}
		return nil
	}
	switch e.state {
	case StateCooldown:
		return &AddressError{Addr: e.addr, Reason: ErrCoolingDown, State: e.state, Until: e.at}
	case StatePending, StateAllocated:
		return &AddressError{Addr: e.addr, Reason: ErrInUse, State: e.state, Owner: e.owner}
	}
	return nil
}

func (m *Manager) setPending(e *entry, r Reservation, now time.Time) {
	m.touch(e)
	e.state = StatePending
	e.armed, e.arming = false, false
	e.owner = Owner{Token: r.Token, Ref: r.Ref}
	e.ns = r.Namespace
	e.at = now
	m.pending.pushBack(e)
	m.pendingNS[e.ns]++
	m.byToken[r.Token] = e
}

// leavePending takes e out of the pending list and its namespace's count.
func (m *Manager) leavePending(e *entry) {
	m.pending.remove(e)
	if n := m.pendingNS[e.ns] - 1; n > 0 {
		m.pendingNS[e.ns] = n
	} else {
		delete(m.pendingNS, e.ns)
	}
	e.ns = ""
}

// Cancel takes back the pending reservation of token at once, without a
// cooldown, for an admission that made it and is then refused before it
// answers (a dual-stack create that got one family's address and not the
// other's): no object can carry the address, since the only answer that
// could stamp it was never sent. It reports the address, and false when
// the token holds no pending reservation here. The address is free again
// but unarmed: handing it out again first writes its block, as for any
// address that the store may show in use.
func (m *Manager) Cancel(token string) (netip.Addr, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.byToken[token]
	if e == nil || e.state != StatePending {
		return netip.Addr{}, false
	}
	m.leavePending(e)
	delete(m.byToken, token)
	m.touch(e)
	e.owner = Owner{}
	e.at = time.Time{}
	if m.rest(e) {
		m.Kick()
	}
	// A flush since the reservation shows it in use; the next write
	// drops that.
	m.markDirty(e.addr)
	return e.addr, true
}

// Bind binds the pending reservation of o.Token to the machine the cluster
// stored for it, o.UID (o.Ref names it in messages). Binding again to the
// same UID is a no-op.
func (m *Manager) Bind(o Owner) (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.servingLocked(m.clock.Now()); err != nil {
		return netip.Addr{}, fmt.Errorf("bind token %s in pool %q: %w", o.Token, m.cfg.Pool, err)
	}
	m.advance(m.clock.Now())
	e := m.byToken[o.Token]
	if e == nil {
		return netip.Addr{}, fmt.Errorf("bind token %s to %s in pool %q: %w", o.Token, o.UID, m.cfg.Pool, ErrUnknownToken)
	}
	switch {
	case e.state == StatePending:
		m.leavePending(e)
		m.touch(e)
		e.state = StateAllocated
		e.owner.UID = o.UID
		if o.Ref != "" {
			e.owner.Ref = o.Ref
		}
		e.at = time.Time{}
	case e.owner.UID != o.UID:
		m.stats.conflicts.Add(1)
		return netip.Addr{}, fmt.Errorf("bind token %s in pool %q: %w", o.Token, m.cfg.Pool,
			&AddressError{Addr: e.addr, Reason: ErrConflict, State: e.state, Owner: e.owner})
	}
	return e.addr, nil
}

// Release puts an address into cooldown. The owner must match: the UID of
// the virtual machine it is allocated to, or the token of a pending
// reservation. Releasing an address that is free or not held is a no-op,
// so a retried release is harmless. Releasing, for a machine, an address
// already cooling down starts the cooldown again from now: that machine
// still carries it (its finalizer was not removed yet: a retry, or the
// address was taken over or recovered with its release already made), and
// the cooldown must end no earlier than that long after it goes. It only
// ever lengthens a cooldown. A Manager not recovered
// yet, closed or fenced refuses with ErrNotReady: nobody would persist it.
// Bind and Adopt refuse the same way, so that nothing changes a closed
// Manager and a late Flush of it writes nothing stale.
func (m *Manager) Release(addr netip.Addr, owner Owner) error {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	if err := m.servingLocked(now); err != nil {
		// A release here would be lost.
		return fmt.Errorf("release %s in pool %q: %w", addr, m.cfg.Pool, err)
	}
	m.advance(now)
	e := m.entries[addr]
	if e != nil && e.state == StateCooldown && owner.UID != "" {
		if owner.Token != "" {
			// As below: the machine of a lapsed reservation was stored.
			m.usedLocked(addr, owner.Token)
		}
		// A change all the same: a resync whose list was taken before it
		// shows the machine, which is going, and must not adopt its
		// address back.
		m.touch(e)
		if until := now.Add(m.cfg.Cooldown); until.After(e.at) {
			m.cooldown.remove(e)
			e.at = until
			m.cooldown.insertByAt(e)
			m.markDirty(e.addr)
		}
		return nil
	}
	if e == nil || (e.state != StatePending && e.state != StateAllocated) {
		if e != nil && owner.Token != "" {
			// The machine of a lapsed reservation was stored after all:
			// its address keeps the whole cooldown.
			m.usedLocked(addr, owner.Token)
		}
		return nil
	}
	if !owns(e, owner) {
		m.stats.conflicts.Add(1)
		return fmt.Errorf("release in pool %q: %w", m.cfg.Pool, &AddressError{Addr: addr, Reason: ErrConflict, State: e.state, Owner: e.owner})
	}
	m.toCooldown(e, now)
	m.stats.releases.Add(1)
	return nil
}

func owns(e *entry, o Owner) bool {
	if e.state == StateAllocated && o.UID != "" {
		return e.owner.UID == o.UID
	}
	return o.Token != "" && e.owner.Token == o.Token
}

// Holds reports whether this Manager holds addr (claims it, in any state):
// with several holders, the one that holds an address looks after the
// object that carries it.
func (m *Manager) Holds(addr netip.Addr) bool {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.entries[addr] != nil
}

// Refresh reads addr's block from the store again, so that HolderOf and
// Holds answer from what the store holds now rather than from this
// Manager's last read of it. It is for the controller's rare doubts, not
// for the hot path.
func (m *Manager) Refresh(ctx context.Context, addr netip.Addr) error {
	return m.load(ctx, BlockOf(Canonical(addr)))
}

// HolderOf returns the holder that claims addr as far as this Manager knows:
// itself, or the other holder the store showed when the block was last
// read; false when none.
func (m *Manager) HolderOf(addr netip.Addr) (string, bool) {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.entries[addr] != nil {
		return m.cfg.Holder, true
	}
	if bs := m.blocks[BlockOf(addr)]; bs != nil && bs.loaded {
		return bs.persisted.holderOf(blockOffset(addr))
	}
	return "", false
}

// SeenHolderOf returns the other holder that claims addr in the last
// version of its block that Observe showed (the watch), if any. The watch
// may lag, so it is a hint for work that another holder does, never a
// reason to hand out, adopt or release anything: the controller asks it
// before reading a block again, to learn that a machine is another
// replica's without a read.
func (m *Manager) SeenHolderOf(addr netip.Addr) (string, bool) {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	off := blockOffset(addr)
	for h, bm := range m.seen[BlockOf(addr)] {
		if bm.Has(off) {
			return h, true
		}
	}
	return "", false
}

// Adopt makes addr allocated to owner whatever its state, because a live
// virtual machine carries it: the cluster's objects are the truth. An
// address another UID holds is a conflict, reported and left as it is. A
// pending reservation of another token is displaced: if its machine ever
// appears, adopting it reports the conflict. An address no holder claims is
// claimed first, in the store; one another holder claims is refused with
// ErrHeldElsewhere: that holder adopts it.
func (m *Manager) Adopt(ctx context.Context, addr netip.Addr, owner Owner) error {
	addr = Canonical(addr)
	if !m.cfg.Ranges.Contains(addr) {
		return fmt.Errorf("adopt %s in pool %q (usable: %s): %w", addr, m.cfg.Pool, m.cfg.Ranges, ErrOutOfRange)
	}
	for attempt := 0; ; attempt++ {
		m.mu.Lock()
		if err := m.servingLocked(m.clock.Now()); err != nil {
			m.mu.Unlock()
			return fmt.Errorf("adopt %s in pool %q: %w", addr, m.cfg.Pool, err)
		}
		m.advance(m.clock.Now())
		e := m.entries[addr]
		switch {
		case e != nil && e.state != stateReturning:
			err := m.adoptLocked(addr, owner)
			m.mu.Unlock()
			return err
		case attempt > 4:
			m.mu.Unlock()
			return fmt.Errorf("adopt %s in pool %q: %w", addr, m.cfg.Pool, ErrConflict)
		case e != nil:
			// Being given back or handed over: wait for that write.
			m.mu.Unlock()
			m.io.Lock()
			m.io.Unlock() //nolint:staticcheck // an empty critical section: waiting for the write in flight
			continue
		}
		m.mu.Unlock()
		// Claimed in the store before it is ours: no other holder may hold
		// it at the same time.
		if err := m.claimAddr(ctx, addr); err != nil {
			return fmt.Errorf("adopt %s in pool %q: %w", addr, m.cfg.Pool, err)
		}
	}
}

func (m *Manager) adoptLocked(addr netip.Addr, owner Owner) error {
	e := m.entries[addr]
	switch {
	case e == nil:
		e = m.addEntry(addr, StateAllocated)
		// Claimed without a write of its own (only Recover, which writes
		// before it serves, does this).
		m.markDirty(addr)
	case e.state == StateAllocated:
		if e.owner.UID == owner.UID {
			return nil
		}
		m.stats.conflicts.Add(1)
		return fmt.Errorf("adopt in pool %q: %w", m.cfg.Pool, &AddressError{Addr: addr, Reason: ErrConflict, State: e.state, Owner: e.owner})
	case e.state == StatePending:
		m.leavePending(e)
		if e.owner.Token != owner.Token {
			delete(m.byToken, e.owner.Token)
		}
	case e.state == StateFree:
		m.listOf(e).remove(e)
	case e.state == stateSurplus:
		m.surplus.remove(e)
	case e.state == StateCooldown:
		m.cooldown.remove(e)
	}
	m.touch(e)
	// The store must show it in use before the machine may go: the next
	// write says so (ReleaseDurable flushes until it does).
	m.markDirty(addr)
	e.state = StateAllocated
	e.armed, e.arming = false, false
	e.owner = owner
	e.at = time.Time{}
	if owner.Token != "" {
		if other := m.byToken[owner.Token]; other != nil && other != e {
			// The token's reservation went elsewhere; the live machine wins.
			m.dropToken(other)
		}
		m.byToken[owner.Token] = e
	}
	return nil
}

// listOf returns the list a free entry is in.
func (m *Manager) listOf(e *entry) *list {
	if e.armed {
		return &m.readyList
	}
	return &m.free
}

// dropToken forgets the token of a pending reservation displaced by a live
// machine, sending the address to cooldown since it was handed out.
func (m *Manager) dropToken(e *entry) {
	if e.state == StatePending {
		m.toCooldown(e, m.clock.Now())
	}
}

// Expire moves pending reservations older than the TTL into cooldown and
// cooled-down addresses back to the free list, returning how many pendings
// expired. Allocation does the same lazily; call Expire periodically so the
// counts stay current when nothing allocates.
func (m *Manager) Expire() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.advance(m.clock.Now())
}

// advance applies the passage of time. Pendings expire in reservation order
// and cooldowns end in deadline order, so both walks stop at the first
// entry still in its time.
func (m *Manager) advance(now time.Time) int {
	expired := 0
	for e := m.pending.head; e != nil && !now.Before(e.at.Add(m.cfg.PendingTTL)); e = m.pending.head {
		// The cooldown runs from the moment the reservation lapsed, not
		// from when this walk noticed, so expiry does not depend on load.
		deadline := e.at.Add(m.cfg.PendingTTL)
		u := Unstored{Addr: e.addr, Token: e.owner.Token, Namespace: e.ns, Deadline: deadline}
		m.toCooldown(e, deadline)
		// Kept until the caller proves that no machine was stored with
		// the reservation, or finds one: see Unused.
		m.unstored[u.Addr] = u
		expired++
	}
	if expired > 0 {
		m.stats.expired.Add(uint64(expired))
	}
	kick := false
	for e := m.cooldown.head; e != nil && !now.Before(e.at); e = m.cooldown.head {
		m.cooldown.remove(e)
		m.touch(e)
		e.at = time.Time{}
		kick = m.rest(e) || kick
	}
	if _, _, high := m.marksLocked(); kick || m.freeLocked() > high {
		m.Kick()
	}
	return expired
}

// rest puts an address that left its cooldown, or was never used, where it
// waits for its next owner: the free list (unarmed), or, when the free list
// already holds its target or the address is alone in its block (a static
// request in a large pool), the surplus that Rebalance gives back to the
// store, so that scattered claims and their blocks do not linger: the free
// list is refilled densely, in range order, instead. It reports whether
// the surplus grew.
func (m *Manager) rest(e *entry) bool {
	e.armed, e.arming = false, false
	if _, target, _ := m.marksLocked(); m.freeLocked() >= target || m.blocks[BlockOf(e.addr)].ours == 1 {
		if m.surplus.n == 0 {
			m.surplusSince = m.clock.Now()
		}
		e.state = stateSurplus
		m.surplus.pushBack(e)
		return true
	}
	e.state = StateFree
	m.free.pushBack(e)
	return false
}

func (m *Manager) toCooldown(e *entry, now time.Time) {
	m.touch(e)
	if e.state == StatePending {
		m.leavePending(e)
	}
	if e.owner.Token != "" && m.byToken[e.owner.Token] == e {
		delete(m.byToken, e.owner.Token)
	}
	e.state = StateCooldown
	e.armed, e.arming = false, false
	e.owner = Owner{}
	e.at = now.Add(m.cfg.Cooldown)
	m.cooldown.insertByAt(e)
	m.markDirty(e.addr)
}

// touch records a change of e's owner or state, which settles any lapsed
// reservation of its address.
func (m *Manager) touch(e *entry) {
	m.seq++
	e.changed = m.seq
	e.orphan = false
	if len(m.unstored) > 0 {
		delete(m.unstored, e.addr)
	}
}

// Mark returns a point in the Manager's history: pass it to Resync with a
// list of live objects taken after it.
func (m *Manager) Mark() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seq
}

// blockFor returns the state of addr's block, creating it (not loaded).
func (m *Manager) blockFor(addr netip.Addr) *blockState {
	p := BlockOf(addr)
	b := m.blocks[p]
	if b == nil {
		b = &blockState{persisted: Block{Prefix: p}}
		m.blocks[p] = b
	}
	return b
}

// addEntry creates the entry of a newly held address, in state st and in
// no list.
func (m *Manager) addEntry(addr netip.Addr, st State) *entry {
	e := &entry{addr: addr, state: st}
	m.entries[addr] = e
	m.blockFor(addr).ours++
	delete(m.unhanded, addr)
	return e
}

// removeEntry forgets an address this Manager no longer holds.
func (m *Manager) removeEntry(e *entry) {
	delete(m.entries, e.addr)
	// It may be claimable again: a cached scan that found nothing is stale.
	m.noClaimableUntil = time.Time{}
	if b := m.blocks[BlockOf(e.addr)]; b != nil {
		b.ours--
	}
	if len(m.unstored) > 0 {
		delete(m.unstored, e.addr)
	}
}

// markDirty records that addr's block must be written again.
func (m *Manager) markDirty(addr netip.Addr) {
	m.blockFor(addr).gen++
}

// Kick asks Run to rebalance soon; it never blocks.
func (m *Manager) Kick() {
	select {
	case m.kickC <- struct{}{}:
	default:
	}
}

// Lookup reports the state of addr and its owner or cooldown deadline.
func (m *Manager) Lookup(addr netip.Addr) (State, Owner, time.Time) {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance(m.clock.Now())
	e := m.entries[addr]
	if e == nil {
		return StateUnclaimed, Owner{}, time.Time{}
	}
	if e.state == stateReturning || e.state == stateSurplus {
		return StateFree, Owner{}, time.Time{}
	}
	return e.state, e.owner, e.at
}

// Snapshot returns the counts per state, taken under the lock so they add
// up. It walks nothing: the counts are kept as the state changes.
func (m *Manager) Snapshot() Counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance(m.clock.Now())
	return m.countsLocked()
}

func (m *Manager) countsLocked() Counts {
	c := Counts{
		Usable:   m.cfg.Ranges.Size(),
		Claimed:  len(m.entries),
		Free:     m.readyList.n + m.free.n + m.surplus.n + m.returning,
		Pending:  m.pending.n,
		Cooldown: m.cooldown.n,
	}
	c.Allocated = c.Claimed - c.Free - c.Pending - c.Cooldown
	c.ClaimedElsewhere = m.elsewhere
	return c
}

// Settles returns when the last pending reservation and the last cooldown
// of the moment will have ended at the latest, or zero when there is none.
func (m *Manager) Settles() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance(m.clock.Now())
	var t time.Time
	if e := m.cooldown.tail; e != nil {
		t = e.at
	}
	if e := m.pending.tail; e != nil {
		if u := e.at.Add(m.cfg.PendingTTL + m.cfg.Cooldown); u.After(t) {
			t = u
		}
	}
	return t
}

// Stats returns the Manager's counters.
func (m *Manager) Stats() Stats {
	s := &m.stats
	return Stats{
		Allocations: s.allocations.Load(), Releases: s.releases.Load(), Exhausted: s.exhausted.Load(),
		Conflicts: s.conflicts.Load(), ExpiredPendings: s.expired.Load(), Rebalances: s.rebalances.Load(),
		RebalanceFailures: s.rebalanceFailures.Load(), StoreConflicts: s.storeConflicts.Load(), StoreWrites: s.writes.Load(), StoreFailures: s.storeFailures.Load(),
		PendingLimited: s.pendingLimited.Load(), Unused: s.unused.Load(),
		Granted: s.granted.Load(), Received: s.received.Load(), TakenOver: s.takenOver.Load(),
	}
}

func (m *Manager) exhaustedLocked() error {
	now := m.clock.Now()
	err := &ExhaustedError{Pool: m.cfg.Pool, Family: m.cfg.Family, Counts: m.countsLocked()}
	if e := m.cooldown.head; e != nil {
		err.NextFree = e.at
	} else if e := m.pending.head; e != nil {
		err.NextFree = e.at.Add(m.cfg.PendingTTL + m.cfg.Cooldown)
	}
	if m.elsewhere > 0 {
		// Only when refusing: it walks the blocks read.
		o := m.othersLocked(now)
		err.Others = &o
		if !o.NextFree.IsZero() && (err.NextFree.IsZero() || o.NextFree.Before(err.NextFree)) {
			err.NextFree = o.NextFree
		}
	}
	return err
}

// othersLocked sums what the blocks read show of the other holders'
// addresses at now. The sum walks the blocks, so it is kept until a block
// read or written, a list of live holders, or the end of a cooldown it
// counted changes it: a storm of creates refused in a full pool walks
// them once.
func (m *Manager) othersLocked(now time.Time) Others {
	c := &m.othersCache
	if c.valid && c.persisted == m.persistedSeq && c.peers == m.peersSeq && (c.o.NextFree.IsZero() || now.Before(c.o.NextFree)) {
		return c.o
	}
	o := m.sumOthersLocked(now)
	*c = othersCache{valid: true, persisted: m.persistedSeq, peers: m.peersSeq, o: o}
	return o
}

// othersCache is the last sum of othersLocked, and what it depends on.
type othersCache struct {
	valid            bool
	persisted, peers uint64
	o                Others
}

func (m *Manager) sumOthersLocked(now time.Time) Others {
	var o Others
	holders := map[string]bool{}
	for _, bs := range m.blocks {
		if !bs.loaded || bs.elsewhere == 0 {
			continue
		}
		o.add(&bs.persisted, m.cfg.Holder, m.listedLocked, now, holders)
	}
	return o
}

// Run rebalances the free list, arms addresses and answers other holders'
// requests whenever an allocation crosses a watermark (a kick) and every
// interval, and flushes dirty blocks every interval, until ctx ends. Errors are counted
// and retried on the next round; onError, if set, hears of each.
func (m *Manager) Run(ctx context.Context, interval time.Duration, onError func(error)) {
	tick, stop := m.cfg.Timers.NewTicker(interval)
	defer stop()
	var backoff time.Duration
	for {
		// A kick rebalances; only the tick flushes: what a flush writes
		// (cooldowns, adoptions, the end of lapsed reservations) is safe
		// from a crash already, or flushed by whoever needs it at once
		// (ReleaseDurable, Seal). Flushing on every kick made a write of
		// nearly every allocation while the ready list ran low, and with
		// several holders on one block, writes are what collide.
		flush := false
		select {
		case <-ctx.Done():
			return
		case <-m.kickC:
		case <-tick:
			flush = true
		}
		if !m.Ready() {
			continue
		}
		m.Expire()
		err := m.Rebalance(ctx)
		if flush {
			err = errors.Join(err, m.Flush(ctx))
		}
		if err == nil {
			backoff = 0
			continue
		}
		if onError != nil && ctx.Err() == nil {
			onError(err)
		}
		// A failing store must not turn kicks into a hot loop.
		backoff = min(max(2*backoff, 50*time.Millisecond), interval)
		select {
		case <-ctx.Done():
			return
		case <-m.cfg.Timers.After(backoff):
		}
	}
}
