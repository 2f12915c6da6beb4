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
	// stateReturning: being given back to the store.
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
	// Admission identifies the admission request that made the
	// reservation, for Reenter; empty means it cannot be re-entered.
	Admission string
}

// Config configures a Manager.
type Config struct {
	// Pool names the pool, for errors and metrics.
	Pool string
	// Holder names this Manager in the store's claims. It must be stable
	// across restarts of the same replica and unique among replicas.
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
	// addresses down to target.
	LowWatermark, TargetFree, HighWatermark int
	// Store persists claims and cooldowns.
	Store Store
	// Clock defaults to the system clock.
	Clock Clock
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

// maxStoreRetries bounds re-reads after a store conflict.
const maxStoreRetries = 5

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
	// ns and admission are a pending reservation's namespace and
	// admission; sealed once it can no longer be re-entered.
	ns, admission string
	sealed        bool
	// changed is the Manager's sequence number at the entry's last change
	// of owner or state, so Resync can tell changes newer than its list.
	changed    uint64
	prev, next *entry
}

// blockState is the Manager's view of one persisted block.
type blockState struct {
	persisted Block
	loaded    bool
	// returning: a write that gives addresses back is in flight; once it
	// lands the store may no longer claim what persisted shows claimed.
	returning bool
	// gen counts local changes that the persisted block does not reflect;
	// written is the gen of the last successful write.
	gen, written uint64
	// ours counts this Manager's entries in the block; elsewhere, the
	// addresses other holders claim in persisted.
	ours, elsewhere int
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

// Stats are the Manager's monotonic counters.
type Stats struct {
	Allocations, Releases, Exhausted, Conflicts, ExpiredPendings uint64
	Rebalances, RebalanceFailures, StoreConflicts, StoreWrites   uint64
	// PendingLimited counts reservations refused by the bound per
	// namespace; Unused, lapsed reservations returned without a cooldown
	// because no object was stored with them.
	PendingLimited, Unused uint64
}

type stats struct {
	allocations, releases, exhausted, conflicts, expired  atomic.Uint64
	rebalances, rebalanceFailures, storeConflicts, writes atomic.Uint64
	pendingLimited, unused                                atomic.Uint64
}

// Manager hands out the addresses of one pool. It keeps a free list of
// addresses claimed in the store between two watermarks, so that the common
// allocation touches memory only, and persists claims and cooldowns in
// batches. All methods are safe for concurrent use, and every address they
// take is compared in its canonical form (see Canonical).
type Manager struct {
	cfg   Config
	clock Clock

	// mu guards everything below; it is never held during Store I/O.
	mu       sync.Mutex
	ready    bool
	entries  map[netip.Addr]*entry
	byToken  map[string]*entry
	free     list
	pending  list
	cooldown list
	surplus  list
	blocks   map[netip.Prefix]*blockState
	// returning counts entries being given back; elsewhere sums the
	// blocks' elsewhere; pendingNS counts pending reservations per
	// namespace. All are kept as the state changes, so that counting and
	// the exhausted path walk nothing.
	returning, elsewhere int
	pendingNS            map[string]int
	// unstored holds the reservations that lapsed without their machine
	// being seen, by address, until Unused or Used settles them.
	unstored map[netip.Addr]Unstored
	// cursor is where the search for never-claimed addresses resumes, so
	// they are handed out in range order.
	cursor netip.Addr
	// noClaimableUntil caches a full scan that found nothing to claim.
	noClaimableUntil time.Time

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
	if cfg.Clock == nil {
		cfg.Clock = systemClock{}
	}
	m := &Manager{cfg: cfg, clock: cfg.Clock, kickC: make(chan struct{}, 1)}
	m.reset(0)
	return m, nil
}

// reset empties the Manager's state, sized for about n entries.
func (m *Manager) reset(n int) {
	m.entries = make(map[netip.Addr]*entry, n)
	m.byToken = make(map[string]*entry, n)
	m.free, m.pending, m.cooldown, m.surplus = list{}, list{}, list{}, list{}
	m.blocks = map[netip.Prefix]*blockState{}
	m.returning, m.elsewhere = 0, 0
	m.pendingNS = map[string]int{}
	m.unstored = map[netip.Addr]Unstored{}
	m.cursor = m.cfg.Ranges.First()
	m.noClaimableUntil = time.Time{}
}

// Pool returns the pool's name.
func (m *Manager) Pool() string { return m.cfg.Pool }

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

// Ready reports whether the Manager has recovered and can allocate.
func (m *Manager) Ready() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ready
}

// Allocate hands out an address for a reservation. It is idempotent: the
// same token gets the same address while its reservation or allocation
// lasts. It claims from the store synchronously only when the free list is
// empty; ctx bounds that wait.
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
	for attempt := 0; ; attempt++ {
		m.mu.Lock()
		if !m.ready {
			m.mu.Unlock()
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, ErrNotReady)
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
		e := m.free.head
		if e != nil {
			m.free.remove(e)
		} else if e = m.surplus.head; e != nil {
			// Better than a claim: it is ours already.
			m.surplus.remove(e)
		}
		if e != nil {
			m.setPending(e, r, now)
			low := m.free.n < m.cfg.LowWatermark
			m.mu.Unlock()
			m.stats.allocations.Add(1)
			if low {
				m.Kick()
			}
			return e.addr, nil
		}
		if attempt == maxClaimRounds || m.claimableLocked() == 0 {
			// Nothing is left to claim: say so without scanning, however
			// large the pool.
			err := m.exhaustedLocked()
			m.mu.Unlock()
			m.stats.exhausted.Add(1)
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, err)
		}
		m.mu.Unlock()
		// The free list is empty: claim synchronously, outside the lock.
		// Whether this claim or a concurrent one refilled the list, try
		// again; only a claim that finds nothing means exhaustion.
		avail, err := m.claim(ctx, m.cfg.TargetFree)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, err)
		}
		if avail == 0 {
			attempt = maxClaimRounds - 1
		}
	}
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
// claimed yet is claimed synchronously.
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
		m.mu.Lock()
		if !m.ready {
			m.mu.Unlock()
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, ErrNotReady)
		}
		m.advance(now)
		if e := m.byToken[r.Token]; e != nil {
			m.mu.Unlock()
			if e.addr == addr {
				return nil
			}
			return fmt.Errorf("reserve %s in pool %q: token %s already holds %s: %w", addr, m.cfg.Pool, r.Token, e.addr, ErrConflict)
		}
		e := m.entries[addr]
		if e != nil {
			if err := m.takeLocked(e); err != nil {
				m.mu.Unlock()
				return fmt.Errorf("reserve in pool %q: %w", m.cfg.Pool, err)
			}
			if err := m.pendingLimitLocked(r.Namespace); err != nil {
				m.putBackLocked(e)
				m.mu.Unlock()
				return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
			}
			m.setPending(e, r, now)
			m.mu.Unlock()
			m.stats.allocations.Add(1)
			return nil
		}
		err := m.pendingLimitLocked(r.Namespace)
		m.mu.Unlock()
		if err != nil {
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
		}
		if attempt > 0 {
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, ErrConflict)
		}
		if err := m.claimAddr(ctx, addr); err != nil {
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
		}
	}
}

// takeLocked takes e out of whatever free list holds it, for a
// reservation, or says why it cannot be had.
func (m *Manager) takeLocked(e *entry) error {
	switch e.state {
	case StateFree:
		m.free.remove(e)
	case stateSurplus:
		m.surplus.remove(e)
	case stateReturning:
		// Being given back: keep it. The return's completion sees the new
		// state and claims it again.
		m.returning--
	case StateCooldown:
		return &AddressError{Addr: e.addr, Reason: ErrCoolingDown, State: e.state, Until: e.at}
	default:
		return &AddressError{Addr: e.addr, Reason: ErrInUse, State: e.state, Owner: e.owner}
	}
	return nil
}

// putBackLocked undoes takeLocked for a reservation that was refused.
func (m *Manager) putBackLocked(e *entry) {
	switch e.state {
	case StateFree:
		m.free.pushBack(e)
	case stateSurplus:
		m.surplus.pushBack(e)
	case stateReturning:
		m.returning++
	}
}

// CanReserve says, without changing anything, whether Reserve of addr
// would be refused because of the address's state: for a dry run.
func (m *Manager) CanReserve(addr netip.Addr) error {
	addr = Canonical(addr)
	if !m.cfg.Ranges.Contains(addr) {
		return fmt.Errorf("reserve %s in pool %q (usable: %s): %w", addr, m.cfg.Pool, m.cfg.Ranges, ErrOutOfRange)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ready {
		return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, ErrNotReady)
	}
	m.advance(m.clock.Now())
	e := m.entries[addr]
	if e == nil {
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
	e.owner = Owner{Token: r.Token, Ref: r.Ref}
	e.ns, e.admission, e.sealed = r.Namespace, r.Admission, r.Admission == ""
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
	e.ns, e.admission, e.sealed = "", "", false
}

// Bind binds the pending reservation of o.Token to the machine the cluster
// stored for it, o.UID (o.Ref names it in messages). Binding again to the
// same UID is a no-op.
func (m *Manager) Bind(o Owner) (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ready {
		return netip.Addr{}, fmt.Errorf("bind token %s in pool %q: %w", o.Token, m.cfg.Pool, ErrNotReady)
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
// reservation. Releasing an address that is free, cooling down or not held
// is a no-op, so a retried release is harmless. A Manager not recovered
// yet, or closed, refuses with ErrNotReady: nobody would persist it. Bind
// and Adopt refuse the same way, so that nothing changes a closed Manager
// and a late Flush of it writes nothing stale.
func (m *Manager) Release(addr netip.Addr, owner Owner) error {
	addr = Canonical(addr)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ready {
		// Not recovered yet, or closed: a release here would be lost.
		return fmt.Errorf("release %s in pool %q: %w", addr, m.cfg.Pool, ErrNotReady)
	}
	now := m.clock.Now()
	m.advance(now)
	e := m.entries[addr]
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

// Adopt makes addr allocated to owner whatever its state, because a live
// virtual machine carries it: the cluster's objects are the truth. An
// address another UID holds is a conflict, reported and left as it is. A
// pending reservation of another token is displaced: if its machine ever
// appears, adopting it reports the conflict.
func (m *Manager) Adopt(addr netip.Addr, owner Owner) error {
	addr = Canonical(addr)
	if !m.cfg.Ranges.Contains(addr) {
		return fmt.Errorf("adopt %s in pool %q (usable: %s): %w", addr, m.cfg.Pool, m.cfg.Ranges, ErrOutOfRange)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ready {
		return fmt.Errorf("adopt %s in pool %q: %w", addr, m.cfg.Pool, ErrNotReady)
	}
	m.advance(m.clock.Now())
	return m.adoptLocked(addr, owner)
}

func (m *Manager) adoptLocked(addr netip.Addr, owner Owner) error {
	e := m.entries[addr]
	switch {
	case e == nil:
		e = m.addEntry(addr, StateAllocated)
		// Claimed without the store's say: persist it with the next flush.
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
		m.free.remove(e)
	case e.state == stateSurplus:
		m.surplus.remove(e)
	case e.state == stateReturning:
		m.returning--
	case e.state == StateCooldown:
		m.cooldown.remove(e)
		m.markDirty(addr)
	}
	m.touch(e)
	e.state = StateAllocated
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
	if kick || m.free.n > m.cfg.HighWatermark {
		m.Kick()
	}
	return expired
}

// rest puts an address that left its cooldown, or was never used, where it
// waits for its next owner: the free list, or, when the free list already
// holds its target or the address is alone in its block (a static request
// in a large pool), the surplus that Rebalance gives back to the store, so
// that scattered claims and their blocks do not linger: the free list is
// refilled densely, in range order, instead. It reports whether the
// surplus grew.
func (m *Manager) rest(e *entry) bool {
	if m.free.n >= m.cfg.TargetFree || m.blocks[BlockOf(e.addr)].ours == 1 {
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
	return e
}

// removeEntry forgets an address this Manager no longer holds.
func (m *Manager) removeEntry(e *entry) {
	delete(m.entries, e.addr)
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
		Free:     m.free.n + m.surplus.n + m.returning,
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
		RebalanceFailures: s.rebalanceFailures.Load(), StoreConflicts: s.storeConflicts.Load(), StoreWrites: s.writes.Load(),
		PendingLimited: s.pendingLimited.Load(), Unused: s.unused.Load(),
	}
}

func (m *Manager) exhaustedLocked() error {
	err := &ExhaustedError{Pool: m.cfg.Pool, Counts: m.countsLocked()}
	if e := m.cooldown.head; e != nil {
		err.NextFree = e.at
	} else if e := m.pending.head; e != nil {
		err.NextFree = e.at.Add(m.cfg.PendingTTL + m.cfg.Cooldown)
	}
	return err
}

// Run rebalances the free list and flushes dirty blocks whenever an
// allocation crosses a watermark and at least every interval, until ctx
// ends. Errors are counted and retried on the next round; onError, if set,
// hears of each.
func (m *Manager) Run(ctx context.Context, interval time.Duration, onError func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var backoff time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kickC:
		case <-t.C:
		}
		if !m.Ready() {
			continue
		}
		m.Expire()
		err := errors.Join(m.Rebalance(ctx), m.Flush(ctx))
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
		case <-time.After(backoff):
		}
	}
}
