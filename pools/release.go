package pools

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
)

// EarlyRelease is an operator's request (an IPRelease) to end an
// address's pending reservation or cooldown early.
type EarlyRelease struct {
	Addr         netip.Addr
	SkipCooldown bool
	// By is the user who asked and Reason why: both go into the history.
	By, Reason string
	// Key picks the replica that answers for an address no replica
	// claims (the IPRelease's name).
	Key string
}

// Released says what an EarlyRelease did.
type Released struct {
	Pool string
	// Was is the state the address was in.
	Was ipam.State
	// Message says what was done.
	Message string
}

// ErrNotMine means another replica answers the request; ErrWaitTakeover,
// that the replica that claims the address left and a live one takes its
// claims over shortly: ask again then.
var (
	ErrNotMine      = errors.New("another replica answers for the address")
	ErrWaitTakeover = errors.New("the replica that claims the address left; its claims are being taken over")
)

// RefusedError is a request vmipam will not carry out, and why.
type RefusedError struct{ Msg string }

func (e *RefusedError) Error() string { return e.Msg }

func refuse(format string, args ...any) error {
	return &RefusedError{Msg: fmt.Sprintf(format, args...)}
}

// ReleaseEarly carries out req if this replica answers for its address:
// the one whose claim holds it, or, for an address no replica claims, the
// one chosen for req.Key. It refuses while an object, live or being
// deleted, carries the address (naming it); ends a pending reservation
// (into its cooldown, or free with SkipCooldown), or a cooldown with
// SkipCooldown; releases into cooldown an address allocated to an object
// that is gone (its finalizer was removed by force); and records what it
// did in the history, with req.By and req.Reason.
func (r *Registry) ReleaseEarly(ctx context.Context, req EarlyRelease) (Released, error) {
	addr := ipam.Canonical(req.Addr)
	p := r.PoolFor(addr)
	if p == nil {
		if err := r.Ready(ctx); err != nil {
			return Released{}, err
		}
		if !r.Chosen(req.Key) {
			return Released{}, ErrNotMine
		}
		return Released{}, refuse("%s is in no IPPool's ranges: nothing to release", addr)
	}
	out := Released{Pool: p.name}
	if !p.Ready() {
		return out, fmt.Errorf("pool %s: %w", p.name, ErrNotReady)
	}
	switch k, err := r.KeeperOf(ctx, p, addr, req.Key); {
	case err != nil:
		return out, err
	case k == KeeperPeer || k == KeeperNotChosen:
		return out, ErrNotMine
	case k == KeeperLeaving:
		return out, ErrWaitTakeover
	case k == KeeperUnclaimed:
		out.Was = ipam.StateUnclaimed
		return out, refuse("%s in pool %s is claimed by no replica: it is free, nothing to release", addr, p.name)
	}
	// Whatever this replica's state says, an object carrying the address
	// keeps it: its garbage collector releases it when it goes.
	holder, err := r.carrier(ctx, addr)
	if err != nil {
		return out, err
	}
	st, owner, _ := p.Lookup(addr)
	out.Was = st
	if holder != "" {
		return out, refuse("%s in pool %s is held by %s: delete that object to release it", addr, p.name, holder)
	}
	ns, name := splitRef(owner.Ref)
	rec := vmipamv1.AddressRecord{Address: addr.String(), Pool: p.name, Namespace: ns, Name: name, UID: owner.UID,
		To: metav1.NewTime(r.clock.Now()), ReleasedBy: req.By, Reason: req.Reason, Holder: r.opts.Holder}
	switch st {
	case ipam.StateFree:
		return out, refuse("%s in pool %s is free: nothing to release", addr, p.name)
	case ipam.StateAllocated:
		// Bound to an object no longer there: its finalizer was removed
		// by force. Into the cooldown its deletion would have given it.
		if err := p.Release(ctx, addr, owner); err != nil {
			return out, fmt.Errorf("release %s: %w", addr, err)
		}
		_, _, until := p.Lookup(addr)
		rec.Ended = vmipamv1.EndedVanished
		out.Message = fmt.Sprintf("released %s, allocated to %s (uid %s), which is gone, into its cooldown until %s", addr, owner.Ref, owner.UID, until.UTC().Format(time.RFC3339))
		if req.SkipCooldown {
			out.Message += fmt.Sprintf("; its cooldown can be skipped from %s", until.Add(-cooldownOf(p.spec)).Add(ipam.InFlight).UTC().Format(time.RFC3339))
		}
	case ipam.StatePending, ipam.StateCooldown:
		m := p.of(addr)
		end, err := m.EndEarly(addr, req.SkipCooldown)
		if errors.Is(err, ipam.ErrTooSoon) || errors.Is(err, ipam.ErrNothingToEnd) {
			return out, refuse("%v", err)
		}
		if err != nil {
			return out, err
		}
		rec.Ended = vmipamv1.EndedPending
		if end.Was == ipam.StateCooldown {
			rec.Ended = vmipamv1.EndedCooldown
		}
		if end.Until.IsZero() {
			out.Message = fmt.Sprintf("ended the %s of %s: it is free", strings.ToLower(end.Was.String()), addr)
		} else {
			out.Message = fmt.Sprintf("ended the pending reservation of %s (for %s): it cools down until %s", addr, end.Owner.Ref, end.Until.UTC().Format(time.RFC3339))
		}
	default:
		return out, refuse("%s in pool %s is %s: nothing to release", addr, p.name, st)
	}
	if err := r.Record(ctx, rec); err != nil {
		return out, fmt.Errorf("record the release of %s: %w", addr, err)
	}
	r.LogReleased(logf.FromContext(ctx), rec, "releasedBy", req.By, "reason", req.Reason)
	return out, nil
}

// carrier names the object, live or being deleted, that carries addr,
// read from the API server; empty when none does.
func (r *Registry) carrier(ctx context.Context, addr netip.Addr) (string, error) {
	var found string
	err := r.eachObject(ctx, "", func(o *Object) {
		if found != "" {
			return
		}
		for _, h := range o.holdings() {
			if h.Addr == addr {
				found = fmt.Sprintf("%s %s (uid %s)", o.GVK.Kind, Ref(o.Namespace, o.Name), o.UID)
				if o.Deleting {
					found += ", being deleted"
				}
			}
		}
	})
	return found, err
}

// splitRef splits a Ref into namespace and name.
func splitRef(ref string) (string, string) {
	if ns, name, ok := strings.Cut(ref, "/"); ok {
		return ns, name
	}
	return "", ref
}

// cooldownOf is spec's cooldown, or the default.
func cooldownOf(spec vmipamv1.IPPoolSpec) time.Duration {
	if spec.Cooldown != nil {
		return spec.Cooldown.Duration
	}
	return ipam.DefaultCooldown
}
