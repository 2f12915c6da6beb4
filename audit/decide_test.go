package audit

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools"
)

// The times of the test snapshots: objects listed at t0, Leases read a
// second later.
var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

const (
	testGrace = 10 * time.Second
	testTTL   = time.Minute
	testLease = 15 * time.Second
)

var (
	prefix = netip.MustParsePrefix("10.0.0.0/20")
	a5     = netip.MustParseAddr("10.0.0.5")
	a6     = netip.MustParseAddr("10.0.0.6")
)

// tsnap is a snapshot builder: pool "p" over 10.0.0.0/20, one block, the
// given objects, and holders h0 and h1 live.
type tsnap struct{ s *snapshot }

func newSnap() *tsnap {
	rs, err := ipam.ParseRanges([]ipam.RangeSpec{{CIDR: "10.0.0.0/20"}})
	if err != nil {
		panic(err)
	}
	s := &snapshot{
		listed: t0, now: t0.Add(time.Second), grace: testGrace, namespace: "vmipam-system",
		pools: map[string]pool{"p": {name: "p", ranges: rs, pendingTTL: testTTL, specWritten: t0.Add(-time.Hour)}},
		blocks: []block{{pool: "p", name: "p.10-0-0-0-20", written: t0.Add(-time.Hour), holders: map[string]part{},
			b: ipam.Block{Prefix: prefix, Claims: map[string]*ipam.Bitmap{}, InUse: map[string]*ipam.Bitmap{}, Armed: map[string]*ipam.Bitmap{},
				Cooldowns: map[netip.Addr]time.Time{}, Exact: true}}},
		leases: map[string]pools.HolderLease{
			"h0": {Holder: "h0", Identity: "h0", Renewed: t0, Duration: testLease},
			"h1": {Holder: "h1", Identity: "h1", Renewed: t0, Duration: testLease},
		},
	}
	return &tsnap{s: s}
}

// vm adds a live VirtualMachine, created an hour ago, labelled for h0.
func (t *tsnap) vm(name string, addrs ...netip.Addr) *object {
	t.s.objects = append(t.s.objects, object{kind: "VirtualMachine.vmipam.io", resource: "virtualmachines.vmipam.io", namespace: "ns", name: name,
		uid: name, created: t0.Add(-time.Hour), inScope: true, addrs: addrs, label: "h0", labelled: true, finalizer: true})
	return &t.s.objects[len(t.s.objects)-1]
}

// claim makes holder h claim a in the block, in use when inUse, its part
// written at written.
func (t *tsnap) claim(h string, a netip.Addr, inUse bool, written time.Time) *tsnap {
	b := &t.s.blocks[0].b
	off := int(a.As4()[3]) + int(a.As4()[2])<<8
	set := func(m map[string]*ipam.Bitmap) {
		if m[h] == nil {
			m[h] = &ipam.Bitmap{}
		}
		m[h].Set(off)
	}
	set(b.Claims)
	if inUse {
		set(b.InUse)
	}
	t.s.blocks[0].holders[h] = part{written: written, exact: true}
	return t
}

func (t *tsnap) with(f func(s *snapshot)) *snapshot { f(t.s); return t.s }

// TestDecide: every finding, and every case a race would make look like
// one, decided on snapshots without a client.
func TestDecide(t *testing.T) {
	old := t0.Add(-time.Hour)
	recent := t0.Add(-testTTL) // within TTL + grace
	tests := map[string]struct {
		s    *snapshot
		want []string // "Type address object holder", sorted
	}{
		"consistent: two VMs, their claims, live holders": {
			s: func() *snapshot {
				b := newSnap().claim("h0", a5, true, old).claim("h0", a6, true, old)
				b.vm("a", a5)
				b.vm("b", a6)
				return b.s
			}(),
		},
		// DuplicateAddress.
		"two live VMs on one address, any spelling": {
			s: func() *snapshot {
				b := newSnap().claim("h0", a5, true, old)
				b.vm("a", a5)
				b.vm("b", ipam.Canonical(netip.MustParseAddr("::ffff:10.0.0.5"))).created = t0.Add(-time.Minute)
				return b.s
			}(),
			want: []string{"DuplicateAddress 10.0.0.5 VirtualMachine.vmipam.io ns/b "},
		},
		"a terminating VM and a live one on one address": {
			s: func() *snapshot {
				b := newSnap().claim("h0", a5, true, old)
				b.vm("a", a5).deleting = true
				b.vm("b", a5)
				return b.s
			}(),
		},
		// NoAddress.
		"a live VM in scope without an address": {
			s:    func() *snapshot { b := newSnap(); b.vm("a"); return b.s }(),
			want: []string{"NoAddress  VirtualMachine.vmipam.io ns/a "},
		},
		"a VM without an address, created within the grace (the collector assigns one)": {
			s: func() *snapshot { b := newSnap(); b.vm("a").created = t0.Add(-time.Second); return b.s }(),
		},
		"a VM out of scope without an address": {
			s: func() *snapshot { b := newSnap(); b.vm("a").inScope = false; return b.s }(),
		},
		"a terminating VM without an address": {
			s: func() *snapshot { b := newSnap(); b.vm("a").deleting = true; return b.s }(),
		},
		// Leak.
		"in use, on no object, last written past TTL + grace": {
			s:    func() *snapshot { b := newSnap().claim("h0", a5, true, old); return b.s }(),
			want: []string{"Leak 10.0.0.5  h0"},
		},
		"in use, on no object, of a dead holder (no replica left)": {
			s: newSnap().claim("h0", a5, true, t0.Add(-5*time.Minute)).with(func(s *snapshot) {
				s.leases["h0"] = pools.HolderLease{Holder: "h0", Identity: "h0", Renewed: t0.Add(-5 * time.Minute), Duration: testLease}
			}),
			want: []string{"DeadHolderClaims   h0", "Leak 10.0.0.5  h0"},
		},
		"in use, on no object, written within TTL + grace (a create in flight)": {
			s: newSnap().claim("h0", a5, true, recent).with(func(s *snapshot) {}),
		},
		"in use, on a terminating object": {
			s: func() *snapshot { b := newSnap().claim("h0", a5, true, old); b.vm("a", a5).deleting = true; return b.s }(),
		},
		"in use and cooling down (released)": {
			s: newSnap().claim("h0", a5, true, old).with(func(s *snapshot) { s.blocks[0].b.Cooldowns[a5] = t0.Add(time.Minute) }),
		},
		"armed only": {
			s: newSnap().claim("h0", a5, false, old).with(func(s *snapshot) {
				s.blocks[0].b.Armed["h0"] = &ipam.Bitmap{}
				s.blocks[0].b.Armed["h0"].Set(5)
			}),
		},
		"in use marks that are not exact (share missing, every claim reads in use)": {
			s: newSnap().claim("h0", a5, true, old).with(func(s *snapshot) { s.blocks[0].holders["h0"] = part{written: old} }),
		},
		// DeadHolderClaims.
		"claims of a holder whose Lease lapsed long ago": {
			s: func() *snapshot {
				b := newSnap().claim("h2", a5, true, old)
				b.vm("a", a5).label = pools.HolderLabelValue("h2")
				b.s.leases["h2"] = pools.HolderLease{Holder: "h2", Identity: "h2", Renewed: t0.Add(-time.Hour), Duration: testLease}
				return b.s
			}(),
			want: []string{"DeadHolderClaims   h2"},
		},
		"claims of a holder whose Lease lapsed recently": {
			s: func() *snapshot {
				b := newSnap().claim("h2", a5, true, old)
				b.vm("a", a5).label = "h2"
				b.s.leases["h2"] = pools.HolderLease{Holder: "h2", Identity: "h2", Renewed: t0.Add(-30 * time.Second), Duration: testLease}
				return b.s
			}(),
		},
		"claims of a holder being taken over": {
			s: func() *snapshot {
				b := newSnap().claim("h2", a5, true, old)
				b.vm("a", a5).label = "h2"
				b.s.leases["h2"] = pools.HolderLease{Holder: "h2", Identity: pools.TakeoverPrefix + "h0", Renewed: t0, Duration: testLease}
				return b.s
			}(),
		},
		"claims of a holder whose taker died long ago": {
			s: func() *snapshot {
				b := newSnap().claim("h2", a5, true, old)
				b.vm("a", a5).label = "h2"
				b.s.leases["h2"] = pools.HolderLease{Holder: "h2", Identity: pools.TakeoverPrefix + "h0", Renewed: t0.Add(-time.Hour), Duration: testLease}
				return b.s
			}(),
			want: []string{"DeadHolderClaims   h2"},
		},
		"claims of a holder without a Lease, blocks quiet": {
			s: func() *snapshot {
				b := newSnap().claim("h2", a5, true, old)
				b.vm("a", a5).label = "h2"
				return b.s
			}(),
			want: []string{"DeadHolderClaims   h2"},
		},
		"claims of a holder without a Lease, block just written (a takeover's last move read late)": {
			s: func() *snapshot {
				b := newSnap().claim("h2", a5, true, t0.Add(-5*time.Second))
				b.vm("a", a5).label = "h2"
				return b.s
			}(),
		},
		// HolderLabelMismatch.
		"a VM labelled for another live holder": {
			s:    func() *snapshot { b := newSnap().claim("h1", a5, true, old); b.vm("a", a5); return b.s }(),
			want: []string{"HolderLabelMismatch 10.0.0.5 VirtualMachine.vmipam.io ns/a h1"},
		},
		"a VM without a holder label": {
			s: func() *snapshot {
				b := newSnap().claim("h0", a5, true, old)
				b.vm("a", a5).labelled = false
				return b.s
			}(),
			want: []string{"HolderLabelMismatch 10.0.0.5 VirtualMachine.vmipam.io ns/a h0"},
		},
		"labelled for a holder being taken over (relabelled after)": {
			s: func() *snapshot {
				b := newSnap().claim("h1", a5, true, old)
				b.vm("a", a5)
				b.s.leases["h0"] = pools.HolderLease{Holder: "h0", Identity: pools.TakeoverPrefix + "h1", Renewed: t0, Duration: testLease}
				return b.s
			}(),
		},
		"labelled for a holder whose Lease lapsed": {
			s: func() *snapshot {
				b := newSnap().claim("h1", a5, true, old)
				b.vm("a", a5)
				b.s.leases["h0"] = pools.HolderLease{Holder: "h0", Identity: "h0", Renewed: t0.Add(-20 * time.Second), Duration: testLease}
				return b.s
			}(),
		},
		"labelled for a holder whose Lease went with its takeover, block just written": {
			s: func() *snapshot {
				b := newSnap().claim("h1", a5, true, old)
				b.s.blocks[0].written = t0.Add(-5 * time.Second)
				b.vm("a", a5)
				delete(b.s.leases, "h0")
				return b.s
			}(),
		},
		"labelled for a holder whose Lease went long ago": {
			s: func() *snapshot {
				b := newSnap().claim("h1", a5, true, old)
				b.vm("a", a5)
				delete(b.s.leases, "h0")
				return b.s
			}(),
			want: []string{"HolderLabelMismatch 10.0.0.5 VirtualMachine.vmipam.io ns/a h1"},
		},
		"the claim's holder lapsed (its taker relabels)": {
			s: func() *snapshot {
				b := newSnap().claim("h1", a5, true, old)
				b.vm("a", a5)
				b.s.leases["h1"] = pools.HolderLease{Holder: "h1", Identity: "h1", Renewed: t0.Add(-20 * time.Second), Duration: testLease}
				return b.s
			}(),
		},
		"a young VM not labelled yet": {
			s: func() *snapshot {
				b := newSnap().claim("h0", a5, true, old)
				o := b.vm("a", a5)
				o.labelled, o.created = false, t0.Add(-5*time.Second)
				return b.s
			}(),
		},
		"an unclaimed address": {
			s: func() *snapshot { b := newSnap(); b.vm("a", a5).labelled = false; return b.s }(),
		},
		// UnconfiguredKind.
		"an object of a kind no replica serves, labelled and finalized": {
			s: newSnap().with(func(s *snapshot) {
				s.marked = []object{{kind: "VirtualMachine.kubevirt.io", resource: "virtualmachines.kubevirt.io", namespace: "ns", name: "kv",
					label: "h0", labelled: true, finalizer: true, finalizers: []string{"other", "vmipam.io/release-address"}}}
			}),
			want: []string{"UnconfiguredKind  VirtualMachine.kubevirt.io ns/kv "},
		},
		// UnknownBlock.
		"a block of no pool": {
			s:    newSnap().with(func(s *snapshot) { s.blocks[0].pool = "gone" }),
			want: []string{"UnknownBlock  IPBlock p.10-0-0-0-20 "},
		},
		"a block of no pool, just written (its pool being deleted)": {
			s: newSnap().with(func(s *snapshot) { s.blocks[0].pool, s.blocks[0].written = "gone", t0.Add(-time.Second) }),
		},
		"claims outside the shrunk ranges": {
			s: newSnap().claim("h0", netip.MustParseAddr("10.0.8.1"), false, old).with(func(s *snapshot) {
				p := s.pools["p"]
				p.ranges, _ = ipam.ParseRanges([]ipam.RangeSpec{{CIDR: "10.0.0.0/21"}})
				s.pools["p"] = p
			}),
			want: []string{"UnknownBlock  IPBlock p.10-0-0-0-20 "},
		},
		"claims outside ranges shrunk just now (replicas recovering)": {
			s: newSnap().claim("h0", netip.MustParseAddr("10.0.8.1"), false, old).with(func(s *snapshot) {
				p := s.pools["p"]
				p.ranges, _ = ipam.ParseRanges([]ipam.RangeSpec{{CIDR: "10.0.0.0/21"}})
				p.specWritten = t0.Add(-10 * time.Second)
				s.pools["p"] = p
			}),
		},
		"a share without its block": {
			s: newSnap().with(func(s *snapshot) {
				s.orphans = []share{{pool: "p", name: "p.10-0-16-0-20.abc", prefix: "10.0.16.0/20", holder: "h0", written: old}}
			}),
			want: []string{"UnknownBlock  IPBlockShare p.10-0-16-0-20.abc h0"},
		},
		"a share written just before its block is created": {
			s: newSnap().with(func(s *snapshot) {
				s.orphans = []share{{pool: "p", name: "p.10-0-16-0-20.abc", prefix: "10.0.16.0/20", holder: "h0", written: t0.Add(-time.Second)}}
			}),
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got := decide(tt.s)
			var keys []string
			for _, f := range got {
				keys = append(keys, strings.Join([]string{f.Type, f.Address, f.Object, f.Holder}, " "))
				if f.Message == "" || f.Fix == "" {
					t.Errorf("%s: empty message or fix: %+v", f.Type, f)
				}
			}
			slices.Sort(keys)
			if !slices.Equal(keys, tt.want) {
				t.Errorf("findings:\n got %q\nwant %q", keys, tt.want)
				for _, f := range got {
					t.Logf("%s: %s; fix: %s", f.Type, f.Message, f.Fix)
				}
			}
		})
	}
}

// TestAddrAt: offsets of a block spelt as addresses, both families.
func TestAddrAt(t *testing.T) {
	tests := map[string]struct {
		p    string
		off  int
		want string
	}{
		"first":         {"10.0.16.0/20", 0, "10.0.16.0"},
		"carry":         {"10.0.16.0/20", 300, "10.0.17.44"},
		"last":          {"10.0.16.0/20", ipam.BlockSize - 1, "10.0.31.255"},
		"IPv6":          {"fd00::/116", 0x123, "fd00::123"},
		"IPv6 carry":    {"fd00::1:0/116", 0xfff, "fd00::1:fff"},
		"IPv4 high end": {"10.255.240.0/20", ipam.BlockSize - 1, "10.255.255.255"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := addrAt(netip.MustParsePrefix(tt.p), tt.off); got.String() != tt.want {
				t.Errorf("addrAt(%s, %d) = %s, want %s", tt.p, tt.off, got, tt.want)
			}
		})
	}
}

// TestUnmarkPatch: the fix keeps the object's other finalizers.
func TestUnmarkPatch(t *testing.T) {
	got := unmarkPatch(object{finalizers: []string{"other", "vmipam.io/release-address"}})
	want := `{"metadata":{"finalizers":["other"],"labels":{"vmipam.io/holder":null}}}`
	if got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
