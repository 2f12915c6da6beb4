package deploy

import (
	"net/netip"
	"testing"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/harness"
)

func TestSamples(t *testing.T) {
	harness.NeedControlPlane(t)
	r := mustRender(t, "deploy/samples")

	var pool vmipamv1.IPPool
	r.get(t, "IPPool", "", "default", &pool)
	if !pool.Spec.Default {
		t.Errorf("IPPool default is not the default pool")
	}
	if len(pool.Spec.Ranges) == 0 {
		t.Fatalf("IPPool default has no range")
	}
	hasExclude := false
	for _, rg := range pool.Spec.Ranges {
		hasExclude = hasExclude || len(rg.Exclude) > 0
	}
	if !hasExclude {
		t.Errorf("IPPool default shows no exclude")
	}
	if pool.Spec.Cooldown == nil || pool.Spec.Cooldown.Duration <= 0 || pool.Spec.PendingTTL == nil || pool.Spec.PendingTTL.Duration <= 0 {
		t.Errorf("IPPool default sets no cooldown or pendingTTL")
	}

	vms := r.ofKind("VirtualMachine")
	if len(vms) != 3 {
		t.Errorf("%d VirtualMachines, want 3", len(vms))
	}
	var static int
	for _, o := range vms {
		var vm vmipamv1.VirtualMachine
		convert(t, o, &vm)
		if vm.Namespace != "default" {
			t.Errorf("VirtualMachine %s is in namespace %q, want default", vm.Name, vm.Namespace)
		}
		if vm.Spec.IPPool != "" && vm.Spec.IPPool != pool.Name {
			t.Errorf("VirtualMachine %s names pool %q, which the samples do not create", vm.Name, vm.Spec.IPPool)
		}
		for _, a := range vm.Spec.Addresses {
			static++
			addr, err := netip.ParseAddr(a)
			if err != nil {
				t.Errorf("VirtualMachine %s: %v", vm.Name, err)
				continue
			}
			if !usable(t, pool, addr) {
				t.Errorf("VirtualMachine %s asks for %s, which pool %s never hands out", vm.Name, addr, pool.Name)
			}
		}
	}
	if static != 1 {
		t.Errorf("%d VirtualMachines ask for a static address, want 1", static)
	}

	// The API server checks the samples against the CRDs' schemas and
	// validation rules (vmipam's webhooks are not registered here).
	r.dryRun(t)
}

// usable tells whether addr lies in a range of pool, outside its excludes
// and is not a network or IPv4 broadcast address.
func usable(t *testing.T, pool vmipamv1.IPPool, addr netip.Addr) bool {
	t.Helper()
	for _, rg := range pool.Spec.Ranges {
		p, err := netip.ParsePrefix(rg.CIDR)
		if err != nil {
			t.Errorf("pool %s: %v", pool.Name, err)
			continue
		}
		if !p.Contains(addr) || addr == p.Masked().Addr() || (addr.Is4() && p.Bits() < 31 && addr == broadcast(p)) {
			continue
		}
		if rg.First != "" && addr.Less(parseAddr(t, rg.First)) || rg.Last != "" && parseAddr(t, rg.Last).Less(addr) {
			continue
		}
		excluded := false
		for _, e := range rg.Exclude {
			ep, err := netip.ParsePrefix(e)
			if a, aerr := netip.ParseAddr(e); aerr == nil {
				ep, err = netip.PrefixFrom(a, a.BitLen()), nil
			}
			if err != nil {
				t.Errorf("pool %s: exclude %q: %v", pool.Name, e, err)
				continue
			}
			excluded = excluded || ep.Contains(addr)
		}
		if !excluded {
			return true
		}
	}
	return false
}

func broadcast(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom4(b)
}

func parseAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Errorf("%v", err)
	}
	return a
}
