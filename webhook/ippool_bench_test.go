package webhook

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
)

// ippoolAtLimits returns a pool at the IPPool CRD's limits: 64 ranges of
// 256 exclusions, 32 IPv4 /21s in 10.<index>.0.0/16 and 32 IPv6 /64s in
// fd00:<index>::/48. shift moves every exclusion, so that an update from
// shift 0 to 1 takes thousands of runs out of the pool.
func ippoolAtLimits(name string, index, shift int) vmipamv1.IPPool {
	var ranges []vmipamv1.IPRange
	for i := range 32 {
		r := vmipamv1.IPRange{CIDR: fmt.Sprintf("10.%d.%d.0/21", index, 8*i)}
		for j := range 256 {
			// One address in every 8, and every 64th a /30.
			if j%64 == 0 {
				r.Exclude = append(r.Exclude, fmt.Sprintf("10.%d.%d.%d/30", index, 8*i+j/32, (j%32)*8+shift%2*4))
				continue
			}
			r.Exclude = append(r.Exclude, fmt.Sprintf("10.%d.%d.%d", index, 8*i+j/32, (j%32)*8+2+shift%4))
		}
		ranges = append(ranges, r)
	}
	for i := range 32 {
		r := vmipamv1.IPRange{CIDR: fmt.Sprintf("fd00:%x:%x::/64", index, i)}
		for j := range 256 {
			r.Exclude = append(r.Exclude, fmt.Sprintf("fd00:%x:%x::%x:%x/120", index, i, j, 0x100*shift))
		}
		ranges = append(ranges, r)
	}
	return ippoolTestPool(name, ranges...)
}

// ippoolModerate returns a pool of four ranges of 16 exclusions, in
// 10.<index>.0.0/16 and fd00:<index>::/48.
func ippoolModerate(name string, index int) vmipamv1.IPPool {
	var ranges []vmipamv1.IPRange
	for i := range 2 {
		r := vmipamv1.IPRange{CIDR: fmt.Sprintf("10.%d.%d.0/24", index, i)}
		s := vmipamv1.IPRange{CIDR: fmt.Sprintf("fd00:%x:%x::/64", index, i)}
		for j := range 16 {
			r.Exclude = append(r.Exclude, fmt.Sprintf("10.%d.%d.%d", index, i, 16*j+1))
			s.Exclude = append(s.Exclude, fmt.Sprintf("fd00:%x:%x::%x:0/112", index, i, j))
		}
		ranges = append(ranges, r, s)
	}
	return ippoolTestPool(name, ranges...)
}

// ippoolCarved returns a pool of 64 host ranges, each on an address that
// the pool ippoolAtLimits(_, index, 0) excludes: the two interleave without
// sharing an address.
func ippoolCarved(name string, index int) vmipamv1.IPPool {
	var ranges []vmipamv1.IPRange
	for i := range 64 {
		ranges = append(ranges, vmipamv1.IPRange{CIDR: fmt.Sprintf("10.%d.%d.%d/32", index, i*4, 8*(i%32)+2)})
	}
	return ippoolTestPool(name, ranges...)
}

// ippoolBenchPools returns a pool at the CRD's limits in 10.0.0.0/16 and n
// other pools: one carved out of its exclusions, the rest moderate (or, if
// atLimits, at the limits too), none sharing an address with it.
func ippoolBenchPools(n int, atLimits bool) (vmipamv1.IPPool, []vmipamv1.IPPool) {
	pool := ippoolAtLimits("big", 0, 0)
	others := []vmipamv1.IPPool{ippoolCarved("carved", 0)}
	for i := 1; i < n; i++ {
		name := fmt.Sprintf("other-%02d", i)
		if atLimits {
			others = append(others, ippoolAtLimits(name, i, 0))
		} else {
			others = append(others, ippoolModerate(name, i))
		}
	}
	for i := range others {
		others[i].UID = types.UID("uid-" + others[i].Name)
		others[i].Generation = 1
	}
	return pool, others
}

// BenchmarkValidateIPPoolAtLimits validates a pool at the CRD's limits (64
// ranges × 256 exclusions) against 50 other pools: on create; on an update
// that moves every exclusion, with its warnings; and against 50 pools that
// are at the limits too. Like the webhook, it keeps the other pools parsed
// between requests.
func BenchmarkValidateIPPoolAtLimits(b *testing.B) {
	run := func(b *testing.B, pool *vmipamv1.IPPool, others []vmipamv1.IPPool, each func(field.ErrorList, *ipam.Ranges)) {
		v := &IPPoolValidator{}
		for b.Loop() {
			errs, ranges := ippoolValidate(b.Context(), pool, others, v.parsed.get)
			each(errs, ranges)
		}
	}
	none := func(errs field.ErrorList, _ *ipam.Ranges) {
		if len(errs) > 0 {
			b.Fatal(errs)
		}
	}
	b.Run("create", func(b *testing.B) {
		pool, others := ippoolBenchPools(50, false)
		run(b, &pool, others, none)
	})
	b.Run("update with warnings", func(b *testing.B) {
		old, others := ippoolBenchPools(51, false)
		others = others[1:] // the carved pool takes what the update gives back
		pool := ippoolAtLimits("big", 0, 1)
		var warnings []string
		run(b, &pool, others, func(errs field.ErrorList, ranges *ipam.Ranges) {
			none(errs, ranges)
			warnings = ippoolUpdateWarnings(b.Context(), &old, ranges)
		})
		if len(warnings) != ippoolMaxRemovedWarnings+1 {
			b.Fatalf("%d warnings: %q", len(warnings), warnings)
		}
	})
	b.Run("create, others at limits", func(b *testing.B) {
		pool, others := ippoolBenchPools(50, true)
		run(b, &pool, others, none)
	})
	b.Run("create overlapping everywhere", func(b *testing.B) {
		// Every range shares runs with 50 pools: the errors stay bounded.
		pool, _ := ippoolBenchPools(0, false)
		var others []vmipamv1.IPPool
		for i := range 50 {
			o := ippoolAtLimits(fmt.Sprintf("other-%02d", i), 0, 1+i%3)
			o.UID = types.UID("uid-" + o.Name)
			others = append(others, o)
		}
		var n int
		run(b, &pool, others, func(errs field.ErrorList, _ *ipam.Ranges) { n = len(errs) })
		if n != ippoolMaxOverlapErrors+1 {
			b.Fatalf("%d errors", n)
		}
	})
}
