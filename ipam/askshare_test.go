package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// TestConcurrentAllocationsShareAnAnswer: allocations that find nothing
// free at their holder while another live holder holds free addresses all
// get one, however many ask at once. They share one request per block,
// and the first to see the answer takes it in for them all; one whose
// share the others took used to count the block as asked and refuse the
// create as exhausted, with addresses left at the other holder.
func TestConcurrentAllocationsShareAnAnswer(t *testing.T) {
	tests := []struct {
		name string
		cidr string
		// free is how many addresses the first holder keeps free; the
		// second allocates clients × each of them, fewer than free.
		free, clients, each int
	}{
		{name: "16 at once, 40 free", cidr: "10.0.0.0/25", free: 40, clients: 16, each: 2},
		{name: "32 at once, 60 free", cidr: "10.0.0.0/25", free: 60, clients: 32, each: 1},
		{name: "8 at once, a larger block", cidr: "10.0.0.0/24", free: 40, clients: 8, each: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			st := newWatchStore()
			// h0 answers h1's requests in the background; h1 does nothing
			// of its own, so that h0 alone claims the pool before h1 asks.
			ms := startPeers(t, st, mustRanges(t, RangeSpec{CIDR: tt.cidr}), 2, 1)
			h0, h1 := ms[0], ms[1]
			held := map[netip.Addr]string{}
			// h0 takes the whole pool, then lets tt.free of its
			// reservations go (cancelled admissions: free again at once).
			var toks []string
			for i := 0; ; i++ {
				tok := fmt.Sprint("h0-", i)
				a, err := h0.Allocate(ctx, Reservation{Token: tok, Namespace: fmt.Sprint("ns-", i)})
				if err != nil {
					break
				}
				toks = append(toks, tok)
				held[a] = tok
			}
			if len(toks) < tt.free {
				t.Fatalf("h0 got %d addresses; want more than %d", len(toks), tt.free)
			}
			for _, tok := range toks[:tt.free] {
				a, ok := h0.Cancel(tok)
				if !ok {
					t.Fatalf("cancel %s", tok)
				}
				delete(held, a)
			}
			// The store shows them free once h0 writes its blocks (its
			// background flush does within a second).
			if err := h0.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			// And h1 reads it (the pool is one block), as its watch or a
			// refresh before a refusal would.
			if err := h1.Refresh(ctx, netip.MustParsePrefix(tt.cidr).Addr()); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			var refused []error
			for c := range tt.clients {
				wg.Go(func() {
					for j := range tt.each {
						tok := fmt.Sprintf("h1-%d-%d", c, j)
						actx, cancel := context.WithTimeout(ctx, 5*time.Second)
						a, err := h1.Allocate(actx, Reservation{Token: tok, Namespace: "ns-" + tok})
						cancel()
						mu.Lock()
						if err != nil {
							refused = append(refused, err)
						} else if other, dup := held[a]; dup {
							t.Errorf("%s handed to %s and %s", a, other, tok)
						} else {
							held[a] = tok
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(refused) > 0 {
				t.Errorf("%d of %d allocations refused while h0 held %d free addresses; the first: %v",
					len(refused), tt.clients*tt.each, tt.free, refused[0])
			}
		})
	}
}

// TestAskReadsUnreadBlocks: an ask for any free addresses that finds the
// blocks where others hold them marked unread (a concurrent write lost a
// compare-and-swap) reads them and asks there. It used to find nothing to
// ask, and the allocation, whose pacing allowed no other read just then,
// was refused as exhausted with addresses free at the other holder.
func TestAskReadsUnreadBlocks(t *testing.T) {
	ctx := t.Context()
	cidr := "10.0.0.0/25"
	p := BlockOf(netip.MustParsePrefix(cidr).Addr())
	st := newWatchStore()
	ms := startPeers(t, st, mustRanges(t, RangeSpec{CIDR: cidr}), 2, 1)
	h0, h1 := ms[0], ms[1]
	var toks []string
	for i := 0; ; i++ {
		tok := fmt.Sprint("h0-", i)
		if _, err := h0.Allocate(ctx, Reservation{Token: tok}); err != nil {
			break
		}
		toks = append(toks, tok)
	}
	for _, tok := range toks[:len(toks)/2] {
		if _, ok := h0.Cancel(tok); !ok {
			t.Fatalf("cancel %s", tok)
		}
	}
	if err := h0.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h1.Refresh(ctx, p.Addr()); err != nil {
		t.Fatal(err)
	}
	h1.mu.Lock()
	h1.blocks[p].loaded = false
	h1.mu.Unlock()
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	asked, err := h1.askIn(actx, netip.Addr{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if asked != p {
		t.Fatalf("asked in %v; want %v, where h0 holds %d addresses free", asked, p, len(toks)/2)
	}
}
