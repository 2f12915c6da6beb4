package harness

import (
	"fmt"
	"net/netip"
	"slices"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Space is the addresses a pool hands out, e.g. *ipam.Ranges or Prefixes.
type Space interface {
	Contains(a netip.Addr) bool
	String() string
}

// Prefixes is a Space of whole prefixes, one per family.
type Prefixes []netip.Prefix

// Contains reports whether one of the prefixes contains a.
func (ps Prefixes) Contains(a netip.Addr) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
}

func (ps Prefixes) String() string { return fmt.Sprint([]netip.Prefix(ps)) }

// Addresses parses the addresses of vm, which must be families addresses
// of sp, each of its own family, or says what is wrong with them.
func Addresses(vm *vmipamv1.VirtualMachine, families int, sp Space) ([]netip.Addr, error) {
	if len(vm.Spec.Addresses) != families {
		return nil, fmt.Errorf("addresses %v, want %d", vm.Spec.Addresses, families)
	}
	var out []netip.Addr
	for i, s := range vm.Spec.Addresses {
		a, err := netip.ParseAddr(s)
		if err != nil || !sp.Contains(a) || i > 0 && a.Is4() == out[0].Is4() {
			return nil, fmt.Errorf("%q, not one usable address of each family of %s", s, sp)
		}
		out = append(out, a)
	}
	return out, nil
}

// UsableOf counts the addresses vmipam hands out in an IPv4 CIDR: all but
// the network and broadcast addresses.
func UsableOf(p netip.Prefix) int {
	return 1<<(32-p.Bits()) - 2
}

// AddrAt returns the address at offset off of a prefix of either family.
func AddrAt(p netip.Prefix, off int) netip.Addr {
	if p.Addr().Is4() {
		b := p.Addr().As4()
		v := (uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])) + uint32(off)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	b := p.Addr().As16()
	carry := uint(off)
	for i := 15; i >= 0 && carry > 0; i-- {
		sum := uint(b[i]) + carry
		b[i], carry = byte(sum), sum>>8
	}
	return netip.AddrFrom16(b)
}
