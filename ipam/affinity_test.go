package ipam

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// TestClaimsPreferBlocksOfTheirOwn: with other live holders, a holder claims
// in a block no other holder claims in while there is one, so that several
// holders seldom write one block; it claims beside them only when no such
// block is left, and a single holder still claims in range order.
func TestClaimsPreferBlocksOfTheirOwn(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		cidr  string
		peers []string
		// h2Before: h2 recovers before h1 claims; seeded: block 0 is in the
		// store then, without claims, so that h2 has read it and its view
		// is stale when it claims; observe: h2 is shown h1's write;
		// sealed: h1 seals after its allocation, so that it keeps
		// addresses in block 0 but hands out none from there.
		h2Before, seeded, observe, sealed bool
		// want is the block h2's first address is in; conflicts, how many
		// of h2's writes may lose a compare-and-swap.
		want      string
		conflicts uint64
	}{
		{name: "recovered after the other claimed", cidr: "10.0.0.0/18", peers: []string{"h1", "h2"},
			want: "10.0.16.0/20", conflicts: 0},
		{name: "recovered before the other claimed", cidr: "10.0.0.0/18", peers: []string{"h1", "h2"},
			h2Before: true, want: "10.0.16.0/20", conflicts: 0},
		{name: "stale view: one conflict, then its own block", cidr: "10.0.0.0/18", peers: []string{"h1", "h2"},
			h2Before: true, seeded: true, want: "10.0.16.0/20", conflicts: 1},
		{name: "stale view, shown the other's write", cidr: "10.0.0.0/18", peers: []string{"h1", "h2"},
			h2Before: true, seeded: true, observe: true, want: "10.0.16.0/20", conflicts: 0},
		{name: "a holder that keeps addresses but hands out none: still another block", cidr: "10.0.0.0/18", peers: []string{"h1", "h2"},
			sealed: true, want: "10.0.16.0/20", conflicts: 0},
		{name: "one block: beside the other", cidr: "10.0.0.0/20", peers: []string{"h1", "h2"},
			want: "10.0.0.0/20", conflicts: 0},
		{name: "one block, stale view: one conflict", cidr: "10.0.0.0/20", peers: []string{"h1", "h2"},
			h2Before: true, seeded: true, want: "10.0.0.0/20", conflicts: 1},
		{name: "one block, stale view, shown the other's write: read before the claim", cidr: "10.0.0.0/20", peers: []string{"h1", "h2"},
			h2Before: true, seeded: true, observe: true, want: "10.0.0.0/20", conflicts: 0},
		{name: "no other live holder: range order", cidr: "10.0.0.0/18", peers: []string{"h2"},
			want: "10.0.0.0/20", conflicts: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, clk := NewMemoryStore(), newFakeClock()
			if tt.seeded {
				cooling := addr("10.0.15.250")
				if _, err := st.Put(ctx, Block{Prefix: BlockOf(cooling), Claims: map[string]*Bitmap{},
					Cooldowns: map[netip.Addr]time.Time{cooling: clk.Now().Add(time.Minute)}}); err != nil {
					t.Fatal(err)
				}
			}
			newM := func(holder string) *Manager {
				return newAffinityManager(t, st, clk, holder, tt.cidr, tt.peers...)
			}
			h1 := newM("h1")
			var h2 *Manager
			if tt.h2Before {
				h2 = newM("h2")
			}
			a1, err := h1.Allocate(ctx, Reservation{Token: "t1", Namespace: "ns"})
			if err != nil {
				t.Fatal(err)
			}
			if got := BlockOf(a1).String(); got != "10.0.0.0/20" {
				t.Fatalf("h1's first address %s is in %s, want the first block", a1, got)
			}
			if tt.sealed {
				if err := h1.Seal(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if h2 == nil {
				h2 = newM("h2")
			}
			if tt.observe {
				b, err := st.Get(ctx, BlockOf(a1))
				if err != nil {
					t.Fatal(err)
				}
				h2.Observe(b)
			}
			a2, err := h2.Allocate(ctx, Reservation{Token: "t2", Namespace: "ns"})
			if err != nil {
				t.Fatal(err)
			}
			if a2 == a1 {
				t.Fatalf("both holders handed out %s", a1)
			}
			if got := BlockOf(a2).String(); got != tt.want {
				t.Errorf("h2's first address %s is in %s, want %s", a2, got, tt.want)
			}
			if got := h2.Stats().StoreConflicts; got != tt.conflicts {
				t.Errorf("h2 lost %d compare-and-swaps, want %d", got, tt.conflicts)
			}
		})
	}
}

// TestClaimsBesideOthersWhenTheirOwnRunOut: once no block of its own has
// unclaimed addresses, a holder claims in blocks other holders claim in,
// so that the whole pool stays usable.
func TestClaimsBesideOthersWhenTheirOwnRunOut(t *testing.T) {
	ctx := context.Background()
	st, clk := NewMemoryStore(), newFakeClock()
	var ms []*Manager
	for _, h := range []string{"h1", "h2", "h3"} {
		ms = append(ms, newAffinityManager(t, st, clk, h, "10.0.0.0/19", "h1", "h2", "h3"))
	}
	seen := map[netip.Addr]string{}
	blocks := map[string]map[netip.Prefix]bool{}
	for i := range 300 {
		m := ms[i%len(ms)]
		a, err := m.Allocate(ctx, Reservation{Token: fmt.Sprint(i), Namespace: "ns"})
		if err != nil {
			t.Fatalf("allocation %d from %s: %v", i, m.Holder(), err)
		}
		if h, dup := seen[a]; dup {
			t.Fatalf("%s handed out %s, which %s holds", m.Holder(), a, h)
		}
		seen[a] = m.Holder()
		if blocks[m.Holder()] == nil {
			blocks[m.Holder()] = map[netip.Prefix]bool{}
		}
		blocks[m.Holder()][BlockOf(a)] = true
	}
	// Two blocks, three holders: two have a block each, and the third
	// claims beside one of them.
	shared := 0
	for p := range blocks["h3"] {
		if blocks["h1"][p] || blocks["h2"][p] {
			shared++
		}
	}
	if len(blocks["h1"]) != 1 || len(blocks["h2"]) != 1 || blocks["h1"][netip.MustParsePrefix("10.0.16.0/20")] ||
		!blocks["h2"][netip.MustParsePrefix("10.0.16.0/20")] || shared == 0 {
		t.Errorf("blocks handed out from: %v; want h1 and h2 in a block each and h3 beside one of them", blocks)
	}
}

// TestSeenHolderOf: the watch's last version of a block tells whose an
// address is, for other holders only, and a block observed without claims
// (deleted) tells nothing any more.
func TestSeenHolderOf(t *testing.T) {
	ctx := context.Background()
	st, clk := NewMemoryStore(), newFakeClock()
	h1 := newSharingManager(t, st, clk, "h1")
	h2 := newSharingManager(t, st, clk, "h2")
	a1, err := h1.Allocate(ctx, Reservation{Token: "t1", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.Get(ctx, BlockOf(a1))
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name   string
		m      *Manager
		block  Block
		holder string
	}{
		{name: "before any version was seen", m: h2},
		{name: "another holder's claim", m: h2, block: b, holder: "h1"},
		{name: "its own claim is not another's", m: h1, block: b},
		{name: "the block deleted", m: h2, block: Block{Prefix: BlockOf(a1)}},
	}
	for _, s := range steps {
		if s.block.Prefix.IsValid() {
			s.m.Observe(s.block)
		}
		h, ok := s.m.SeenHolderOf(a1)
		if want := s.holder != ""; ok != want || h != s.holder {
			t.Errorf("%s: %s.SeenHolderOf(%s) = %q, %v; want %q, %v", s.name, s.m.Holder(), a1, h, ok, s.holder, want)
		}
	}
}

// TestClaimsBesideKeptAddresses: when every block holds addresses of
// other holders, a holder claims in one they do not hand out from (no
// armed addresses there) before one they do.
func TestClaimsBesideKeptAddresses(t *testing.T) {
	ctx := context.Background()
	st, clk := NewMemoryStore(), newFakeClock()
	// Block 0: h1 hands out from it (armed); block 1: h1 only keeps an
	// address in use there.
	armed, kept := new(Bitmap), new(Bitmap)
	armed.Set(1)
	kept.Set(1)
	for _, b := range []Block{
		{Prefix: netip.MustParsePrefix("10.0.0.0/20"), Claims: map[string]*Bitmap{"h1": armed}, Armed: map[string]*Bitmap{"h1": armed}, InUse: map[string]*Bitmap{}, Exact: true},
		{Prefix: netip.MustParsePrefix("10.0.16.0/20"), Claims: map[string]*Bitmap{"h1": kept}, InUse: map[string]*Bitmap{"h1": kept}, Armed: map[string]*Bitmap{}, Exact: true},
	} {
		if _, err := st.Put(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	h2 := newAffinityManager(t, st, clk, "h2", "10.0.0.0/19", "h1", "h2")
	a, err := h2.Allocate(ctx, Reservation{Token: "t", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := BlockOf(a).String(), "10.0.16.0/20"; got != want {
		t.Errorf("h2 handed out %s from %s; want it from %s, where h1 hands out nothing", a, got, want)
	}
}

// newAffinityManager is a recovered Manager of pool p over cidr under
// holder, with small watermarks and peers as the live holders.
func newAffinityManager(t *testing.T, st Store, clk *fakeClock, holder, cidr string, peers ...string) *Manager {
	t.Helper()
	return newPeerManager(t, Config{
		Pool: "p", Holder: holder, Ranges: mustRanges(t, RangeSpec{CIDR: cidr}),
		Cooldown: time.Minute, PendingTTL: 30 * time.Second,
		LowWatermark: 2, TargetFree: 8, HighWatermark: 64,
		Store: st, Clock: clk,
	}, peers...)
}
