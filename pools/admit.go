package pools

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
)

// Create is an object's create as its admission read it: what Admit
// decides on.
type Create struct {
	Kind kinds.Kind
	// Namespace and Name are the object's (no name with generateName);
	// Pool the pool it names, if any.
	Namespace, Name, Pool string
	// Ref names the object in messages and in its reservation.
	Ref string
	Ask Ask
	// DryRun reserves nothing: Admit only says whether the static
	// requests could be had.
	DryRun bool
	// Names, if set, tells whether the object's name is taken already
	// (the API server would refuse the create after admission): asked
	// once everything else holds, before anything is reserved.
	Names Names
}

// Names tells whether an object of a namespace and name is known; ctx
// bounds a wait for the answer.
type Names interface {
	Has(ctx context.Context, namespace, name string) bool
}

// Admitted is what Admit gave a create: the pool, the plan, and the
// addresses reserved under Token in the plan's order (for a dry run, the
// static requests that could be reserved, and no token). Skipped is set
// when a PreferDualStack create gets one family because the pool had no
// free address of the other.
type Admitted struct {
	Pool    *Pool
	Plan    Plan
	Token   string
	Addrs   []netip.Addr
	Skipped *FamilyError
}

// ErrNameTaken refuses a create whose name an object already holds.
var ErrNameTaken = errors.New("the name is taken")

// FieldError refuses a create for what its fields say.
type FieldError struct{ Errs field.ErrorList }

func (e *FieldError) Error() string { return e.Errs.ToAggregate().Error() }

func fieldError(errs ...*field.Error) error { return &FieldError{Errs: errs} }

// RecoveringError says that a pool's allocator is recovering its state.
type RecoveringError struct{ Pool string }

func (e *RecoveringError) Error() string {
	return fmt.Sprintf("IPPool %s is recovering its state", e.Pool)
}

// Is reports whether target is ErrNotReady.
func (e *RecoveringError) Is(target error) bool { return target == ErrNotReady }

// PausedError refuses an allocation from a pool whose spec.paused is set.
// Field is where the object names its pool, for the message; empty when
// not known (an object that bypassed the webhook).
type PausedError struct{ Pool, Field string }

func (e *PausedError) Error() string {
	other := "name another pool"
	if e.Field != "" {
		other += " in " + e.Field
	}
	return fmt.Sprintf("IPPool %q is paused (spec.paused): it hands out no new addresses; %s, "+
		"or unpause it with kubectl patch ippools.vmipam.io %s --type merge -p '{\"spec\":{\"paused\":false}}'", e.Pool, other, e.Pool)
}

// Admit gives a create its addresses: it selects the pool, plans the
// families strictly, checks the static requests against the pool, and,
// unless it is a dry run, reserves the addresses under a fresh token (the
// object has no UID yet, and no name with generateName).
//
// Its refusals: a *FieldError (the fields say why; the pool the object
// names among them), ErrNotReady (vmipam or the pool is recovering; retry),
// ErrNotAllowed (wrapped with the pool's field), ErrNameTaken, and a
// *FamilyError from Assign. A paused pool (see PausedError) is refused as
// a *FieldError naming the pool's field, dry runs and static requests
// included.
func (r *Registry) Admit(ctx context.Context, c Create) (Admitted, error) {
	pool, err := r.Select(ctx, c.Kind, c.Namespace, c.Pool)
	var paused *PausedError
	switch {
	case errors.Is(err, ErrNotReady):
		return Admitted{}, err
	case errors.Is(err, ErrNotAllowed):
		return Admitted{}, fmt.Errorf("%s: %w", c.Kind.PoolPath(), err)
	case errors.As(err, &paused):
		return Admitted{}, fieldError(field.Forbidden(field.NewPath(c.Kind.PoolPath()), paused.Error()))
	case err != nil:
		return Admitted{}, fieldError(field.Invalid(field.NewPath(c.Kind.PoolPath()), c.Pool, err.Error()))
	case !pool.Ready():
		return Admitted{}, &RecoveringError{Pool: pool.Name()}
	}
	plan, ferr := PlanFamilies(c.Kind, c.Ask, pool, true)
	if ferr != nil {
		return Admitted{}, fieldError(ferr)
	}
	for _, st := range c.Ask.Statics {
		if ferr := pool.CheckStatic(st); ferr != nil {
			return Admitted{}, fieldError(ferr)
		}
	}
	if c.Names != nil && c.Name != "" && c.Names.Has(ctx, c.Namespace, c.Name) {
		return Admitted{}, ErrNameTaken
	}
	ad := Admitted{Pool: pool, Plan: plan}
	if c.DryRun {
		// No side effect: say whether the static addresses could be had.
		for _, st := range plan.Statics() {
			if err := pool.CanReserve(st.Addr); err != nil {
				return Admitted{}, fieldError(field.Invalid(st.Path, st.Raw, ipam.Message(err)))
			}
			ad.Addrs = append(ad.Addrs, st.Addr)
		}
		return ad, nil
	}
	if ad.Token, err = newToken(); err != nil {
		return Admitted{}, err
	}
	got, err := pool.Assign(ctx, ipam.Reservation{Token: ad.Token, Namespace: c.Namespace, Ref: c.Ref}, plan)
	if errors.As(err, &paused) {
		// Paused between Select and Assign.
		paused.Field = c.Kind.PoolPath()
		return Admitted{}, fieldError(field.Forbidden(field.NewPath(c.Kind.PoolPath()), paused.Error()))
	} else if err != nil {
		return Admitted{}, err
	}
	ad.Addrs, ad.Skipped = got.Addrs, got.Skipped
	return ad, nil
}

// newToken returns a fresh reservation token.
func newToken() (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make reservation token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// CheckStatic refuses a static request for an address the pool never
// hands out, or written with another prefix length than its subnet's.
func (p *Pool) CheckStatic(st Static) *field.Error {
	if !p.Ranges().Contains(st.Addr) {
		if p.Ranges().Router(st.Addr) {
			return field.Invalid(st.Path, st.Raw,
				fmt.Sprintf("is the gateway or a route's next hop of IPPool %s, which no VM is given; ask for another address, or leave the field empty", p.Name()))
		}
		return field.Invalid(st.Path, st.Raw,
			fmt.Sprintf("outside IPPool %s (usable: %s); ask for an address inside it, or leave the field empty", p.Name(), p.Ranges()))
	}
	if st.Bits >= 0 {
		if sub, ok := p.Subnet(st.Addr); ok && sub.Prefix.Bits() != st.Bits {
			return field.Invalid(st.Path, st.Raw, fmt.Sprintf(
				"the prefix length /%d differs from the subnet %s of IPPool %s that holds the address; write %s, or the address alone",
				st.Bits, sub.Prefix, p.Name(), netip.PrefixFrom(st.Addr, sub.Prefix.Bits())))
		}
	}
	return nil
}
