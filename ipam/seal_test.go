package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// TestSealGivesFreeBack: a sealed holder keeps only the addresses in use
// or cooling down; every free one (armed, unarmed or surplus) goes back to
// the pool in the same writes, so that another live holder can claim all
// of them while the sealed holder's claims wait for its next process, and
// that process recovers its allocations and cooldowns as they were.
func TestSealGivesFreeBack(t *testing.T) {
	tests := []struct {
		name string
		cidr string
		// pending is how many reservations stay unbound at the seal;
		// ended, how many addresses were released a whole cooldown
		// before it, with nothing looking at them since.
		allocated, cooling, pending, ended int
	}{
		{name: "one block", cidr: "10.0.0.0/26", allocated: 5, cooling: 3},
		{name: "nothing in use", cidr: "10.0.0.0/26"},
		{name: "a pending reservation stays claimed", cidr: "10.0.0.0/26", allocated: 2, cooling: 1, pending: 1},
		{name: "cooldowns that ended go back too", cidr: "10.0.0.0/26", allocated: 2, cooling: 2, ended: 5},
		{name: "several blocks", cidr: "10.0.0.0/19", allocated: 40, cooling: 30, ended: 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			clk := newFakeClock()
			st := &countingStore{Store: NewMemoryStore()}
			cfg := func(holder string) Config {
				return Config{
					Pool: "p", Holder: holder, Ranges: mustRanges(t, RangeSpec{CIDR: tt.cidr}),
					Cooldown: time.Minute, PendingTTL: 30 * time.Second,
					LowWatermark: 2, TargetFree: 8, HighWatermark: 64,
					Store: st, Clock: clk,
				}
			}
			h1 := newPeerManager(t, cfg("h1"), "h1", "h2")
			kept := map[netip.Addr]State{}
			var live []Holding
			var release []Holding
			n := tt.ended + tt.allocated + tt.cooling + tt.pending
			for i := range n {
				tok := fmt.Sprintf("t%d", i)
				a, err := h1.Allocate(ctx, Reservation{Token: tok, Namespace: "ns"})
				if err != nil {
					t.Fatal(err)
				}
				o := Owner{Token: tok, UID: "uid-" + tok}
				switch {
				case i < tt.ended:
					if _, err := h1.Bind(o); err != nil {
						t.Fatal(err)
					}
					if err := h1.Release(a, o); err != nil {
						t.Fatal(err)
					}
				case i < tt.ended+tt.pending:
					kept[a] = StatePending
				case i < tt.ended+tt.pending+tt.cooling:
					if _, err := h1.Bind(o); err != nil {
						t.Fatal(err)
					}
					release = append(release, Holding{Addr: a, Owner: o})
					kept[a] = StateCooldown
				default:
					if _, err := h1.Bind(o); err != nil {
						t.Fatal(err)
					}
					kept[a] = StateAllocated
					live = append(live, Holding{Addr: a, Owner: o})
				}
			}
			// Fill the free list to its target and arm a batch, so that
			// the seal finds armed and unarmed free addresses.
			for range 8 {
				if err := h1.Rebalance(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if c := h1.Snapshot(); c.Free == 0 {
				t.Fatalf("h1 holds no free address before the seal: %+v", c)
			}
			// The first releases' cooldowns end (a minute), the others' do
			// not, and nothing looks at h1 in between.
			clk.Step(40 * time.Second)
			for _, h := range release {
				if err := h1.Release(h.Addr, h.Owner); err != nil {
					t.Fatal(err)
				}
			}
			clk.Step(30 * time.Second)
			puts := st.Puts()
			if err := h1.Seal(ctx); err != nil {
				t.Fatal(err)
			}
			blocks, err := st.List(ctx)
			if err != nil {
				t.Fatal(err)
			}
			claimed := 0
			for _, b := range blocks {
				if bm := b.Claims["h1"]; bm != nil {
					claimed += bm.Count()
				}
				if bm := b.Armed["h1"]; bm != nil && !bm.Empty() {
					t.Errorf("block %s: h1 still armed after the seal", b.Prefix)
				}
			}
			if claimed != len(kept) {
				t.Errorf("after the seal h1 claims %d addresses in the store; want %d (in use or cooling down)", claimed, len(kept))
			}
			if got, most := st.Puts()-puts, len(blocks)+1; got > most {
				t.Errorf("the seal wrote %d times; want at most one write per block (%d)", got, most)
			}

			// Another live holder can have every address h1 does not keep,
			// without h1 answering anything.
			h2 := newPeerManager(t, cfg("h2"), "h1", "h2")
			usable := int(h2.Snapshot().Usable)
			for i := range usable - len(kept) {
				a, err := h2.Allocate(ctx, Reservation{Token: fmt.Sprintf("h2-%d", i), Namespace: "ns"})
				if err != nil {
					t.Fatalf("h2's allocation %d of %d: %v", i+1, usable-len(kept), err)
				}
				if _, ok := kept[a]; ok {
					t.Fatalf("h2 handed out %s, which sealed h1 keeps as %v", a, kept[a])
				}
			}
			if a, err := h2.Allocate(ctx, Reservation{Token: "one-more", Namespace: "ns"}); !errors.Is(err, ErrExhausted) {
				t.Fatalf("h2 allocated %s (err %v) past the addresses h1 does not keep; want ErrExhausted", a, err)
			}

			// h1's next process finds what h1 kept, and nothing free.
			h1b, err := NewManager(cfg("h1"))
			if err != nil {
				t.Fatal(err)
			}
			h1b.SetPeers([]string{"h1", "h2"})
			rep, err := h1b.Recover(ctx, live)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Allocated != tt.allocated || rep.Free != 0 || rep.Cooldown != tt.cooling+tt.pending {
				t.Errorf("h1 recovered %d allocated, %d free, %d cooling down; want %d, 0, %d",
					rep.Allocated, rep.Free, rep.Cooldown, tt.allocated, tt.cooling+tt.pending)
			}
			for a, was := range kept {
				if was == StatePending {
					continue // rests, as after a crash: its machine may yet appear
				}
				if got, _, _ := h1b.Lookup(a); got != was {
					t.Errorf("h1 recovered %s as %v; want %v, as sealed", a, got, was)
				}
			}
		})
	}
}
