package pools

import (
	"context"
	"fmt"
	"net/netip"
)

// Keeper says which replica looks after an object, by the address whose
// holder looks after it (its first: the replica that reserved both
// reserved them together, and a takeover moves both).
type Keeper int

const (
	// KeeperMine means this replica holds the address; it binds, releases and
	// repairs the object.
	KeeperMine Keeper = iota
	// KeeperPeer means another live replica holds it, and looks after the
	// object.
	KeeperPeer
	// KeeperLeaving means a replica that left holds it; a live one takes its
	// claims over once its lease lapses.
	KeeperLeaving
	// KeeperUnclaimed means no replica holds it, and this one is chosen for the
	// object among the live ones: it claims the address (a live object)
	// or has nothing to release (one being deleted).
	KeeperUnclaimed
	// KeeperNotChosen means no replica holds it, and another live replica is
	// chosen for the object.
	KeeperNotChosen
)

func (k Keeper) String() string {
	switch k {
	case KeeperMine:
		return "mine"
	case KeeperPeer:
		return "another live replica's"
	case KeeperLeaving:
		return "a leaving replica's"
	case KeeperUnclaimed:
		return "unclaimed"
	case KeeperNotChosen:
		return "unclaimed, another replica's to claim"
	}
	return fmt.Sprintf("Keeper(%d)", int(k))
}

// KeeperOf answers who looks after the object of UID uid whose address
// (its first) is addr, in pool. This replica's view of the address's block
// may lag (claimed since its last read, or taken over): the watch's last
// version may say whose it is, enough to leave it alone; else, before
// claiming it or giving up on it, the block is read again.
func (r *Registry) KeeperOf(ctx context.Context, pool *Pool, addr netip.Addr, uid string) (Keeper, error) {
	if pool.Held(addr) {
		return KeeperMine, nil
	}
	holder, claimed := pool.HolderOf(addr)
	if !claimed || !r.Live(holder) {
		if seen, ok := pool.SeenHolderOf(addr); ok && r.Live(seen) {
			holder, claimed = seen, true
		} else {
			if err := pool.Refresh(ctx, addr); err != nil {
				return 0, fmt.Errorf("read the block of %s: %w", addr, err)
			}
			holder, claimed = pool.HolderOf(addr)
		}
	}
	switch {
	case pool.Held(addr):
		// Its claim is this replica's after all.
		return KeeperMine, nil
	case claimed && r.Live(holder):
		return KeeperPeer, nil
	case claimed:
		return KeeperLeaving, nil
	case !r.Chosen(uid):
		return KeeperNotChosen, nil
	}
	return KeeperUnclaimed, nil
}
