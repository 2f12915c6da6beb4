package ipam

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// rtAddrs parses a list of addresses.
func rtAddrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// rtFields returns the field paths of a FieldErrors error, in order.
func rtFields(err error) []string {
	var fe FieldErrors
	if !errors.As(err, &fe) {
		return nil
	}
	out := make([]string, len(fe))
	for i, e := range fe {
		out[i] = e.Field()
	}
	return out
}

// rtWalk lists the addresses of r by calling Next from the lowest address
// of each family, as the allocator does, failing after more than limit
// addresses or if Next ever goes backwards.
func rtWalk(tb testing.TB, r *Ranges, limit int) []netip.Addr {
	tb.Helper()
	var out []netip.Addr
	a := netip.IPv4Unspecified()
	for {
		x, ok := r.Next(a)
		if !ok {
			return out
		}
		if !x.IsValid() {
			tb.Fatalf("Next(%s) = invalid address, true", a)
		}
		if x.Less(a) {
			tb.Fatalf("Next(%s) = %s: went backwards", a, x)
		}
		out = append(out, x)
		if len(out) > limit {
			tb.Fatalf("Next walk yields more than %d addresses (so far: ...%v)", limit, out[max(0, len(out)-5):])
		}
		n := x.Next()
		switch {
		case !n.IsValid() && !x.Is4():
			n = netip.Addr{} // top of the IPv6 space: Next has none
		case !n.IsValid():
			n = netip.IPv6Unspecified() // top of the IPv4 space
		case n.Is4In6():
			// Next reads ::ffff:0:0 as 0.0.0.0; no range hands out the
			// mapped block, so a walk steps over it (After does).
			n = netip.MustParseAddr("::1:0:0:0")
		}
		// After is the walk's step in one call.
		y, yok := r.After(x)
		if nx, nok := r.Next(n); y != nx || yok != nok {
			tb.Fatalf("After(%s) = %v, %v; the Next walk goes on to %v, %v", x, y, yok, nx, nok)
		}
		if !n.IsValid() {
			return out
		}
		a = n
	}
}

// rtEnum lists every address of the prefix p (which must be small).
func rtEnum(p netip.Prefix) []netip.Addr {
	var out []netip.Addr
	for a := p.Addr(); a.IsValid() && p.Contains(a); a = a.Next() {
		out = append(out, a)
	}
	return out
}

// rtBrute lists, in increasing order, the addresses of the CIDRs of specs
// for which r.Contains is true.
func rtBrute(r *Ranges, specs []RangeSpec) []netip.Addr {
	var out []netip.Addr
	for _, s := range specs {
		for _, a := range rtEnum(netip.MustParsePrefix(strings.TrimSpace(s.CIDR))) {
			if r.Contains(a) {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// rtModel computes, independently of ParseRanges, the usable addresses of
// valid specs with small CIDRs, in increasing order.
func rtModel(specs []RangeSpec) []netip.Addr {
	var out []netip.Addr
	for _, s := range specs {
		p := netip.MustParsePrefix(s.CIDR)
		all := rtEnum(p)
		var first, last netip.Addr
		if s.First != "" {
			first = netip.MustParseAddr(s.First)
		}
		if s.Last != "" {
			last = netip.MustParseAddr(s.Last)
		}
		var excl []netip.Prefix
		for _, x := range s.Exclude {
			if strings.Contains(x, "/") {
				excl = append(excl, netip.MustParsePrefix(x))
			} else {
				a := netip.MustParseAddr(x)
				excl = append(excl, netip.PrefixFrom(a, a.BitLen()))
			}
		}
	next:
		for i, a := range all {
			if len(all) >= 4 && (i == 0 || p.Addr().Is4() && i == len(all)-1) {
				continue // network, IPv4 broadcast
			}
			if first.IsValid() && a.Less(first) || last.IsValid() && last.Less(a) {
				continue
			}
			for _, x := range excl {
				if x.Contains(a) {
					continue next
				}
			}
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

func TestParseRanges(t *testing.T) {
	tests := map[string]struct {
		specs []RangeSpec
		size  uint64
		first string
		in    []string // usable addresses
		out   []string // addresses that must not be usable
	}{
		"ipv4 /24": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24"}},
			size:  254, first: "10.0.0.1",
			in:  []string{"10.0.0.1", "10.0.0.100", "10.0.0.254", "::ffff:10.0.0.7"},
			out: []string{"10.0.0.0", "10.0.0.255", "9.255.255.255", "10.0.1.0", "10.0.1.1", "fd00::1", "::a00:1"},
		},
		"ipv4 /24 with surrounding spaces": {
			specs: []RangeSpec{{CIDR: " 10.0.0.0/24\t", First: " 10.0.0.5 ", Exclude: []string{" 10.0.0.6 "}}},
			size:  249, first: "10.0.0.5",
			in:  []string{"10.0.0.5", "10.0.0.7", "10.0.0.254"},
			out: []string{"10.0.0.4", "10.0.0.6", "10.0.0.255"},
		},
		"ipv4 /31 point-to-point": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/31"}},
			size:  2, first: "10.0.0.0",
			in:  []string{"10.0.0.0", "10.0.0.1"},
			out: []string{"10.0.0.2", "9.255.255.255"},
		},
		"ipv4 /32 host": {
			specs: []RangeSpec{{CIDR: "10.0.0.7/32"}},
			size:  1, first: "10.0.0.7",
			in:  []string{"10.0.0.7"},
			out: []string{"10.0.0.6", "10.0.0.8"},
		},
		"ipv4 /30 at the top of the space": {
			specs: []RangeSpec{{CIDR: "255.255.255.252/30"}},
			size:  2, first: "255.255.255.253",
			in:  []string{"255.255.255.253", "255.255.255.254"},
			out: []string{"255.255.255.252", "255.255.255.255", "255.255.255.251"},
		},
		"ipv6 /64 size is 2^64-1 (network excluded)": {
			specs: []RangeSpec{{CIDR: "fd00::/64"}},
			size:  math.MaxUint64, first: "fd00::1",
			in:  []string{"fd00::1", "fd00::2", "fd00::ffff:ffff:ffff:ffff", "fd00::8000:0:0:0"},
			out: []string{"fd00::", "fd00:0:0:1::", "fcff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "10.0.0.1"},
		},
		"ipv6 /48 saturates": {
			specs: []RangeSpec{{CIDR: "fd00:1::/48"}},
			size:  math.MaxUint64, first: "fd00:1::1",
			in:  []string{"fd00:1::1", "fd00:1:0:ffff:ffff:ffff:ffff:ffff"},
			out: []string{"fd00:1::", "fd00:2::"},
		},
		"ipv6 /124 has no broadcast": {
			specs: []RangeSpec{{CIDR: "fd00::/124"}},
			size:  15, first: "fd00::1",
			in:  []string{"fd00::1", "fd00::8", "fd00::f"},
			out: []string{"fd00::", "fd00::10", "fcff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		},
		"ipv6 /127 point-to-point": {
			specs: []RangeSpec{{CIDR: "fd00::/127"}},
			size:  2, first: "fd00::",
			in:  []string{"fd00::", "fd00::1"},
			out: []string{"fd00::2"},
		},
		"ipv6 /124 at the top of the space": {
			specs: []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124"}},
			size:  15, first: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff1",
			in:  []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
			out: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffef"},
		},
		"first and last narrow the range": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.10", Last: "10.0.0.20"}},
			size:  11, first: "10.0.0.10",
			in:  []string{"10.0.0.10", "10.0.0.15", "10.0.0.20"},
			out: []string{"10.0.0.0", "10.0.0.1", "10.0.0.9", "10.0.0.21", "10.0.0.254", "10.0.0.255"},
		},
		"first only": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.200"}},
			size:  55, first: "10.0.0.200",
			in:  []string{"10.0.0.200", "10.0.0.254"},
			out: []string{"10.0.0.199", "10.0.0.255"},
		},
		"first equals last": {
			specs: []RangeSpec{{CIDR: "fd00::/120", First: "fd00::42", Last: "fd00::42"}},
			size:  1, first: "fd00::42",
			in:  []string{"fd00::42"},
			out: []string{"fd00::41", "fd00::43"},
		},
		"exclude a single address": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.1"}}},
			size:  253, first: "10.0.0.2",
			in:  []string{"10.0.0.2", "10.0.0.254"},
			out: []string{"10.0.0.0", "10.0.0.1", "10.0.0.255"},
		},
		"exclude a sub-CIDR clipped at the network address": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.0/28"}}},
			size:  239, first: "10.0.0.16",
			in:  []string{"10.0.0.16", "10.0.0.254"},
			out: []string{"10.0.0.0", "10.0.0.1", "10.0.0.15", "10.0.0.255"},
		},
		"exclude a sub-CIDR in the middle": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.64/26"}}},
			size:  190, first: "10.0.0.1",
			in:  []string{"10.0.0.63", "10.0.0.128"},
			out: []string{"10.0.0.64", "10.0.0.100", "10.0.0.127"},
		},
		"exclude outside first/last is clipped": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.10", Last: "10.0.0.20", Exclude: []string{"10.0.0.0/29", "10.0.0.16/28"}}},
			size:  6, first: "10.0.0.10",
			in:  []string{"10.0.0.10", "10.0.0.15"},
			out: []string{"10.0.0.16", "10.0.0.20", "10.0.0.9"},
		},
		"exclude the network and broadcast addresses changes nothing": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.0", "10.0.0.255"}}},
			size:  254, first: "10.0.0.1",
			in:  []string{"10.0.0.1", "10.0.0.254"},
			out: []string{"10.0.0.0", "10.0.0.255"},
		},
		"overlapping and adjacent excludes are merged": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{
				"10.0.0.0/28", "10.0.0.8/29", "10.0.0.16/30", "10.0.0.19", "10.0.0.200", "10.0.0.200", "10.0.0.4/30",
			}}},
			size: 234, first: "10.0.0.20",
			in:  []string{"10.0.0.20", "10.0.0.199", "10.0.0.201"},
			out: []string{"10.0.0.1", "10.0.0.9", "10.0.0.16", "10.0.0.19", "10.0.0.200"},
		},
		"exclude everything but one address": {
			specs: []RangeSpec{{CIDR: "fd00::/120", Exclude: []string{"fd00::/121", "fd00::80/122", "fd00::c0/123", "fd00::e0/124", "fd00::f0/125", "fd00::f8/126", "fd00::fc/127", "fd00::fe"}}},
			size:  1, first: "fd00::ff",
			in:  []string{"fd00::ff"},
			out: []string{"fd00::1", "fd00::fe", "fd00::100"},
		},
		"ipv4 and ipv6 ranges": {
			specs: []RangeSpec{{CIDR: "fd00::/120"}, {CIDR: "10.0.0.0/24"}},
			size:  254 + 255, first: "10.0.0.1",
			in:  []string{"10.0.0.1", "10.0.0.254", "fd00::1", "fd00::ff"},
			out: []string{"10.0.0.0", "10.0.0.255", "fd00::", "fd00::100"},
		},
		"two ipv4 ranges given out of order": {
			specs: []RangeSpec{{CIDR: "10.0.1.0/24"}, {CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.1"}}},
			size:  254 + 253, first: "10.0.0.2",
			in:  []string{"10.0.0.2", "10.0.1.1", "10.0.1.254"},
			out: []string{"10.0.0.1", "10.0.0.255", "10.0.1.0", "10.0.1.255", "10.0.2.1"},
		},
		"adjacent ranges do not overlap": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/31"}, {CIDR: "10.0.0.2/31"}},
			size:  4, first: "10.0.0.0",
			in:  []string{"10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3"},
			out: []string{"10.0.0.4"},
		},
		"same subnet split by first/last": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.128"}, {CIDR: "10.0.0.0/24", Last: "10.0.0.127"}},
			size:  254, first: "10.0.0.1",
			in:  []string{"10.0.0.1", "10.0.0.127", "10.0.0.128", "10.0.0.254"},
			out: []string{"10.0.0.0", "10.0.0.255"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r, err := ParseRanges(tc.specs)
			if err != nil {
				t.Fatalf("ParseRanges: %v", err)
			}
			if got := r.Size(); got != tc.size {
				t.Errorf("Size() = %d, want %d", got, tc.size)
			}
			if got := r.First(); got != netip.MustParseAddr(tc.first) {
				t.Errorf("First() = %s, want %s", got, tc.first)
			}
			for _, a := range tc.in {
				if !r.Contains(netip.MustParseAddr(a)) {
					t.Errorf("Contains(%s) = false, want true", a)
				}
			}
			for _, a := range tc.out {
				if r.Contains(netip.MustParseAddr(a)) {
					t.Errorf("Contains(%s) = true, want false", a)
				}
			}
			if r.Contains(netip.Addr{}) {
				t.Errorf("Contains(invalid address) = true")
			}
		})
	}
}

func TestParseRangesInvalid(t *testing.T) {
	tests := map[string]struct {
		specs  []RangeSpec
		fields []string // exact field paths, in report order
		want   []string // substrings of the message: the fix hints
	}{
		"empty ranges list": {
			specs: nil, fields: []string{"ranges"},
			want: []string{"at least one range is required", "10.0.0.0/24"},
		},
		"gateway outside the cidr": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Gateway: "10.0.1.1"}},
			fields: []string{"ranges[0].gateway"},
			want:   []string{`"10.0.1.1"`, "outside the range's CIDR 10.0.0.0/24", "use an address inside it"},
		},
		"gateway is the network address": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Gateway: "10.0.0.0"}},
			fields: []string{"ranges[0].gateway"},
			want:   []string{"network or broadcast", "between 10.0.0.1 and 10.0.0.254"},
		},
		"gateway of the other family": {
			specs:  []RangeSpec{{CIDR: "fd00::/64", Gateway: "10.0.0.1"}},
			fields: []string{"ranges[0].gateway"},
			want:   []string{"outside the range's CIDR fd00::/64"},
		},
		"gateway not an address": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Gateway: "router"}},
			fields: []string{"ranges[0].gateway"},
			want:   []string{"not a valid IP address"},
		},
		"gateway in mapped form": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Gateway: "::ffff:10.0.0.1"}},
			fields: []string{"ranges[0].gateway"},
			want:   []string{"10.0.0.1"},
		},
		"route without a next hop or gateway": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Routes: []RouteSpec{{Destination: "10.200.0.0/16"}}}},
			fields: []string{"ranges[0].routes[0].via"},
			want:   []string{"no gateway", "give the next hop here"},
		},
		"route next hop outside the cidr": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Routes: []RouteSpec{{Destination: "10.200.0.0/16", Via: "10.9.0.1"}}}},
			fields: []string{"ranges[0].routes[0].via"},
			want:   []string{"outside the range's CIDR 10.0.0.0/24"},
		},
		"route destination of the other family": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", Routes: []RouteSpec{{Destination: "::/0"}}}},
			fields: []string{"ranges[0].routes[0].destination"},
			want:   []string{"not of the family", "range of its own family"},
		},
		"route destination with host bits": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", Routes: []RouteSpec{{Destination: "10.200.0.1/16"}}}},
			fields: []string{"ranges[0].routes[0].destination"},
			want:   []string{"host bits are set", "10.200.0.0/16"},
		},
		"route destination missing": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", Routes: []RouteSpec{{Via: "10.0.0.2"}}}},
			fields: []string{"ranges[0].routes[0].destination"},
			want:   []string{"destination CIDR is required"},
		},
		"route destination repeated": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", Routes: []RouteSpec{
				{Destination: "10.200.0.0/16"}, {Destination: "10.200.0.0/16", Via: "10.0.0.2"}}}},
			fields: []string{"ranges[0].routes[1].destination"},
			want:   []string{"repeats ranges[0].routes[0]"},
		},
		"gateway handed out by another range": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.10", Last: "10.0.0.99", Gateway: "10.0.0.1"}, {CIDR: "10.0.0.0/24", First: "10.0.0.1", Last: "10.0.0.9"}},
			fields: []string{"ranges[0].gateway"},
			want:   []string{`"10.0.0.1"`, "is handed out by ranges[1]", "exclude it there"},
		},
		"next hop handed out by another range": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.1", Last: "10.0.0.9"},
				{CIDR: "10.0.0.0/24", First: "10.0.0.10", Last: "10.0.0.99", Routes: []RouteSpec{{Destination: "0.0.0.0/0", Via: "10.0.0.5"}}}},
			fields: []string{"ranges[1].routes[0].via"},
			want:   []string{"is handed out by ranges[0]"},
		},
		"too many routes": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", Routes: make([]RouteSpec, MaxRoutes+1)}},
			fields: []string{"ranges[0].routes"},
			want:   []string{"at most 32 routes"},
		},
		"empty cidr": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24"}, {CIDR: "  "}},
			fields: []string{"ranges[1].cidr"},
			want:   []string{"a CIDR is required", "fd00::/64"},
		},
		"invalid cidr": {
			specs:  []RangeSpec{{CIDR: "10.0.0/24"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{`"10.0.0/24"`, "not a valid CIDR", "address/length"},
		},
		"ipv4 address without prefix length": {
			specs:  []RangeSpec{{CIDR: "10.0.0.1"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{"no prefix length", "10.0.0.1/32"},
		},
		"ipv6 address without prefix length": {
			specs:  []RangeSpec{{CIDR: "fd00::1"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{"no prefix length", "fd00::1/128"},
		},
		"host bits set": {
			specs:  []RangeSpec{{CIDR: "10.0.0.1/24"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{"host bits are set", "10.0.0.0/24"},
		},
		"ipv6 host bits set": {
			specs:  []RangeSpec{{CIDR: "fd00::1/64"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{"host bits are set", "fd00::/64"},
		},
		"ipv6 typo": {
			specs:  []RangeSpec{{CIDR: "fd00::g/64"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{`"fd00::g/64"`, "not a valid CIDR", "address/length"},
		},
		"zoned prefix": {
			specs:  []RangeSpec{{CIDR: "fe80::%eth0/64"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{"zoned", "drop %eth0", "write fe80::/64"},
		},
		"zoned prefix with host bits": {
			specs:  []RangeSpec{{CIDR: "fe80::1%eth0/64"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{"write fe80::/64 (fe80::1/64 with the host bits cleared)"},
		},
		"ipv4-mapped ipv6 prefix": {
			specs:  []RangeSpec{{CIDR: "::ffff:10.0.0.0/120"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{"IPv4-mapped", "IPv4 CIDR", "write 10.0.0.0/24"},
		},
		"ipv4-mapped host prefix": {
			specs:  []RangeSpec{{CIDR: "::ffff:10.0.0.7/128"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{"write 10.0.0.7/32"},
		},
		"zoned ipv4-mapped prefix": {
			specs:  []RangeSpec{{CIDR: "::ffff:10.0.0.0%eth0/120"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{"drop %eth0", "write 10.0.0.0/24"},
		},
		"ipv4-mapped address without prefix length": {
			specs:  []RangeSpec{{CIDR: "::ffff:10.0.0.7"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{"no prefix length", "write 10.0.0.7/32"},
		},
		"ipv4-mapped first": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", First: "::ffff:10.0.0.5"}},
			fields: []string{"ranges[0].first"},
			want:   []string{`"::ffff:10.0.0.5"`, "IPv4-mapped", "write 10.0.0.5"},
		},
		"ipv4-mapped last": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Last: "::ffff:a00:9"}},
			fields: []string{"ranges[0].last"},
			want:   []string{"write 10.0.0.9"},
		},
		"zoned first": {
			specs:  []RangeSpec{{CIDR: "fe80::/64", First: "fe80::5%eth0"}},
			fields: []string{"ranges[0].first"},
			want:   []string{"drop %eth0", "write fe80::5"},
		},
		"ipv4-mapped first of an ipv6 range": {
			specs:  []RangeSpec{{CIDR: "::/64", First: "::ffff:0:5"}},
			fields: []string{"ranges[0].first"},
			want:   []string{"spelt 0.0.0.5", "never hand out ::ffff:0:0/96"},
		},
		"ipv4-mapped exclusions": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.4", "::ffff:10.0.0.5", "::ffff:10.0.0.16/124"}}},
			fields: []string{"ranges[0].exclude[1]", "ranges[0].exclude[2]"},
			want:   []string{"write 10.0.0.5;", "write 10.0.0.16/28"},
		},
		"ipv4-mapped exclusion of an ipv6 range": {
			specs:  []RangeSpec{{CIDR: "::/64", Exclude: []string{"::ffff:0:0/96", "::ffff:10.0.0.1"}}},
			fields: []string{"ranges[0].exclude[0]", "ranges[0].exclude[1]"},
			want:   []string{"needs no exclusion", "drop it"},
		},
		"zoned exclusions": {
			specs:  []RangeSpec{{CIDR: "fe80::/64", Exclude: []string{"fe80::5%eth0", "fe80::10%eth0/124"}}},
			fields: []string{"ranges[0].exclude[0]", "ranges[0].exclude[1]"},
			want:   []string{"write fe80::5;", "write fe80::10/124"},
		},
		"overlaps across a range in between": {
			// ranges[2] overlaps ranges[0] but not ranges[1], which sorts
			// between them.
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24"}, {CIDR: "10.0.0.16/28"}, {CIDR: "10.0.0.64/28"}},
			fields: []string{"ranges[1].cidr", "ranges[2].cidr"},
			want:   []string{"ranges[1].cidr: invalid value \"10.0.0.16/28\": overlaps ranges[0]", "ranges[2].cidr: invalid value \"10.0.0.64/28\": overlaps ranges[0]"},
		},
		"first outside the cidr": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.1.1"}},
			fields: []string{"ranges[0].first"},
			want:   []string{`"10.0.1.1"`, "outside the range's CIDR 10.0.0.0/24", "inside it"},
		},
		"last outside the cidr": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24"}, {CIDR: "fd00::/120", Last: "fd00::1:1"}},
			fields: []string{"ranges[1].last"},
			want:   []string{"outside the range's CIDR fd00::/120"},
		},
		"first of the other family": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", First: "fd00::1"}},
			fields: []string{"ranges[0].first"},
			want:   []string{"outside the range's CIDR 10.0.0.0/24"},
		},
		"first not an address": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.300"}},
			fields: []string{"ranges[0].first"},
			want:   []string{"not a valid IP address"},
		},
		"first after last": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.20", Last: "10.0.0.10"}},
			fields: []string{"ranges[0].first"},
			want:   []string{"is after last (10.0.0.10)", "swap"},
		},
		"first equal to the network address": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.0"}},
			fields: []string{"ranges[0].first"},
			want:   []string{"network or broadcast", "between 10.0.0.1 and 10.0.0.254"},
		},
		"last equal to the broadcast address": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Last: "10.0.0.255"}},
			fields: []string{"ranges[0].last"},
			want:   []string{"network or broadcast", "between 10.0.0.1 and 10.0.0.254"},
		},
		"ipv6 first equal to the network address": {
			specs:  []RangeSpec{{CIDR: "fd00::/120", First: "fd00::"}},
			fields: []string{"ranges[0].first"},
			want:   []string{"between fd00::1 and fd00::ff"},
		},
		"exclude outside the cidr": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.5", "10.0.0.8/29", "10.0.1.0/28"}}},
			fields: []string{"ranges[0].exclude[2]"},
			want:   []string{`"10.0.1.0/28"`, "outside the range's CIDR 10.0.0.0/24"},
		},
		"exclude wider than the cidr": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.0/16"}}},
			fields: []string{"ranges[0].exclude[0]"},
			want:   []string{"outside the range's CIDR 10.0.0.0/24"},
		},
		"exclude with host bits set": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.1/28"}}},
			fields: []string{"ranges[0].exclude[0]"},
			want:   []string{"host bits are set", "10.0.0.0/28"},
		},
		"exclude not an address": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", Exclude: []string{"10.0.0.1", "bogus"}}},
			fields: []string{"ranges[0].exclude[1]"},
			want:   []string{`"bogus"`, "not a valid CIDR or IP address"},
		},
		"overlapping ranges": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24"}, {CIDR: "10.0.0.128/25"}},
			fields: []string{"ranges[1].cidr"},
			want:   []string{"overlaps ranges[0] (10.0.0.0/24)", "narrow one with first/last"},
		},
		"overlapping ranges given out of order": {
			specs:  []RangeSpec{{CIDR: "fd00::/120", First: "fd00::80"}, {CIDR: "fd00::/120", Last: "fd00::80"}},
			fields: []string{"ranges[0].cidr"},
			want:   []string{"overlaps ranges[1] (fd00::/120)"},
		},
		"no usable address": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/30", Exclude: []string{"10.0.0.1", "10.0.0.2"}}},
			fields: []string{"ranges"},
			want:   []string{"no usable address", "widen a range or remove exclusions"},
		},
		"no usable address in ipv6": {
			specs:  []RangeSpec{{CIDR: "fd00::/120", Exclude: []string{"fd00::/120"}}},
			fields: []string{"ranges"},
			want:   []string{"no usable address"},
		},
		"several errors reported together": {
			specs: []RangeSpec{
				{CIDR: "10.0.0.0/24"},
				{CIDR: "10.0.0/24"},
				{CIDR: "fd00::/64", First: "fd01::1", Last: "fd00::"},
				{CIDR: "10.0.1.1/24", Exclude: []string{"x"}},
			},
			fields: []string{"ranges[1].cidr", "ranges[2].first", "ranges[2].last", "ranges[3].cidr"},
			want:   []string{"address/length", "outside the range's CIDR fd00::/64", "between fd00::1 and", "10.0.1.0/24"},
		},
		"bad first and bad exclude in one range": {
			specs:  []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.0", Exclude: []string{"10.0.2.0"}}},
			fields: []string{"ranges[0].first", "ranges[0].exclude[0]"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r, err := ParseRanges(tc.specs)
			if err == nil {
				t.Fatalf("ParseRanges succeeded (%v, size %d), want an error", r, r.Size())
			}
			if r != nil {
				t.Errorf("ParseRanges returned non-nil Ranges with an error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(err, ErrInvalid) = false for %v", err)
			}
			if got := rtFields(err); !slices.Equal(got, tc.fields) {
				t.Errorf("fields = %q, want %q\nerror: %v", got, tc.fields, err)
			}
			msg := err.Error()
			for _, f := range tc.fields {
				if !strings.Contains(msg, f+": ") {
					t.Errorf("message does not name field %q: %s", f, msg)
				}
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message does not contain %q: %s", w, msg)
				}
			}
		})
	}
}

// TestParseRangesExcludesAtTopOfIPv6 checks exclusions that end at the last
// address of the IPv6 space, where "end + 1" wraps to ::.
func TestParseRangesExcludesAtTopOfIPv6(t *testing.T) {
	const top = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124"
	t.Run("overlapping excludes are merged", func(t *testing.T) {
		r, err := ParseRanges([]RangeSpec{{CIDR: top, Exclude: []string{
			"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff8/125", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
		}}})
		if err != nil {
			t.Fatal(err)
		}
		// fff1..fff7 remain.
		if got := r.Size(); got != 7 {
			t.Errorf("Size() = %d, want 7", got)
		}
		if got := len(rtWalk(t, r, 100)); got != 7 {
			t.Errorf("Next walk yields %d addresses, want 7", got)
		}
	})
	t.Run("whole range excluded twice", func(t *testing.T) {
		r, err := ParseRanges([]RangeSpec{{CIDR: top, Exclude: []string{top, top}}})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(fmt.Sprint(err), "no usable address") {
			var size uint64
			var first netip.Addr
			if r != nil {
				size, first = r.Size(), r.First()
			}
			t.Errorf("ParseRanges = (size %d, first %v), %v; want ErrInvalid naming no usable address", size, first, err)
		}
	})
}

// TestParseRangesSaturatedSizeExcludes checks exclusions in spans whose
// address count reaches the largest uint64.
func TestParseRangesSaturatedSizeExcludes(t *testing.T) {
	t.Run("/64 fully excluded", func(t *testing.T) {
		r, err := ParseRanges([]RangeSpec{{CIDR: "fd00::/64", Exclude: []string{"fd00::/64"}}})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(fmt.Sprint(err), "no usable address") {
			var size uint64
			var first netip.Addr
			if r != nil {
				size, first = r.Size(), r.First()
			}
			t.Errorf("ParseRanges = (size %d, first %v), %v; want ErrInvalid naming no usable address", size, first, err)
		}
	})
	t.Run("/63 fully excluded", func(t *testing.T) {
		r, err := ParseRanges([]RangeSpec{{CIDR: "fd00::/63", Exclude: []string{"fd00::/64", "fd00:0:0:1::/64"}}})
		if err == nil {
			t.Errorf("ParseRanges succeeded with Size() = %d, First() = %v; want ErrInvalid (no usable address)", r.Size(), r.First())
		}
	})
	t.Run("/64 minus one address", func(t *testing.T) {
		r := mustRanges(t, RangeSpec{CIDR: "fd00::/64", Exclude: []string{"fd00::5"}})
		// 2^64 addresses, minus the network address and the exclusion:
		// representable, so not saturated.
		if got, want := r.Size(), uint64(math.MaxUint64-1); got != want {
			t.Errorf("Size() = %d, want %d", got, want)
		}
	})
	t.Run("/56 excluded down to a /120", func(t *testing.T) {
		// Everything but fd00::/120 excluded, written as the complement.
		ex := []string{"fd00:0:0:1::/64", "fd00:0:0:2::/63", "fd00:0:0:4::/62", "fd00:0:0:8::/61", "fd00:0:0:10::/60",
			"fd00:0:0:20::/59", "fd00:0:0:40::/58", "fd00:0:0:80::/57"}
		for b := 120; b > 64; b-- {
			// The sibling of fd00::/b inside fd00::/(b-1).
			p := netip.PrefixFrom(fromU128(u128{hi: 0xfd00 << 48, lo: 1 << (128 - b)}, false), b)
			ex = append(ex, p.String())
		}
		r := mustRanges(t, RangeSpec{CIDR: "fd00::/56", Exclude: ex})
		if got := r.Size(); got != 255 {
			t.Errorf("Size() = %d, want 255", got)
		}
		if !r.Contains(netip.MustParseAddr("fd00::ff")) || r.Contains(netip.MustParseAddr("fd00::100")) {
			t.Errorf("Contains is wrong around the end of fd00::/120")
		}
	})
}

// TestParseRangesOverlapAcrossFamilyOrder checks that overlap detection does
// not depend on how IPv4 and IPv6 ranges interleave when sorted.
func TestParseRangesOverlapAcrossFamilyOrder(t *testing.T) {
	// ::1:0:0:0/120 lies inside ::/64. The IPv4 range sorts between them
	// when addresses are compared as IPv4-mapped 128-bit integers.
	r, err := ParseRanges([]RangeSpec{{CIDR: "::/64"}, {CIDR: "10.0.0.0/30"}, {CIDR: "::1:0:0:0/120"}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(fmt.Sprint(err), "overlaps") {
		t.Errorf("ParseRanges = %v, %v; want ErrInvalid naming the overlap of ranges[0] and ranges[2]", r, err)
	}
}

func TestRangesNext(t *testing.T) {
	tests := map[string]struct {
		specs []RangeSpec
		want  []string
	}{
		"excludes": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/28", Exclude: []string{"10.0.0.1", "10.0.0.4/30", "10.0.0.14", "10.0.0.6"}}},
			want:  []string{"10.0.0.2", "10.0.0.3", "10.0.0.8", "10.0.0.9", "10.0.0.10", "10.0.0.11", "10.0.0.12", "10.0.0.13"},
		},
		"adjacent excludes": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/28", Exclude: []string{"10.0.0.3", "10.0.0.4/31", "10.0.0.6", "10.0.0.8/29"}}},
			want:  []string{"10.0.0.1", "10.0.0.2", "10.0.0.7"},
		},
		"first/last with excludes": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/24", First: "10.0.0.100", Last: "10.0.0.105", Exclude: []string{"10.0.0.100", "10.0.0.102/31"}}},
			want:  []string{"10.0.0.101", "10.0.0.104", "10.0.0.105"},
		},
		"two ranges": {
			specs: []RangeSpec{{CIDR: "10.0.0.8/30"}, {CIDR: "10.0.0.0/30", Exclude: []string{"10.0.0.2"}}},
			want:  []string{"10.0.0.1", "10.0.0.9", "10.0.0.10"},
		},
		"second range fully excluded": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/30"}, {CIDR: "10.0.0.4/30", Exclude: []string{"10.0.0.4/30"}}, {CIDR: "10.0.0.8/31"}},
			want:  []string{"10.0.0.1", "10.0.0.2", "10.0.0.8", "10.0.0.9"},
		},
		"both families": {
			specs: []RangeSpec{{CIDR: "fd00::/126", Exclude: []string{"fd00::2"}}, {CIDR: "10.0.0.0/30"}},
			want:  []string{"10.0.0.1", "10.0.0.2", "fd00::1", "fd00::3"},
		},
		"both families, last ipv4 range excluded at its end": {
			specs: []RangeSpec{{CIDR: "10.0.0.0/29", Exclude: []string{"10.0.0.4/30"}}, {CIDR: "fd00::/127"}},
			want:  []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::", "fd00::1"},
		},
		"top of the ipv4 space": {
			specs: []RangeSpec{{CIDR: "255.255.255.252/30"}, {CIDR: "fd00::/126"}},
			want:  []string{"255.255.255.253", "255.255.255.254", "fd00::1", "fd00::2", "fd00::3"},
		},
		"top of the ipv4 space, /31": {
			specs: []RangeSpec{{CIDR: "255.255.255.254/31"}, {CIDR: "fd00::/127"}},
			want:  []string{"255.255.255.254", "255.255.255.255", "fd00::", "fd00::1"},
		},
		"top of the ipv4 space, last excluded": {
			specs: []RangeSpec{{CIDR: "255.255.255.254/31", Exclude: []string{"255.255.255.255"}}, {CIDR: "fd00::/127"}},
			want:  []string{"255.255.255.254", "fd00::", "fd00::1"},
		},
		"bottom of the ipv4 space": {
			specs: []RangeSpec{{CIDR: "0.0.0.0/30"}},
			want:  []string{"0.0.0.1", "0.0.0.2"},
		},
		"top of the ipv6 space": {
			specs: []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124", Exclude: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff4/126"}}},
			want: []string{
				"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff2", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff3",
				"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff8", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff9", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffa",
				"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffb", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffc", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffd",
				"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
			},
		},
		"top of the ipv6 space, end excluded": {
			specs: []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124", Exclude: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff4/126", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff8/125"}}},
			want:  []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff2", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff3"},
		},
		"top of the ipv6 space, end excluded, then a lower range": {
			specs: []RangeSpec{{CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffc/126", Exclude: []string{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127"}}, {CIDR: "fd00::/127"}, {CIDR: "10.0.0.0/31"}},
			want:  []string{"10.0.0.0", "10.0.0.1", "fd00::", "fd00::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffd"},
		},
		"ipv6 range below the ipv4-mapped space": {
			// ::/126 sorts before every IPv4 range as a 128-bit integer;
			// IPv4 ranges must still come first.
			specs: []RangeSpec{{CIDR: "10.0.0.0/30"}, {CIDR: "::/126"}},
			want:  []string{"10.0.0.1", "10.0.0.2", "::1", "::2", "::3"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := mustRanges(t, tc.specs...)
			want := rtAddrs(tc.want...)
			if got := rtBrute(r, tc.specs); !slices.Equal(got, want) {
				t.Errorf("addresses with Contains = %v, want %v", got, want)
			}
			got := rtWalk(t, r, len(want)+16)
			if !slices.Equal(got, want) {
				t.Errorf("Next walk = %v, want %v", got, want)
			}
			if r.Size() != uint64(len(want)) {
				t.Errorf("Size() = %d, want %d", r.Size(), len(want))
			}
			if f := r.First(); f != want[0] {
				t.Errorf("First() = %v, want %v", f, want[0])
			}
			// Next of a usable address is itself; Next of an unusable one
			// is the next usable address.
			for i, a := range want {
				if x, ok := r.Next(a); !ok || x != a {
					t.Errorf("Next(%v) = %v, %v; want itself", a, x, ok)
				}
				if i > 0 && want[i-1].Next() != a && want[i-1].Next().IsValid() && want[i-1].Is4() == a.Is4() {
					if x, ok := r.Next(want[i-1].Next()); !ok || x != a {
						t.Errorf("Next(%v) = %v, %v; want %v", want[i-1].Next(), x, ok, a)
					}
				}
			}
			last := want[len(want)-1]
			if n := last.Next(); n.IsValid() {
				if x, ok := r.Next(n); ok {
					t.Errorf("Next(%v) past the last address = %v, true; want false", n, x)
				}
			}
		})
	}
}

func TestRangesNextFrom(t *testing.T) {
	r := mustRanges(t,
		RangeSpec{CIDR: "10.0.0.0/29", Exclude: []string{"10.0.0.2/31"}},
		RangeSpec{CIDR: "10.0.1.0/30"},
		RangeSpec{CIDR: "fd00::/126"},
		RangeSpec{CIDR: "fd01::/126", First: "fd01::2"},
	)
	tests := map[string]struct {
		from string
		want string // "" for none
	}{
		"unspecified ipv4":             {"0.0.0.0", "10.0.0.1"},
		"network address":              {"10.0.0.0", "10.0.0.1"},
		"usable address":               {"10.0.0.1", "10.0.0.1"},
		"inside an exclusion":          {"10.0.0.2", "10.0.0.4"},
		"end of an exclusion":          {"10.0.0.3", "10.0.0.4"},
		"broadcast address":            {"10.0.0.7", "10.0.1.1"},
		"between ranges":               {"10.0.0.200", "10.0.1.1"},
		"after every ipv4 range":       {"10.0.1.3", "fd00::1"},
		"top of ipv4":                  {"255.255.255.255", "fd00::1"},
		"unspecified ipv6":             {"::", "fd00::1"},
		"ipv6 between ranges":          {"fd00::4", "fd01::2"},
		"ipv6 below first":             {"fd01::1", "fd01::2"},
		"ipv6 last":                    {"fd01::3", "fd01::3"},
		"ipv6 after every range":       {"fd01::4", ""},
		"top of ipv6":                  {"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", ""},
		"ipv6 below every ipv4 as int": {"::1", "fd00::1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := r.Next(netip.MustParseAddr(tc.from))
			if tc.want == "" {
				if ok {
					t.Fatalf("Next(%s) = %v, true; want false", tc.from, got)
				}
				return
			}
			if !ok || got != netip.MustParseAddr(tc.want) {
				t.Fatalf("Next(%s) = %v, %v; want %s, true", tc.from, got, ok, tc.want)
			}
		})
	}
}

// rtRandomSpec returns a random valid small range, usually IPv4 inside
// 10.0.0.0/22 so that ranges of one pool sometimes overlap.
func rtRandomSpec(rng *rand.Rand) RangeSpec {
	var p netip.Prefix
	if rng.IntN(6) == 0 {
		bits := 122 + rng.IntN(7) // /122../128
		var b [16]byte
		b[0], b[1], b[13], b[14], b[15] = 0xfd, 0x00, byte(rng.IntN(2)), byte(rng.IntN(4)), byte(rng.IntN(256))
		p = netip.PrefixFrom(netip.AddrFrom16(b), bits).Masked()
	} else {
		bits := 26 + rng.IntN(5) // /26../30
		if rng.IntN(10) == 0 {
			bits = 31 + rng.IntN(2)
		}
		p = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(4)), byte(rng.IntN(256))}), bits).Masked()
	}
	return rtRandomSpecIn(rng, p, 4)
}

// rtRandomSpecIn returns a random valid range of subnet p: maybe narrowed
// by first and last, with up to maxExcludes-1 exclusions, single addresses
// or subnets.
func rtRandomSpecIn(rng *rand.Rand, p netip.Prefix, maxExcludes int) RangeSpec {
	all := rtEnum(p)
	lo, hi := 0, len(all)-1
	if len(all) >= 4 {
		lo++
		if p.Addr().Is4() {
			hi--
		}
	}
	s := RangeSpec{CIDR: p.String()}
	first := lo
	if rng.IntN(3) == 0 {
		first = lo + rng.IntN(hi-lo+1)
		s.First = all[first].String()
	}
	if rng.IntN(3) == 0 {
		s.Last = all[first+rng.IntN(hi-first+1)].String()
	}
	for range rng.IntN(maxExcludes) {
		if rng.IntN(2) == 0 {
			s.Exclude = append(s.Exclude, all[rng.IntN(len(all))].String())
			continue
		}
		bits := p.Addr().BitLen()
		if n := bits - p.Bits(); n > 0 {
			bits = p.Bits() + 1 + rng.IntN(n)
		}
		x, _ := all[rng.IntN(len(all))].Prefix(bits)
		s.Exclude = append(s.Exclude, x.String())
	}
	return s
}

// rtBounds returns the lowest and highest address of a valid spec after
// first/last narrowing, exclusions ignored.
func rtBounds(s RangeSpec) (lo, hi netip.Addr) {
	all := rtEnum(netip.MustParsePrefix(s.CIDR))
	lo, hi = all[0], all[len(all)-1]
	if len(all) >= 4 {
		lo = all[1]
		if lo.Is4() {
			hi = all[len(all)-2]
		}
	}
	if s.First != "" {
		lo = netip.MustParseAddr(s.First)
	}
	if s.Last != "" {
		hi = netip.MustParseAddr(s.Last)
	}
	return lo, hi
}

// TestRangesNextRandomPools checks Size, Contains and Next against an
// independent model on random small pools.
func TestRangesNextRandomPools(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 0x7a9e5))
	valid := 0
	for i := range 500 {
		specs := make([]RangeSpec, 1+rng.IntN(3))
		for j := range specs {
			specs[j] = rtRandomSpec(rng)
		}
		want := rtModel(specs)
		// Ranges overlap when their [first, last] intervals intersect.
		overlap := false
		for j := range specs {
			for k := range j {
				jlo, jhi := rtBounds(specs[j])
				klo, khi := rtBounds(specs[k])
				if jlo.Is4() == klo.Is4() && !jhi.Less(klo) && !khi.Less(jlo) {
					overlap = true
				}
			}
		}
		r, err := ParseRanges(specs)
		switch {
		case err != nil && !errors.Is(err, ErrInvalid):
			t.Fatalf("pool %d %+v: error does not match ErrInvalid: %v", i, specs, err)
		case err != nil && !overlap && len(want) > 0:
			t.Fatalf("pool %d %+v: rejected: %v", i, specs, err)
		case err != nil && overlap && !strings.Contains(err.Error(), "overlaps"):
			t.Fatalf("pool %d %+v: overlapping ranges rejected without naming the overlap: %v", i, specs, err)
		case err != nil && !overlap && !strings.Contains(err.Error(), "no usable address"):
			t.Fatalf("pool %d %+v: empty pool rejected with %v", i, specs, err)
		case err == nil && overlap:
			t.Fatalf("pool %d %+v: overlapping ranges accepted", i, specs)
		case err == nil && len(want) == 0:
			t.Fatalf("pool %d %+v: accepted with no usable address (Size %d)", i, specs, r.Size())
		case err != nil:
			continue
		}
		valid++
		if got := r.Size(); got != uint64(len(want)) {
			t.Fatalf("pool %d %+v: Size() = %d, want %d", i, specs, got, len(want))
		}
		if got := rtBrute(r, specs); !slices.Equal(got, want) {
			t.Fatalf("pool %d %+v: addresses with Contains = %v, want %v", i, specs, got, want)
		}
		if got := rtWalk(t, r, len(want)+1); !slices.Equal(got, want) {
			t.Fatalf("pool %d %+v: Next walk = %v, want %v", i, specs, got, want)
		}
		if got := r.First(); got != want[0] {
			t.Fatalf("pool %d %+v: First() = %v, want %v", i, specs, got, want[0])
		}
	}
	if valid < 250 {
		t.Fatalf("only %d of 500 random pools were valid; the generator needs fixing", valid)
	}
}

func FuzzParseRanges(f *testing.F) {
	f.Add("10.0.0.0/24", "", "", "")
	f.Add("10.0.0.0/24", "10.0.0.10", "10.0.0.20", "10.0.0.12,10.0.0.16/30")
	f.Add("10.0.0.0/30", "", "", "10.0.0.1,10.0.0.2")
	f.Add("10.0.0.0/31", "10.0.0.1", "", "")
	f.Add("10.0.0.7/32", "", "", "")
	f.Add("255.255.255.252/30", "", "255.255.255.254", "255.255.255.253")
	f.Add("0.0.0.0/0", "", "", "10.0.0.0/8")
	f.Add("fd00::/64", "", "", "fd00::1")
	f.Add("fd00::/120", "fd00::10", "fd00::ff", "fd00::20/124,fd00::ff")
	f.Add("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff0/124", "", "", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fff8/125")
	f.Add("ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127", "", "", "")
	f.Add("::/0", "", "", "::/1")
	f.Add("10.0.0/24", "", "", "")
	f.Add("10.0.0.1", "", "", "")
	f.Add("10.0.0.1/24", "", "", "")
	f.Add("fd00::g/64", "", "", "")
	f.Add("10.0.0.0/24", "10.0.0.20", "10.0.0.10", "10.0.1.0/28")
	f.Add("::ffff:10.0.0.0/120", "", "", "")
	f.Add("::ffff:10.0.0.0%eth0/120", "", "", "")
	f.Add("10.0.0.0/24", "::ffff:10.0.0.5", "::ffff:a00:fe", "::ffff:10.0.0.8/126,10.0.0.9")
	f.Add("fe80::%eth0/64", "", "", "")
	f.Add("fe80::/64", "fe80::1%eth0", "fe80::ff%1", "fe80::8%eth0/125,fe80::2%lo")
	f.Add("::/64", "::fffe:ffff:fff0", "::1:0:0:f", "::ffff:0:0/96,::ffff:10.0.0.1")
	f.Add("::/0", "", "", "::ffff:0:0/95")
	f.Add("::ffff:0:0/95", "", "", "")
	f.Fuzz(func(t *testing.T, cidr, first, last, exclude string) {
		spec := RangeSpec{CIDR: cidr, First: first, Last: last}
		if exclude != "" {
			spec.Exclude = strings.Split(exclude, ",")
		}
		r, err := ParseRanges([]RangeSpec{spec})
		if err != nil {
			if r != nil {
				t.Fatalf("non-nil Ranges with error %v", err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not match ErrInvalid: %v", err)
			}
			fields := rtFields(err)
			if len(fields) == 0 {
				t.Fatalf("error is not FieldErrors: %v", err)
			}
			for _, f := range fields {
				// "ranges" alone is the pool-level "no usable address".
				if f != "ranges" && !strings.HasPrefix(f, "ranges[0].") {
					t.Fatalf("field %q does not name ranges[0]: %v", f, err)
				}
			}
			if msg := err.Error(); !strings.Contains(msg, "ranges[0]") && !strings.Contains(msg, "no usable address") {
				t.Fatalf("message names neither ranges[0] nor the empty pool: %s", msg)
			}
			return
		}
		size := r.Size()
		if size == 0 {
			t.Fatalf("accepted with Size() = 0")
		}
		a := r.First()
		if !a.IsValid() || !r.Contains(a) {
			t.Fatalf("Size() = %d but First() = %v is not contained", size, a)
		}
		if size <= 4096 {
			walk := rtWalk(t, r, int(size)+1)
			if uint64(len(walk)) != size {
				t.Fatalf("Next walk yields %d addresses, Size() = %d", len(walk), size)
			}
			if walk[0] != a {
				t.Fatalf("Next walk starts at %v, First() = %v", walk[0], a)
			}
			for _, x := range walk {
				if !r.Contains(x) {
					t.Fatalf("Next yields %v, which is not contained", x)
				}
				if x.Is4In6() {
					t.Fatalf("Next yields the IPv4-mapped %v", x)
				}
			}
			if got := ivExpand(r.Intervals()); !slices.Equal(got, walk) {
				t.Fatalf("Intervals() = %v, want the Next walk %v", r.Intervals(), walk)
			}
		}
		if s := r.String(); len(s) > 2*stringBudget {
			t.Fatalf("String() is %d bytes long", len(s))
		}
	})
}

// TestRangesSubnet: each usable address gets its range's subnet, gateway
// and routes (a route without via goes through the gateway); the gateway
// and every next hop are never handed out, and an address no range hands
// out has no subnet.
func TestRangesSubnet(t *testing.T) {
	r, err := ParseRanges([]RangeSpec{
		{CIDR: "10.0.0.0/24", First: "10.0.0.1", Last: "10.0.0.9", Gateway: "10.0.0.1",
			Routes: []RouteSpec{{Destination: "10.200.0.0/16"}, {Destination: "0.0.0.0/0", Via: "10.0.0.9"}}},
		{CIDR: "fd00::/120", Gateway: "fd00::1"},
		{CIDR: "10.1.0.0/30"},
	})
	if err != nil {
		t.Fatal(err)
	}
	v4 := Subnet{
		Prefix:  netip.MustParsePrefix("10.0.0.0/24"),
		Gateway: netip.MustParseAddr("10.0.0.1"),
		Routes: []Route{
			{Destination: netip.MustParsePrefix("10.200.0.0/16"), Via: netip.MustParseAddr("10.0.0.1")},
			{Destination: netip.MustParsePrefix("0.0.0.0/0"), Via: netip.MustParseAddr("10.0.0.9")},
		},
	}
	v6 := Subnet{Prefix: netip.MustParsePrefix("fd00::/120"), Gateway: netip.MustParseAddr("fd00::1")}
	plain := Subnet{Prefix: netip.MustParsePrefix("10.1.0.0/30")}
	tests := map[string]struct {
		addr string
		want Subnet
		ok   bool
	}{
		"first usable v4":             {"10.0.0.2", v4, true},
		"last usable v4":              {"10.0.0.8", v4, true},
		"the gateway":                 {"10.0.0.1", Subnet{}, false},
		"a route's next hop":          {"10.0.0.9", Subnet{}, false},
		"outside first/last":          {"10.0.0.10", Subnet{}, false},
		"v6":                          {"fd00::2", v6, true},
		"v6 gateway":                  {"fd00::1", Subnet{}, false},
		"range without gateway":       {"10.1.0.1", plain, true},
		"mapped spelling of a v4 one": {"::ffff:10.0.0.3", v4, true},
		"outside every range":         {"192.168.0.1", Subnet{}, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := netip.MustParseAddr(tc.addr)
			got, ok := r.Subnet(a)
			if ok != tc.ok || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Subnet(%s) = %+v, %v; want %+v, %v", a, got, ok, tc.want, tc.ok)
			}
			if ok != r.Contains(a) {
				t.Errorf("Subnet(%s) found %v, but Contains says %v", a, ok, r.Contains(a))
			}
		})
	}
	for a, want := range map[string]bool{"10.0.0.1": true, "10.0.0.9": true, "fd00::1": true, "10.0.0.2": false, "10.1.0.1": false, "::ffff:10.0.0.1": true} {
		if got := r.Router(netip.MustParseAddr(a)); got != want {
			t.Errorf("Router(%s) = %v, want %v", a, got, want)
		}
	}
	if got, want := r.Size(), uint64(7+254+2); got != want {
		t.Errorf("Size() = %d, want %d: the gateways and next hops are not handed out", got, want)
	}
}

// TestRangesFamily: each family's ranges keep their addresses, size and
// subnets; a family the ranges lack is nil.
func TestRangesFamily(t *testing.T) {
	r := mustRanges(t, RangeSpec{CIDR: "fd00::/125", Gateway: "fd00::1"}, RangeSpec{CIDR: "10.0.0.0/29", Gateway: "10.0.0.1"}, RangeSpec{CIDR: "10.1.0.0/30"})
	v4, v6 := r.Family(true), r.Family(false)
	if v4 == nil || v6 == nil {
		t.Fatalf("Family: %v, %v", v4, v6)
	}
	if v4.Size()+v6.Size() != r.Size() || v4.Size() != 5+2 || v6.Size() != 6 {
		t.Errorf("sizes %d + %d, want 7 + 6 = %d", v4.Size(), v6.Size(), r.Size())
	}
	for _, a := range []string{"10.0.0.2", "10.1.0.2", "fd00::2"} {
		x := netip.MustParseAddr(a)
		in4, in6 := v4.Contains(x), v6.Contains(x)
		if in4 != x.Is4() || in6 == x.Is4() {
			t.Errorf("%s: in the IPv4 ranges %v, in the IPv6 ones %v", a, in4, in6)
		}
		want, _ := r.Subnet(x)
		fam := v6
		if x.Is4() {
			fam = v4
		}
		if got, ok := fam.Subnet(x); !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: subnet %+v, %v; want %+v", a, got, ok, want)
		}
	}
	if only4 := mustRanges(t, RangeSpec{CIDR: "10.0.0.0/29"}); only4.Family(false) != nil {
		t.Errorf("the IPv6 ranges of an IPv4 pool: %v, want nil", only4.Family(false))
	}
}
