package ipam

import (
	"fmt"
	"testing"
)

// benchSpecsAtLimits returns a pool at the IPPool CRD's limits: 64 ranges
// of 256 exclusions each, half IPv4 /21s and half IPv6 /64s, starting at
// the index-th /16 (IPv4) and /48 (IPv6), so that pools of different
// index are disjoint. shift moves every exclusion by that many addresses,
// so that two pools of one index exclude different parts.
func benchSpecsAtLimits(index, shift int) []RangeSpec {
	specs := make([]RangeSpec, 0, 64)
	for i := range 32 {
		s := RangeSpec{CIDR: fmt.Sprintf("10.%d.%d.0/21", index, 8*i)}
		for j := range 256 {
			// One address in every 8, and every 64th a /30: both kinds.
			if j%64 == 0 {
				s.Exclude = append(s.Exclude, fmt.Sprintf("10.%d.%d.%d/30", index, 8*i+j/32, (j%32)*8+shift%2*4))
				continue
			}
			s.Exclude = append(s.Exclude, fmt.Sprintf("10.%d.%d.%d", index, 8*i+j/32, (j%32)*8+2+shift%4))
		}
		specs = append(specs, s)
	}
	for i := range 32 {
		s := RangeSpec{CIDR: fmt.Sprintf("fd00:%x:%x::/64", index, i)}
		for j := range 256 {
			s.Exclude = append(s.Exclude, fmt.Sprintf("fd00:%x:%x::%x:%x/120", index, i, j, 0x100*shift))
		}
		specs = append(specs, s)
	}
	return specs
}

// BenchmarkParseRangesAtLimits parses a pool at the CRD's limits (64 ranges
// × 256 exclusions), as the IPPool webhook does on every create and update.
func BenchmarkParseRangesAtLimits(b *testing.B) {
	specs := benchSpecsAtLimits(1, 0)
	for b.Loop() {
		if _, err := ParseRanges(specs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/pool")
}

// BenchmarkRangesOverlapsAtLimits checks two pools at the CRD's limits that
// split every range of one subnet: the worst case of the merge, a run of
// each every few addresses.
func BenchmarkRangesOverlapsAtLimits(b *testing.B) {
	x, y := mustRanges(b, benchSpecsAtLimits(1, 0)...), mustRanges(b, benchSpecsAtLimits(1, 1)...)
	n := 0
	for b.Loop() {
		n = 0
		for range x.Overlaps(y) {
			n++
		}
	}
	b.ReportMetric(float64(n), "overlaps")
}

// BenchmarkRangesDifferenceAtLimits is the update warning's computation
// between two pools at the CRD's limits.
func BenchmarkRangesDifferenceAtLimits(b *testing.B) {
	x, y := mustRanges(b, benchSpecsAtLimits(1, 0)...), mustRanges(b, benchSpecsAtLimits(1, 1)...)
	n := 0
	for b.Loop() {
		n = 0
		for range x.Difference(y) {
			n++
		}
	}
	b.ReportMetric(float64(n), "runs")
}

// BenchmarkRangesString is the "usable: ..." part of an out-of-range
// message for a pool at the CRD's limits.
func BenchmarkRangesString(b *testing.B) {
	r := mustRanges(b, benchSpecsAtLimits(1, 0)...)
	for b.Loop() {
		_ = r.String()
	}
}
