package ipam

import (
	"iter"
	"net/netip"
	"slices"
)

// Interval is a run of consecutive usable addresses [First, Last] of one
// family.
type Interval struct {
	First, Last netip.Addr
	// Range is the index, in the specs given to ParseRanges, of the range
	// the addresses belong to.
	Range int
}

// String writes the interval as 10.0.0.8-10.0.0.11, or 10.0.0.5 alone.
func (iv Interval) String() string { return runString(iv.First, iv.Last) }

// Overlap is a run of addresses [First, Last] that two Ranges share.
type Overlap struct {
	First, Last netip.Addr
	// Range is the index of the range of the first Ranges the addresses
	// belong to, OtherRange that of the second (each in the specs given to
	// ParseRanges).
	Range, OtherRange int
}

// String writes the shared addresses as Interval.String does.
func (o Overlap) String() string { return runString(o.First, o.Last) }

func runString(first, last netip.Addr) string {
	if first == last {
		return first.String()
	}
	return first.String() + "-" + last.String()
}

// Intervals returns the usable addresses as sorted, disjoint intervals,
// exclusions removed: IPv4 before IPv6, each family in address order, as
// Next walks them. Adjacent addresses of two ranges stay in two intervals,
// so that each names its range.
func (r *Ranges) Intervals() []Interval {
	out := make([]Interval, len(r.ivs))
	for i, iv := range r.ivs {
		out[i] = iv.interval()
	}
	return out
}

// Overlaps yields, in address order, the runs of addresses that r and
// other both hand out. Exclusions count: two pools may split one subnet by
// excluding each other's part. A nil Ranges is empty.
//
// It costs O(n + m) in the number of runs (ranges and exclusions) of both,
// and less when one is much smaller than the other (O(n log m)); never
// anything in the number of addresses.
func (r *Ranges) Overlaps(other *Ranges) iter.Seq[Overlap] {
	return func(yield func(Overlap) bool) {
		a, b := r.runs(), other.runs()
		for i, j := 0, 0; i < len(a) && j < len(b); {
			x, y := &a[i], &b[j]
			switch {
			case x.hip().cmp(y.lop()) < 0:
				i = gallop(a, i+1, y.lop())
			case y.hip().cmp(x.lop()) < 0:
				j = gallop(b, j+1, x.lop())
			default:
				// Neither ends before the other starts, so both are of
				// one family.
				lo, hi := pos{x.v6, maxU128(x.lo, y.lo)}, pos{x.v6, minU128(x.hi, y.hi)}
				if !yield(Overlap{First: lo.addr(), Last: hi.addr(), Range: x.rng, OtherRange: y.rng}) {
					return
				}
				switch c := x.hi.cmp(y.hi); {
				case c < 0:
					i++
				case c > 0:
					j++
				default:
					i, j = i+1, j+1
				}
			}
		}
	}
}

// Difference yields, in address order, the runs of addresses r hands out
// and other does not (r − other), each tagged with its range in r: what an
// update from r to other takes out of a pool. A nil Ranges is empty. It
// costs what Overlaps does.
func (r *Ranges) Difference(other *Ranges) iter.Seq[Interval] {
	return func(yield func(Interval) bool) {
		a, b := r.runs(), other.runs()
		j := 0
		for _, x := range a {
			// Runs of other ending before x end before every later run of r
			// too: skip them for good.
			j = gallop(b, j, x.lop())
			cur, open := x.lo, true
			for k := j; k < len(b) && b[k].lop().cmp(x.hip()) <= 0; k++ {
				y := &b[k] // overlaps x, so of its family
				if y.lo.cmp(cur) > 0 {
					// y.lo > cur, so y.lo - 1 cannot wrap.
					if !yield(ival{lo: cur, hi: y.lo.sub(u128{lo: 1}), v6: x.v6, rng: x.rng}.interval()) {
						return
					}
				}
				if y.hi.cmp(x.hi) >= 0 {
					open = false // may reach into the next run of r: keep j
					break
				}
				cur = y.hi.add(1) // y.hi < x.hi, so no wrap either
			}
			if open && !yield(ival{lo: cur, hi: x.hi, v6: x.v6, rng: x.rng}.interval()) {
				return
			}
		}
	}
}

func (r *Ranges) runs() []ival {
	if r == nil {
		return nil
	}
	return r.ivs
}

// pos is an address in the order of Ranges: IPv4 before IPv6, then by
// value. As a bare 128-bit number a low IPv6 address (::1) would sort
// among the IPv4 ones.
type pos struct {
	v6 bool
	v  u128
}

func posOf(a netip.Addr) pos { return pos{v6: !a.Is4(), v: toU128(a)} }

func (p pos) addr() netip.Addr { return fromU128(p.v, !p.v6) }

func (p pos) cmp(q pos) int {
	if p.v6 != q.v6 {
		if q.v6 {
			return -1
		}
		return 1
	}
	return p.v.cmp(q.v)
}

// ival is a run of usable addresses [lo, hi] of one family, from the range
// at index rng of the specs.
type ival struct {
	lo, hi u128
	v6     bool
	rng    int
}

func (iv ival) lop() pos { return pos{iv.v6, iv.lo} }
func (iv ival) hip() pos { return pos{iv.v6, iv.hi} }

func (iv ival) interval() Interval {
	return Interval{First: iv.lop().addr(), Last: iv.hip().addr(), Range: iv.rng}
}

// size is the number of addresses in iv, saturated at the largest uint64.
func (iv ival) size() uint64 {
	n := iv.hi.sub(iv.lo)
	if n.hi != 0 || n.lo == ^uint64(0) {
		return ^uint64(0)
	}
	return n.lo + 1
}

// gallop returns the index of the first run at or after from that ends at
// or after t, or len(ivs). It probes from, from+1, from+3, from+7... and
// then bisects, so a jump of d runs costs O(log d): a merge of two
// interleaved lists stays linear, a small list against a large one costs
// logarithms of the large one.
func gallop(ivs []ival, from int, t pos) int {
	lo, hi := from, from
	for step := 1; hi < len(ivs) && ivs[hi].hip().cmp(t) < 0; step *= 2 {
		lo, hi = hi+1, hi+step
	}
	hi = min(hi, len(ivs))
	k, _ := slices.BinarySearchFunc(ivs[lo:hi], t, func(iv ival, t pos) int { return iv.hip().cmp(t) })
	return lo + k
}
