package ctl

import (
	"net/netip"
	"testing"
	"time"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools"
)

// ctlBits returns a bitmap of addrs' offsets.
func ctlBits(addrs ...netip.Addr) *ipam.Bitmap {
	var bm ipam.Bitmap
	for _, a := range addrs {
		bm.Set(offsetOf(a))
	}
	return &bm
}

func TestStateOf(t *testing.T) {
	now := time.Date(2026, 3, 1, 14, 0, 0, 0, time.UTC)
	a := netip.MustParseAddr("10.0.16.42")
	other := netip.MustParseAddr("10.0.16.43")
	blockWith := func(f func(b *ipam.Block)) []ipam.Block {
		b := ipam.Block{Prefix: ipam.BlockOf(a), Exact: true, Claims: map[string]*ipam.Bitmap{"vmipam-0": ctlBits(a, other)},
			InUse: map[string]*ipam.Bitmap{}, Armed: map[string]*ipam.Bitmap{}, Cooldowns: map[netip.Addr]time.Time{}}
		if f != nil {
			f(&b)
		}
		return []ipam.Block{b}
	}
	tests := map[string]struct {
		blocks []ipam.Block
		live   int
		want   AddressState
	}{
		"no block: unclaimed": {want: AddressState{State: StateUnclaimed}},
		"claimed by another address only: unclaimed": {
			blocks: blockWith(func(b *ipam.Block) { b.Claims["vmipam-0"] = ctlBits(other) }),
			want:   AddressState{State: StateUnclaimed},
		},
		"claimed, neither in use nor armed: free": {
			blocks: blockWith(nil),
			want:   AddressState{State: StateFree, Claim: "vmipam-0"},
		},
		"armed: free and ready on its replica": {
			blocks: blockWith(func(b *ipam.Block) { b.Armed["vmipam-0"] = ctlBits(a) }),
			want:   AddressState{State: StateArmed, Claim: "vmipam-0", Armed: true},
		},
		"in use at the last write, no live object: pending": {
			blocks: blockWith(func(b *ipam.Block) { b.InUse["vmipam-0"] = ctlBits(a) }),
			want:   AddressState{State: StatePending, Claim: "vmipam-0"},
		},
		"in use of another holder's bitmap only: free": {
			blocks: blockWith(func(b *ipam.Block) { b.InUse["vmipam-1"] = ctlBits(a) }),
			want:   AddressState{State: StateFree, Claim: "vmipam-0"},
		},
		"a live object carries it: allocated, whatever the block": {
			blocks: blockWith(func(b *ipam.Block) { b.Armed["vmipam-0"] = ctlBits(a) }),
			live:   1,
			want:   AddressState{State: StateAllocated, Claim: "vmipam-0", Armed: true},
		},
		"live and unclaimed: allocated": {
			live: 2,
			want: AddressState{State: StateAllocated},
		},
		"cooldown ahead: cooling down until its end": {
			blocks: blockWith(func(b *ipam.Block) { b.Cooldowns[a] = now.Add(time.Hour) }),
			want:   AddressState{State: StateCooldown, Claim: "vmipam-0", Until: now.Add(time.Hour)},
		},
		"cooldown ahead and unclaimed: cooling down": {
			blocks: blockWith(func(b *ipam.Block) { b.Claims = map[string]*ipam.Bitmap{}; b.Cooldowns[a] = now.Add(time.Minute) }),
			want:   AddressState{State: StateCooldown, Until: now.Add(time.Minute)},
		},
		"cooldown ended, not written away: free, with when it ended": {
			blocks: blockWith(func(b *ipam.Block) { b.Cooldowns[a] = now.Add(-time.Minute) }),
			want:   AddressState{State: StateFree, Claim: "vmipam-0", Until: now.Add(-time.Minute)},
		},
		"cooldown ends exactly now: over": {
			blocks: blockWith(func(b *ipam.Block) { b.Cooldowns[a] = now }),
			want:   AddressState{State: StateFree, Claim: "vmipam-0", Until: now},
		},
		"block of an older vmipam: unknown": {
			blocks: blockWith(func(b *ipam.Block) { b.Exact = false }),
			want:   AddressState{State: StateUnknown, Claim: "vmipam-0"},
		},
		"block of another prefix: unclaimed": {
			blocks: []ipam.Block{{Prefix: netip.MustParsePrefix("10.0.32.0/20"), Claims: map[string]*ipam.Bitmap{"vmipam-0": ctlBits(a)}}},
			want:   AddressState{State: StateUnclaimed},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := stateOf(a, tt.blocks, tt.live, now)
			if got != tt.want {
				t.Errorf("stateOf = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestOffsetOf(t *testing.T) {
	tests := map[string]int{
		"10.0.16.0":       0,
		"10.0.16.42":      42,
		"10.0.31.255":     4095,
		"10.0.32.1":       1,
		"fd00::1:f001":    1,
		"fd00::1:fffe":    4094,
		"192.168.255.254": 0xffe,
	}
	for s, want := range tests {
		t.Run(s, func(t *testing.T) {
			a := netip.MustParseAddr(s)
			if got := offsetOf(a); got != want {
				t.Errorf("offsetOf(%s) = %d, want %d", s, got, want)
			}
			// The block's own arithmetic must agree: a is its block's
			// address at that offset.
			b := ipam.Block{Prefix: ipam.BlockOf(a), Claims: map[string]*ipam.Bitmap{"h": ctlBits(a)}}
			if h, ok := b.ClaimedBy(a); !ok || h != "h" {
				t.Errorf("block %s does not see %s claimed at offset %d", b.Prefix, a, want)
			}
		})
	}
}

func TestPlaceOf(t *testing.T) {
	spec := []vmipamv1.IPRange{
		{CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", Exclude: []string{"10.0.0.10", "10.0.0.64/30"},
			Routes: []vmipamv1.Route{{Destination: "10.200.0.0/16", Via: "10.0.0.2"}}},
		{CIDR: "10.0.1.0/24", First: "10.0.1.10", Last: "10.0.1.20"},
		{CIDR: "fd00::/120", Gateway: "fd00::1"},
		{CIDR: "10.0.2.0/31"},
	}
	ranges, err := ipam.ParseRanges(pools.RangeSpecs(spec))
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		want Place
		in   bool
	}{
		"10.0.0.5":   {in: true},
		"10.0.0.1":   {in: true, want: Place{State: StateGateway, Why: "ranges[0].gateway"}},
		"10.0.0.2":   {in: true, want: Place{State: StateGateway, Why: "ranges[0].routes[0].via"}},
		"10.0.0.0":   {in: true, want: Place{State: StateNetwork, Why: "ranges[0].cidr"}},
		"10.0.0.255": {in: true, want: Place{State: StateBroadcast, Why: "ranges[0].cidr"}},
		"10.0.0.10":  {in: true, want: Place{State: StateExcluded, Why: "ranges[0].exclude"}},
		"10.0.0.66":  {in: true, want: Place{State: StateExcluded, Why: "ranges[0].exclude"}},
		"10.0.1.9":   {in: true, want: Place{Range: 1, State: StateExcluded, Why: "ranges[1].first"}},
		"10.0.1.21":  {in: true, want: Place{Range: 1, State: StateExcluded, Why: "ranges[1].last"}},
		"10.0.1.15":  {in: true, want: Place{Range: 1}},
		"fd00::ff":   {in: true, want: Place{Range: 2}},
		"fd00::1":    {in: true, want: Place{Range: 2, State: StateGateway, Why: "ranges[2].gateway"}},
		"fd00::":     {in: true, want: Place{Range: 2, State: StateNetwork, Why: "ranges[2].cidr"}},
		"10.0.2.0":   {in: true, want: Place{Range: 3}},
		"10.0.2.1":   {in: true, want: Place{Range: 3}},
		"10.0.3.1":   {},
		"fd01::1":    {},
	}
	for s, tt := range tests {
		t.Run(s, func(t *testing.T) {
			got, in := placeOf(netip.MustParseAddr(s), spec, ranges)
			if in != tt.in || got != tt.want {
				t.Errorf("placeOf(%s) = %+v, %v; want %+v, %v", s, got, in, tt.want, tt.in)
			}
		})
	}
}
