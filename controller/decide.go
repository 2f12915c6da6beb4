package controller

import (
	"net/netip"
	"time"

	"github.com/vmipam/vmipam/pools"
)

// facts are what the garbage collector knows of one object when it
// decides: what the object says, and what the pools know of it.
type facts struct {
	deleted, finalizer bool
	// addrs are the addresses the object carries, the first the one whose
	// holder looks after it; addrErr says why they cannot be read.
	addrs   []netip.Addr
	addrErr error
	// notOurs: its kind's condition leaves it out, and vmipam never gave
	// it an address (no token, no finalizer, not deleted); or, carrying
	// no address and naming no pool, its kind's condition leaves it out.
	notOurs bool
	// pool is its pool, nil when none is known; noPool says why none could
	// be selected for an object without an address, retry that a retry
	// soon is likely to do, without a warning: pools.ErrNotReady (a pool
	// recovering, or created after this replica's cache last saw the
	// pools, or this replica's holder lease not held) for an object
	// created less than a minute ago.
	pool   *pools.Pool
	noPool error
	retry  bool
	// poolComing: no pool is known for its address yet, but this replica
	// is building the allocator of one that covers it (pools.Registry.Covers).
	poolComing bool
	// poolsUnknown: some pool is not recovered yet (asked only for an
	// object being deleted whose pool is not known).
	poolsUnknown bool
	poolReady    bool
	// second: it carries a second address, and this replica does not hold
	// its first (see holdSecond).
	second bool
	// keeper looks after it (for an object with an address, in a ready
	// pool); chosen reports whether this replica is chosen for an object
	// without one.
	keeper pools.Keeper
	chosen bool
}

func (f facts) hasAddr() bool { return len(f.addrs) > 0 }

// action is what the garbage collector does with an object.
type action int

const (
	// actWait does nothing more, and looks again after the returned
	// duration (never, when zero).
	actWait action = iota
	// actInvalidAddress reports an address that cannot be read.
	actInvalidAddress
	// actNoPool reports that no pool could be selected, and looks again in
	// a minute.
	actNoPool
	// actRemoveFinalizer lets the object go: there is nothing to release.
	actRemoveFinalizer
	// actRelease releases its addresses into their cooldown, then lets it
	// go.
	actRelease
	// actAssign gives an address to an object created without the webhook.
	actAssign
	// actKeep adds the finalizer, and binds or adopts its addresses.
	actKeep
)

// decide chooses what to do with an object from what is known of it.
func decide(f facts) (action, time.Duration) {
	switch {
	case f.addrErr != nil:
		return actInvalidAddress, 0
	case f.notOurs:
		return actWait, 0
	case f.noPool != nil && f.retry:
		// Not a reason to warn yet: most such refusals end within
		// seconds.
		return actWait, time.Second
	case f.noPool != nil:
		return actNoPool, time.Minute
	case f.pool == nil:
		switch {
		case f.poolComing && (!f.deleted || !f.finalizer):
			// Its pool's recovery may have read the objects before this
			// one was stored: look again once the pool is served.
			return actWait, time.Second
		case f.deleted && f.finalizer && f.poolsUnknown:
			// Not every pool is known yet: this one may still be
			// recovering, and its address must go into cooldown.
			return actWait, time.Second
		case f.deleted && f.finalizer:
			// The pool is gone, and its addresses with it.
			return actRemoveFinalizer, 0
		case f.hasAddr():
			// Outside every pool: not ours to manage.
			return actWait, 0
		case f.deleted && !f.finalizer:
			// Going, with no address and nothing of vmipam's to remove.
			return actWait, 0
		}
		return actWait, 10 * time.Second
	case !f.poolReady:
		return actWait, time.Second
	}
	// With several replicas, each object is looked after by the one that
	// holds its address; one no replica holds, by the replica chosen for
	// its UID among the live ones.
	if f.hasAddr() {
		switch f.keeper {
		case pools.KeeperPeer, pools.KeeperNotChosen:
			// Another replica binds, releases and repairs it. Look again
			// later, in case this replica's view of the block lags, or
			// that holder dies before it is done: soon for an object being
			// deleted, whose finalizer waits on it.
			return actWait, lookAgain(f.deleted)
		case pools.KeeperLeaving:
			// Its replica left: a live one takes its claims over soon.
			return actWait, 5 * time.Second
		case pools.KeeperUnclaimed:
			if f.deleted {
				// No replica holds the address: nothing to release.
				if f.finalizer {
					return actRemoveFinalizer, 0
				}
				return actWait, 0
			}
			// Not deleted, and no replica holds it: this one claims and
			// adopts it.
		}
	}
	switch {
	case f.deleted && !f.finalizer:
		return actWait, 0
	case f.deleted:
		return actRelease, 0
	case !f.hasAddr() && !f.chosen:
		return actWait, time.Minute
	case !f.hasAddr():
		return actAssign, 0
	}
	return actKeep, 0
}

// lookAgain is when a replica that does not look after an object checks
// it again: soon while it is being deleted (the replica that should
// release it may have died, and its taker has no event left to act on),
// else in a minute.
func lookAgain(deleted bool) time.Duration {
	if deleted {
		return 5 * time.Second
	}
	return time.Minute
}
