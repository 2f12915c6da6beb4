package deploy

import (
	"net/netip"
	"testing"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools"
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

// usable tells whether pool hands addr out, as the allocator reads the
// pool's ranges (exclusions, gateway and next hops, network and broadcast
// addresses).
func usable(t *testing.T, pool vmipamv1.IPPool, addr netip.Addr) bool {
	t.Helper()
	r, err := ipam.ParseRanges(pools.RangeSpecs(pool.Spec.Ranges))
	if err != nil {
		t.Errorf("pool %s: %v", pool.Name, err)
		return false
	}
	return r.Contains(addr)
}
