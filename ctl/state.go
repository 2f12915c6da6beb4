package ctl

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
)

// The states of an address, as who reports them.
const (
	// StateAllocated: a live object carries the address.
	StateAllocated = "allocated"
	// StatePending: no live object carries it, but its holder had it
	// pending or allocated when it last wrote the block: a reservation
	// handed out at admission whose object is not stored yet, or a release
	// the holder has not written since.
	StatePending = "pending"
	// StateCooldown: released, resting until the block's deadline.
	StateCooldown = "cooling down"
	// StateArmed: free, and its holder may hand it out before it writes the
	// block again.
	StateArmed = "free (armed)"
	// StateFree: claimed by a holder, neither in use nor armed.
	StateFree = "free"
	// StateUnclaimed: no holder claims it; the first to need it will.
	StateUnclaimed = "unclaimed"
	// StateUnknown: claimed in a block an older vmipam wrote, which does
	// not record what its holder had in use.
	StateUnknown = "claimed (in use or free: the block does not record which)"
	// StateExcluded, StateGateway, StateNetwork and StateBroadcast: inside a
	// range's CIDR but never handed out.
	StateExcluded  = "excluded"
	StateGateway   = "gateway"
	StateNetwork   = "network address"
	StateBroadcast = "broadcast address"
)

// stateHelp is the derivation of the states, for who's help.
const stateHelp = `The state is worked out from what vmipam persists, in this order:
  allocated      a live object of a kind vmipam serves carries the address
                 (two or more: a duplicate, which check reports).
  cooling down   the address's block lists it in its cooldowns with a
                 deadline still ahead: released, resting until then.
  pending        a holder claims it and had it in use (pending or
                 allocated) when it last wrote the block, and no live object
                 carries it: a reservation awaiting its object, or a release
                 the holder has not written yet; past the pool's pending TTL
                 with a live holder, check reports it as a leak.
  free (armed)   its holder claims it and armed it: free, and that replica
                 may hand it out without writing the block first.
  free           its holder claims it, neither in use nor armed.
  unclaimed      no holder claims it: the first replica that needs an
                 address of the block claims it.
  excluded, gateway, network address, broadcast address
                 inside a range's CIDR, but never handed out: in the
                 range's exclude list or outside its first..last, its
                 gateway or a route's via, the subnet's network address or
                 (IPv4) its broadcast address.
The claim's replica is live when its holder Lease was renewed within the
Lease's duration; a claim of a replica that is not live is taken over by
another replica when its Lease lapses.`

// AddressState is what the persisted block says of one address.
type AddressState struct {
	// State is one of the State constants.
	State string `json:"state"`
	// Claim is the holder whose claim the address is; empty when
	// unclaimed.
	Claim string `json:"claim,omitempty"`
	// Until is the end of the cooldown, for StateCooldown; or, when a
	// cooldown ended but its holder has not written the block since, when
	// it ended.
	Until time.Time `json:"until,omitzero"`
	// Armed reports that the claim's holder armed the address (it may be
	// in use by a live object as well, in the moment between hand out and
	// write).
	Armed bool `json:"armed,omitempty"`
}

// stateOf derives addr's state from its pool's blocks (kubestore.Read) and
// the number of live objects carrying it, at now. See stateHelp.
func stateOf(addr netip.Addr, blocks []ipam.Block, live int, now time.Time) AddressState {
	var st AddressState
	i := slices.IndexFunc(blocks, func(b ipam.Block) bool { return b.Prefix.Contains(addr) })
	var b *ipam.Block
	if i >= 0 {
		b = &blocks[i]
		st.Claim, _ = b.ClaimedBy(addr)
	}
	off := offsetOf(addr)
	if b != nil && st.Claim != "" {
		st.Armed = has(b.Armed, st.Claim, off)
	}
	var until time.Time
	if b != nil {
		until = b.Cooldowns[addr]
	}
	switch {
	case live > 0:
		st.State = StateAllocated
	case !until.IsZero() && now.Before(until):
		st.State, st.Until = StateCooldown, until
	case st.Claim == "":
		st.State = StateUnclaimed
	case !b.Exact:
		st.State = StateUnknown
	case has(b.InUse, st.Claim, off):
		st.State = StatePending
	case st.Armed:
		st.State = StateArmed
	default:
		st.State = StateFree
	}
	if st.State != StateCooldown && !until.IsZero() && live == 0 {
		// A cooldown past its deadline that the holder has not written
		// away yet: it no longer holds the address back.
		st.Until = until
	}
	return st
}

// offsetOf is addr's offset inside its block of ipam.BlockSize addresses:
// the low ipam.BlockBits bits.
func offsetOf(addr netip.Addr) int {
	b := addr.As16()
	return (int(b[14])<<8 | int(b[15])) & (ipam.BlockSize - 1)
}

// has reports whether holder h's bitmap in m has offset off.
func has(m map[string]*ipam.Bitmap, h string, off int) bool {
	bm := m[h]
	return bm != nil && bm.Has(off)
}

// Place is where an address lies in a pool's ranges.
type Place struct {
	// State is "" for a usable address, else StateExcluded, StateGateway,
	// StateNetwork or StateBroadcast.
	State string
	// Range is the index of the range whose CIDR holds the address.
	Range int
	// Why says which field keeps a reserved address out, e.g.
	// "ranges[0].exclude" or "ranges[1].routes[0].via".
	Why string
}

// placeOf finds addr in pool's ranges (spec) and ranges (their parsed
// form): false when no range's CIDR holds it.
func placeOf(addr netip.Addr, spec []vmipamv1.IPRange, ranges *ipam.Ranges) (Place, bool) {
	for i, r := range spec {
		p, err := netip.ParsePrefix(r.CIDR)
		if err != nil || !p.Contains(addr) {
			continue
		}
		pl := Place{Range: i}
		if ranges != nil && ranges.Contains(addr) {
			return pl, true
		}
		field := fmt.Sprintf("ranges[%d]", i)
		hostBits := p.Addr().BitLen() - p.Bits()
		switch {
		case sameAddr(r.Gateway, addr):
			pl.State, pl.Why = StateGateway, field+".gateway"
		case slices.ContainsFunc(r.Routes, func(rt vmipamv1.Route) bool { return sameAddr(rt.Via, addr) }):
			j := slices.IndexFunc(r.Routes, func(rt vmipamv1.Route) bool { return sameAddr(rt.Via, addr) })
			pl.State, pl.Why = StateGateway, fmt.Sprintf("%s.routes[%d].via", field, j)
		case hostBits >= 2 && addr == p.Addr():
			pl.State, pl.Why = StateNetwork, field+".cidr"
		case hostBits >= 2 && addr.Is4() && addr == lastOf(p):
			pl.State, pl.Why = StateBroadcast, field+".cidr"
		default:
			pl.State, pl.Why = StateExcluded, excludedWhy(addr, field, r)
		}
		return pl, true
	}
	return Place{}, false
}

// excludedWhy names the field that keeps addr, inside r's CIDR, out.
func excludedWhy(addr netip.Addr, field string, r vmipamv1.IPRange) string {
	for _, e := range r.Exclude {
		if sameAddr(e, addr) {
			return field + ".exclude"
		}
		if p, err := netip.ParsePrefix(e); err == nil && p.Contains(addr) {
			return field + ".exclude"
		}
	}
	if f, err := netip.ParseAddr(r.First); err == nil && addr.Less(f) {
		return field + ".first"
	}
	if l, err := netip.ParseAddr(r.Last); err == nil && l.Less(addr) {
		return field + ".last"
	}
	return field
}

// sameAddr reports whether s spells addr.
func sameAddr(s string, addr netip.Addr) bool {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	return err == nil && a.Unmap() == addr
}

// lastOf is the last address of p.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
