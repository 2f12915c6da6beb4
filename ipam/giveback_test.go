package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// gateStore holds Puts at a gate while the test acts, and can fail a Put
// after it has committed (a timeout after the write landed).
type gateStore struct {
	*MemoryStore
	mu sync.Mutex
	// gate, when set, holds the next Put until closed; entered is closed
	// once that Put waits at it.
	gate, entered chan struct{}
	// lostReplies fails that many committed Puts.
	lostReplies int
}

func (s *gateStore) Put(ctx context.Context, b Block) (string, error) {
	s.mu.Lock()
	gate, entered := s.gate, s.entered
	s.gate, s.entered = nil, nil
	lost := s.lostReplies > 0
	if lost {
		s.lostReplies--
	}
	s.mu.Unlock()
	if gate != nil {
		close(entered)
		<-gate
	}
	v, err := s.MemoryStore.Put(ctx, b)
	if err == nil && lost {
		return "", errors.New("injected: the reply was lost after the commit")
	}
	return v, err
}

// newRecovered is a Manager over st with watermarks that make a claim of 6
// addresses trigger a give-back, recovered with no live machines.
func newRecovered(t *testing.T, st Store, clk *fakeClock, cooldown time.Duration) *Manager {
	t.Helper()
	m, err := NewManager(Config{
		Pool: "p", Holder: "h", Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24"}),
		Cooldown: cooldown, PendingTTL: 30 * time.Second,
		LowWatermark: 1, TargetFree: 2, HighWatermark: 3,
		Store: st, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Recover(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	return m
}

// lifetime reserves a, binds it to a machine and deletes the machine as the
// garbage collector does: release, and flush unless the release is durable.
func lifetime(t *testing.T, m *Manager, a netip.Addr) {
	t.Helper()
	if err := m.Reserve(t.Context(), Reservation{Token: "tok"}, a); err != nil {
		t.Fatalf("reserve %s: %v", a, err)
	}
	if _, err := m.Bind(Owner{Token: "tok", UID: "uid"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Release(a, Owner{UID: "uid", Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	if !m.Durable(a) {
		if err := m.Flush(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// notReusedAfterCrash restarts on st and checks that a, released just now
// with a 10-minute cooldown, cannot be had a second later.
func notReusedAfterCrash(t *testing.T, st Store, clk *fakeClock, a netip.Addr) {
	t.Helper()
	m2 := newRecovered(t, st, clk, 10*time.Minute)
	clk.Step(time.Second)
	if err := m2.Reserve(t.Context(), Reservation{Token: "other"}, a); err == nil {
		t.Errorf("%s was reserved again 1s after its release and a crash, inside its 10m cooldown", a)
	}
}

// TestReserveDuringGiveBack: an address being given back cannot be reserved
// until the write lands (another holder could claim it the moment it does);
// then it is claimed again, and its lifetime is as safe from a crash as any.
func TestReserveDuringGiveBack(t *testing.T) {
	clk := newFakeClock()
	gs := &gateStore{MemoryStore: NewMemoryStore()}
	m := newRecovered(t, gs, clk, 10*time.Minute)
	if _, err := m.claim(t.Context(), 6); err != nil {
		t.Fatal(err)
	}
	gs.mu.Lock()
	gate, entered := make(chan struct{}), make(chan struct{})
	gs.gate, gs.entered = gate, entered
	gs.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- m.Rebalance(context.Background()) }()
	<-entered
	var victim netip.Addr
	m.mu.Lock()
	for a, e := range m.entries {
		if e.state == stateReturning {
			victim = a
			break
		}
	}
	m.mu.Unlock()
	if !victim.IsValid() {
		t.Fatal("no address being given back")
	}
	reserved := make(chan error, 1)
	go func() { reserved <- m.Reserve(context.Background(), Reservation{Token: "tok"}, victim) }()
	select {
	case err := <-reserved:
		t.Fatalf("Reserve(%s) returned %v while the write giving it back was in flight", victim, err)
	case <-time.After(50 * time.Millisecond): //nolint:forbidigo // a real wait: nothing must happen meanwhile
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-reserved; err != nil {
		t.Fatalf("Reserve(%s) after the give-back: %v", victim, err)
	}
	if _, err := m.Bind(Owner{Token: "tok", UID: "uid"}); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseDurable(t.Context(), victim, Owner{UID: "uid", Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	notReusedAfterCrash(t, gs.MemoryStore, clk, victim)
}

func TestGiveBackWhoseReplyWasLost(t *testing.T) {
	for _, tt := range []struct {
		name string
		// after the lost reply, before the crash
		act func(t *testing.T, m *Manager, a netip.Addr)
	}{
		{"released", func(t *testing.T, m *Manager, a netip.Addr) { lifetime(t, m, a) }},
		{"pending", func(t *testing.T, m *Manager, a netip.Addr) {
			if err := m.Reserve(t.Context(), Reservation{Token: "tok"}, a); err != nil {
				t.Fatalf("reserve %s: %v", a, err)
			}
			if err := m.Flush(t.Context()); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			gs := &gateStore{MemoryStore: NewMemoryStore()}
			m := newRecovered(t, gs, clk, 10*time.Minute)
			if _, err := m.claim(t.Context(), 6); err != nil {
				t.Fatal(err)
			}
			a := m.readyList.tail.addr // given back first
			if m.free.tail != nil {
				a = m.free.tail.addr
			}
			gs.lostReplies = 1
			if err := m.Rebalance(t.Context()); err == nil {
				t.Fatal("rebalance with a lost reply succeeded")
			}
			if st, _, _ := m.Lookup(a); st == StateFree {
				t.Errorf("%s is free after a give-back whose outcome is unknown", a)
			}
			tt.act(t, m, a)
			m2 := newRecovered(t, gs.MemoryStore, clk, 10*time.Minute)
			clk.Step(time.Second)
			if err := m2.Reserve(t.Context(), Reservation{Token: "other"}, a); err == nil {
				t.Errorf("%s %s before a crash was reserved again a second after it", a, tt.name)
			}
		})
	}
}

func TestClosedManagerRefusesChanges(t *testing.T) {
	clk := newFakeClock()
	m := newRecovered(t, NewMemoryStore(), clk, time.Minute)
	a, err := m.Allocate(t.Context(), Reservation{Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(t.Context(), Reservation{Token: "pending"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Bind(Owner{Token: "tok", UID: "uid"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	m.Close()
	writes := m.Stats().StoreWrites
	for name, change := range map[string]func() error{
		"release": func() error { return m.Release(a, Owner{UID: "uid"}) },
		"bind":    func() error { _, err := m.Bind(Owner{Token: "pending", UID: "uid-2"}); return err },
		"adopt":   func() error { return m.Adopt(context.Background(), addr("10.0.0.200"), Owner{UID: "uid-3"}) },
	} {
		if err := change(); !errors.Is(err, ErrNotReady) {
			t.Errorf("%s on a closed Manager = %v, want ErrNotReady", name, err)
		}
	}
	// So a late flush of it, racing a new Manager, writes nothing stale.
	if err := m.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if w := m.Stats().StoreWrites; w != writes {
		t.Errorf("a flush of a closed Manager wrote %d blocks", w-writes)
	}
}

// TestRebuildKeepsUnwrittenCooldowns is the protocol pools.Registry follows
// when a pool's spec changes: close the old Manager, flush it, then recover
// the new one. A cooldown shortened by the change must not shorten the
// cooldown of an address released before it, even one not yet written.
func TestRebuildKeepsUnwrittenCooldowns(t *testing.T) {
	clk := newFakeClock()
	st := NewMemoryStore()
	m := newRecovered(t, st, clk, time.Hour)
	a, err := m.Allocate(t.Context(), Reservation{Token: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Bind(Owner{Token: "tok", UID: "uid"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := m.Release(a, Owner{UID: "uid"}); err != nil {
		t.Fatal(err)
	}
	if !m.Durable(a) {
		t.Fatalf("Durable(%s) = false for an address claimed before it was handed out", a)
	}
	m.Close()
	if err := m.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	shorter := newRecovered(t, st, clk, time.Minute)
	clk.Step(10 * time.Minute)
	if err := shorter.Reserve(t.Context(), Reservation{Token: "other"}, a); err == nil {
		t.Errorf("%s, released with a 1h cooldown, was reserved again 10m later after the cooldown was shortened", a)
	}
}

// TestFailedWriteLeavesNoOrphans: a claim or a give-back whose reply was
// lost after it committed (or that never landed) leaves addresses the
// store shows claimed by this holder, maybe armed, that the Manager holds
// no entry for. It handed none of them out, so when it reads the block
// again they are free at once, not orphans cooling down until a resync
// and then resting max(pending TTL, cooldown).
func TestFailedWriteLeavesNoOrphans(t *testing.T) {
	for _, tt := range []struct {
		name string
		// fail makes a write fail as the case says and returns the
		// addresses it concerned.
		fail func(t *testing.T, m *Manager, gs *gateStore) []netip.Addr
	}{
		{"claim committed, reply lost", func(t *testing.T, m *Manager, gs *gateStore) []netip.Addr {
			gs.lostReplies = 1
			if _, err := m.claim(t.Context(), 6); err == nil {
				t.Fatal("claim with a lost reply succeeded")
			}
			b, err := gs.Get(t.Context(), BlockOf(netip.MustParseAddr("10.0.0.1")))
			if err != nil {
				t.Fatal(err)
			}
			var out []netip.Addr
			for off := range BlockSize {
				if b.Claims["h"].Has(off) {
					out = append(out, blockAddr(b.Prefix, off))
				}
			}
			if len(out) == 0 {
				t.Fatal("the claim did not commit")
			}
			return out
		}},
		{"give-back not landed", func(t *testing.T, m *Manager, gs *gateStore) []netip.Addr {
			if _, err := m.claim(t.Context(), 6); err != nil {
				t.Fatal(err)
			}
			if err := m.Flush(t.Context()); err != nil {
				t.Fatal(err)
			}
			var held []netip.Addr
			for a := range m.entries {
				held = append(held, a)
			}
			fs := &failStore{Store: gs, fail: true}
			m.cfg.Store = fs
			if err := m.Rebalance(t.Context()); err == nil {
				t.Fatal("rebalance with a failing store succeeded")
			}
			fs.fail = false
			return held
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			gs := &gateStore{MemoryStore: NewMemoryStore()}
			m := newRecovered(t, gs, clk, 10*time.Minute)
			addrs := tt.fail(t, m, gs)
			if err := m.load(t.Context(), BlockOf(addrs[0])); err != nil {
				t.Fatal(err)
			}
			for _, a := range addrs {
				if st, _, until := m.Lookup(a); st != StateFree {
					t.Errorf("%s is %s (until %v) after a failed write and a read of its block; want free: nothing handed it out", a, st, until)
				}
			}
			if c := m.Snapshot(); c.Cooldown != 0 {
				t.Errorf("%d addresses cooling down, want 0", c.Cooldown)
			}
		})
	}
}

// failStore fails every Put while fail is set, before it reaches the store.
type failStore struct {
	Store
	fail bool
}

func (s *failStore) Put(ctx context.Context, b Block) (string, error) {
	if s.fail {
		return "", errors.New("injected: the store is unreachable")
	}
	return s.Store.Put(ctx, b)
}

// TestAnswerToWithdrawnRequest: an answer computed from one read of a
// block is written over a later read in which the request is gone (the
// asker withdrew it, or another holder answered it): the write leaves no
// request behind and does not fail.
func TestAnswerToWithdrawnRequest(t *testing.T) {
	m := newRecovered(t, NewMemoryStore(), newFakeClock(), time.Minute)
	m.SetPeers([]string{"h", "other"})
	p := BlockOf(netip.MustParseAddr("10.0.0.1"))
	m.mu.Lock()
	bs := m.blockFor(p.Addr())
	bs.persisted = Block{Prefix: p, Claims: map[string]*Bitmap{}} // no Requests map at all
	b, err := m.buildLocked(bs, writePlan{answer: map[string]answer{"other": {countMet: true}}})
	m.mu.Unlock()
	if err != nil {
		t.Fatalf("build = %v", err)
	}
	if len(b.Requests) != 0 {
		t.Errorf("requests %v after answering a withdrawn one, want none", b.Requests)
	}
}

// TestSurplusGivenBackInBatches: addresses leaving their cooldowns while
// the free list is full are given back once they make a batch (the high
// watermark's distance from the target) or once some have waited
// surplusDelay, not a write for every few: each give-back writes the whole
// block.
func TestSurplusGivenBackInBatches(t *testing.T) {
	const batch = 4 // high 8 - target 4
	for name, released := range map[string]int{"fewer than a batch": 3, "more than a batch": 9} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			clk := newFakeClock()
			st := NewMemoryStore()
			m := newManager(t, Config{Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24"}), Cooldown: time.Minute, PendingTTL: time.Minute,
				LowWatermark: 2, TargetFree: 4, HighWatermark: 8, Clock: clk, Store: st})
			settle := func() {
				t.Helper()
				for range 8 {
					if err := m.Rebalance(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			var used []netip.Addr
			for i := range released {
				a, err := m.Allocate(ctx, Reservation{Token: fmt.Sprint("t", i)})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := m.Bind(Owner{Token: fmt.Sprint("t", i), UID: fmt.Sprint("u", i)}); err != nil {
					t.Fatal(err)
				}
				used = append(used, a)
			}
			settle()
			for i, a := range used {
				if err := m.ReleaseDurable(ctx, a, Owner{UID: fmt.Sprint("u", i)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			surplus := func() int {
				m.mu.Lock()
				defer m.mu.Unlock()
				return m.surplus.n
			}
			writes := st.writes()
			clk.Step(time.Minute)
			settle()
			switch got := st.writes() - writes; {
			case released < batch && (got != 0 || surplus() == 0):
				t.Fatalf("%d out of their cooldowns: %d writes, surplus %d; want them kept, unwritten", released, got, surplus())
			case released >= batch && (got == 0 || surplus() >= batch):
				t.Fatalf("%d out of their cooldowns: %d writes, surplus %d; want a batch given back", released, got, surplus())
			}
			clk.Step(surplusDelay)
			settle()
			if surplus() != 0 {
				t.Fatalf("surplus %d after it waited %s, want it given back", surplus(), surplusDelay)
			}
		})
	}
}

// conflictStore loses every Put's compare-and-swap.
type conflictStore struct{ Store }

func (s *conflictStore) Put(context.Context, Block) (string, error) { return "", ErrStoreConflict }

// TestStoreFailuresCounted: a write the store refuses or does not answer
// counts in StoreFailures (vmipam_store_write_failures_total, which an
// alert watches), a lost compare-and-swap in StoreConflicts only.
func TestStoreFailuresCounted(t *testing.T) {
	for name, tt := range map[string]struct {
		store               func(Store) Store
		failures, conflicts uint64
	}{
		"refused":      {func(s Store) Store { return &failStore{Store: s, fail: true} }, 1, 0},
		"lost the CAS": {func(s Store) Store { return &conflictStore{Store: s} }, 0, 1},
	} {
		t.Run(name, func(t *testing.T) {
			m := newRecovered(t, NewMemoryStore(), newFakeClock(), time.Minute)
			if _, err := m.claim(t.Context(), 6); err != nil {
				t.Fatal(err)
			}
			if err := m.Flush(t.Context()); err != nil {
				t.Fatal(err)
			}
			before := m.Stats()
			m.cfg.Store = tt.store(m.cfg.Store)
			// A lost compare-and-swap is retried until the deadline.
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			if err := m.Rebalance(ctx); err == nil {
				t.Fatal("a rebalance through a failing store succeeded")
			}
			after := m.Stats()
			if got := after.StoreFailures - before.StoreFailures; got < tt.failures || tt.failures == 0 && got != 0 {
				t.Errorf("StoreFailures +%d, want %s", got, map[bool]string{true: "at least 1", false: "0"}[tt.failures > 0])
			}
			if got := after.StoreConflicts - before.StoreConflicts; got < tt.conflicts || tt.conflicts == 0 && got != 0 {
				t.Errorf("StoreConflicts +%d, want %s", got, map[bool]string{true: "at least 1", false: "0"}[tt.conflicts > 0])
			}
		})
	}
}
