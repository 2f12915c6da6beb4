package ipam

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// u128 is an address as an unsigned 128-bit integer, so that range
// arithmetic is the same for both families. IPv4 addresses use only lo.
type u128 struct{ hi, lo uint64 }

func toU128(a netip.Addr) u128 {
	b := a.As16()
	return u128{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:])}
}

func fromU128(v u128, is4 bool) netip.Addr {
	if is4 {
		return netip.AddrFrom4([4]byte{byte(v.lo >> 24), byte(v.lo >> 16), byte(v.lo >> 8), byte(v.lo)})
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], v.hi)
	binary.BigEndian.PutUint64(b[8:], v.lo)
	return netip.AddrFrom16(b)
}

func (v u128) cmp(w u128) int {
	switch {
	case v.hi < w.hi:
		return -1
	case v.hi > w.hi:
		return 1
	case v.lo < w.lo:
		return -1
	case v.lo > w.lo:
		return 1
	}
	return 0
}

func (v u128) add(n uint64) u128 {
	lo, carry := bits.Add64(v.lo, n, 0)
	return u128{hi: v.hi + carry, lo: lo}
}

func (v u128) sub(w u128) u128 {
	lo, borrow := bits.Sub64(v.lo, w.lo, 0)
	return u128{hi: v.hi - w.hi - borrow, lo: lo}
}

func addSat(a, b uint64) uint64 {
	s, carry := bits.Add64(a, b, 0)
	if carry != 0 {
		return ^uint64(0)
	}
	return s
}

// lastAddr returns the highest address of p (p must be masked).
func lastAddr(p netip.Prefix) netip.Addr {
	is4 := p.Addr().Is4()
	width := 128
	if is4 {
		width = 32
	}
	hostBits := width - p.Bits()
	v := toU128(p.Addr())
	switch {
	case hostBits >= 128:
		return fromU128(u128{^uint64(0), ^uint64(0)}, is4)
	case hostBits >= 64:
		v.lo = ^uint64(0)
		v.hi |= (uint64(1) << (hostBits - 64)) - 1
	default:
		v.lo |= (uint64(1) << hostBits) - 1
	}
	return fromU128(v, is4)
}

// addrWidth is the number of bits in an address of a's family.
func addrWidth(a netip.Addr) int {
	if a.Is4() {
		return 32
	}
	return 128
}

// Canonical returns the one spelling of a that vmipam compares: an
// IPv4-mapped IPv6 address (::ffff:10.0.0.5) becomes the IPv4 address, and
// a zone is dropped. Every address that enters the Manager passes through
// it, so that no second spelling can hold an address twice.
func Canonical(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}
