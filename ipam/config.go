package ipam

import (
	"fmt"
	"net/netip"
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
	m := &Manager{cfg: cfg, clock: cfg.Clock, kickC: make(chan struct{}, 1), seen: map[netip.Prefix]map[string]*Bitmap{}, armedIn: map[netip.Prefix]bool{}, armMax: armMax, denseAt: denseAt}
	m.reset(0)
	return m, nil
}
