package pools

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
)

// The one door for "give this object its addresses": Plan decides, purely,
// which families a create gets an address of and which of them are static
// requests; Assign reserves them. The webhook plans strictly (a value it
// cannot honour is refused, naming the field), the garbage collector,
// assigning an object that bypassed the webhook, leniently (such a value
// counts as unset: the object is stored already, and an address serves it
// better than an error).

// Static is an address a create asks for, as the object writes it.
type Static struct {
	// Addr is the address, canonical.
	Addr netip.Addr
	// Bits is the prefix length it was written with (10.0.0.5/24), or -1.
	Bits int
	// Raw is how the object writes it, and Path where, for messages.
	Raw  string
	Path *field.Path
}

// Ask is what an object asks of its pool: its family policy and its
// families as written (empty when its kind has no such field), and its
// static requests, at most one per family.
type Ask struct {
	Policy   string
	Families []string
	Statics  []Static
}

// Plan is what a create gets: an address of each of Families, in order
// (the primary first); all of them or none when Require is set. Note says
// why a PreferDualStack create gets one family.
type Plan struct {
	Families []vmipamv1.IPFamily
	Require  bool
	Note     string
	statics  []Static
}

// Static returns the static request of family f, nil when f is allocated.
func (p Plan) Static(f vmipamv1.IPFamily) *Static {
	for i := range p.statics {
		if FamilyOf(p.statics[i].Addr) == f {
			return &p.statics[i]
		}
	}
	return nil
}

// Statics returns the static requests in the plan's order of families.
func (p Plan) Statics() []Static {
	out := make([]Static, 0, len(p.statics))
	for _, f := range p.Families {
		if st := p.Static(f); st != nil {
			out = append(out, *st)
		}
	}
	return out
}

// PlanFamilies works out, as the API server does for a Service, which
// families an object of kind k asking ask gets an address of from pool:
// its family policy (SingleStack when unset), its families in order
// (unset: those of its static requests, then IPv4 before IPv6), and the
// families pool has ranges of.
//
// Strict (the webhook) refuses what it cannot honour with an error naming
// the field. Lenient (an object stored without the webhook) never
// refuses: an unknown policy counts as unset, unknown or repeated families
// are skipped, a family the pool lacks gives way to the pool's first, and
// RequireDualStack on a pool of one family gets that family.
func PlanFamilies(k kinds.Kind, ask Ask, pool *Pool, strict bool) (Plan, *field.Error) {
	policyPath := field.NewPath(strings.Join(k.FamilyPolicyField, "."))
	famPath := field.NewPath(strings.Join(k.FamiliesField, "."))
	policy := vmipamv1.IPFamilyPolicy(ask.Policy)
	switch policy {
	case vmipamv1.SingleStack, vmipamv1.PreferDualStack, vmipamv1.RequireDualStack:
	default:
		if policy != "" && strict {
			return Plan{}, field.NotSupported(policyPath, ask.Policy,
				[]string{string(vmipamv1.SingleStack), string(vmipamv1.PreferDualStack), string(vmipamv1.RequireDualStack)})
		}
		policy = vmipamv1.SingleStack
	}
	var order []vmipamv1.IPFamily
	for i, s := range ask.Families {
		f := vmipamv1.IPFamily(s)
		switch {
		case f != vmipamv1.IPv4 && f != vmipamv1.IPv6:
			if strict {
				return Plan{}, field.NotSupported(famPath.Index(i), s, []string{string(vmipamv1.IPv4), string(vmipamv1.IPv6)})
			}
			continue
		case slices.Contains(order, f):
			if strict {
				return Plan{}, field.Duplicate(famPath.Index(i), s)
			}
			continue
		}
		order = append(order, f)
	}
	explicit := len(order) > 0
	if !explicit {
		for _, st := range ask.Statics {
			order = append(order, FamilyOf(st.Addr))
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
	statics := ask.Statics
	if policy == vmipamv1.SingleStack {
		if len(statics) > 1 {
			if len(k.FamilyPolicyField) == 0 {
				return Plan{}, field.TooMany(field.NewPath(k.AddressesPath()), len(statics), 1)
			}
			return Plan{}, field.Invalid(policyPath, string(policy),
				fmt.Sprintf("%s holds an address of each family: set %s to PreferDualStack or RequireDualStack", k.AddressesPath(), policyPath))
		}
		f := order[0]
		if len(statics) == 1 && FamilyOf(statics[0].Addr) != f {
			return Plan{}, field.Invalid(statics[0].Path, statics[0].Raw,
				fmt.Sprintf("an %s address, but %s puts %s first; ask for an %s address, or change %s", FamilyOf(statics[0].Addr), famPath, f, f, famPath))
		}
		if !pool.Serves(f) {
			switch {
			case strict && explicit:
				return Plan{}, field.Invalid(famPath.Index(0), string(f), fmt.Sprintf("IPPool %s has no %s range; choose a pool that has", pool.Name(), f))
			case !strict:
				f = pool.Families()[0]
			}
		}
		return Plan{Families: []vmipamv1.IPFamily{f}, statics: statics}, nil
	}
	plan := Plan{Require: policy == vmipamv1.RequireDualStack, statics: statics}
	for _, f := range order {
		if pool.Serves(f) {
			plan.Families = append(plan.Families, f)
			continue
		}
		if plan.Require && strict {
			return Plan{}, field.Invalid(policyPath, string(policy),
				fmt.Sprintf("IPPool %s has no %s range: a VM that requires both families needs a pool with ranges of both", pool.Name(), f))
		}
		if !plan.Require {
			plan.Note = fmt.Sprintf("IPPool %s has no %s range", pool.Name(), f)
		}
	}
	return plan, nil
}

// Assignment is what Assign reserved: an address of each family it could
// have, in the plan's order. Skipped is set when a PreferDualStack create
// gets one family because the pool had no free address of the other.
type Assignment struct {
	Addrs   []netip.Addr
	Skipped *FamilyError
}

// FamilyError is why an address of Family could not be had from Pool:
// Static is the request that asked for it, nil when it was to be
// allocated.
type FamilyError struct {
	Pool   string
	Family vmipamv1.IPFamily
	Static *Static
	Err    error
}

// Error is the allocator's message: it names the address or the pool.
func (e *FamilyError) Error() string { return e.Err.Error() }

// Unwrap returns the allocator's error.
func (e *FamilyError) Unwrap() error { return e.Err }

// Assign reserves for r an address of each family of plan: its static
// request where it has one, else the next free one. Nothing is
// half-assigned: when a family fails (other than an exhausted family of a
// PreferDualStack plan that still gets the other), what this call
// reserved goes back at once, without a cooldown, since no object can
// carry it, and the error is a *FamilyError. A paused pool reserves
// nothing: the error is a *PausedError.
func (p *Pool) Assign(ctx context.Context, r ipam.Reservation, plan Plan) (Assignment, error) {
	if p.Paused() {
		return Assignment{}, &PausedError{Pool: p.name}
	}
	var out Assignment
	out.Addrs = make([]netip.Addr, 0, len(plan.Families))
	// The debug lines' values are built only when they are written: this
	// runs on every create.
	debug := logf.Log.V(1).Enabled()
	for _, f := range plan.Families {
		st := plan.Static(f)
		var a netip.Addr
		var err error
		if st != nil {
			if debug {
				logf.FromContext(ctx).V(1).Info("Reserving address", "object", r.Ref, "pool", p.name, "address", st.Addr)
			}
			a, err = st.Addr, p.Reserve(ctx, r, st.Addr)
		} else {
			if debug {
				logf.FromContext(ctx).V(1).Info("Allocating address", "object", r.Ref, "pool", p.name, "family", f)
			}
			a, err = p.AllocateFamily(ctx, r, f)
		}
		if err == nil {
			out.Addrs = append(out.Addrs, a)
			continue
		}
		fe := &FamilyError{Pool: p.name, Family: f, Static: st, Err: err}
		if st == nil && !plan.Require && len(plan.Families) > 1 && errors.Is(err, ipam.ErrExhausted) {
			// PreferDualStack takes what it can, and says what it could not.
			out.Skipped = fe
			if len(out.Addrs) > 0 || f != plan.Families[len(plan.Families)-1] {
				continue
			}
		}
		p.Cancel(r.Token)
		return Assignment{}, fe
	}
	return out, nil
}
