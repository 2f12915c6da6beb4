package ipam

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
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
)

var stateNames = [...]string{"unclaimed", "free", "pending", "allocated", "cooldown", "returning"}

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
	// Cooldown is how long a released address rests before reuse.
	Cooldown time.Duration
	// PendingTTL bounds how long a reservation may wait for its virtual
	// machine to appear before it is expired into cooldown. It must exceed
	// the API server's request timeout.
	PendingTTL time.Duration
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

// Defaults for Config fields left zero.
const (
	DefaultCooldown      = 5 * time.Minute
	DefaultPendingTTL    = 2 * time.Minute
	DefaultLowWatermark  = 32
	DefaultTargetFree    = 128
	DefaultHighWatermark = 512
)

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
}

type stats struct {
	allocations, releases, exhausted, conflicts, expired  atomic.Uint64
	rebalances, rebalanceFailures, storeConflicts, writes atomic.Uint64
}

// Manager hands out the addresses of one pool. It keeps a free list of
// addresses claimed in the store between two watermarks, so that the common
// allocation touches memory only, and persists claims and cooldowns in
// batches. All methods are safe for concurrent use.
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
	blocks   map[netip.Prefix]*blockState
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
	if cfg.Cooldown == 0 {
		cfg.Cooldown = DefaultCooldown
	}
	if cfg.PendingTTL == 0 {
		cfg.PendingTTL = DefaultPendingTTL
	}
	if cfg.Cooldown < 0 {
		bad("cooldown", cfg.Cooldown.String(), "must not be negative")
	}
	if cfg.PendingTTL < 0 {
		bad("pendingTTL", cfg.PendingTTL.String(), "must not be negative")
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
	return &Manager{
		cfg:     cfg,
		clock:   cfg.Clock,
		entries: map[netip.Addr]*entry{},
		byToken: map[string]*entry{},
		blocks:  map[netip.Prefix]*blockState{},
		cursor:  cfg.Ranges.First(),
		kickC:   make(chan struct{}, 1),
	}, nil
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

// Allocate hands out an address for a reservation token. It is idempotent:
// the same token gets the same address while its reservation or allocation
// lasts. It claims from the store synchronously only when the free list is
// empty; ctx bounds that wait.
func (m *Manager) Allocate(ctx context.Context, token string) (netip.Addr, error) {
	start := m.clock.Now()
	a, err := m.allocate(ctx, token, start)
	if m.cfg.ObserveAllocation != nil {
		m.cfg.ObserveAllocation(m.clock.Now().Sub(start), err)
	}
	return a, err
}

func (m *Manager) allocate(ctx context.Context, token string, now time.Time) (netip.Addr, error) {
	if token == "" {
		return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, &FieldError{Path: Path{{Field: "token"}}, Type: ErrorTypeRequired, Detail: "a reservation token is required"})
	}
	for attempt := 0; ; attempt++ {
		m.mu.Lock()
		if !m.ready {
			m.mu.Unlock()
			return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", m.cfg.Pool, ErrNotReady)
		}
		m.advance(now)
		if e := m.byToken[token]; e != nil {
			m.mu.Unlock()
			return e.addr, nil
		}
		if e := m.free.head; e != nil {
			m.free.remove(e)
			m.setPending(e, token, now)
			low := m.free.n < m.cfg.LowWatermark
			m.mu.Unlock()
			m.stats.allocations.Add(1)
			if low {
				m.Kick()
			}
			return e.addr, nil
		}
		if attempt == maxClaimRounds {
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

// Reserve hands out a specific address for a reservation token, as for a
// virtual machine that asks for a static address. It is refused while the
// address is pending, allocated or cooling down, with an AddressError that
// says who holds it or until when it cools down. An address this Manager
// has not claimed yet is claimed synchronously.
func (m *Manager) Reserve(ctx context.Context, token string, addr netip.Addr) error {
	now := m.clock.Now()
	if token == "" {
		return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, &FieldError{Path: Path{{Field: "token"}}, Type: ErrorTypeRequired, Detail: "a reservation token is required"})
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
		if e := m.byToken[token]; e != nil {
			m.mu.Unlock()
			if e.addr == addr {
				return nil
			}
			return fmt.Errorf("reserve %s in pool %q: token %s already holds %s: %w", addr, m.cfg.Pool, token, e.addr, ErrConflict)
		}
		e := m.entries[addr]
		if e != nil {
			switch e.state {
			case StateFree:
				m.free.remove(e)
			case stateReturning:
				// Being given back: keep it. The return's completion
				// sees the new state and claims it again.
			case StateCooldown:
				err := &AddressError{Addr: addr, Reason: ErrCoolingDown, State: e.state, Until: e.at}
				m.mu.Unlock()
				return fmt.Errorf("reserve in pool %q: %w", m.cfg.Pool, err)
			default:
				err := &AddressError{Addr: addr, Reason: ErrInUse, State: e.state, Owner: e.owner}
				m.mu.Unlock()
				return fmt.Errorf("reserve in pool %q: %w", m.cfg.Pool, err)
			}
			m.setPending(e, token, now)
			m.mu.Unlock()
			m.stats.allocations.Add(1)
			return nil
		}
		m.mu.Unlock()
		if attempt > 0 {
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, ErrConflict)
		}
		if err := m.claimAddr(ctx, addr); err != nil {
			return fmt.Errorf("reserve %s in pool %q: %w", addr, m.cfg.Pool, err)
		}
	}
}

func (m *Manager) setPending(e *entry, token string, now time.Time) {
	m.touch(e)
	e.state = StatePending
	e.owner = Owner{Token: token}
	e.at = now
	m.pending.pushBack(e)
	m.byToken[token] = e
}

// Bind binds a pending reservation to the UID of the virtual machine the
// cluster stored for it. Binding again to the same UID is a no-op.
func (m *Manager) Bind(token, uid string) (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.ready {
		return netip.Addr{}, fmt.Errorf("bind token %s in pool %q: %w", token, m.cfg.Pool, ErrNotReady)
	}
	m.advance(m.clock.Now())
	e := m.byToken[token]
	if e == nil {
		return netip.Addr{}, fmt.Errorf("bind token %s to %s in pool %q: %w", token, uid, m.cfg.Pool, ErrUnknownToken)
	}
	switch {
	case e.state == StatePending:
		m.pending.remove(e)
		m.touch(e)
		e.state = StateAllocated
		e.owner.UID = uid
		e.at = time.Time{}
	case e.owner.UID != uid:
		m.stats.conflicts.Add(1)
		return netip.Addr{}, fmt.Errorf("bind token %s in pool %q: %w", token, m.cfg.Pool,
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
		e = &entry{addr: addr}
		m.entries[addr] = e
		// Claimed without the store's say: persist it with the next flush.
		m.markDirty(addr)
	case e.state == StateAllocated:
		if e.owner.UID == owner.UID {
			return nil
		}
		m.stats.conflicts.Add(1)
		return fmt.Errorf("adopt in pool %q: %w", m.cfg.Pool, &AddressError{Addr: addr, Reason: ErrConflict, State: e.state, Owner: e.owner})
	case e.state == StatePending:
		m.pending.remove(e)
		if e.owner.Token != owner.Token {
			delete(m.byToken, e.owner.Token)
		}
	case e.state == StateFree:
		m.free.remove(e)
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
		m.toCooldown(e, e.at.Add(m.cfg.PendingTTL))
		expired++
	}
	if expired > 0 {
		m.stats.expired.Add(uint64(expired))
	}
	for e := m.cooldown.head; e != nil && !now.Before(e.at); e = m.cooldown.head {
		m.cooldown.remove(e)
		e.state = StateFree
		e.at = time.Time{}
		m.free.pushBack(e)
	}
	if m.free.n > m.cfg.HighWatermark {
		m.Kick()
	}
	return expired
}

func (m *Manager) toCooldown(e *entry, now time.Time) {
	m.touch(e)
	if e.state == StatePending {
		m.pending.remove(e)
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

// touch records a change of e's owner or state.
func (m *Manager) touch(e *entry) {
	m.seq++
	e.changed = m.seq
}

// Mark returns a point in the Manager's history: pass it to Resync with a
// list of live objects taken after it.
func (m *Manager) Mark() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.seq
}

// markDirty records that addr's block must be written again.
func (m *Manager) markDirty(addr netip.Addr) {
	p := BlockOf(addr)
	b := m.blocks[p]
	if b == nil {
		b = &blockState{persisted: Block{Prefix: p}}
		m.blocks[p] = b
	}
	b.gen++
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
	m.mu.Lock()
	defer m.mu.Unlock()
	m.advance(m.clock.Now())
	e := m.entries[addr]
	if e == nil {
		return StateUnclaimed, Owner{}, time.Time{}
	}
	if e.state == stateReturning {
		return StateFree, Owner{}, time.Time{}
	}
	return e.state, e.owner, e.at
}

// Snapshot returns the counts per state, taken under the lock so they add
// up.
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
		Free:     m.free.n,
		Pending:  m.pending.n,
		Cooldown: m.cooldown.n,
	}
	returning := 0
	for _, e := range m.entries {
		if e.state == stateReturning {
			returning++
		}
	}
	// Addresses on their way back to the store still count as free.
	c.Free += returning
	c.Allocated = c.Claimed - c.Free - c.Pending - c.Cooldown
	for _, b := range m.blocks {
		for h, bm := range b.persisted.Claims {
			if h == m.cfg.Holder {
				continue
			}
			for _, w := range bm {
				c.ClaimedElsewhere += bits.OnesCount64(w)
			}
		}
	}
	return c
}

// Stats returns the Manager's counters.
func (m *Manager) Stats() Stats {
	s := &m.stats
	return Stats{
		Allocations: s.allocations.Load(), Releases: s.releases.Load(), Exhausted: s.exhausted.Load(),
		Conflicts: s.conflicts.Load(), ExpiredPendings: s.expired.Load(), Rebalances: s.rebalances.Load(),
		RebalanceFailures: s.rebalanceFailures.Load(), StoreConflicts: s.storeConflicts.Load(), StoreWrites: s.writes.Load(),
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
