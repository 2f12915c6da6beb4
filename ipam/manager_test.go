package ipam

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAllocateOrderAndIdempotence(t *testing.T) {
	m, _, _ := newTestManager(t, testPool{cidr: "10.0.0.0/28", exclude: []string{"10.0.0.3"}})
	ctx := t.Context()
	want := []string{"10.0.0.1", "10.0.0.2", "10.0.0.4", "10.0.0.5"}
	for i, w := range want {
		tok := string(rune('a' + i))
		got, err := m.Allocate(ctx, Reservation{Token: tok})
		if err != nil || got != addr(w) {
			t.Fatalf("Allocate(%s) = %s, %v; want %s (never-used addresses in range order)", tok, got, err, w)
		}
		again, err := m.Allocate(ctx, Reservation{Token: tok})
		if err != nil || again != got {
			t.Fatalf("Allocate(%s) again = %s, %v; want %s", tok, again, err, got)
		}
	}
}

func TestReuseOrderFollowsRelease(t *testing.T) {
	// Target 8 over a /28: everything is claimed at once, so the order of
	// reuse is the free list's alone.
	m, clk, _ := newTestManager(t, testPool{cidr: "10.0.0.0/29", low: 0, target: 6, high: 6, cooldown: time.Minute})
	ctx := t.Context()
	for i := range 6 {
		tok := string(rune('a' + i))
		a, _ := m.Allocate(ctx, Reservation{Token: tok})
		if _, err := m.Bind(Owner{Token: tok, UID: "uid-" + tok}); err != nil {
			t.Fatal(err)
		}
		_ = a
	}
	// Release .4 first, then .2, then .6, a second apart.
	for _, r := range []struct{ a, uid string }{{"10.0.0.4", "uid-d"}, {"10.0.0.2", "uid-b"}, {"10.0.0.6", "uid-f"}} {
		if err := m.Release(addr(r.a), Owner{UID: r.uid}); err != nil {
			t.Fatal(err)
		}
		clk.Step(time.Second)
	}
	if _, err := m.Allocate(ctx, Reservation{Token: "early"}); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Allocate inside every cooldown: err = %v, want ErrExhausted", err)
	}
	clk.Step(time.Minute)
	for i, w := range []string{"10.0.0.4", "10.0.0.2", "10.0.0.6"} {
		got, err := m.Allocate(ctx, Reservation{Token: "late" + string(rune('0'+i))})
		if err != nil || got != addr(w) {
			t.Fatalf("reuse %d = %s, %v; want %s (released longest ago first)", i, got, err, w)
		}
	}
}

func TestCooldownNeverShortened(t *testing.T) {
	m, clk, _ := newTestManager(t, testPool{cidr: "10.0.0.0/30", cooldown: time.Hour})
	ctx := t.Context()
	a, _ := m.Allocate(ctx, Reservation{Token: "a"})
	b, _ := m.Allocate(ctx, Reservation{Token: "b"})
	if _, err := m.Bind(Owner{Token: "a", UID: "uid-a"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Release(a, Owner{UID: "uid-a"}); err != nil {
		t.Fatal(err)
	}
	for _, step := range []time.Duration{time.Minute, 30 * time.Minute, 28*time.Minute + 59*time.Second} {
		clk.Step(step)
		got, err := m.Allocate(ctx, Reservation{Token: "c" + step.String()})
		if err == nil {
			t.Fatalf("after %s got %s, want exhaustion while %s cools down (b holds %s)", step, got, a, b)
		}
		var ex *ExhaustedError
		if !errors.As(err, &ex) || ex.NextFree.IsZero() {
			t.Fatalf("error %v: want *ExhaustedError with NextFree", err)
		}
	}
	clk.Step(time.Second)
	if got, err := m.Allocate(ctx, Reservation{Token: "d"}); err != nil || got != a {
		t.Fatalf("after the cooldown: %s, %v; want %s", got, err, a)
	}
}

func TestReserve(t *testing.T) {
	tests := map[string]struct {
		setup   func(t *testing.T, m *Manager, clk *fakeClock)
		addr    string
		wantErr error
		wantMsg string
	}{
		"unclaimed address is claimed and reserved": {addr: "10.0.0.9"},
		"free address": {
			setup: func(t *testing.T, m *Manager, _ *fakeClock) { mustAllocate(t, m, "x") },
			addr:  "10.0.0.3",
		},
		"outside every range": {addr: "10.0.1.1", wantErr: ErrOutOfRange, wantMsg: "10.0.0.1-10.0.0.14"},
		"network address":     {addr: "10.0.0.0", wantErr: ErrOutOfRange},
		"pending for another": {
			setup:   func(t *testing.T, m *Manager, _ *fakeClock) { mustAllocate(t, m, "other") },
			addr:    "10.0.0.1",
			wantErr: ErrInUse, wantMsg: "reserved for another virtual machine being created (token other)",
		},
		"allocated to another": {
			setup: func(t *testing.T, m *Manager, _ *fakeClock) {
				mustAllocate(t, m, "other")
				if _, err := m.Bind(Owner{Token: "other", UID: "uid-1"}); err != nil {
					t.Fatal(err)
				}
			},
			addr:    "10.0.0.1",
			wantErr: ErrInUse, wantMsg: "allocated to the virtual machine with UID uid-1",
		},
		"cooling down": {
			setup: func(t *testing.T, m *Manager, _ *fakeClock) {
				a := mustAllocate(t, m, "other")
				if err := m.Release(a, Owner{Token: "other"}); err != nil {
					t.Fatal(err)
				}
			},
			addr:    "10.0.0.1",
			wantErr: ErrCoolingDown, wantMsg: "cools down until 2026-01-01T00:01:00Z",
		},
		"same token, same address again": {
			setup: func(t *testing.T, m *Manager, _ *fakeClock) {
				if err := m.Reserve(t.Context(), Reservation{Token: "tok"}, addr("10.0.0.7")); err != nil {
					t.Fatal(err)
				}
			},
			addr: "10.0.0.7",
		},
		"same token, other address": {
			setup:   func(t *testing.T, m *Manager, _ *fakeClock) { mustAllocate(t, m, "tok") },
			addr:    "10.0.0.7",
			wantErr: ErrConflict, wantMsg: "token tok already holds 10.0.0.1",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, clk, _ := newTestManager(t, testPool{cidr: "10.0.0.0/28"})
			if tc.setup != nil {
				tc.setup(t, m, clk)
			}
			err := m.Reserve(t.Context(), Reservation{Token: "tok"}, addr(tc.addr))
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Reserve: %v", err)
				}
				if st, o, _ := m.Lookup(addr(tc.addr)); st != StatePending || o.Token != "tok" {
					t.Fatalf("after Reserve: %s %+v, want pending for tok", st, o)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("Reserve error = %v; want %v containing %q", err, tc.wantErr, tc.wantMsg)
			}
		})
	}
}

func mustAllocate(t *testing.T, m *Manager, tok string) netip.Addr {
	t.Helper()
	a, err := m.Allocate(t.Context(), Reservation{Token: tok})
	if err != nil {
		t.Fatalf("Allocate(%s): %v", tok, err)
	}
	return a
}

func TestBindReleaseAdopt(t *testing.T) {
	tests := map[string]struct {
		run     func(m *Manager, a netip.Addr) error
		wantErr error
		state   State
	}{
		"bind pending": {
			run:   func(m *Manager, _ netip.Addr) error { _, err := m.Bind(Owner{Token: "tok", UID: "uid"}); return err },
			state: StateAllocated,
		},
		"bind twice, same uid": {
			run: func(m *Manager, _ netip.Addr) error {
				_, _ = m.Bind(Owner{Token: "tok", UID: "uid"})
				_, err := m.Bind(Owner{Token: "tok", UID: "uid"})
				return err
			},
			state: StateAllocated,
		},
		"bind twice, other uid": {
			run: func(m *Manager, _ netip.Addr) error {
				_, _ = m.Bind(Owner{Token: "tok", UID: "uid"})
				_, err := m.Bind(Owner{Token: "tok", UID: "uid2"})
				return err
			},
			wantErr: ErrConflict, state: StateAllocated,
		},
		"bind unknown token": {
			run:     func(m *Manager, _ netip.Addr) error { _, err := m.Bind(Owner{Token: "nope", UID: "uid"}); return err },
			wantErr: ErrUnknownToken, state: StatePending,
		},
		"release pending by token": {
			run:   func(m *Manager, a netip.Addr) error { return m.Release(a, Owner{Token: "tok"}) },
			state: StateCooldown,
		},
		"release by a stranger": {
			run:     func(m *Manager, a netip.Addr) error { return m.Release(a, Owner{Token: "x", UID: "y"}) },
			wantErr: ErrConflict, state: StatePending,
		},
		"release allocated, twice": {
			run: func(m *Manager, a netip.Addr) error {
				_, _ = m.Bind(Owner{Token: "tok", UID: "uid"})
				if err := m.Release(a, Owner{UID: "uid"}); err != nil {
					return err
				}
				return m.Release(a, Owner{UID: "uid"})
			},
			state: StateCooldown,
		},
		"release allocated with wrong uid": {
			run: func(m *Manager, a netip.Addr) error {
				_, _ = m.Bind(Owner{Token: "tok", UID: "uid"})
				return m.Release(a, Owner{UID: "other", Token: "tok"})
			},
			wantErr: ErrConflict, state: StateAllocated,
		},
		"adopt a pending address for its own token": {
			run: func(m *Manager, a netip.Addr) error {
				return m.Adopt(context.Background(), a, Owner{Token: "tok", UID: "uid"})
			},
			state: StateAllocated,
		},
		"adopt a pending address for another machine displaces the reservation": {
			run: func(m *Manager, a netip.Addr) error {
				if err := m.Adopt(context.Background(), a, Owner{UID: "live"}); err != nil {
					return err
				}
				if _, err := m.Bind(Owner{Token: "tok", UID: "late"}); !errors.Is(err, ErrUnknownToken) {
					return errors.New("displaced token still bindable")
				}
				return nil
			},
			state: StateAllocated,
		},
		"adopt a cooling address": {
			run: func(m *Manager, a netip.Addr) error {
				_ = m.Release(a, Owner{Token: "tok"})
				return m.Adopt(context.Background(), a, Owner{UID: "uid"})
			},
			state: StateAllocated,
		},
		"adopt an address allocated to another uid": {
			run: func(m *Manager, a netip.Addr) error {
				_, _ = m.Bind(Owner{Token: "tok", UID: "uid"})
				return m.Adopt(context.Background(), a, Owner{UID: "uid2"})
			},
			wantErr: ErrConflict, state: StateAllocated,
		},
		"adopt outside the ranges": {
			run: func(m *Manager, _ netip.Addr) error {
				return m.Adopt(context.Background(), addr("192.0.2.1"), Owner{UID: "uid"})
			},
			wantErr: ErrOutOfRange, state: StatePending,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, _, _ := newTestManager(t, testPool{cidr: "10.0.0.0/28"})
			a := mustAllocate(t, m, "tok")
			err := tc.run(m, a)
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if st, _, _ := m.Lookup(a); st != tc.state {
				t.Fatalf("state = %s, want %s", st, tc.state)
			}
			c := m.Snapshot()
			if c.Free+c.Pending+c.Allocated+c.Cooldown != c.Claimed {
				t.Fatalf("counts do not add up: %+v", c)
			}
		})
	}
}

func TestPendingExpiry(t *testing.T) {
	m, clk, _ := newTestManager(t, testPool{cidr: "10.0.0.0/28", pendingTT: 30 * time.Second, cooldown: time.Minute})
	a := mustAllocate(t, m, "tok")
	clk.Step(29 * time.Second)
	if n := m.Expire(); n != 0 {
		t.Fatalf("expired %d before the TTL", n)
	}
	clk.Step(time.Second)
	if n := m.Expire(); n != 1 {
		t.Fatalf("expired %d at the TTL, want 1", n)
	}
	st, _, until := m.Lookup(a)
	if want := newFakeClock().Now().Add(90 * time.Second); st != StateCooldown || !until.Equal(want) {
		t.Fatalf("after expiry: %s until %s, want cooldown until %s", st, until, want)
	}
	if _, err := m.Bind(Owner{Token: "tok", UID: "uid"}); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("Bind after expiry: %v, want ErrUnknownToken", err)
	}
	if got := m.Stats().ExpiredPendings; got != 1 {
		t.Fatalf("ExpiredPendings = %d", got)
	}
}

func TestWatermarks(t *testing.T) {
	m, clk, st := newTestManager(t, testPool{cidr: "10.0.0.0/24", low: 4, target: 16, high: 24, armBatch: 16, cooldown: time.Second})
	ctx := t.Context()
	mustAllocate(t, m, "first")
	if c := m.Snapshot(); c.Claimed != 16 || st.Puts() != 1 {
		t.Fatalf("first allocation claimed %d with %d writes; want target 16 in one write", c.Claimed, st.Puts())
	}
	// Down to the low watermark without touching the store.
	for i := range 11 {
		mustAllocate(t, m, "a"+string(rune('a'+i)))
	}
	if st.Puts() != 1 {
		t.Fatalf("allocations above the low watermark wrote %d times", st.Puts()-1)
	}
	mustAllocate(t, m, "below")
	if err := m.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	// 13 allocations in one second: the refill claims two seconds of
	// them, up to the high watermark, not the target alone.
	if c := m.Snapshot(); c.Free != 24 || st.Puts() != 2 {
		t.Fatalf("rebalance: free %d after %d writes; want refilled to the high watermark 24 in one write", c.Free, st.Puts())
	}
	// Expire all 13 reservations: 13 come back, free rises to 37 > high,
	// and with no allocations since, the target is the configured one.
	clk.Step(time.Hour)
	m.Expire()
	if c := m.Snapshot(); c.Free != 37 {
		t.Fatalf("free = %d, want 37", c.Free)
	}
	if err := m.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	// The 13 that came back go back to the store, in one write.
	if c := m.Snapshot(); c.Free != 24 || c.Claimed != 24 || st.Puts() != 3 {
		t.Fatalf("after returning: %+v after %d writes; want free=claimed=24 in one write", c, st.Puts())
	}
	// The returned ones are unclaimed in the store.
	bl, _ := st.List(ctx)
	n := 0
	for _, w := range bl[0].Claims["h1"] {
		n += bits.OnesCount64(w)
	}
	if n != 24 {
		t.Fatalf("store holds %d claims, want 24", n)
	}
}

func TestNoStoreIOUnderLock(t *testing.T) {
	// A store that blocks every write must not block allocations that the
	// free list can serve.
	clk := newFakeClock()
	blocking := &blockingStore{Store: NewMemoryStore(), release: make(chan struct{})}
	m, err := NewManager(Config{
		Pool: "p", Holder: "h", Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24"}),
		LowWatermark: 8, TargetFree: 16, HighWatermark: 32, ArmBatch: 16, Store: blocking, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Recover(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	close(blocking.release) // let the first claim through
	mustAllocate(t, m, "seed")
	blocking.release = make(chan struct{})
	for i := range 8 {
		mustAllocate(t, m, "a"+string(rune('a'+i)))
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = m.Rebalance(context.Background()) }) // blocks in Put
	for !blocking.waiting() {
		time.Sleep(time.Millisecond)
	}
	done := make(chan error)
	go func() { _, err := m.Allocate(t.Context(), Reservation{Token: "during"}); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Allocate waited on a store write")
	}
	close(blocking.release)
	wg.Wait()
}

type blockingStore struct {
	Store
	mu      sync.Mutex
	release chan struct{}
	blocked bool
}

func (s *blockingStore) Put(ctx context.Context, b Block) (string, error) {
	s.mu.Lock()
	ch := s.release
	s.blocked = true
	s.mu.Unlock()
	<-ch
	s.mu.Lock()
	s.blocked = false
	s.mu.Unlock()
	return s.Store.Put(ctx, b)
}

func (s *blockingStore) waiting() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.blocked
}

func TestNotReadyUntilRecovered(t *testing.T) {
	m, err := NewManager(Config{Pool: "p", Holder: "h", Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24"}), Store: NewMemoryStore(), Clock: newFakeClock()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(t.Context(), Reservation{Token: "a"}); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Allocate before Recover: %v, want ErrNotReady", err)
	}
	if _, err := m.Recover(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if !m.Ready() {
		t.Fatal("not ready after Recover")
	}
}

// recoveryPool returns the recovery tests' pool, a /28 with a cooldown of
// a minute and a pending TTL of 30s over a new store, and a Manager of it
// recovered from nothing.
func recoveryPool(t *testing.T, clk *fakeClock, targetFree int) (Config, *MemoryStore, *Manager) {
	t.Helper()
	store := NewMemoryStore()
	cfg := Config{
		Pool: "p", Holder: "h", Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/28"}),
		Cooldown: time.Minute, PendingTTL: 30 * time.Second, LowWatermark: 1, TargetFree: targetFree, HighWatermark: 14,
		Store: store, Clock: clk,
	}
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Recover(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	return cfg, store, m
}

func TestRecover(t *testing.T) {
	ctx := t.Context()
	clk := newFakeClock()
	cfg, store, m1 := recoveryPool(t, clk, 8)
	a := mustAllocate(t, m1, "a") // .1, will be live
	b := mustAllocate(t, m1, "b") // .2, pending at the crash
	c := mustAllocate(t, m1, "c") // .3, released and flushed
	if _, err := m1.Bind(Owner{Token: "a", UID: "uid-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m1.Bind(Owner{Token: "c", UID: "uid-c"}); err != nil {
		t.Fatal(err)
	}
	_ = m1.Release(c, Owner{UID: "uid-c"})
	if err := m1.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	released := clk.Now()
	clk.Step(10 * time.Second)

	m2, _ := NewManager(cfg)
	rep, err := m2.Recover(ctx, []Holding{
		{Addr: a, Owner: Owner{Token: "a", UID: "uid-a"}},
		{Addr: addr("10.0.0.9"), Owner: Owner{UID: "uid-static"}}, // never claimed: adopted
		{Addr: addr("10.0.0.9"), Owner: Owner{UID: "uid-dup"}},    // a duplicate: reported
		{Addr: addr("192.0.2.1"), Owner: Owner{UID: "uid-out"}},   // outside: reported
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Allocated != 2 || len(rep.Conflicts) != 1 || len(rep.OutOfRange) != 1 {
		t.Fatalf("report = %+v", rep)
	}
	if !errors.Is(rep.Conflicts[0], ErrConflict) || !strings.Contains(rep.Conflicts[0].Error(), "uid-static") {
		t.Fatalf("conflict = %v", rep.Conflicts[0])
	}
	restart := clk.Now()
	rest := restart.Add(time.Minute) // the longer of the pending TTL (30s) and the cooldown (1m)
	for _, tc := range []struct {
		a     netip.Addr
		state State
		until time.Time
	}{
		{a, StateAllocated, time.Time{}},
		{addr("10.0.0.9"), StateAllocated, time.Time{}},
		// pending at the crash (in use in the store): its machine may still
		// appear, or it was released since: the longer rest
		{b, StateCooldown, rest},
		// released and written before the crash: its own deadline
		{c, StateCooldown, released.Add(time.Minute)},
		// armed, never handed out as far as the store knows: the longer rest
		{addr("10.0.0.4"), StateCooldown, rest},
		// claimed for the free list and not armed: free at once
		{addr("10.0.0.5"), StateFree, time.Time{}},
	} {
		st, _, until := m2.Lookup(tc.a)
		if st != tc.state || !until.Equal(tc.until) {
			t.Errorf("%s: %s until %s, want %s until %s", tc.a, st, until, tc.state, tc.until)
		}
	}
	// The adopted claim was written before the Manager served.
	bl, _ := store.Get(ctx, BlockOf(a))
	if !bl.Claims["h"].Has(9) {
		t.Fatal("adopted address 10.0.0.9 not claimed in the store after Recover")
	}
}

func TestStoreConflictRetried(t *testing.T) {
	m, _, st := newTestManager(t, testPool{cidr: "10.0.0.0/24"})
	ctx := t.Context()
	a := mustAllocate(t, m, "a")
	ms := st.Store.(*MemoryStore)
	ms.Touch(BlockOf(a))
	if err := m.Release(a, Owner{Token: "a"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatalf("Flush after a concurrent write: %v", err)
	}
	if s := m.Stats(); s.StoreConflicts != 1 {
		t.Fatalf("StoreConflicts = %d, want 1", s.StoreConflicts)
	}
	b, _ := ms.Get(ctx, BlockOf(a))
	if _, ok := b.Cooldowns[a]; !ok {
		t.Fatal("cooldown not persisted after the retry")
	}
}

func TestRebalanceFailureCounted(t *testing.T) {
	m, _, st := newTestManager(t, testPool{cidr: "10.0.0.0/24"})
	st.mu.Lock()
	st.fail = errors.New("etcd is down")
	st.mu.Unlock()
	_, err := m.Allocate(t.Context(), Reservation{Token: "a"})
	if err == nil || !strings.Contains(err.Error(), "etcd is down") {
		t.Fatalf("Allocate with a failing store and an empty free list: %v", err)
	}
	if err := m.Rebalance(t.Context()); err == nil {
		t.Fatal("Rebalance with a failing store: no error")
	}
	if s := m.Stats(); s.RebalanceFailures != 1 {
		t.Fatalf("RebalanceFailures = %d", s.RebalanceFailures)
	}
}

func TestConfigValidation(t *testing.T) {
	r := mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24"})
	tests := map[string]struct {
		cfg  Config
		want string
	}{
		"no pool":         {Config{Holder: "h", Ranges: r, Store: NewMemoryStore()}, "pool: a pool name is required"},
		"no store":        {Config{Pool: "p", Holder: "h", Ranges: r}, "store: a store is required"},
		"bad watermarks":  {Config{Pool: "p", Holder: "h", Ranges: r, Store: NewMemoryStore(), LowWatermark: 9, TargetFree: 4, HighWatermark: 8}, "low <= target <= high"},
		"target too big":  {Config{Pool: "p", Holder: "h", Ranges: r, Store: NewMemoryStore(), TargetFree: 5000, HighWatermark: 6000}, "at most 4096"},
		"negative cooldn": {Config{Pool: "p", Holder: "h", Ranges: r, Store: NewMemoryStore(), Cooldown: -time.Second}, "cooldown"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := NewManager(tc.cfg)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tc.want)
			}
		})
	}
}

func TestConcurrentAllocations(t *testing.T) {
	m, _, _ := newTestManager(t, testPool{cidr: "10.0.0.0/20", low: 8, target: 32, high: 64, cooldown: time.Second})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go m.Run(ctx, time.Millisecond, nil)
	var mu sync.Mutex
	held := map[netip.Addr]string{}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 200 {
				tok := string(rune('A'+g)) + "-" + string(rune('0'+i%10)) + string(rune('a'+i/10))
				a, err := m.Allocate(ctx, Reservation{Token: tok})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if other, ok := held[a]; ok {
					t.Errorf("%s handed to %s while %s holds it", a, tok, other)
				}
				held[a] = tok
				mu.Unlock()
				if i%2 == 0 {
					mu.Lock()
					delete(held, a)
					mu.Unlock()
					if err := m.Release(a, Owner{Token: tok}); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	c := m.Snapshot()
	if c.Pending != 1600 || c.Cooldown != 1600 || c.Free+c.Pending+c.Allocated+c.Cooldown != c.Claimed {
		t.Fatalf("counts %+v, want 1600 pending and 1600 cooling down", c)
	}
}

func TestResync(t *testing.T) {
	m, _, _ := newTestManager(t, testPool{cidr: "10.0.0.0/28"})
	a := mustAllocate(t, m, "a")
	b := mustAllocate(t, m, "b")
	p := mustAllocate(t, m, "p") // pending: left alone
	for tok, uid := range map[string]string{"a": "uid-a", "b": "uid-b"} {
		if _, err := m.Bind(Owner{Token: tok, UID: uid}); err != nil {
			t.Fatal(err)
		}
	}
	// uid-b's finalizer was removed by force; uid-c was created while the
	// webhook was bypassed; uid-d claims a's address too. The list is taken
	// after the mark; e is bound after it, so the list cannot show it yet
	// and it must keep its address.
	asOf := m.Mark()
	late := mustAllocate(t, m, "e")
	if _, err := m.Bind(Owner{Token: "e", UID: "uid-e"}); err != nil {
		t.Fatal(err)
	}
	rep := m.Resync([]Holding{
		{Addr: a, Owner: Owner{UID: "uid-a", Token: "a"}},
		{Addr: addr("10.0.0.9"), Owner: Owner{UID: "uid-c"}},
		{Addr: a, Owner: Owner{UID: "uid-d"}},
	}, asOf)
	// An address this Manager does not hold is not its to adopt: the
	// controller claims it first (Adopt).
	if rep.Released != 1 || rep.Adopted != 0 || len(rep.Conflicts) != 1 {
		t.Fatalf("report = %+v", rep)
	}
	for _, tc := range []struct {
		a     netip.Addr
		state State
	}{{a, StateAllocated}, {b, StateCooldown}, {p, StatePending}, {addr("10.0.0.9"), StateUnclaimed}, {late, StateAllocated}} {
		if st, _, _ := m.Lookup(tc.a); st != tc.state {
			t.Errorf("%s: %s, want %s", tc.a, st, tc.state)
		}
	}
}

func TestClose(t *testing.T) {
	m, _, _ := newTestManager(t, testPool{cidr: "10.0.0.0/28"})
	m.Close()
	if _, err := m.Allocate(t.Context(), Reservation{Token: "a"}); !errors.Is(err, ErrNotReady) {
		t.Fatalf("Allocate after Close: %v", err)
	}
}

func TestDurable(t *testing.T) {
	m, _, _ := newTestManager(t, testPool{cidr: "10.0.0.0/28", low: 1, target: 2, high: 4, armBatch: 1})
	ctx := t.Context()
	allocated, err := m.Allocate(ctx, Reservation{Token: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Bind(Owner{Token: "a", UID: "uid-a"}); err != nil {
		t.Fatal(err)
	}
	bypassed := addr("10.0.0.12") // claimed by its adoption, in the store at once
	if err := m.Adopt(context.Background(), bypassed, Owner{UID: "uid-b"}); err != nil {
		t.Fatal(err)
	}
	// A free address the store shows neither in use nor armed, adopted:
	// only the next write says it is in use.
	var quiet netip.Addr
	m.mu.Lock()
	for e := m.free.head; e != nil; e = e.next {
		quiet = e.addr
	}
	m.mu.Unlock()
	if !quiet.IsValid() {
		t.Fatal("no unarmed free address")
	}
	if err := m.Adopt(context.Background(), quiet, Owner{UID: "uid-q"}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		addr netip.Addr
		want bool
	}{
		{"armed before it was handed out", allocated, true},
		{"adopted, unclaimed before", bypassed, true},
		{"adopted from the free list, not yet written", quiet, false},
		{"never claimed", addr("10.0.0.13"), false},
		{"outside every block read", addr("192.0.2.1"), false},
	} {
		if got := m.Durable(tt.addr); got != tt.want {
			t.Errorf("%s: Durable(%s) = %t, want %t", tt.name, tt.addr, got, tt.want)
		}
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if !m.Durable(quiet) {
		t.Errorf("Durable(%s) after a flush = false, want true", quiet)
	}
}

// TestCancel: a pending reservation taken back by a refused admission is
// free again at once, without a cooldown, and no longer its token's; a
// bound one, another token's or an unknown one is left alone. After a
// flush and a restart, the store does not show it in use.
func TestCancel(t *testing.T) {
	m, _, store := newTestManager(t, testPool{cidr: "10.0.0.0/29", low: 0, target: 6, high: 6, cooldown: time.Hour})
	ctx := t.Context()
	a, err := m.Allocate(ctx, Reservation{Token: "refused"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Allocate(ctx, Reservation{Token: "stored"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Bind(Owner{Token: "stored", UID: "uid-b"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"stored", "unknown", ""} {
		if got, ok := m.Cancel(tok); ok {
			t.Errorf("Cancel(%q) took back %s; want nothing", tok, got)
		}
	}
	if st, o, _ := m.Lookup(b); st != StateAllocated || o.UID != "uid-b" {
		t.Errorf("the bound %s is %s %+v after the cancels", b, st, o)
	}
	got, ok := m.Cancel("refused")
	if !ok || got != a {
		t.Fatalf("Cancel(refused) = %s, %v; want %s", got, ok, a)
	}
	if st, _, _ := m.Lookup(a); st != StateFree {
		t.Errorf("%s is %s after the cancel, want free (no cooldown)", a, st)
	}
	if again, ok := m.Cancel("refused"); ok {
		t.Errorf("a second Cancel took back %s", again)
	}
	// A flush writes it out of use: a crash now would free it at once.
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	blk, err := store.Get(ctx, BlockOf(a))
	if err != nil {
		t.Fatal(err)
	}
	if bm := blk.InUse[m.Holder()]; bm != nil && bm.Has(blockOffset(a)) {
		t.Errorf("the store shows the cancelled %s in use after a flush", a)
	}
	// The token is no longer the address's, and every address but b can
	// be had at once.
	seen := map[netip.Addr]bool{}
	for i := range 5 {
		x, err := m.Allocate(ctx, Reservation{Token: fmt.Sprint("n", i)})
		if err != nil {
			t.Fatalf("allocation %d after the cancel: %v", i, err)
		}
		seen[x] = true
	}
	if !seen[a] || seen[b] {
		t.Errorf("allocations after the cancel got %v; want %s among them, and never %s", seen, a, b)
	}
}

// TestExhaustedFamily: the Manager of one family of a pool of both says
// which family ran out, with that family's figures.
func TestExhaustedFamily(t *testing.T) {
	m := newManager(t, Config{Pool: "dual", Family: "IPv6", Ranges: mustRanges(t, RangeSpec{CIDR: "fd00::/127"}), Clock: newFakeClock()})
	if _, err := m.Recover(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"a", "b"} {
		if _, err := m.Allocate(t.Context(), Reservation{Token: tok}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := m.Allocate(t.Context(), Reservation{Token: "c"})
	want := `pool "dual" has no IPv6 address left: 0 of 2 usable IPv6 addresses allocated, 2 pending, 0 cooling down`
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v; want ErrExhausted saying %q", err, want)
	}
}

// TestResyncAfterRetriedRelease: a release made while a resync lists the
// objects is a change the list cannot show, even when the address was
// cooling down already (a retried release, or one recovered as made): the
// resync must not hand the address back to the machine it listed, which
// is gone by the time the finalizer is removed; and an address a resync
// adopted for a machine that is gone since goes to cooldown at the next.
func TestResyncAfterRetriedRelease(t *testing.T) {
	m, _, _ := newTestManager(t, testPool{cidr: "10.0.0.0/28"})
	ctx := t.Context()
	a := mustAllocate(t, m, "a")
	owner := Owner{Token: "a", UID: "uid-a"}
	if _, err := m.Bind(owner); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseDurable(ctx, a, owner); err != nil {
		t.Fatal(err)
	}
	// The resync marks, then lists the machine (being deleted, its
	// finalizer still on); the controller releases again meanwhile.
	asOf := m.Mark()
	if err := m.ReleaseDurable(ctx, a, owner); err != nil {
		t.Fatal(err)
	}
	rep := m.Resync([]Holding{{Addr: a, Owner: owner}}, asOf)
	if st, _, _ := m.Lookup(a); st != StateCooldown || rep.Adopted != 0 {
		t.Fatalf("after a resync whose list predates the retried release: %s, report %+v; want it cooling down, nothing adopted", st, rep)
	}
}

// TestResyncLeavesGoingMachinesCooling: a resync that lists a machine
// being deleted (its finalizer still on) after its address was released
// for it leaves the address cooling down; adopting it back would hold it
// for a machine about to vanish, and the next resync would release it as
// vanished.
func TestResyncLeavesGoingMachinesCooling(t *testing.T) {
	m, _, _ := newTestManager(t, testPool{cidr: "10.0.0.0/28"})
	a := mustAllocate(t, m, "a")
	owner := Owner{Token: "a", UID: "uid-a"}
	if _, err := m.Bind(owner); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseDurable(t.Context(), a, owner); err != nil {
		t.Fatal(err)
	}
	asOf := m.Mark()
	for _, going := range []bool{true, false} {
		rep := m.Resync([]Holding{{Addr: a, Owner: owner, Going: going}}, asOf)
		st, _, _ := m.Lookup(a)
		if going && (st != StateCooldown || rep.Adopted != 0) {
			t.Fatalf("a resync listing the going machine: %s, report %+v; want it cooling down, nothing adopted", st, rep)
		}
		if !going && (st != StateAllocated || rep.Adopted != 1) {
			// A live machine carrying a cooling address adopts it, as
			// before: the cooldown was not its.
			t.Fatalf("a resync listing a live machine on the address: %s, report %+v; want it adopted", st, rep)
		}
	}
}

// TestCooldownFrozenWhileFenced: a holder whose lease is not renewed (an
// outage of the API server) refuses every release, so a machine that still
// carries a cooling address cannot lengthen its cooldown. The cooldown must
// not end while fenced, and once the lease is renewed it ends a whole
// cooldown later: the release made again then finds it still cooling.
// Before, it came free at the end of the outage and was handed out while
// the machine still held it (test/chaos, an API server restart of 22 s with
// a 5 s cooldown). "Unseen" makes no call while fenced, as when the API
// server is down and nothing allocates: only the count of lapses tells;
// before that count, the address came free at the first call after the
// renewal (test/chaos again, seed 1796474974786772831).
func TestCooldownFrozenWhileFenced(t *testing.T) {
	const cooldown = 5 * time.Second
	for _, tc := range []struct {
		name   string
		unseen bool // no call while fenced
	}{
		{name: "calls while fenced"},
		{name: "unseen", unseen: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, clk, _ := newTestManager(t, testPool{cidr: "10.0.0.0/30", cooldown: cooldown})
			ctx := t.Context()
			a := mustAllocate(t, m, "a")
			mustAllocate(t, m, "b")
			if _, err := m.Bind(Owner{Token: "a", UID: "uid-a"}); err != nil {
				t.Fatal(err)
			}
			fenced, lapses := false, uint64(0)
			m.SetFence(func() bool { return !fenced }, func() uint64 { return lapses })
			if err := m.Release(a, Owner{UID: "uid-a"}); err != nil {
				t.Fatal(err)
			}
			fenced = true
			for range 5 {
				clk.Step(cooldown)
				if tc.unseen {
					continue
				}
				if st, _, _ := m.Lookup(a); st != StateCooldown {
					t.Fatalf("%s is %s while fenced, want still cooling down", a, st)
				}
				if err := m.Release(a, Owner{UID: "uid-a"}); !errors.Is(err, ErrNotReady) {
					t.Fatalf("release while fenced: %v, want ErrNotReady", err)
				}
			}
			// The renewal counts the lapse before the fence is valid.
			lapses++
			fenced = false
			thawed := clk.Now()
			if st, _, until := m.Lookup(a); st != StateCooldown || until.Before(thawed.Add(cooldown)) {
				t.Fatalf("%s is %s until %s once the lease is renewed at %s, want cooling down a whole %s more", a, st, until, thawed, cooldown)
			}
			clk.Step(cooldown - time.Second)
			if got, err := m.Allocate(ctx, Reservation{Token: "c"}); err == nil {
				t.Fatalf("allocated %s within the cooldown after the renewal", got)
			}
			clk.Step(time.Second)
			if got, err := m.Allocate(ctx, Reservation{Token: "d"}); err != nil || got != a {
				t.Fatalf("after the cooldown: %s, %v; want %s", got, err, a)
			}
		})
	}
}

// TestRecoverCovered: a Manager recovers from some of the live machines
// (a replica's caches) only when they hold every address the store shows
// its holder may have handed out; then it comes to the state Recover from
// every machine would. Otherwise it is left as it was, and Recover from
// every machine still works.
func TestRecoverCovered(t *testing.T) {
	for _, tt := range []struct {
		name string
		// seal: the last Manager sealed (a planned stop); else it only
		// flushed (a crash: what it armed is in the store).
		seal bool
		// lacking: the live machines given leave out this one's.
		lacking string
		// bypassed: a machine of no holder's holds 10.0.0.9, unclaimed.
		bypassed bool
		// other: a machine "x" holds an address another holder claims.
		other       bool
		wantCovered bool
	}{
		{name: "sealed, every machine given", seal: true, wantCovered: true},
		{name: "sealed, a machine that bypassed the webhook too", seal: true, bypassed: true, wantCovered: true},
		{name: "sealed, another holder's machine left out", seal: true, other: true, lacking: "x", wantCovered: true},
		{name: "sealed, a machine in use left out", seal: true, lacking: "a"},
		{name: "sealed, a pending reservation's machine left out", seal: true, lacking: "b"},
		{name: "crashed with addresses armed", seal: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			clk := newFakeClock()
			cfg, store, m1 := recoveryPool(t, clk, 4)
			owners := map[string]Owner{}
			live := map[string]Holding{}
			for _, tok := range []string{"a", "b", "c"} {
				a := mustAllocate(t, m1, tok)
				owners[tok] = Owner{Token: tok, UID: "uid-" + tok, Ref: "ns/" + tok}
				live[tok] = Holding{Addr: a, Owner: owners[tok]}
			}
			// a is bound, b pending (its machine stored, not bound yet), c
			// released and gone.
			if _, err := m1.Bind(owners["a"]); err != nil {
				t.Fatal(err)
			}
			if _, err := m1.Bind(owners["c"]); err != nil {
				t.Fatal(err)
			}
			if err := m1.Release(live["c"].Addr, owners["c"]); err != nil {
				t.Fatal(err)
			}
			delete(live, "c")
			if tt.seal {
				if err := m1.Seal(ctx); err != nil {
					t.Fatal(err)
				}
			} else if err := m1.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if tt.bypassed {
				live["bypassed"] = Holding{Addr: addr("10.0.0.9"), Owner: Owner{UID: "uid-bypassed", Ref: "ns/bypassed"}}
			}
			if tt.other {
				ocfg := cfg
				ocfg.Holder = "other"
				m0, _ := NewManager(ocfg)
				if _, err := m0.Recover(ctx, nil); err != nil {
					t.Fatal(err)
				}
				x := Owner{Token: "x", UID: "uid-x", Ref: "ns/x"}
				ax := mustAllocate(t, m0, "x")
				if _, err := m0.Bind(x); err != nil {
					t.Fatal(err)
				}
				if err := m0.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				live["x"] = Holding{Addr: ax, Owner: x}
			}
			clk.Step(10 * time.Second)
			var given, all []Holding
			for tok, h := range live {
				all = append(all, h)
				if tok != tt.lacking {
					given = append(given, h)
				}
			}

			m2, _ := NewManager(cfg)
			got, err := m2.RecoverCovered(ctx, given)
			if tt.wantCovered != (err == nil) {
				t.Fatalf("RecoverCovered: %v, want covered %t", err, tt.wantCovered)
			}
			if err != nil {
				if !errors.Is(err, ErrUncovered) {
					t.Fatalf("RecoverCovered: %v, want ErrUncovered", err)
				}
				if m2.Ready() {
					t.Fatal("ready after an uncovered RecoverCovered")
				}
				if _, err := m2.Recover(ctx, all); err != nil {
					t.Fatalf("Recover after an uncovered RecoverCovered: %v", err)
				}
				return
			}
			// The same state as Recover from every machine, on a store
			// in the same state.
			store2 := NewMemoryStore()
			blocks, err := store.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range blocks {
				b.Version = ""
				if _, err := store2.Put(ctx, b); err != nil {
					t.Fatal(err)
				}
			}
			cfg2 := cfg
			cfg2.Store = store2
			m3, _ := NewManager(cfg2)
			want, err := m3.Recover(ctx, all)
			if err != nil {
				t.Fatal(err)
			}
			if got.Allocated != want.Allocated || got.Free != want.Free || got.Cooldown != want.Cooldown {
				t.Errorf("RecoverCovered reported %+v, Recover from every machine %+v", got, want)
			}
			for a := addr("10.0.0.0"); a.Less(addr("10.0.0.16")); a = a.Next() {
				s2, o2, u2 := m2.Lookup(a)
				s3, o3, u3 := m3.Lookup(a)
				if s2 != s3 || o2 != o3 || !u2.Equal(u3) {
					t.Errorf("%s: %s to %+v until %s after RecoverCovered, %s to %+v until %s after Recover", a, s2, o2, u2, s3, o3, u3)
				}
			}
		})
	}
}
