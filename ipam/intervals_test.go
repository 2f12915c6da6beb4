package ipam

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// ivExpand lists the addresses of small intervals, in order.
func ivExpand[T interface{ Interval | Overlap }](ivs []T) []netip.Addr {
	var out []netip.Addr
	for _, iv := range ivs {
		var first, last netip.Addr
		switch v := any(iv).(type) {
		case Interval:
			first, last = v.First, v.Last
		case Overlap:
			first, last = v.First, v.Last
		}
		for a := first; a.IsValid() && !last.Less(a); a = a.Next() {
			out = append(out, a)
		}
	}
	return out
}

// ivStrings writes intervals as "first-last@range", overlaps as
// "first-last@range/otherRange".
func ivStrings[T interface{ Interval | Overlap }](ivs []T) []string {
	out := make([]string, len(ivs))
	for i, iv := range ivs {
		switch v := any(iv).(type) {
		case Interval:
			out[i] = fmt.Sprintf("%s@%d", v, v.Range)
		case Overlap:
			out[i] = fmt.Sprintf("%s@%d/%d", v, v.Range, v.OtherRange)
		}
	}
	return out
}

func TestRangesIntervals(t *testing.T) {
	tests := map[string]struct {
		specs []RangeSpec
		want  []string
	}{
		"one subnet": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24"}},
			want:  []string{"10.0.0.1-10.0.0.254@0"},
		},
		"exclusions cut runs": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/28", Exclude: []string{"10.0.0.1", "10.0.0.4/30", "10.0.0.14", "10.0.0.6"}}},
			want:  []string{"10.0.0.2-10.0.0.3@0", "10.0.0.8-10.0.0.13@0"},
		},
		"adjacent ranges stay apart": {
			specs: []RangeSpec{{CIDR: "10.0.0.2/31"}, {CIDR: "10.0.0.0/31"}},
			want:  []string{"10.0.0.0-10.0.0.1@1", "10.0.0.2-10.0.0.3@0"},
		},
		"ipv4 before ipv6, even below it as a number": {
			specs: []RangeSpec{{CIDR: "::/126"}, {CIDR: "10.0.0.0/30"}, {CIDR: "fd00::/127", Exclude: []string{"fd00::1"}}},
			want:  []string{"10.0.0.1-10.0.0.2@1", "::1-::3@0", "fd00::@2"},
		},
		"top of the ipv6 space": {
			specs: []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124", Exclude: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff4/126"}}},
			want: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff1-ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff3@0",
				"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff8-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff@0"},
		},
		"top of the ipv6 space excluded": {
			specs: []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124", Exclude: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff8/125"}}},
			want:  []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff1-ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff7@0"},
		},
		"top and bottom of the ipv4 space": {
			specs: []RangeSpec{{CIDR: "255.255.255.254/31"}, {CIDR: "0.0.0.0/31"}},
			want:  []string{"0.0.0.0-0.0.0.1@1", "255.255.255.254-255.255.255.255@0"},
		},
		"a /64 is two numbers": {
			specs: []RangeSpec{{CIDR: "fd00::/64", Exclude: []string{"fd00::8000:0:0:0/65"}}},
			want:  []string{"fd00::1-fd00::7fff:ffff:ffff:ffff@0"},
		},
		"ipv6 ranges skip the ipv4-mapped block": {
			specs: []RangeSpec{{CIDR: "::/64", First: "::fffe:ffff:fffe", Last: "::1:0:0:1"}},
			want:  []string{"::fffe:ffff:fffe-::fffe:ffff:ffff@0", "::1:0:0:0-::1:0:0:1@0"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := mustRanges(t, tc.specs...)
			if got := ivStrings(r.Intervals()); !slices.Equal(got, tc.want) {
				t.Errorf("Intervals() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRangesOverlaps(t *testing.T) {
	tests := map[string]struct {
		a, b []RangeSpec
		want []string
	}{
		"disjoint": {
			a: []RangeSpec{{CIDR: "10.0.0.0/25"}},
			b: []RangeSpec{{CIDR: "10.0.0.128/25"}, {CIDR: "fd00::/64"}},
		},
		"same subnet": {
			a:    []RangeSpec{{CIDR: "10.0.0.0/24"}},
			b:    []RangeSpec{{CIDR: "10.0.0.0/24"}},
			want: []string{"10.0.0.1-10.0.0.254@0/0"},
		},
		"one subnet split by exclusions": {
			a: []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.128/25"}}},
			b: []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.0/25"}}},
		},
		"exclusions leave a shared part": {
			a:    []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.128/26"}}},
			b:    []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.0/25", "10.0.0.200"}}},
			want: []string{"10.0.0.192-10.0.0.199@0/0", "10.0.0.201-10.0.0.254@0/0"},
		},
		"one subnet split by first and last": {
			a:    []RangeSpec{{CIDR: "10.0.0.0/24", Last: "10.0.0.128"}},
			b:    []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.128"}},
			want: []string{"10.0.0.128@0/0"},
		},
		"several ranges, tagged": {
			a:    []RangeSpec{{CIDR: "10.0.2.0/24"}, {CIDR: "10.0.0.0/23"}},
			b:    []RangeSpec{{CIDR: "fd00::/120"}, {CIDR: "10.0.1.128/25"}, {CIDR: "10.0.2.16/28"}, {CIDR: "10.0.0.8/30"}},
			want: []string{"10.0.0.9-10.0.0.10@1/3", "10.0.1.129-10.0.1.254@1/1", "10.0.2.17-10.0.2.30@0/2"},
		},
		"families apart, though equal as numbers": {
			a: []RangeSpec{{CIDR: "10.0.0.0/24"}},
			b: []RangeSpec{{CIDR: "::a00:0/120"}},
		},
		"ipv4 and ipv6 of both": {
			a:    []RangeSpec{{CIDR: "10.0.0.0/30"}, {CIDR: "::a00:0/126"}},
			b:    []RangeSpec{{CIDR: "::a00:0/127"}, {CIDR: "10.0.0.2/31"}},
			want: []string{"10.0.0.2@0/1", "::a00:1@1/0"},
		},
		"top of the ipv6 space": {
			a:    []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120"}},
			b:    []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124", Exclude: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff1"}}},
			want: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff2-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff@0/0"},
		},
		"many small against one large": {
			a:    []RangeSpec{{CIDR: "fd00::/64"}},
			b:    []RangeSpec{{CIDR: "fd00::/127"}, {CIDR: "fd00::1:0:0/127"}, {CIDR: "fd00:0:0:0:8000::/127"}, {CIDR: "fd00:0:0:1::/127"}},
			want: []string{"fd00::1@0/0", "fd00::1:0:0-fd00::1:0:1@0/1", "fd00::8000:0:0:0-fd00::8000:0:0:1@0/2"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a, b := mustRanges(t, tc.a...), mustRanges(t, tc.b...)
			got := ivStrings(slices.Collect(a.Overlaps(b)))
			if !slices.Equal(got, tc.want) {
				t.Errorf("a.Overlaps(b) = %q, want %q", got, tc.want)
			}
			// Symmetric, with the range indices swapped.
			var back []string
			for o := range b.Overlaps(a) {
				o.Range, o.OtherRange = o.OtherRange, o.Range
				back = append(back, ivStrings([]Overlap{o})...)
			}
			if !slices.Equal(back, tc.want) {
				t.Errorf("b.Overlaps(a), swapped = %q, want %q", back, tc.want)
			}
		})
	}
}

func TestRangesDifference(t *testing.T) {
	tests := map[string]struct {
		old, new []RangeSpec
		want     []string
	}{
		"unchanged": {
			old: []RangeSpec{{CIDR: "10.0.0.0/24"}},
			new: []RangeSpec{{CIDR: "10.0.0.0/24"}},
		},
		"widened": {
			old: []RangeSpec{{CIDR: "10.0.0.0/24", Last: "10.0.0.100"}},
			new: []RangeSpec{{CIDR: "10.0.0.0/23"}},
		},
		"range removed": {
			old:  []RangeSpec{{CIDR: "10.0.0.0/24"}, {CIDR: "fd00::/120"}},
			new:  []RangeSpec{{CIDR: "10.0.0.0/24"}},
			want: []string{"fd00::1-fd00::ff@1"},
		},
		"narrowed on both ends": {
			old:  []RangeSpec{{CIDR: "10.0.0.0/24"}},
			new:  []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.10", Last: "10.0.0.250"}},
			want: []string{"10.0.0.1-10.0.0.9@0", "10.0.0.251-10.0.0.254@0"},
		},
		"exclusions added": {
			old:  []RangeSpec{{CIDR: "10.0.1.0/24"}, {CIDR: "10.0.0.0/24"}},
			new:  []RangeSpec{{CIDR: "10.0.0.0/23", Exclude: []string{"10.0.0.7", "10.0.1.16/28"}}},
			want: []string{"10.0.0.7@1", "10.0.1.16-10.0.1.31@0"},
		},
		"one new run over several old ones": {
			old:  []RangeSpec{{CIDR: "10.0.0.0/28", Exclude: []string{"10.0.0.4", "10.0.0.8"}}, {CIDR: "10.0.0.16/28"}},
			new:  []RangeSpec{{CIDR: "10.0.0.2/31"}, {CIDR: "10.0.0.4/31"}, {CIDR: "10.0.0.6/31"}, {CIDR: "10.0.0.8/29"}, {CIDR: "10.0.0.16/28", First: "10.0.0.20"}},
			want: []string{"10.0.0.1@0", "10.0.0.17-10.0.0.19@1"},
		},
		"families apart": {
			old:  []RangeSpec{{CIDR: "::a00:0/126"}},
			new:  []RangeSpec{{CIDR: "10.0.0.0/30"}},
			want: []string{"::a00:1-::a00:3@0"},
		},
		"top of the ipv6 space": {
			old:  []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124"}},
			new:  []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124", Exclude: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff4/126"}}},
			want: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff4-ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff7@0"},
		},
		"top of the ipv6 space taken out": {
			old:  []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124"}},
			new:  []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124", Last: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"}},
			want: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff@0"},
		},
		"a /64 shrunk": {
			old:  []RangeSpec{{CIDR: "fd00::/64"}},
			new:  []RangeSpec{{CIDR: "fd00::/65"}},
			want: []string{"fd00::8000:0:0:0-fd00::ffff:ffff:ffff:ffff@0"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			old, nw := mustRanges(t, tc.old...), mustRanges(t, tc.new...)
			if got := ivStrings(slices.Collect(old.Difference(nw))); !slices.Equal(got, tc.want) {
				t.Errorf("Difference = %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("nil is empty", func(t *testing.T) {
		r := mustRanges(t, RangeSpec{CIDR: "10.0.0.0/30"})
		if got := ivStrings(slices.Collect(r.Difference(nil))); !slices.Equal(got, []string{"10.0.0.1-10.0.0.2@0"}) {
			t.Errorf("r.Difference(nil) = %q", got)
		}
		var empty *Ranges
		if n := len(slices.Collect(empty.Difference(r))) + len(slices.Collect(empty.Overlaps(r))) + len(slices.Collect(r.Overlaps(nil))); n != 0 {
			t.Errorf("nil Ranges yield %d runs", n)
		}
	})
	t.Run("stops when asked", func(t *testing.T) {
		old := mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24"})
		nw := mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.1", "10.0.0.3", "10.0.0.5"}})
		n := 0
		for range old.Difference(nw) {
			if n++; n == 2 {
				break
			}
		}
		for range old.Overlaps(nw) {
			if n++; n == 4 {
				break
			}
		}
		if n != 4 {
			t.Errorf("n = %d", n)
		}
	})
}

// ivBases are the /118s random pools are drawn from: IPv4 and IPv6 that are
// equal as numbers, ordinary IPv6, and the top of the IPv6 space.
var ivBases = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/22"),
	netip.MustParsePrefix("::a00:0/118"),
	netip.MustParsePrefix("fd00::/118"),
	netip.MustParsePrefix("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fc00/118"),
}

// ivRandomSpec returns a random, valid small range inside base (1024
// addresses), often overlapping others drawn from the same base.
func ivRandomSpec(rng *rand.Rand, base netip.Prefix) RangeSpec {
	hostBits := base.Addr().BitLen() - base.Bits() // 10
	bits := base.Bits() + 1 + rng.IntN(hostBits)
	v := toU128(base.Addr()).add(uint64(rng.IntN(1 << hostBits)))
	p, _ := fromU128(v, base.Addr().Is4()).Prefix(bits)
	return rtRandomSpecIn(rng, p, 5)
}

// ivRandomPool returns a valid pool of one to three random ranges, mostly
// inside base, and its addresses as the independent model computes them.
func ivRandomPool(t *testing.T, rng *rand.Rand, base netip.Prefix) (*Ranges, []RangeSpec, []netip.Addr) {
	t.Helper()
	for {
		specs := make([]RangeSpec, 1+rng.IntN(3))
		for i := range specs {
			b := base
			if rng.IntN(4) == 0 {
				b = ivBases[rng.IntN(len(ivBases))]
			}
			specs[i] = ivRandomSpec(rng, b)
		}
		if r, err := ParseRanges(specs); err == nil {
			return r, specs, rtModel(specs)
		}
	}
}

// ivSetOp returns the addresses of a that are (in) or are not (!in) in b;
// both sorted.
func ivSetOp(a, b []netip.Addr, in bool) []netip.Addr {
	var out []netip.Addr
	for _, x := range a {
		if _, found := slices.BinarySearchFunc(b, x, netip.Addr.Compare); found == in {
			out = append(out, x)
		}
	}
	return out
}

// TestRangesSetOperationsRandom checks Intervals, Overlaps and Difference
// against brute-force set operations over the addresses of random small
// pools of both families, near the top of the IPv6 space and where IPv4 and
// IPv6 addresses are equal as numbers.
func TestRangesSetOperationsRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 0x1e7a15))
	shared, partial := 0, 0
	for i := range 1500 {
		base := ivBases[rng.IntN(len(ivBases))]
		a, aspecs, aaddrs := ivRandomPool(t, rng, base)
		b, bspecs, baddrs := ivRandomPool(t, rng, base)
		ivs := a.Intervals()
		if got := ivExpand(ivs); !slices.Equal(got, aaddrs) {
			t.Fatalf("pool %d %+v: Intervals() = %v, want the addresses %v", i, aspecs, ivStrings(ivs), aaddrs)
		}
		if got := rtWalk(t, a, len(aaddrs)+1); !slices.Equal(got, aaddrs) {
			t.Fatalf("pool %d %+v: Next walk = %v, want %v", i, aspecs, got, aaddrs)
		}
		for k, iv := range ivs {
			if k > 0 && !ivs[k-1].Last.Less(iv.First) {
				t.Fatalf("pool %d %+v: intervals %v and %v are not sorted and disjoint", i, aspecs, ivs[k-1], iv)
			}
			if lo, hi := rtBounds(aspecs[iv.Range]); iv.First.Less(lo) || hi.Less(iv.Last) {
				t.Fatalf("pool %d %+v: interval %v is not inside its range %d", i, aspecs, iv, iv.Range)
			}
		}
		ovs := slices.Collect(a.Overlaps(b))
		if got, want := ivExpand(ovs), ivSetOp(aaddrs, baddrs, true); !slices.Equal(got, want) {
			t.Fatalf("pools %+v and %+v: Overlaps = %v, want the addresses %v", aspecs, bspecs, ivStrings(ovs), want)
		}
		for _, o := range ovs {
			alo, ahi := rtBounds(aspecs[o.Range])
			blo, bhi := rtBounds(bspecs[o.OtherRange])
			if o.First.Less(alo) || ahi.Less(o.Last) || o.First.Less(blo) || bhi.Less(o.Last) {
				t.Fatalf("pools %+v and %+v: overlap %s is not inside ranges %d and %d", aspecs, bspecs, ivStrings([]Overlap{o}), o.Range, o.OtherRange)
			}
		}
		if len(ovs) > 0 {
			shared++
		}
		diff := slices.Collect(a.Difference(b))
		if len(ovs) > 0 && len(diff) > 0 {
			partial++
		}
		if got, want := ivExpand(diff), ivSetOp(aaddrs, baddrs, false); !slices.Equal(got, want) {
			t.Fatalf("pools %+v − %+v: Difference = %v, want the addresses %v", aspecs, bspecs, ivStrings(diff), want)
		}
		for _, d := range diff {
			if lo, hi := rtBounds(aspecs[d.Range]); d.First.Less(lo) || hi.Less(d.Last) {
				t.Fatalf("pools %+v − %+v: run %v is not inside its range %d", aspecs, bspecs, d, d.Range)
			}
		}
	}
	t.Logf("%d of 1500 pairs share addresses, %d of them only some", shared, partial)
	if shared < 200 || partial < 150 {
		t.Fatalf("only %d pairs share addresses, %d only some; the generator needs fixing", shared, partial)
	}
}

func TestRangesAfter(t *testing.T) {
	r := mustRanges(t,
		RangeSpec{CIDR: "255.255.255.254/31"},
		RangeSpec{CIDR: "::/64", First: "::fffe:ffff:fffe", Last: "::1:0:0:1"},
		RangeSpec{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127"},
	)
	tests := map[string]struct{ from, want string }{
		"inside a run":                 {"255.255.255.254", "255.255.255.255"},
		"top of ipv4 into ipv6":        {"255.255.255.255", "::fffe:ffff:fffe"},
		"over the ipv4-mapped block":   {"::fffe:ffff:ffff", "::1:0:0:0"},
		"zoned":                        {"::fffe:ffff:fffe%eth0", "::fffe:ffff:ffff"},
		"below everything":             {"0.0.0.0", "255.255.255.254"},
		"into the top of ipv6":         {"::1:0:0:1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe"},
		"top of ipv6":                  {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", ""},
		"ipv4-mapped is ipv4":          {"::ffff:255.255.255.254", "255.255.255.255"},
		"ipv6 unspecified":             {"::", "::fffe:ffff:fffe"},
		"before the last ipv6 address": {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := r.After(netip.MustParseAddr(tc.from))
			if tc.want == "" {
				if ok {
					t.Fatalf("After(%s) = %v, true; want none", tc.from, got)
				}
				return
			}
			if !ok || got != netip.MustParseAddr(tc.want) {
				t.Fatalf("After(%s) = %v, %v; want %s", tc.from, got, ok, tc.want)
			}
		})
	}
	if _, ok := r.After(netip.Addr{}); ok {
		t.Errorf("After(invalid) found an address")
	}
}

// TestRangesCanonical checks that Contains and Next read an address in its
// one spelling: IPv4-mapped as IPv4, the zone dropped.
func TestRangesCanonical(t *testing.T) {
	r := mustRanges(t, RangeSpec{CIDR: "10.0.0.0/29", Exclude: []string{"10.0.0.2"}}, RangeSpec{CIDR: "fe80::/126"})
	tests := map[string]struct {
		a        string
		contains bool
		next     string
	}{
		"ipv4":                       {"10.0.0.1", true, "10.0.0.1"},
		"ipv4-mapped":                {"::ffff:10.0.0.1", true, "10.0.0.1"},
		"ipv4-mapped, excluded":      {"::ffff:10.0.0.2", false, "10.0.0.3"},
		"ipv4-mapped, zoned":         {"::ffff:10.0.0.3%eth0", true, "10.0.0.3"},
		"zoned ipv6":                 {"fe80::1%eth0", true, "fe80::1"},
		"zoned ipv6, network":        {"fe80::%eth0", false, "fe80::1"},
		"ipv6 equal to ipv4 as int":  {"::a00:1", false, "fe80::1"},
		"ipv4-mapped past the ipv4s": {"::ffff:10.0.0.7", false, "fe80::1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := netip.MustParseAddr(tc.a)
			if got := r.Contains(a); got != tc.contains {
				t.Errorf("Contains(%s) = %v, want %v", a, got, tc.contains)
			}
			got, ok := r.Next(a)
			if !ok || got != netip.MustParseAddr(tc.next) || got.Zone() != "" {
				t.Errorf("Next(%s) = %v, %v; want %s", a, got, ok, tc.next)
			}
		})
	}
}

// TestParseRangesIPv4MappedBlock checks that an IPv6 range never hands out
// ::ffff:0:0/96: those addresses are IPv4 addresses in their one spelling.
func TestParseRangesIPv4MappedBlock(t *testing.T) {
	r := mustRanges(t, RangeSpec{CIDR: "::/64"})
	if got, want := r.Size(), uint64(math.MaxUint64-1<<32); got != want {
		t.Errorf("Size() = %d, want 2^64 - 1 (network) - 2^32 (mapped) = %d", got, want)
	}
	for a, want := range map[string]bool{"::fffe:ffff:ffff": true, "::1:0:0:0": true, "::ffff:0:0": false, "::ffff:10.0.0.1": false, "::1": true} {
		if got := r.Contains(netip.MustParseAddr(a)); got != want {
			t.Errorf("Contains(%s) = %v, want %v", a, got, want)
		}
	}
	if s := r.String(); s != "::1-::ffff:ffff:ffff:ffff except ::ffff:0.0.0.0-::ffff:255.255.255.255" {
		t.Errorf("String() = %s", s)
	}
	// A range inside the block cannot be written; one around it is fine.
	if _, err := ParseRanges([]RangeSpec{{CIDR: "::fffe:0:0/95"}}); err != nil {
		t.Errorf("::fffe:0:0/95: %v", err)
	}
	if _, err := ParseRanges([]RangeSpec{{CIDR: "::/64", First: "::ffff:0:0", Last: "::ffff:ffff:ffff"}}); err == nil {
		t.Errorf("a range of only mapped addresses was accepted")
	}
}

func TestRangesString(t *testing.T) {
	many := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("10.0.0.%d", 2*i+2))
		}
		return out
	}
	var wide []RangeSpec
	for i := range 64 {
		wide = append(wide, RangeSpec{CIDR: fmt.Sprintf("fd00:%x::/64", i), Exclude: []string{fmt.Sprintf("fd00:%x::8000:0:0:0/65", i)}})
	}
	tests := map[string]struct {
		specs []RangeSpec
		want  string
	}{
		"one range": {
			specs: []RangeSpec{{CIDR: "10.40.0.0/28"}},
			want:  "10.40.0.1-10.40.0.14",
		},
		"a single address": {
			specs: []RangeSpec{{CIDR: "10.0.0.7/32"}},
			want:  "10.0.0.7",
		},
		"exclusions, both families": {
			specs: []RangeSpec{{CIDR: "fd00::/120"}, {CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.8/30", "10.0.0.5"}}},
			want:  "10.0.0.1-10.0.0.254 except 10.0.0.5, 10.0.0.8-10.0.0.11; fd00::1-fd00::ff",
		},
		"exclusions at the ends narrow the range": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.0/28", "10.0.0.240/28", "10.0.0.100"}}},
			want:  "10.0.0.16-10.0.0.239 except 10.0.0.100",
		},
		"fully excluded ranges are left out": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/30", Exclude: []string{"10.0.0.0/30"}}, {CIDR: "10.0.1.0/30"}},
			want:  "10.0.1.1-10.0.1.2",
		},
		"first eight exclusions": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: many(10)}},
			want: "10.0.0.1-10.0.0.254 except 10.0.0.2, 10.0.0.4, 10.0.0.6, 10.0.0.8, 10.0.0.10, 10.0.0.12, 10.0.0.14, 10.0.0.16, " +
				"and 2 more",
		},
		"bounded": {
			specs: wide,
			want:  "fd00::1-fd00::7fff:ffff:ffff:ffff; fd00:1::-fd00:1::7fff:ffff:ffff:ffff; ",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := mustRanges(t, tc.specs...).String()
			if name == "bounded" {
				if !strings.HasPrefix(got, "fd00::1-fd00::7fff:ffff:ffff:ffff; ") || !strings.HasSuffix(got, " more ranges") || len(got) > 2*stringBudget {
					t.Errorf("String() = %q (%d bytes), want about %d bytes ending in \"and N more ranges\"", got, len(got), stringBudget)
				}
				return
			}
			if got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestParseRangesTypedPaths checks the paths and types of FieldErrors, which
// the webhook maps onto Kubernetes field paths without reading text.
func TestParseRangesTypedPaths(t *testing.T) {
	_, err := ParseRanges([]RangeSpec{{CIDR: "10.0.0.0/24"}, {CIDR: ""}, {CIDR: "10.0.1.0/24", Exclude: []string{"10.0.1.1", "x"}}})
	var fe FieldErrors
	if !errors.As(err, &fe) || len(fe) != 2 {
		t.Fatalf("ParseRanges = %v, want two FieldErrors", err)
	}
	want := []struct {
		path Path
		typ  ErrorType
	}{
		{Path{{Field: "ranges", Index: 1, Indexed: true}, {Field: "cidr"}}, ErrorTypeRequired},
		{Path{{Field: "ranges", Index: 2, Indexed: true}, {Field: "exclude", Index: 1, Indexed: true}}, ErrorTypeInvalid},
	}
	for i, w := range want {
		if !slices.Equal(fe[i].Path, w.path) || fe[i].Type != w.typ {
			t.Errorf("error %d: path %v type %d, want %v type %d", i, fe[i].Path, fe[i].Type, w.path, w.typ)
		}
	}
	_, err = ParseRanges(nil)
	if !errors.As(err, &fe) || len(fe) != 1 || !slices.Equal(fe[0].Path, Path{{Field: "ranges"}}) || fe[0].Type != ErrorTypeRequired {
		t.Errorf("ParseRanges(nil) = %v, want ranges required", err)
	}
}
