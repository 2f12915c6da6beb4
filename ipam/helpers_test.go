package ipam

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// fakeClock is a Clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// countingStore counts the writes that reach a Store.
type countingStore struct {
	Store
	mu   sync.Mutex
	puts int
	fail error
}

func (s *countingStore) Put(ctx context.Context, b Block) (string, error) {
	s.mu.Lock()
	s.puts++
	fail := s.fail
	s.mu.Unlock()
	if fail != nil {
		return "", fail
	}
	return s.Store.Put(ctx, b)
}

func (s *countingStore) Puts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.puts
}

type testPool struct {
	cidr                string
	exclude             []string
	low, target, high   int
	armBatch            int
	cooldown, pendingTT time.Duration
}

func mustRanges(t testing.TB, specs ...RangeSpec) *Ranges {
	t.Helper()
	r, err := ParseRanges(specs)
	if err != nil {
		t.Fatalf("ParseRanges(%v): %v", specs, err)
	}
	return r
}

// newTestManager returns a recovered Manager over a fresh MemoryStore.
func newTestManager(t testing.TB, p testPool) (*Manager, *fakeClock, *countingStore) {
	t.Helper()
	clk := newFakeClock()
	st := &countingStore{Store: NewMemoryStore()}
	if p.cooldown == 0 {
		p.cooldown = time.Minute
	}
	if p.pendingTT == 0 {
		p.pendingTT = 30 * time.Second
	}
	if p.target == 0 {
		p.low, p.target, p.high = 2, 4, 8
	}
	m, err := NewManager(Config{
		Pool: "test", Holder: "h1",
		Ranges:   mustRanges(t, RangeSpec{CIDR: p.cidr, Exclude: p.exclude}),
		Cooldown: p.cooldown, PendingTTL: p.pendingTT,
		LowWatermark: p.low, TargetFree: p.target, HighWatermark: p.high, ArmBatch: p.armBatch,
		Store: st, Clock: clk,
	})
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	if _, err := m.Recover(context.Background(), nil); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	return m, clk, st
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

// newPeerManager is a Manager of cfg that knows peers as the pool's live
// holders, recovered with no live machines.
func newPeerManager(t testing.TB, cfg Config, peers ...string) *Manager {
	t.Helper()
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.SetPeers(peers)
	if _, err := m.Recover(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	return m
}
