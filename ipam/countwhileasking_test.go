package ipam

import (
	"context"
	"net/netip"
	"testing"
)

// TestCountNotMetWhileAsking: a holder whose allocations wait for answers
// of their own keeps its free addresses for them, and meets another
// holder's request for any addresses once none waits. It used to meet
// the request with an address it had just been handed, before its own
// allocation took it: in the replicas suite's churn on a full pool of
// one block, one free address passed from replica to replica for seconds
// while each refused creates as exhausted.
func TestCountNotMetWhileAsking(t *testing.T) {
	ctx := context.Background()
	st := newWatchStore()
	ms := startPeers(t, st, mustRanges(t, RangeSpec{CIDR: "10.0.0.0/26"}), 2, 0)
	h0, h1 := ms[0], ms[1]
	p := BlockOf(netip.MustParseAddr("10.0.0.1"))
	if _, err := h0.Allocate(ctx, Reservation{Token: "t", Namespace: "ns"}); err != nil {
		t.Fatal(err)
	}
	// h1 asks for any addresses in the block h0 claims.
	r := Request{Count: 1}
	if err := h1.writeBlock(ctx, p, writePlan{request: &r}); err != nil {
		t.Fatal(err)
	}
	handed := func() int {
		if err := h1.load(ctx, p); err != nil {
			t.Fatal(err)
		}
		// The read takes in what was handed over, as free.
		h1.mu.Lock()
		defer h1.mu.Unlock()
		return len(h1.entries)
	}
	h0.mu.Lock()
	h0.asking++
	h0.mu.Unlock()
	if err := h0.serveRequests(ctx, p); err != nil {
		t.Fatal(err)
	}
	if n := handed(); n != 0 {
		t.Fatalf("h0 handed over %d addresses while its own allocation waited for an answer; want 0", n)
	}
	h0.mu.Lock()
	h0.asking--
	h0.mu.Unlock()
	if err := h0.serveRequests(ctx, p); err != nil {
		t.Fatal(err)
	}
	if n := handed(); n != 1 {
		t.Fatalf("h0 handed over %d addresses with no allocation of its own waiting; want 1", n)
	}
}
