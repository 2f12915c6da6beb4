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
	// Gateway, optional, is the subnet's router: an address inside CIDR,
	// never handed out, that a guest sends off-subnet traffic to.
	Gateway string
	// Routes, optional, are further routes a guest on the subnet needs.
	Routes []RouteSpec
}

// RouteSpec is one route of a range as a user writes it.
type RouteSpec struct {
	// Destination is a CIDR of the range's family, such as 10.200.0.0/16
	// or 0.0.0.0/0.
	Destination string
	// Via is the next hop: an address inside the range's CIDR that no VM
	// is given. Empty means the range's gateway.
	Via string
}

// Subnet is what a guest needs besides its address to configure its
// interface: the subnet holding the address, its gateway and its routes.
type Subnet struct {
	// Prefix is the range's CIDR.
	Prefix netip.Prefix
	// Gateway is the range's gateway; invalid (the zero Addr) when it has
	// none.
	Gateway netip.Addr
	// Routes are the range's routes, each with its next hop (the gateway
	// when the spec left it out).
	Routes []Route
}

// Route is one route of a Subnet.
type Route struct {
	Destination netip.Prefix
	Via         netip.Addr
}

// MaxRoutes bounds the routes of one range.
const MaxRoutes = 32

// span is one validated range while ParseRanges checks it against the
// others: the addresses [first, last] of a subnet, whose runs between
// exclusions are ivs[start:end] of the parse.
type span struct {
	index       int // in the specs, for error messages and Interval.Range
	cidr        netip.Prefix
	first, last u128
	is4         bool
	start, end  int
	subnet      Subnet
	// hops are the range's routers (gateway and next hops), with the
	// fields that name them.
	hops []hop
}

// hop is a router address of a range and the field naming it.
type hop struct {
	addr netip.Addr
	path Path
}

// Ranges is a validated, immutable set of address ranges. It is never
// materialised: it keeps the runs of usable addresses between exclusions,
// so a /64 costs as little as a /30.
type Ranges struct {
	ivs  []ival // sorted, IPv4 first; disjoint
	size uint64
	// subnets holds each range's Subnet, by its index in the specs
	// (ival.rng).
	subnets []Subnet
	// routers are the ranges' gateways and next hops.
	routers []netip.Addr
}

// mapped4 is ::ffff:0:0/96, the IPv4-mapped block of IPv6. No IPv6 range
// hands out an address in it: its canonical spelling is the IPv4 address,
// which an IPv4 pool may hold.
var mapped4 = [2]u128{{lo: 0xffff << 32}, {lo: 0xffff<<32 | 0xffffffff}}

// ParseRanges validates specs and returns them as Ranges. Every problem is
// reported, each naming its field (ranges[i].cidr and so on) and the fix.
func ParseRanges(specs []RangeSpec) (*Ranges, error) {
	var errs FieldErrors
	root := Path{}.Child("ranges")
	if len(specs) == 0 {
		errs = append(errs, &FieldError{Path: root, Type: ErrorTypeRequired,
			Detail: "at least one range is required, for example {cidr: 10.0.0.0/24}"})
		return nil, errs
	}
	// One array for every range's runs, in the order of specs, and one
	// scratch list of exclusions: a pool at the CRD's limits has 16384 of
	// them, and writing fresh memory was a third of the parse
	// (BenchmarkParseRangesAtLimits).
	n, most := 0, 0
	for _, s := range specs {
		n, most = n+len(s.Exclude)+1, max(most, len(s.Exclude))
	}
	ivs := make([]ival, 0, n)
	scratch := make([][2]u128, 0, most+1)
	var spans []span
	subnets := make([]Subnet, len(specs))
	for i, s := range specs {
		if sp, exclude, ok := parseSpan(root.Index(i), i, s, scratch[:0], &errs); ok {
			sp.start = len(ivs)
			ivs = sp.appendIntervals(ivs, exclude)
			sp.end = len(ivs)
			spans = append(spans, sp)
			subnets[i] = sp.subnet
		}
	}
	// IPv4 ranges first, then IPv6, each in address order: as 128-bit
	// numbers a low IPv6 range would otherwise sort among the IPv4 ones.
	slices.SortFunc(spans, func(a, b span) int {
		return pos{v6: !a.is4, v: a.first}.cmp(pos{v6: !b.is4, v: b.first})
	})
	// Compare each range with the one reaching furthest before it, not only
	// its neighbour: [0, 100] overlaps [30, 40] across [10, 20].
	reach := -1
	for i, sp := range spans {
		if reach >= 0 && spans[reach].is4 == sp.is4 && spans[reach].last.cmp(sp.first) >= 0 {
			o := spans[reach]
			errs = append(errs, &FieldError{Path: root.Index(sp.index).Child("cidr"), Value: sp.cidr.String(),
				Detail: fmt.Sprintf("overlaps %s (%s); ranges of one pool must not overlap: narrow one with first/last or remove it",
					root.Index(o.index), o.cidr)})
		}
		if reach < 0 || spans[reach].is4 != sp.is4 || sp.last.cmp(spans[reach].last) > 0 {
			reach = i
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	r := &Ranges{ivs: ivs, subnets: subnets}
	if !slices.IsSortedFunc(spans, func(a, b span) int { return a.index - b.index }) {
		r.ivs = make([]ival, 0, len(ivs))
		for _, sp := range spans {
			r.ivs = append(r.ivs, ivs[sp.start:sp.end]...)
		}
	}
	for _, iv := range r.ivs {
		r.size = addSat(r.size, iv.size())
	}
	// A router is never handed out: not by its own range (it is excluded
	// there), nor by another range of the pool over the same subnet.
	for _, sp := range spans {
		for _, h := range sp.hops {
			r.routers = append(r.routers, h.addr)
			if k, ok := r.rangeOf(h.addr); ok {
				errs = append(errs, &FieldError{Path: h.path, Value: h.addr.String(),
					Detail: fmt.Sprintf("is handed out by %s: a router must not be given to a VM; exclude it there", root.Index(k))})
			}
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	if r.size == 0 {
		return nil, FieldErrors{{Path: root, Detail: "the pool has no usable address: every address is excluded or reserved (network/broadcast); widen a range or remove exclusions"}}
	}
	return r, nil
}

// appendIntervals appends the runs of usable addresses of sp minus its
// sorted, merged exclusions, in order.
func (sp *span) appendIntervals(ivs []ival, exclude [][2]u128) []ival {
	cur := sp.first
	for _, x := range exclude {
		if x[0].cmp(cur) > 0 {
			ivs = append(ivs, ival{lo: cur, hi: x[0].sub(u128{lo: 1}), v6: !sp.is4, rng: sp.index})
		}
		if x[1] == sp.last {
			return ivs // excluded to the end; x[1] + 1 may wrap at the top of IPv6
		}
		cur = x[1].add(1)
	}
	return append(ivs, ival{lo: cur, hi: sp.last, v6: !sp.is4, rng: sp.index})
}

// parseSpan validates one range, and returns it with its exclusions
// sorted, merged and clipped to it, in the memory of scratch.
func parseSpan(path Path, index int, s RangeSpec, scratch [][2]u128, errs *FieldErrors) (span, [][2]u128, bool) {
	fail := func(p Path, value, format string, args ...any) {
		*errs = append(*errs, &FieldError{Path: p, Value: value, Detail: fmt.Sprintf(format, args...)})
	}
	cidrPath := path.Child("cidr")
	raw := strings.TrimSpace(s.CIDR)
	if raw == "" {
		*errs = append(*errs, &FieldError{Path: cidrPath, Type: ErrorTypeRequired,
			Detail: "a CIDR is required, for example 10.0.0.0/24 or fd00::/64"})
		return span{}, nil, false
	}
	p, respell, err := parseCanonicalPrefix(raw)
	switch {
	case err != nil:
		hint := "write it as address/length, for example 10.0.0.0/24 or fd00::/64"
		if a, aerr := netip.ParseAddr(raw); aerr == nil {
			a = Canonical(a)
			hint = fmt.Sprintf("it has no prefix length; for a single address write %s/%d", a, a.BitLen())
		}
		fail(cidrPath, raw, "not a valid CIDR (%v); %s", err, hint)
		return span{}, nil, false
	case respell != "":
		fail(cidrPath, raw, "%s", respell)
		return span{}, nil, false
	case p.Masked() != p:
		fail(cidrPath, raw, "host bits are set; the network is %s", p.Masked())
		return span{}, nil, false
	}
	sp := span{index: index, cidr: p, is4: p.Addr().Is4()}
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
			fail(path.Child(field), v, "not a valid IP address (%v)", err)
		case respellAddr(a, sp.is4, false) != "":
			fail(path.Child(field), v, "%s", respellAddr(a, sp.is4, false))
		case !p.Contains(a):
			fail(path.Child(field), v, "outside the range's CIDR %s; use an address inside it", p)
		case toU128(a).cmp(lo) < 0 || toU128(a).cmp(hi) > 0:
			fail(path.Child(field), v, "is the network or broadcast address of %s, which is never handed out; use an address between %s and %s",
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
		fail(path.Child("first"), s.First, "is after last (%s); swap them", fromU128(sp.last, sp.is4))
		ok = false
	}
	exclude := scratch
	for j, x := range s.Exclude {
		// Built only for an error: a pool at the CRD's limits has 16384
		// exclusions.
		xfail := func(format string, args ...any) {
			fail(path.Child("exclude").Index(j), x, format, args...)
		}
		xs := strings.TrimSpace(x)
		var xp netip.Prefix
		if strings.Contains(xs, "/") {
			xp, respell, err = parseCanonicalPrefix(xs)
			if err == nil && !sp.is4 && xp.Addr().Is4In6() && xp.Bits() >= 96 {
				respell = "needs no exclusion: IPv6 ranges never hand out the IPv4-mapped addresses ::ffff:0:0/96, whose one spelling is IPv4; drop it"
			}
			if err == nil && respell == "" && xp.Masked() != xp {
				xfail("host bits are set; the network is %s", xp.Masked())
				ok = false
				continue
			}
		} else {
			var a netip.Addr
			a, err = netip.ParseAddr(xs)
			xp, respell = netip.PrefixFrom(a, a.BitLen()), respellAddr(a, sp.is4, true)
		}
		switch {
		case err != nil:
			xfail("not a valid CIDR or IP address (%v)", err)
			ok = false
			continue
		case respell != "":
			xfail("%s", respell)
			ok = false
			continue
		case !p.Contains(xp.Addr()) || xp.Bits() < p.Bits():
			xfail("outside the range's CIDR %s; exclusions must lie inside the range they belong to", p)
			ok = false
			continue
		}
		exclude = append(exclude, [2]u128{toU128(xp.Addr()), toU128(lastAddr(xp))})
	}
	// The gateway and the routes' next hops are routers: never handed out.
	sp.subnet.Prefix = p
	hops, good := parseSubnet(path, s, &sp, lo, hi, fail)
	ok = ok && good
	for _, h := range hops {
		exclude = append(exclude, [2]u128{toU128(h.addr), toU128(h.addr)})
	}
	sp.hops = hops
	if !ok {
		return span{}, nil, false
	}
	if !sp.is4 {
		exclude = append(exclude, mapped4)
	}
	// Clip to [first, last], then sort and merge overlapping or adjacent
	// exclusions; compare without adding one to the upper bound, which
	// wraps at the top of IPv6.
	clipped := exclude[:0]
	for _, x := range exclude {
		x[0], x[1] = maxU128(x[0], sp.first), minU128(x[1], sp.last)
		if x[0].cmp(x[1]) <= 0 {
			clipped = append(clipped, x)
		}
	}
	slices.SortFunc(clipped, func(a, b [2]u128) int { return a[0].cmp(b[0]) })
	merged := clipped[:0]
	for _, x := range clipped {
		if n := len(merged); n > 0 && (x[0].cmp(merged[n-1][1]) <= 0 || x[0] == merged[n-1][1].add(1)) {
			merged[n-1][1] = maxU128(merged[n-1][1], x[1])
			continue
		}
		merged = append(merged, x)
	}
	return sp, merged, true
}

// parseCanonicalPrefix parses a CIDR. A zoned or IPv4-mapped spelling
// parses, but comes back with respell saying what to write instead: one
// address has one spelling in vmipam, so that no second one can make two
// pools, or a pool and an exclusion, disagree about it.
func parseCanonicalPrefix(s string) (p netip.Prefix, respell string, err error) {
	p, err = netip.ParsePrefix(s)
	if err != nil {
		// netip refuses zones in prefixes; say which prefix was meant.
		addr, bits, _ := strings.Cut(s, "/")
		host, zone, zoned := strings.Cut(addr, "%")
		q, qerr := netip.ParsePrefix(host + "/" + bits)
		if !zoned || qerr != nil {
			return p, "", err
		}
		if c, ok := canonicalPrefix(q); ok {
			q = c
		}
		return q, fmt.Sprintf("zoned prefixes are not supported (drop %%%s); write %s", zone, prefixHint(q)), nil
	}
	if c, ok := canonicalPrefix(p); ok && c != p {
		return p, fmt.Sprintf("an IPv4-mapped IPv6 prefix is the IPv4 CIDR spelt differently; write %s", prefixHint(c)), nil
	}
	return p, "", nil
}

// prefixHint writes p as the user should, host bits cleared.
func prefixHint(p netip.Prefix) string {
	if p.Masked() != p {
		return fmt.Sprintf("%s (%s with the host bits cleared)", p.Masked(), p)
	}
	return p.String()
}

// canonicalPrefix returns p with an IPv4-mapped address as the IPv4 prefix
// it spells, and false when p reaches out of the mapped block (a shorter
// prefix, whose host bits are then set).
func canonicalPrefix(p netip.Prefix) (netip.Prefix, bool) {
	if !p.Addr().Is4In6() {
		return p, true
	}
	if p.Bits() < 96 {
		return p, false
	}
	return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96), true
}

// respellAddr says why a, written in a range of IPv4 (in4) or IPv6, is
// refused and what to write instead, or returns "" when a is already in the
// one spelling vmipam compares.
func respellAddr(a netip.Addr, in4, exclude bool) string {
	switch c := Canonical(a); {
	case a.Is4In6() && !in4 && exclude:
		return "needs no exclusion: IPv6 ranges never hand out the IPv4-mapped addresses ::ffff:0:0/96, whose one spelling is IPv4; drop it"
	case a.Is4In6() && !in4:
		return fmt.Sprintf("an IPv4-mapped address, spelt %s in vmipam; IPv6 ranges never hand out ::ffff:0:0/96: use an address outside it", c)
	case a.Zone() != "":
		return fmt.Sprintf("zoned addresses are not supported (drop %%%s); write %s", a.Zone(), c)
	case a.Is4In6():
		return fmt.Sprintf("an IPv4-mapped IPv6 address is the IPv4 address spelt differently; write %s", c)
	}
	return ""
}

// Size is the number of usable addresses, saturated at the largest uint64.
func (r *Ranges) Size() uint64 { return r.size }

// Contains reports whether a is a usable address of the ranges. It
// compares a canonically: ::ffff:10.0.0.5 is 10.0.0.5, and a zone is
// ignored.
func (r *Ranges) Contains(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	at := posOf(Canonical(a))
	k := r.search(at)
	return k < len(r.ivs) && r.ivs[k].lop().cmp(at) <= 0
}

// Next returns the lowest usable address at or after a, in range order
// (IPv4 ranges before IPv6), and false when there is none. It reads a
// canonically, as Contains does. An invalid a, such as the Next of the
// highest IPv6 address, has none after it.
func (r *Ranges) Next(a netip.Addr) (netip.Addr, bool) {
	if !a.IsValid() {
		return netip.Addr{}, false
	}
	return r.from(posOf(Canonical(a)))
}

// After returns the lowest usable address after a, in range order, and
// false when there is none: the step of a walk over the usable addresses.
// Unlike Next(a.Next()) it goes on from the top of IPv4 into the IPv6
// ranges, and never steps onto an IPv4-mapped address, which Next would
// read as IPv4.
func (r *Ranges) After(a netip.Addr) (netip.Addr, bool) {
	if !a.IsValid() {
		return netip.Addr{}, false
	}
	at := posOf(Canonical(a))
	switch top := (u128{^uint64(0), ^uint64(0)}); {
	case at.v6 && at.v == top:
		return netip.Addr{}, false
	case !at.v6 && at.v == u128{lo: 1<<32 - 1}:
		at = pos{v6: true}
	default:
		at.v = at.v.add(1)
	}
	return r.from(at)
}

// from returns the lowest usable address at or after at.
func (r *Ranges) from(at pos) (netip.Addr, bool) {
	k := r.search(at)
	if k == len(r.ivs) {
		return netip.Addr{}, false
	}
	if iv := &r.ivs[k]; iv.lop().cmp(at) > 0 {
		at = iv.lop()
	}
	return at.addr(), true
}

// search returns the index of the first run that ends at or after at, or
// len(r.ivs) when none does.
func (r *Ranges) search(at pos) int {
	k, _ := slices.BinarySearchFunc(r.ivs, at, func(iv ival, t pos) int { return iv.hip().cmp(t) })
	return k
}

// First returns the lowest usable address.
func (r *Ranges) First() netip.Addr {
	if len(r.ivs) == 0 {
		return netip.Addr{}
	}
	return r.ivs[0].lop().addr()
}

// Bounds on String, which ends up in error messages: the API server and
// kubectl print them whole.
const (
	stringMaxExcludes = 8
	stringBudget      = 1024
)

// String lists the usable addresses range by range, each with its
// exclusions, as error messages show them:
// "10.0.0.1-10.0.0.254 except 10.0.0.5, 10.0.0.8-10.0.0.11; fd00::1-fd00::ff".
// A range shows its first eight exclusions, and the list stops after about
// a kilobyte, each saying how many more there are.
func (r *Ranges) String() string {
	var b strings.Builder
	for i := 0; i < len(r.ivs); {
		j := i + 1
		for j < len(r.ivs) && r.ivs[j].rng == r.ivs[i].rng {
			j++
		}
		if b.Len() > 0 {
			if b.Len() >= stringBudget {
				fmt.Fprintf(&b, "; and %d more ranges", r.countRanges(i))
				break
			}
			b.WriteString("; ")
		}
		b.WriteString(runString(r.ivs[i].lop().addr(), r.ivs[j-1].hip().addr()))
		for k := i; k < j-1; k++ {
			if k-i == stringMaxExcludes {
				fmt.Fprintf(&b, ", and %d more", j-1-k)
				break
			}
			if k == i {
				b.WriteString(" except ")
			} else {
				b.WriteString(", ")
			}
			v6 := r.ivs[k].v6
			b.WriteString(runString(pos{v6, r.ivs[k].hi.add(1)}.addr(), pos{v6, r.ivs[k+1].lo.sub(u128{lo: 1})}.addr()))
		}
		i = j
	}
	return b.String()
}

// countRanges returns the number of ranges with usable addresses from the
// run at index i on.
func (r *Ranges) countRanges(i int) int {
	n := 0
	for k := i; k < len(r.ivs); k++ {
		if k == i || r.ivs[k].rng != r.ivs[k-1].rng {
			n++
		}
	}
	return n
}

func maxU128(a, b u128) u128 {
	if a.cmp(b) >= 0 {
		return a
	}
	return b
}

func minU128(a, b u128) u128 {
	if a.cmp(b) <= 0 {
		return a
	}
	return b
}

// parseSubnet validates the gateway and the routes of range s, whose
// hosts are [lo, hi] of sp.cidr, into sp.subnet, and returns the next hops
// (the gateway and every route's via), which the range must not hand out.
func parseSubnet(path Path, s RangeSpec, sp *span, lo, hi u128, fail func(p Path, value, format string, args ...any)) ([]hop, bool) {
	p := sp.cidr
	ok := true
	// parseHop parses a router address: a host of the range's subnet.
	parseHop := func(fp Path, v string) (netip.Addr, bool) {
		a, err := netip.ParseAddr(strings.TrimSpace(v))
		switch {
		case err != nil:
			fail(fp, v, "not a valid IP address (%v)", err)
		case respellAddr(a, sp.is4, false) != "":
			fail(fp, v, "%s", respellAddr(a, sp.is4, false))
		case !p.Contains(a):
			fail(fp, v, "outside the range's CIDR %s: a guest reaches only routers on its own subnet; use an address inside it", p)
		case toU128(a).cmp(lo) < 0 || toU128(a).cmp(hi) > 0:
			fail(fp, v, "is the network or broadcast address of %s, which no router has; use an address between %s and %s",
				p, fromU128(lo, sp.is4), fromU128(hi, sp.is4))
		default:
			return a, true
		}
		return netip.Addr{}, false
	}
	var hops []hop
	if s.Gateway != "" {
		if g, good := parseHop(path.Child("gateway"), s.Gateway); good {
			sp.subnet.Gateway = g
			hops = append(hops, hop{g, path.Child("gateway")})
		} else {
			ok = false
		}
	}
	routes := path.Child("routes")
	if len(s.Routes) > MaxRoutes {
		fail(routes, fmt.Sprint(len(s.Routes)), "a range has at most %d routes; summarise them into shorter prefixes", MaxRoutes)
		return hops, false
	}
	seen := make(map[netip.Prefix]int, len(s.Routes))
	for j, r := range s.Routes {
		rp := routes.Index(j)
		raw := strings.TrimSpace(r.Destination)
		d, respell, err := parseCanonicalPrefix(raw)
		switch {
		case raw == "":
			fail(rp.Child("destination"), raw, "a destination CIDR is required, for example 10.200.0.0/16, or 0.0.0.0/0 for a default route")
			ok = false
			continue
		case err != nil:
			fail(rp.Child("destination"), raw, "not a valid CIDR (%v); write it as address/length, for example 10.200.0.0/16", err)
			ok = false
			continue
		case respell != "":
			fail(rp.Child("destination"), raw, "%s", respell)
			ok = false
			continue
		case d.Masked() != d:
			fail(rp.Child("destination"), raw, "host bits are set; the network is %s", d.Masked())
			ok = false
			continue
		case d.Addr().Is4() != sp.is4:
			fail(rp.Child("destination"), raw, "is not of the family of the range's CIDR %s; put it in a range of its own family", p)
			ok = false
			continue
		}
		if k, dup := seen[d]; dup {
			fail(rp.Child("destination"), raw, "repeats %s; give each destination one route", routes.Index(k))
			ok = false
			continue
		}
		seen[d] = j
		var via netip.Addr
		switch {
		case r.Via != "":
			v, good := parseHop(rp.Child("via"), r.Via)
			if !good {
				ok = false
				continue
			}
			via = v
			hops = append(hops, hop{v, rp.Child("via")})
		case s.Gateway == "":
			fail(rp.Child("via"), "", "the range has no gateway to route through; give the next hop here, or a gateway to the range")
			ok = false
			continue
		default:
			via = sp.subnet.Gateway
		}
		sp.subnet.Routes = append(sp.subnet.Routes, Route{Destination: d, Via: via})
	}
	return hops, ok
}

// Subnet returns the Subnet of the range holding a, and false when a is
// not a usable address of the ranges.
func (r *Ranges) Subnet(a netip.Addr) (Subnet, bool) {
	if !a.IsValid() {
		return Subnet{}, false
	}
	at := posOf(Canonical(a))
	k := r.search(at)
	if k >= len(r.ivs) || r.ivs[k].lop().cmp(at) > 0 {
		return Subnet{}, false
	}
	return r.subnets[r.ivs[k].rng], true
}

// Router reports whether a is the gateway or a route's next hop of one of
// the ranges: an address that is never handed out.
func (r *Ranges) Router(a netip.Addr) bool {
	return slices.Contains(r.routers, Canonical(a))
}

// Routers returns the ranges' gateways and next hops, which no pool may
// hand out.
func (r *Ranges) Routers() []netip.Addr { return slices.Clone(r.routers) }

// rangeOf returns the index in the specs of the range that hands out a.
func (r *Ranges) rangeOf(a netip.Addr) (int, bool) {
	at := posOf(Canonical(a))
	k := r.search(at)
	if k >= len(r.ivs) || r.ivs[k].lop().cmp(at) > 0 {
		return 0, false
	}
	return r.ivs[k].rng, true
}

// Family returns the ranges of one address family (IPv4 when is4, else
// IPv6), with their subnets, and nil when there is none.
func (r *Ranges) Family(is4 bool) *Ranges {
	out := &Ranges{subnets: r.subnets}
	for _, a := range r.routers {
		if a.Is4() == is4 {
			out.routers = append(out.routers, a)
		}
	}
	for _, iv := range r.ivs {
		if iv.v6 != is4 {
			out.ivs = append(out.ivs, iv)
			out.size = addSat(out.size, iv.size())
		}
	}
	if len(out.ivs) == 0 {
		return nil
	}
	return out
}
