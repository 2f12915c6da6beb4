package ipam

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// RangeSpec is one range of a pool as a user writes it.
type RangeSpec struct {
	// CIDR is the subnet, for example "10.0.0.0/16" or "fd00::/64".
	CIDR string
	// First and Last optionally narrow the range to [First, Last] inside CIDR.
	First, Last string
	// Exclude lists CIDRs or single addresses inside CIDR never handed out.
	Exclude []string
}

// span is one validated range: the usable addresses [first, last] of a
// subnet minus sorted, non-overlapping exclusions.
type span struct {
	path        string // where the user wrote it, for error messages
	cidr        netip.Prefix
	first, last u128
	is4         bool
	exclude     [][2]u128 // sorted, merged, clipped to [first, last]
	size        uint64
}

// Ranges is a validated, immutable set of address ranges. It is never
// materialised: a /64 costs as little as a /30.
type Ranges struct {
	spans []span // sorted by first address, non-overlapping
	size  uint64
}

// ParseRanges validates specs and returns them as Ranges. Every problem is
// reported, each naming its field ("ranges[i].cidr" and so on) and the fix.
func ParseRanges(specs []RangeSpec) (*Ranges, error) {
	var errs FieldErrors
	fail := func(field, value, format string, args ...any) {
		errs = append(errs, &FieldError{Path: legacyPath(field), Value: value, Detail: fmt.Sprintf(format, args...)})
	}
	if len(specs) == 0 {
		fail("ranges", "", "at least one range is required, for example {cidr: 10.0.0.0/24}")
		return nil, errs
	}
	var spans []span
	for i, s := range specs {
		if sp, ok := parseSpan(fmt.Sprintf("ranges[%d]", i), s, fail); ok {
			spans = append(spans, sp)
		}
	}
	// IPv4 ranges first, then IPv6, each in address order: as 128-bit
	// numbers a low IPv6 range would otherwise sort among the IPv4 ones.
	slices.SortFunc(spans, func(a, b span) int {
		if a.is4 != b.is4 {
			if a.is4 {
				return -1
			}
			return 1
		}
		return a.first.cmp(b.first)
	})
	r := &Ranges{spans: spans}
	for i, sp := range spans {
		if i > 0 && spans[i-1].last.cmp(sp.first) >= 0 && spans[i-1].is4 == sp.is4 {
			fail(sp.path+".cidr", sp.cidr.String(), "overlaps %s (%s); ranges of one pool must not overlap: narrow one with first/last or remove it",
				spans[i-1].path, spans[i-1].cidr)
		}
		r.size = addSat(r.size, sp.size)
	}
	if len(errs) == 0 && r.size == 0 {
		fail("ranges", "", "the pool has no usable address: every address is excluded or reserved (network/broadcast); widen a range or remove exclusions")
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return r, nil
}

func parseSpan(path string, s RangeSpec, fail func(field, value, format string, args ...any)) (span, bool) {
	raw := strings.TrimSpace(s.CIDR)
	if raw == "" {
		fail(path+".cidr", "", "a CIDR is required, for example 10.0.0.0/24 or fd00::/64")
		return span{}, false
	}
	p, err := netip.ParsePrefix(raw)
	if err != nil {
		hint := "write it as address/length, for example 10.0.0.0/24 or fd00::/64"
		if a, aerr := netip.ParseAddr(raw); aerr == nil {
			hint = fmt.Sprintf("it has no prefix length; for a single address write %s/%d", a, a.BitLen())
		}
		fail(path+".cidr", raw, "not a valid CIDR (%v); %s", err, hint)
		return span{}, false
	}
	if p.Addr().Zone() != "" {
		fail(path+".cidr", raw, "zoned addresses are not supported; drop the %%%s suffix", p.Addr().Zone())
		return span{}, false
	}
	if p.Addr().Is4In6() {
		fail(path+".cidr", raw, "IPv4-mapped IPv6 prefixes are not supported; write the IPv4 CIDR instead")
		return span{}, false
	}
	if p.Masked() != p {
		fail(path+".cidr", raw, "host bits are set; the network is %s", p.Masked())
		return span{}, false
	}
	sp := span{path: path, cidr: p, is4: p.Addr().Is4()}
	// The network address, and in IPv4 the broadcast address, are never
	// handed out, except in point-to-point /31 (/127) and host /32 (/128)
	// subnets where every address is a host.
	lo, hi := toU128(p.Addr()), toU128(lastAddr(p))
	if addrWidth(p.Addr())-p.Bits() >= 2 {
		lo = lo.add(1)
		if sp.is4 {
			hi = hi.sub(u128{lo: 1})
		}
	}
	sp.first, sp.last = lo, hi
	ok := true
	bound := func(field, v string) (u128, bool) {
		a, err := netip.ParseAddr(strings.TrimSpace(v))
		switch {
		case err != nil:
			fail(path+"."+field, v, "not a valid IP address (%v)", err)
		case !p.Contains(a):
			fail(path+"."+field, v, "outside the range's CIDR %s; use an address inside it", p)
		case toU128(a).cmp(lo) < 0 || toU128(a).cmp(hi) > 0:
			fail(path+"."+field, v, "is the network or broadcast address of %s, which is never handed out; use an address between %s and %s",
				p, fromU128(lo, sp.is4), fromU128(hi, sp.is4))
		default:
			return toU128(a), true
		}
		return u128{}, false
	}
	if s.First != "" {
		v, good := bound("first", s.First)
		ok = ok && good
		if good {
			sp.first = v
		}
	}
	if s.Last != "" {
		v, good := bound("last", s.Last)
		ok = ok && good
		if good {
			sp.last = v
		}
	}
	if ok && sp.first.cmp(sp.last) > 0 {
		fail(path+".first", s.First, "is after last (%s); swap them", fromU128(sp.last, sp.is4))
		ok = false
	}
	for j, x := range s.Exclude {
		field := fmt.Sprintf("%s.exclude[%d]", path, j)
		xs := strings.TrimSpace(x)
		var xp netip.Prefix
		if strings.Contains(xs, "/") {
			xp, err = netip.ParsePrefix(xs)
			if err == nil && xp.Masked() != xp {
				fail(field, x, "host bits are set; the network is %s", xp.Masked())
				ok = false
				continue
			}
		} else {
			var a netip.Addr
			a, err = netip.ParseAddr(xs)
			xp = netip.PrefixFrom(a, a.BitLen())
		}
		if err != nil {
			fail(field, x, "not a valid CIDR or IP address (%v)", err)
			ok = false
			continue
		}
		if !p.Contains(xp.Addr()) || xp.Bits() < p.Bits() {
			fail(field, x, "outside the range's CIDR %s; exclusions must lie inside the range they belong to", p)
			ok = false
			continue
		}
		xlo, xhi := toU128(xp.Addr()), toU128(lastAddr(xp))
		if xlo.cmp(sp.first) < 0 {
			xlo = sp.first
		}
		if xhi.cmp(sp.last) > 0 {
			xhi = sp.last
		}
		if xlo.cmp(xhi) <= 0 {
			sp.exclude = append(sp.exclude, [2]u128{xlo, xhi})
		}
	}
	if !ok {
		return span{}, false
	}
	slices.SortFunc(sp.exclude, func(a, b [2]u128) int { return a[0].cmp(b[0]) })
	merged := sp.exclude[:0]
	for _, x := range sp.exclude {
		// Merge overlapping or adjacent exclusions; compare without adding
		// one to the upper bound, which wraps at the top of IPv6.
		if n := len(merged); n > 0 && (x[0].cmp(merged[n-1][1]) <= 0 || x[0] == merged[n-1][1].add(1)) {
			if x[1].cmp(merged[n-1][1]) > 0 {
				merged[n-1][1] = x[1]
			}
			continue
		}
		merged = append(merged, x)
	}
	sp.exclude = merged
	// Count in 128 bits, saturating only at the end: a /64 alone holds
	// 2^64-1 usable addresses, and its exclusions must still count.
	n := sp.last.sub(sp.first).add(1)
	for _, x := range sp.exclude {
		n = n.sub(x[1].sub(x[0]).add(1))
	}
	sp.size = n.lo
	if n.hi != 0 {
		sp.size = ^uint64(0)
	}
	return sp, true
}

// Size is the number of usable addresses, saturated at the largest uint64.
func (r *Ranges) Size() uint64 { return r.size }

// Contains reports whether a is a usable address of the ranges.
func (r *Ranges) Contains(a netip.Addr) bool {
	if !a.IsValid() || a.Zone() != "" {
		return false
	}
	a = a.Unmap()
	v := toU128(a)
	for i := range r.spans {
		sp := &r.spans[i]
		if sp.is4 != a.Is4() || v.cmp(sp.first) < 0 || v.cmp(sp.last) > 0 {
			continue
		}
		j, found := slices.BinarySearchFunc(sp.exclude, v, func(x [2]u128, t u128) int { return x[0].cmp(t) })
		if found {
			return false
		}
		return j == 0 || sp.exclude[j-1][1].cmp(v) < 0
	}
	return false
}

// Next returns the lowest usable address at or after a, in range order
// (IPv4 ranges before IPv6), and false when there is none. An invalid a,
// such as the Next of the highest IPv6 address, has none after it.
func (r *Ranges) Next(a netip.Addr) (netip.Addr, bool) {
	if !a.IsValid() {
		return netip.Addr{}, false
	}
	a = a.Unmap()
	v, is4 := toU128(a), a.Is4()
	for i := range r.spans {
		sp := &r.spans[i]
		if sp.is4 != is4 {
			if is4 && !sp.is4 {
				// Past every IPv4 range: continue at the first IPv6 one.
				v, is4 = sp.first, false
			} else {
				continue
			}
		}
		if v.cmp(sp.last) > 0 {
			continue
		}
		if v.cmp(sp.first) < 0 {
			v = sp.first
		}
		for _, x := range sp.exclude {
			if v.cmp(x[0]) >= 0 && v.cmp(x[1]) <= 0 {
				v = x[1].add(1)
			}
		}
		if v.cmp(sp.last) > 0 || v == (u128{}) && sp.first != (u128{}) {
			// Excluded to the end of the span (or wrapped past the
			// top of the address space): look in the next one.
			continue
		}
		return fromU128(v, sp.is4), true
	}
	return netip.Addr{}, false
}

// First returns the lowest usable address.
func (r *Ranges) First() netip.Addr {
	a, _ := r.Next(netip.IPv4Unspecified())
	return a
}

// String lists the ranges in the form used in error messages.
func (r *Ranges) String() string {
	parts := make([]string, len(r.spans))
	for i, sp := range r.spans {
		parts[i] = fmt.Sprintf("%s-%s", fromU128(sp.first, sp.is4), fromU128(sp.last, sp.is4))
	}
	return strings.Join(parts, ", ")
}

// legacyPath reads "ranges[1].exclude[0]" into a Path. Temporary: the
// parser should build typed paths directly.
func legacyPath(s string) Path {
	var p Path
	for _, seg := range strings.Split(s, ".") {
		name, rest, ok := strings.Cut(seg, "[")
		p = p.Child(name)
		if ok {
			var i int
			fmt.Sscanf(rest, "%d]", &i)
			p = p.Index(i)
		}
	}
	return p
}
