package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// newManager builds and recovers a Manager over st with cfg's gaps filled.
func newManager(t testing.TB, cfg Config) *Manager {
	t.Helper()
	if cfg.Pool == "" {
		cfg.Pool = "p"
	}
	if cfg.Holder == "" {
		cfg.Holder = "h"
	}
	if cfg.Store == nil {
		cfg.Store = NewMemoryStore()
	}
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Recover(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestOneAddressOneSpelling: an IPv4-mapped or zoned spelling of an address
// is that address on every path, so no second spelling can hold it twice.
func TestOneAddressOneSpelling(t *testing.T) {
	ctx := t.Context()
	for name, tc := range map[string]struct{ cidr, plain, other string }{
		"IPv4 and its mapped form": {"10.0.0.0/28", "10.0.0.6", "::ffff:10.0.0.6"},
		"IPv4 mapped with a zone":  {"10.0.0.0/28", "10.0.0.6", "::ffff:10.0.0.6%eth0"},
		"IPv6 and a zone":          {"fd00::/120", "fd00::6", "fd00::6%eth0"},
	} {
		t.Run(name, func(t *testing.T) {
			clk := newFakeClock()
			m := newManager(t, Config{Ranges: mustRanges(t, RangeSpec{CIDR: tc.cidr}), Cooldown: time.Minute, Clock: clk,
				LowWatermark: 1, TargetFree: 2, HighWatermark: 4})
			plain, other := addr(tc.plain), netip.MustParseAddr(tc.other)
			if err := m.Reserve(ctx, Reservation{Token: "a"}, plain); err != nil {
				t.Fatal(err)
			}
			if err := m.Reserve(ctx, Reservation{Token: "b"}, other); !errors.Is(err, ErrInUse) {
				t.Fatalf("Reserve(%s) while %s is pending: %v, want ErrInUse", other, plain, err)
			}
			if err := m.CanReserve(other); !errors.Is(err, ErrInUse) {
				t.Fatalf("CanReserve(%s): %v, want ErrInUse", other, err)
			}
			if st, o, _ := m.Lookup(other); st != StatePending || o.Token != "a" {
				t.Fatalf("Lookup(%s) = %s %+v, want pending for a", other, st, o)
			}
			if _, err := m.Bind(Owner{Token: "a", UID: "u1"}); err != nil {
				t.Fatal(err)
			}
			if err := m.Adopt(context.Background(), other, Owner{UID: "u2"}); !errors.Is(err, ErrConflict) {
				t.Fatalf("Adopt(%s) by another UID: %v, want ErrConflict", other, err)
			}
			if err := m.ReleaseDurable(ctx, other, Owner{UID: "u1"}); err != nil {
				t.Fatal(err)
			}
			if st, _, _ := m.Lookup(plain); st != StateCooldown {
				t.Fatalf("after releasing %s, %s is %s, want cooldown", other, plain, st)
			}
			if err := m.Reserve(ctx, Reservation{Token: "c"}, other); !errors.Is(err, ErrCoolingDown) {
				t.Fatalf("Reserve(%s) in cooldown: %v, want ErrCoolingDown", other, err)
			}
			c := m.Snapshot()
			if c.Claimed > 2 || c.Cooldown != 1 {
				t.Fatalf("counts %+v: one spelling became two entries", c)
			}
		})
	}
}

// TestPendingBoundPerNamespace: one namespace's pending reservations are
// bounded; others still get addresses, and binding frees room.
func TestPendingBoundPerNamespace(t *testing.T) {
	ctx := t.Context()
	m := newManager(t, Config{Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24"}), Cooldown: time.Minute, Clock: newFakeClock(),
		MaxPendingPerNamespace: 3})
	for i := range 3 {
		if _, err := m.Allocate(ctx, Reservation{Token: fmt.Sprint("a", i), Namespace: "team-a"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := m.Allocate(ctx, Reservation{Token: "a3", Namespace: "team-a"})
	var pl *PendingLimitError
	if !errors.As(err, &pl) || !errors.Is(err, ErrTooManyPending) || pl.Namespace != "team-a" || pl.Limit != 3 {
		t.Fatalf("4th pending in team-a: %v, want a PendingLimitError", err)
	}
	if !strings.Contains(err.Error(), "namespace team-a already has 3 reservations") {
		t.Errorf("message %q does not say which namespace and bound", err)
	}
	if err := m.Reserve(ctx, Reservation{Token: "s", Namespace: "team-a"}, addr("10.0.0.200")); !errors.Is(err, ErrTooManyPending) {
		t.Fatalf("static request past the bound: %v, want ErrTooManyPending", err)
	}
	if _, err := m.Allocate(ctx, Reservation{Token: "b0", Namespace: "team-b"}); err != nil {
		t.Fatalf("another namespace: %v", err)
	}
	if _, err := m.Bind(Owner{Token: "a0", UID: "u0"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Allocate(ctx, Reservation{Token: "a3", Namespace: "team-a"}); err != nil {
		t.Fatalf("after a bind frees room: %v", err)
	}
	if got := m.Stats().PendingLimited; got != 2 {
		t.Errorf("PendingLimited = %d, want 2", got)
	}
	if n := DefaultMaxPendingPerNamespace(254); n != 64 {
		t.Errorf("default bound of a /24 = %d, want 64", n)
	}
	if n := DefaultMaxPendingPerNamespace(1 << 16); n != 8192 {
		t.Errorf("default bound of a /16 = %d, want 8192", n)
	}
}

// TestUnusedSkipsCooldownOnlyWithProof: a lapsed reservation's address
// cools down, unless a read begun after its deadline proves no object was
// stored with it.
func TestUnusedSkipsCooldownOnlyWithProof(t *testing.T) {
	ctx := t.Context()
	clk := newFakeClock()
	m := newManager(t, Config{Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/29"}), Cooldown: 5 * time.Minute, PendingTTL: time.Minute,
		Clock: clk, LowWatermark: 1, TargetFree: 2, HighWatermark: 6})
	a, _ := m.Allocate(ctx, Reservation{Token: "lost", Namespace: "ns"})
	b, _ := m.Allocate(ctx, Reservation{Token: "found", Namespace: "ns"})
	if len(m.Unstored()) != 0 {
		t.Fatal("Unstored lists reservations before their TTL")
	}
	clk.Step(time.Minute + time.Second)
	us := m.Unstored()
	if len(us) != 2 || us[0].Addr != a || us[0].Token != "lost" || us[0].Namespace != "ns" || !us[0].Deadline.Equal(clk.Now().Add(-time.Second)) {
		t.Fatalf("Unstored = %+v", us)
	}
	if m.Unused(us[0], us[0].Deadline) {
		t.Fatal("a read that began at the deadline proved the reservation unused")
	}
	forged := us[0]
	forged.Token = "other"
	if m.Unused(forged, clk.Now()) {
		t.Fatal("a proof for another token freed the address")
	}
	m.Used(us[1])
	if m.Unused(us[1], clk.Now()) {
		t.Fatal("an address whose object was found left its cooldown")
	}
	if !m.Unused(us[0], clk.Now()) {
		t.Fatal("an honest proof was refused")
	}
	if st, _, _ := m.Lookup(a); st != StateFree {
		t.Fatalf("%s is %s after the proof, want free", a, st)
	}
	if st, _, _ := m.Lookup(b); st != StateCooldown {
		t.Fatalf("%s is %s, want cooldown (its object was found)", b, st)
	}
	if m.Unused(us[0], clk.Now()) {
		t.Fatal("a proof counted twice")
	}
	if got := m.Stats().Unused; got != 1 {
		t.Errorf("Stats().Unused = %d, want 1", got)
	}
}

// TestNoCooldown: a pool with a zero cooldown hands a released address out
// again at once; after a crash, an address the store shows in use rests for
// the pending TTL only, and one it shows free is free.
func TestNoCooldown(t *testing.T) {
	ctx := t.Context()
	clk := newFakeClock()
	st := NewMemoryStore()
	cfg := Config{Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/30"}), Cooldown: 0, PendingTTL: time.Minute, Clock: clk, Store: st,
		LowWatermark: 0, TargetFree: 2, HighWatermark: 2}
	m := newManager(t, cfg)
	a, _ := m.Allocate(ctx, Reservation{Token: "a"})
	b, _ := m.Allocate(ctx, Reservation{Token: "b"})
	for _, tok := range []string{"a", "b"} {
		if _, err := m.Bind(Owner{Token: tok, UID: "u" + tok}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseDurable(ctx, a, Owner{UID: "ua"}); err != nil {
		t.Fatal(err)
	}
	if s, _, _ := m.Lookup(a); s != StateFree {
		t.Fatalf("%s is %s right after its release with no cooldown, want free", a, s)
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// b is released after the last write: the store still shows it in use.
	if err := m.ReleaseDurable(ctx, b, Owner{UID: "ub"}); err != nil {
		t.Fatal(err)
	}
	m2 := newManager(t, cfg)
	if s, _, _ := m2.Lookup(a); s != StateFree {
		t.Errorf("after a restart %s, written free, is %s, want free", a, s)
	}
	if s, _, until := m2.Lookup(b); s != StateCooldown || !until.Equal(clk.Now().Add(time.Minute)) {
		t.Errorf("after a restart %s, released since the last write, is %s until %s, want to rest for the pending TTL", b, s, until)
	}
}

// TestStorageShrinksBack: static requests scattered over a huge IPv6 pool
// leave no block behind, in the store or in memory, once their machines
// are gone and their cooldowns over.
func TestStorageShrinksBack(t *testing.T) {
	ctx := t.Context()
	clk := newFakeClock()
	st := NewMemoryStore()
	m := newManager(t, Config{Ranges: mustRanges(t, RangeSpec{CIDR: "fd00::/64"}), Cooldown: time.Minute, PendingTTL: time.Minute,
		Clock: clk, Store: st})
	const n = 200
	var addrs []netip.Addr
	for i := range n {
		a := netip.MustParseAddr(fmt.Sprintf("fd00::%x:1", i+1)) // one per block of 4096
		if err := m.Reserve(ctx, Reservation{Token: fmt.Sprint("t", i)}, a); err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, a)
	}
	for i, a := range addrs {
		if i%2 == 0 {
			// Half are stored and deleted; the others never appear.
			if _, err := m.Bind(Owner{Token: fmt.Sprint("t", i), UID: fmt.Sprint("u", i)}); err != nil {
				t.Fatal(err)
			}
			if err := m.ReleaseDurable(ctx, a, Owner{UID: fmt.Sprint("u", i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := st.Len(); got != n {
		t.Fatalf("%d blocks stored while the addresses cool down, want %d", got, n)
	}
	clk.Step(3 * time.Minute)
	// Out of their cooldowns they are surplus, given back once they have
	// waited surplusDelay (fewer than a batch).
	m.Expire()
	clk.Step(surplusDelay)
	for range 4 * n {
		if err := m.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
		if err := m.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// What remains is the free list, claimed densely from one block in
	// range order: the scattered blocks are gone, from the store and from
	// memory.
	if got := st.Len(); got > 1 {
		t.Errorf("%d blocks left in the store, want at most the free list's one", got)
	}
	m.mu.Lock()
	left := len(m.blocks)
	m.mu.Unlock()
	if left > 1 {
		t.Errorf("the Manager still remembers %d blocks, want at most the free list's one", left)
	}
	if c := m.Snapshot(); c.Claimed != c.Free || c.Free > DefaultTargetFree {
		t.Errorf("counts %+v, want only a free list of at most %d", c, DefaultTargetFree)
	}
	// The pool still works.
	if _, err := m.Allocate(ctx, Reservation{Token: "again"}); err != nil {
		t.Fatal(err)
	}
}

// TestExhaustedWithoutScanning: once every address is claimed, a failing
// allocation says so from the kept counts, without walking the pool.
func TestExhaustedWithoutScanning(t *testing.T) {
	ctx := t.Context()
	st := &countingStore{Store: NewMemoryStore()}
	m := newManager(t, Config{Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/26"}), Cooldown: time.Minute, Clock: newFakeClock(), Store: st,
		LowWatermark: 0, TargetFree: 64, HighWatermark: 64})
	for i := range 62 {
		if _, err := m.Allocate(ctx, Reservation{Token: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	before := st.Puts()
	m.mu.Lock()
	m.noClaimableUntil = time.Time{} // no cached scan to lean on
	m.mu.Unlock()
	_, err := m.Allocate(ctx, Reservation{Token: "one too many"})
	var ex *ExhaustedError
	if !errors.As(err, &ex) || ex.Counts.Pending != 62 {
		t.Fatalf("Allocate in a full pool: %v, want exhaustion with 62 pending", err)
	}
	if st.Puts() != before {
		t.Error("the exhausted path went to the store")
	}
}
