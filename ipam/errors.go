package ipam

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"time"
)

// Sentinel errors for the conditions callers act on; match them with
// errors.Is, the concrete errors below carry the details.
var (
	// ErrNotReady is returned until the Manager has recovered its state.
	ErrNotReady = errors.New("allocator is not ready: state not yet recovered")
	// ErrExhausted means no address can be handed out now; see ExhaustedError.
	ErrExhausted = errors.New("pool exhausted")
	// ErrOutOfRange means an address is in none of the pool's ranges.
	ErrOutOfRange = errors.New("address outside every range of the pool")
	// ErrInUse means an address is pending for, or allocated to, another owner.
	ErrInUse = errors.New("address in use")
	// ErrCoolingDown means an address was released and its cooldown has not ended.
	ErrCoolingDown = errors.New("address cooling down")
	// ErrConflict means two owners claim one address; it is never resolved silently.
	ErrConflict = errors.New("address conflict")
	// ErrUnknownToken means no reservation exists for a token (never made, or expired).
	ErrUnknownToken = errors.New("unknown reservation token")
	// ErrStoreConflict is returned by a Store when a write's version is stale.
	ErrStoreConflict = errors.New("store version conflict")
	// ErrInvalid marks a configuration error; see FieldErrors.
	ErrInvalid = errors.New("invalid configuration")
	// ErrNoAnswer means another holder claims the address asked for and
	// did not hand it over in time, or is not running; see HolderError.
	// Retrying is the remedy: a live holder answers, and a dead one's
	// claims are taken over within the lease duration.
	ErrNoAnswer = errors.New("no answer from the holder of the address")
	// ErrTooManyPending means a namespace holds as many pending
	// reservations as the pool allows it; see PendingLimitError.
	ErrTooManyPending = errors.New("too many pending reservations")
)

// ExhaustedError says why a pool cannot hand out an address and when one
// will free up, so the user is told something they can act on.
type ExhaustedError struct {
	Pool string
	// Family, if set, is the address family the pool has none left of
	// ("IPv6"), for a pool of both families.
	Family string
	Counts Counts
	// NextFree is when the next address leaves cooldown; zero when no
	// address is cooling down or pending.
	NextFree time.Time
	// Others is what the store showed of the other holders' addresses
	// (the other replicas), when they hold any: with Counts, the pool's
	// state as a whole, not this replica's share.
	Others *Others
}

// Others is what the store shows of the addresses that other holders
// claim, as of their last writes.
type Others struct {
	// Holders is how many other holders claim addresses.
	Holders int
	// InUse are allocated or pending there (the store does not tell
	// which); Cooling, cooling down; Free, neither, armed or not.
	InUse, Cooling, Free int
	// Unreachable are claimed by holders that are not running; they come
	// free once another takes their claims over.
	Unreachable int
	// NextFree is the earliest cooldown deadline among them.
	NextFree time.Time
}

// add counts the other holders' addresses in b; live tells which holders
// run; a cooldown counts if it ends after now; holders, if not nil,
// collects the holders, for Holders.
func (o *Others) add(b *Block, self string, live func(string) bool, now time.Time, holders map[string]bool) {
	cooling := map[string]int{}
	for a, d := range b.Cooldowns {
		if !d.After(now) {
			continue
		}
		if h, ok := b.holderOf(blockOffset(a)); ok && h != self && live(h) && !has(b.InUse, h, blockOffset(a)) {
			cooling[h]++
			if o.NextFree.IsZero() || d.Before(o.NextFree) {
				o.NextFree = d
			}
		}
	}
	for h, bm := range b.Claims {
		if h == self || bm.Empty() {
			continue
		}
		if holders != nil && !holders[h] {
			holders[h] = true
			o.Holders++
		}
		n := bm.Count()
		if !live(h) {
			o.Unreachable += n
			continue
		}
		used := n
		if b.Exact {
			used = 0
			if u := b.InUse[h]; u != nil {
				for w, x := range bm {
					used += bits.OnesCount64(x & u[w])
				}
			}
		}
		o.InUse += used
		o.Cooling += cooling[h]
		o.Free += max(n-used-cooling[h], 0)
	}
}

func (e *ExhaustedError) Error() string {
	what, of := "is exhausted", "usable addresses"
	if e.Family != "" {
		what, of = "has no "+e.Family+" address left", "usable "+e.Family+" addresses"
	}
	var msg string
	if o := e.Others; o != nil && o.Holders > 0 {
		// Several replicas: the pool as a whole first, then this one.
		msg = fmt.Sprintf("pool %q %s: of %d %s, %d are allocated or pending, %d cooling down, %d free",
			e.Pool, what, e.Counts.Usable, of, e.Counts.Allocated+e.Counts.Pending+o.InUse,
			e.Counts.Cooldown+o.Cooling, e.Counts.Free+o.Free)
		if o.Unreachable > 0 {
			msg += fmt.Sprintf(", %d held by vmipam replicas that are not running (free again once their claims are taken over)", o.Unreachable)
		}
		if n := int(e.Counts.Usable) - e.Counts.Claimed - e.Counts.ClaimedElsewhere; n > 0 {
			msg += fmt.Sprintf(", %d unclaimed", n)
		}
		msg += fmt.Sprintf(" (this replica: %d allocated, %d pending, %d cooling down; %d other replicas, as the store last showed them)",
			e.Counts.Allocated, e.Counts.Pending, e.Counts.Cooldown, o.Holders)
	} else {
		msg = fmt.Sprintf("pool %q %s: %d of %d %s allocated, %d pending, %d cooling down",
			e.Pool, what, e.Counts.Allocated, e.Counts.Usable, of, e.Counts.Pending, e.Counts.Cooldown)
		if e.Counts.ClaimedElsewhere > 0 {
			msg += fmt.Sprintf(", %d claimed by other holders", e.Counts.ClaimedElsewhere)
		}
	}
	if !e.NextFree.IsZero() {
		msg += "; the next address frees at " + e.NextFree.UTC().Format(time.RFC3339)
	} else {
		msg += "; add a range to the pool or delete virtual machines"
	}
	return msg
}

// Is reports whether target is ErrExhausted.
func (e *ExhaustedError) Is(target error) bool { return target == ErrExhausted }

// AddressError says why one specific address cannot be had: who holds it, or
// until when it cools down. It matches ErrInUse, ErrCoolingDown or
// ErrConflict, according to Reason.
type AddressError struct {
	Addr   netip.Addr
	Reason error
	// State the address is in, and its holder: a UID when allocated, a
	// reservation token when pending.
	State State
	Owner Owner
	// Until is the end of the cooldown, for ErrCoolingDown.
	Until time.Time
	// Holder is the other holder (another replica) that holds it, when
	// this Manager knows it only from the store.
	Holder string
}

func (e *AddressError) Error() string {
	if e.Holder != "" && e.Owner.Ref != "" {
		// As the holder said it.
		switch e.State {
		case StateAllocated:
			return fmt.Sprintf("address %s is allocated to %s (vmipam replica %s holds it)", e.Addr, e.Owner.Ref, e.Holder)
		case StatePending:
			return fmt.Sprintf("address %s is reserved for %s, being created (vmipam replica %s holds it)", e.Addr, e.Owner.Ref, e.Holder)
		}
	}
	if e.Holder != "" {
		if e.State == StateCooldown {
			return fmt.Sprintf("address %s was released recently and cools down until %s (held by vmipam replica %s)", e.Addr, e.Until.UTC().Format(time.RFC3339), e.Holder)
		}
		return fmt.Sprintf("address %s is in use: vmipam replica %s holds it", e.Addr, e.Holder)
	}
	switch e.State {
	case StateAllocated:
		if e.Owner.Ref != "" {
			return fmt.Sprintf("address %s is allocated to %s (UID %s)", e.Addr, e.Owner.Ref, e.Owner.UID)
		}
		return fmt.Sprintf("address %s is allocated to the virtual machine with UID %s", e.Addr, e.Owner.UID)
	case StatePending:
		if e.Owner.Ref != "" {
			return fmt.Sprintf("address %s is reserved for %s, being created (token %s)", e.Addr, e.Owner.Ref, e.Owner.Token)
		}
		return fmt.Sprintf("address %s is reserved for another virtual machine being created (token %s)", e.Addr, e.Owner.Token)
	case StateCooldown:
		return fmt.Sprintf("address %s was released recently and cools down until %s", e.Addr, e.Until.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("address %s: %v", e.Addr, e.Reason)
}

// Unwrap returns the sentinel the error matches.
func (e *AddressError) Unwrap() error { return e.Reason }

// PendingLimitError refuses a reservation because its namespace already
// holds as many pending reservations in the pool as it may.
type PendingLimitError struct {
	Pool, Namespace string
	Limit           int
}

func (e *PendingLimitError) Error() string {
	ns := e.Namespace
	if ns == "" {
		ns = "(cluster scope)"
	}
	return fmt.Sprintf("namespace %s already has %d reservations in pool %q waiting for their objects to be stored, the most one namespace may have; "+
		"retry once they are stored, or raise the pool's limit per namespace", ns, e.Limit, e.Pool)
}

// Is reports whether target is ErrTooManyPending.
func (e *PendingLimitError) Is(target error) bool { return target == ErrTooManyPending }

// HolderError says that an address is claimed by another holder (another
// replica) that could not be asked for it: it did not answer in time, or
// it is not running and its claims are not taken over yet. The address
// may well be free there; the request should be retried.
type HolderError struct {
	Addr   netip.Addr
	Holder string
	// Live: the holder runs, and did not answer before the deadline.
	Live bool
}

func (e *HolderError) Error() string {
	if e.Live {
		return fmt.Sprintf("address %s is held by vmipam replica %s, which did not hand it over in time; retry", e.Addr, e.Holder)
	}
	return fmt.Sprintf("address %s is held by vmipam replica %s, which is not running; "+
		"another replica takes its addresses over once its lease lapses: retry in a few seconds", e.Addr, e.Holder)
}

// Is reports whether target is ErrNoAnswer.
func (e *HolderError) Is(target error) bool { return target == ErrNoAnswer }

// Message returns the user-facing explanation of the allocator's error
// in err, without the context ("allocate from pool ...") wrapped around
// it, which the caller's message already names; else err's message.
func Message(err error) string {
	var ex *ExhaustedError
	if errors.As(err, &ex) {
		return ex.Error()
	}
	var ae *AddressError
	if errors.As(err, &ae) {
		return ae.Error()
	}
	var pl *PendingLimitError
	if errors.As(err, &pl) {
		return pl.Error()
	}
	var he *HolderError
	if errors.As(err, &he) {
		return he.Error()
	}
	return err.Error()
}
