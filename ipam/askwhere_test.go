package ipam

import (
	"net/netip"
	"testing"
	"time"
)

// TestAskWhereOthersHaveFree: with every address claimed, a Manager asks
// for free ones in the block where the other live holders showed the most
// free, not the one where they claim the most.
func TestAskWhereOthersHaveFree(t *testing.T) {
	a, b := BlockOf(addr("10.0.0.0")), BlockOf(addr("10.0.16.0"))
	type claims struct {
		holder      string
		first, n    int // offsets [first, first+n) claimed
		inUse, cool int // of those, the first inUse are in use, the next cool cooling down
	}
	for _, tt := range []struct {
		name   string
		blocks map[netip.Prefix][]claims
		want   netip.Prefix
	}{
		{"the fuller block has nothing free", map[netip.Prefix][]claims{
			a: {{holder: "h2", n: 200, inUse: 200}},
			b: {{holder: "h3", n: 20, inUse: 10}},
		}, b},
		{"the fuller block's free are cooling down", map[netip.Prefix][]claims{
			a: {{holder: "h2", n: 200, inUse: 100, cool: 100}},
			b: {{holder: "h3", n: 20, inUse: 19}},
		}, b},
		{"the most free wins", map[netip.Prefix][]claims{
			a: {{holder: "h2", n: 200, inUse: 150}},
			b: {{holder: "h3", n: 20}},
		}, a},
		{"no read shows any free: the most claimed", map[netip.Prefix][]claims{
			a: {{holder: "h2", n: 200, inUse: 200}},
			b: {{holder: "h3", n: 20, inUse: 20}},
		}, a},
		{"a holder that left is not asked", map[netip.Prefix][]claims{
			a: {{holder: "gone", n: 200}},
			b: {{holder: "h3", n: 20, inUse: 20}},
		}, b},
		{"free of a holder that left is not counted", map[netip.Prefix][]claims{
			a: {{holder: "gone", first: 0, n: 100}, {holder: "h2", first: 100, n: 100, inUse: 100}},
			b: {{holder: "h3", n: 20, inUse: 19}},
		}, b},
		{"only this holder's claims", map[netip.Prefix][]claims{
			a: {{holder: "h1", n: 200}},
		}, netip.Prefix{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			m := newPeerManager(t, Config{
				Pool: "p", Holder: "h1", Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/19"}),
				Cooldown: time.Minute, PendingTTL: 30 * time.Second,
				LowWatermark: 1, TargetFree: 2, HighWatermark: 200,
				Store: NewMemoryStore(), Clock: clk,
			}, "h1", "h2", "h3")
			m.mu.Lock()
			defer m.mu.Unlock()
			for p, cs := range tt.blocks {
				blk := Block{Prefix: p, Exact: true, Claims: map[string]*Bitmap{}, InUse: map[string]*Bitmap{}, Cooldowns: map[netip.Addr]time.Time{}}
				for _, c := range cs {
					blk.Claims[c.holder], blk.InUse[c.holder] = new(Bitmap), new(Bitmap)
					for i := range c.n {
						off := c.first + i
						blk.Claims[c.holder].Set(off)
						switch {
						case i < c.inUse:
							blk.InUse[c.holder].Set(off)
						case i < c.inUse+c.cool:
							blk.Cooldowns[blockAddr(p, off)] = clk.Now().Add(time.Minute)
						}
					}
				}
				bs := m.blockFor(p.Addr())
				m.setPersistedLocked(bs, blk)
				bs.loaded = true
			}
			if got := m.askWhereLocked(nil); got != tt.want {
				t.Errorf("asks in %v, want %v", got, tt.want)
			}
		})
	}
}
