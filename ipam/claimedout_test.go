package ipam

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestClaimFindingNothingAsks: a holder whose view still shows unclaimed
// addresses that another holder has since claimed, and holds free, gets
// one of them by asking that holder. Its claim finds nothing left to
// claim; that is no reason to refuse the pool as exhausted before asking
// (a wrong "exhausted" seen once in the churn suite with three replicas,
// as the pool first filled).
func TestClaimFindingNothingAsks(t *testing.T) {
	ranges := mustRanges(t, RangeSpec{CIDR: "10.0.0.0/28"})
	st := newWatchStore()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done; st.close() })
	holders := []string{"h1", "h2"}
	mk := func(h string) *Manager {
		m, err := NewManager(Config{Pool: "p", Holder: h, Ranges: ranges, Store: st, Cooldown: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		m.SetPeers(holders)
		if _, err := m.Recover(ctx, nil); err != nil {
			t.Fatal(err)
		}
		return m
	}
	a, b := mk("h1"), mk("h2")
	// Only b sees the store's versions: a's view stays as its recovery
	// left it, every address unclaimed.
	st.watch(b)
	go func() { defer close(done); b.Run(ctx, 100*time.Millisecond, nil) }()

	// b claims every address, and keeps some free.
	for i := 0; ; i++ {
		b.mu.Lock()
		unclaimed, free := b.claimableLocked(), b.free.n+b.surplus.n+b.readyList.n
		b.mu.Unlock()
		if unclaimed == 0 && free > 0 {
			break
		}
		if unclaimed == 0 || i == 64 {
			t.Fatalf("after %d allocations, h2 leaves %d unclaimed and holds %d free; want none unclaimed and some free", i, unclaimed, free)
		}
		if _, err := b.Allocate(ctx, Reservation{Token: fmt.Sprint("b", i), Namespace: "ns"}); err != nil {
			t.Fatalf("h2's allocation %d: %v", i, err)
		}
	}
	a.mu.Lock()
	stale := a.claimableLocked()
	a.mu.Unlock()
	if stale == 0 {
		t.Fatal("h1's view shows nothing unclaimed: the test needs it stale")
	}

	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	defer acancel()
	addr, err := a.Allocate(actx, Reservation{Token: "a", Namespace: "ns"})
	if err != nil {
		t.Fatalf("h1, whose view showed %d unclaimed, allocates while h2 holds free addresses: %v", stale, err)
	}
	if s, _, _ := a.Lookup(addr); s != StatePending {
		t.Errorf("%s is %v at h1 after its allocation, want pending", addr, s)
	}
}
