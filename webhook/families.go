package webhook

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
)

// request is an address a create asks for.
type request struct {
	addr netip.Addr
	// bits is the prefix length it was written with, or -1.
	bits int
	raw  string
	path *field.Path
}

// familyPlan is what a create gets of the address families: an address of
// each of families, in order (the primary first), all of them or none
// when require is set; note says why a PreferDualStack create gets one.
type familyPlan struct {
	families []vmipamv1.IPFamily
	require  bool
	note     string
}

// static returns the static request of family f, nil when f is allocated.
func (p familyPlan) static(statics []request, f vmipamv1.IPFamily) *request {
	for i := range statics {
		if pools.FamilyOf(statics[i].addr) == f {
			return &statics[i]
		}
	}
	return nil
}

// ordered returns statics in the plan's order of families.
func (p familyPlan) ordered(statics []request) []request {
	out := make([]request, 0, len(statics))
	for _, f := range p.families {
		if st := p.static(statics, f); st != nil {
			out = append(out, *st)
		}
	}
	return out
}

// planFamilies works out, as the API server does for a Service, which
// families a create gets an address of: its family policy (SingleStack
// when unset), its families in order (unset: those of its static requests,
// then IPv4 before IPv6), and the families pool has ranges of.
func planFamilies(t kinds.Kind, v *kinds.View, statics []request, pool *pools.Pool) (familyPlan, *field.Error) {
	policyPath := field.NewPath(strings.Join(t.FamilyPolicyField, "."))
	famPath := field.NewPath(strings.Join(t.FamiliesField, "."))
	policy := vmipamv1.IPFamilyPolicy(v.FamilyPolicy)
	switch policy {
	case "":
		policy = vmipamv1.SingleStack
	case vmipamv1.SingleStack, vmipamv1.PreferDualStack, vmipamv1.RequireDualStack:
	default:
		return familyPlan{}, field.NotSupported(policyPath, v.FamilyPolicy,
			[]string{string(vmipamv1.SingleStack), string(vmipamv1.PreferDualStack), string(vmipamv1.RequireDualStack)})
	}
	var order []vmipamv1.IPFamily
	for i, s := range v.Families {
		f := vmipamv1.IPFamily(s)
		switch {
		case f != vmipamv1.IPv4 && f != vmipamv1.IPv6:
			return familyPlan{}, field.NotSupported(famPath.Index(i), s, []string{string(vmipamv1.IPv4), string(vmipamv1.IPv6)})
		case slices.Contains(order, f):
			return familyPlan{}, field.Duplicate(famPath.Index(i), s)
		}
		order = append(order, f)
	}
	explicit := len(order) > 0
	if !explicit {
		for _, st := range statics {
			order = append(order, pools.FamilyOf(st.addr))
		}
	}
	if len(order) == 0 {
		order = pool.Families()[:1]
	}
	for _, f := range []vmipamv1.IPFamily{vmipamv1.IPv4, vmipamv1.IPv6} {
		if !slices.Contains(order, f) {
			order = append(order, f)
		}
	}
	if policy == vmipamv1.SingleStack {
		if len(statics) > 1 {
			if len(t.FamilyPolicyField) == 0 {
				return familyPlan{}, field.TooMany(field.NewPath(t.AddressesPath()), len(statics), 1)
			}
			return familyPlan{}, field.Invalid(policyPath, string(policy),
				fmt.Sprintf("%s holds an address of each family: set %s to PreferDualStack or RequireDualStack", t.AddressesPath(), policyPath))
		}
		f := order[0]
		if len(statics) == 1 && pools.FamilyOf(statics[0].addr) != f {
			return familyPlan{}, field.Invalid(statics[0].path, statics[0].raw,
				fmt.Sprintf("an %s address, but %s puts %s first; ask for an %s address, or change %s", pools.FamilyOf(statics[0].addr), famPath, f, f, famPath))
		}
		if explicit && !pool.Serves(f) {
			return familyPlan{}, field.Invalid(famPath.Index(0), string(f), fmt.Sprintf("IPPool %s has no %s range; choose a pool that has", pool.Name(), f))
		}
		return familyPlan{families: []vmipamv1.IPFamily{f}}, nil
	}
	plan := familyPlan{require: policy == vmipamv1.RequireDualStack}
	for _, f := range order {
		if pool.Serves(f) {
			plan.families = append(plan.families, f)
			continue
		}
		if plan.require {
			return familyPlan{}, field.Invalid(policyPath, string(policy),
				fmt.Sprintf("IPPool %s has no %s range: a VM that requires both families needs a pool with ranges of both", pool.Name(), f))
		}
		plan.note = fmt.Sprintf("IPPool %s has no %s range", pool.Name(), f)
	}
	return plan, nil
}
