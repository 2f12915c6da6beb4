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

// getCountingStore counts the reads that reach a Store.
type getCountingStore struct {
	Store
	mu   sync.Mutex
	gets int
}

func (s *getCountingStore) Get(ctx context.Context, p netip.Prefix) (Block, error) {
	s.mu.Lock()
	s.gets++
	s.mu.Unlock()
	return s.Store.Get(ctx, p)
}

func (s *getCountingStore) Gets() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets
}

// TestUnmetRequestReadOnce: a request that a holder cannot meet (it has
// nothing free) costs it one read of the block, not one per rebalance;
// the holder answers it again once it has an address free. Before, the
// read that answered marked the block requested again, and each holder
// with addresses there read it in a loop while the request stood: 828
// reads in 20s of the replicas suite's churn, 40 of them with anything
// to hand over.
func TestUnmetRequestReadOnce(t *testing.T) {
	ctx := context.Background()
	mem := NewMemoryStore()
	counted := &getCountingStore{Store: mem}
	ranges := mustRanges(t, RangeSpec{CIDR: "10.0.0.0/26"})
	newHolder := func(h string, st Store) *Manager {
		m, err := NewManager(Config{Pool: "p", Holder: h, Ranges: ranges, Store: st, Cooldown: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		m.SetPeers([]string{"h0", "h1"})
		if _, err := m.Recover(ctx, nil); err != nil {
			t.Fatal(err)
		}
		return m
	}
	h0, h1 := newHolder("h0", counted), newHolder("h1", mem)
	p := BlockOf(netip.MustParseAddr("10.0.0.1"))
	// h0 holds the whole pool, every address pending.
	var toks []string
	for i := 0; ; i++ {
		tok := fmt.Sprint("t", i)
		if _, err := h0.Allocate(ctx, Reservation{Token: tok, Namespace: fmt.Sprint("ns", i)}); err != nil {
			if !errors.Is(err, ErrExhausted) {
				t.Fatal(err)
			}
			break
		}
		toks = append(toks, tok)
	}
	// h1 asks for any addresses, and h0's watch shows it the request.
	r := Request{Count: 1}
	if err := h1.writeBlock(ctx, p, writePlan{request: &r}); err != nil {
		t.Fatal(err)
	}
	b, err := mem.Get(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	h0.Observe(b)
	before := counted.Gets()
	for range 5 {
		if err := h0.Rebalance(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := counted.Gets() - before; n != 1 {
		t.Errorf("h0 read the block %d times in 5 rebalances with nothing to hand over; want 1", n)
	}
	// An address free at h0: the request is answered.
	if _, ok := h0.Cancel(toks[0]); !ok {
		t.Fatalf("cancel %s", toks[0])
	}
	if err := h0.Rebalance(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h1.load(ctx, p); err != nil {
		t.Fatal(err)
	}
	h1.mu.Lock()
	got := len(h1.entries)
	h1.mu.Unlock()
	if got != 1 {
		t.Errorf("h1 holds %d addresses after h0 had one free; want 1", got)
	}
}
