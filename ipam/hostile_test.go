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
			if err := m.Adopt(other, Owner{UID: "u2"}); !errors.Is(err, ErrConflict) {
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

// TestReenterOnceBySameAdmission: a reinvoked admission may find its own
// reservation once; a copied token, another admission or a sealed
// reservation is never trusted.
func TestReenterOnceBySameAdmission(t *testing.T) {
	ctx := t.Context()
	m := newManager(t, Config{Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/28"}), Cooldown: time.Minute, Clock: newFakeClock()})
	a, err := m.Allocate(ctx, Reservation{Token: "t1", Admission: "adm-1"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Allocate(ctx, Reservation{Token: "t2", Admission: "adm-2"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		token, admission string
		addr             netip.Addr
		want             bool
	}{
		{"t1", "adm-2", a, false},                                    // another admission
		{"t1", "adm-1", b, false},                                    // another address
		{"t1", "", a, false},                                         // no admission at all
		{"t1", "adm-1", a, true},                                     // the reinvocation
		{"t1", "adm-1", a, false},                                    // once only
		{"nope", "adm-1", a, false},                                  // an unknown token
		{"t2", "adm-2", Canonical(netip.AddrFrom16(b.As16())), true}, // any spelling
	}
	for i, tc := range tests {
		if got := m.Reenter(tc.token, tc.admission, tc.addr); got != tc.want {
			t.Errorf("%d: Reenter(%s, %q, %s) = %t, want %t", i, tc.token, tc.admission, tc.addr, got, tc.want)
		}
	}
	c, _ := m.Allocate(ctx, Reservation{Token: "t3", Admission: "adm-3"})
	m.Seal("t3")
	if m.Reenter("t3", "adm-3", c) {
		t.Error("Reenter of a sealed reservation succeeded")
	}
	d, _ := m.Allocate(ctx, Reservation{Token: "t4", Admission: "adm-4"})
	if _, err := m.Bind(Owner{Token: "t4", UID: "u4"}); err != nil {
		t.Fatal(err)
	}
	if m.Reenter("t4", "adm-4", d) {
		t.Error("Reenter of a bound reservation (its token is visible on a stored object) succeeded")
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
// again at once, and a crash rests it for the pending TTL only.
func TestNoCooldown(t *testing.T) {
	ctx := t.Context()
	clk := newFakeClock()
	st := NewMemoryStore()
	cfg := Config{Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/30"}), Cooldown: 0, PendingTTL: time.Minute, Clock: clk, Store: st,
		LowWatermark: 0, TargetFree: 2, HighWatermark: 2}
	m := newManager(t, cfg)
	a, _ := m.Allocate(ctx, Reservation{Token: "a"})
	if _, err := m.Bind(Owner{Token: "a", UID: "u"}); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseDurable(ctx, a, Owner{UID: "u"}); err != nil {
		t.Fatal(err)
	}
	if s, _, _ := m.Lookup(a); s != StateFree {
		t.Fatalf("%s is %s right after its release with no cooldown, want free", a, s)
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	m2 := newManager(t, cfg)
	if s, _, until := m2.Lookup(a); s != StateCooldown || !until.Equal(clk.Now().Add(time.Minute)) {
		t.Fatalf("after a restart %s is %s until %s, want to rest for the pending TTL", a, s, until)
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
