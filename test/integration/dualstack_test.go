package integration

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/test/harness"
)

// dualVM builds a VirtualMachine of pool with the family policy given.
func dualVM(ns, name, pool string, policy vmipamv1.IPFamilyPolicy, addrs ...string) *vmipamv1.VirtualMachine {
	v := vm(ns, name, pool, addrs...)
	v.Spec.IPFamilyPolicy = ptr.To(policy)
	return v
}

// TestDualStack: 32 clients create dual-stack VMs from a pool with ranges
// of both families: each VM holds an IPv4 and an IPv6 address, each bound
// to it, with every address distinct per family, and its network carries
// both. A static pair and a static single work. Deleting a VM puts both of
// its addresses into cooldown.
func TestDualStack(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "dual", []vmipamv1.IPRange{
		{CIDR: "10.160.0.0/24", Gateway: "10.160.0.1"},
		{CIDR: "fd00:160::/120", Gateway: "fd00:160::1"},
	})
	ctx := t.Context()
	const clients, perClient = 32, 4
	var wg sync.WaitGroup
	errs := make(chan error, clients*perClient)
	for c := range clients {
		wg.Go(func() {
			for i := range perClient {
				if err := createWithRetry(ctx, dualVM(ns, fmt.Sprintf("vm-%02d-%d", c, i), "dual", vmipamv1.RequireDualStack)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("create: %v", err)
	}
	pool := v.reg.Get("dual")
	seen := map[netip.Addr]string{}
	vms := listVMs(t, ns)
	if len(vms) != clients*perClient {
		t.Fatalf("%d VMs, want %d", len(vms), clients*perClient)
	}
	for _, x := range vms {
		if len(x.Spec.Addresses) != 2 {
			t.Errorf("%s holds %v, want an IPv4 and an IPv6 address", x.Name, x.Spec.Addresses)
			continue
		}
		a4, a6 := netip.MustParseAddr(x.Spec.Addresses[0]), netip.MustParseAddr(x.Spec.Addresses[1])
		if !a4.Is4() || !a6.Is6() || !netip.MustParsePrefix("10.160.0.0/24").Contains(a4) || !netip.MustParsePrefix("fd00:160::/120").Contains(a6) {
			t.Errorf("%s holds %s and %s; want IPv4 then IPv6, of the pool", x.Name, a4, a6)
		}
		for _, a := range []netip.Addr{a4, a6} {
			if other, dup := seen[a]; dup {
				t.Errorf("DUPLICATE: %s on %s and %s", a, other, x.Name)
			}
			seen[a] = x.Name
		}
		if n := x.Spec.Network; n == nil || len(n.Addresses) != 2 || n.Addresses[0] != a4.String()+"/24" || n.Addresses[1] != a6.String()+"/120" ||
			len(n.Gateways) != 2 || n.Gateways[0] != "10.160.0.1" || n.Gateways[1] != "fd00:160::1" {
			t.Errorf("%s: network %+v", x.Name, x.Spec.Network)
		}
		if got := x.Annotations[vmipamv1.AddressAnnotation]; got != a4.String()+","+a6.String() {
			t.Errorf("%s: address annotation %q", x.Name, got)
		}
	}
	harness.Eventually(t, 20*time.Second, "every address bound", func() error {
		for _, x := range vms {
			for _, s := range x.Spec.Addresses {
				if st, o, _ := pool.Lookup(netip.MustParseAddr(s)); st != ipam.StateAllocated || o.UID != string(x.UID) {
					return fmt.Errorf("%s of %s is %s for %q", s, x.Name, st, o.UID)
				}
			}
		}
		return nil
	})
	// Static requests: a pair (IPv6 first), and one IPv6 address alone.
	pair := dualVM(ns, "pair", "dual", vmipamv1.RequireDualStack, "fd00:160::f0", "10.160.0.240")
	if err := k8sClient.Create(ctx, pair); err != nil {
		t.Fatalf("static pair: %v", err)
	}
	if strings.Join(pair.Spec.Addresses, ",") != "fd00:160::f0,10.160.0.240" {
		t.Errorf("static pair stored as %v", pair.Spec.Addresses)
	}
	single := vm(ns, "single", "dual", "fd00:160::f1")
	if err := k8sClient.Create(ctx, single); err != nil {
		t.Fatalf("static IPv6 alone: %v", err)
	}
	if strings.Join(single.Spec.Addresses, ",") != "fd00:160::f1" {
		t.Errorf("static single stored as %v", single.Spec.Addresses)
	}
	// The set is immutable once assigned.
	edit := pair.DeepCopy()
	edit.Spec.Addresses = edit.Spec.Addresses[:1]
	if err := k8sClient.Update(ctx, edit); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.addresses is immutable") {
		t.Errorf("dropping an address of the pair: %v; want it refused", err)
	}
	// Delete puts both addresses into cooldown.
	harness.Eventually(t, 10*time.Second, "the pair bound", func() error {
		for _, s := range pair.Spec.Addresses {
			if st, _, _ := pool.Lookup(netip.MustParseAddr(s)); st != ipam.StateAllocated {
				return fmt.Errorf("%s is %s", s, st)
			}
		}
		return nil
	})
	if err := k8sClient.Delete(ctx, pair); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "the pair gone, both addresses cooling down", func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pair), &vmipamv1.VirtualMachine{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %w", err)
		}
		for _, s := range pair.Spec.Addresses {
			if st, _, until := pool.Lookup(netip.MustParseAddr(s)); st != ipam.StateCooldown || !until.Equal(epoch.Add(time.Minute)) {
				return fmt.Errorf("%s is %s until %s", s, st, until)
			}
		}
		return nil
	})
}

// TestDualStackExhausted: RequireDualStack against an exhausted IPv6 range
// is refused with a message naming the family, and leaves the IPv4 counts
// as they were; PreferDualStack gets its IPv4 address, says why in an
// annotation and an event, and the pool's status counts each family and
// shows it exhausted.
func TestDualStackExhausted(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "tight", []vmipamv1.IPRange{{CIDR: "10.161.0.0/24"}, {CIDR: "fd00:161::/127"}})
	ctx := t.Context()
	for i := range 2 {
		if err := k8sClient.Create(ctx, dualVM(ns, fmt.Sprintf("vm-%d", i), "tight", vmipamv1.RequireDualStack)); err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
	}
	pool := v.reg.Get("tight")
	before, _ := pool.FamilySnapshot(vmipamv1.IPv4)
	err := k8sClient.Create(ctx, dualVM(ns, "third", "tight", vmipamv1.RequireDualStack))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `pool "tight" has no IPv6 address left: `) {
		t.Fatalf("RequireDualStack with IPv6 exhausted: %v", err)
	}
	if after, _ := pool.FamilySnapshot(vmipamv1.IPv4); after.Pending+after.Allocated != before.Pending+before.Allocated {
		t.Errorf("IPv4 counts moved from %+v to %+v: the refused create kept its IPv4 reservation", before, after)
	}
	pref := dualVM(ns, "prefers", "tight", vmipamv1.PreferDualStack)
	if err := k8sClient.Create(ctx, pref); err != nil {
		t.Fatalf("PreferDualStack with IPv6 exhausted: %v", err)
	}
	if len(pref.Spec.Addresses) != 1 || !netip.MustParseAddr(pref.Spec.Addresses[0]).Is4() ||
		!strings.Contains(pref.Annotations[vmipamv1.SingleStackAnnotation], "no IPv6 address") {
		t.Errorf("PreferDualStack got %v with %q", pref.Spec.Addresses, pref.Annotations[vmipamv1.SingleStackAnnotation])
	}
	harness.Eventually(t, 10*time.Second, "the SingleStack event", func() error {
		return wantEvent(ctx, ns, "prefers", "SingleStack")
	})
	harness.Eventually(t, 10*time.Second, "the status per family", func() error {
		var p vmipamv1.IPPool
		if err := k8sClient.Get(ctx, client.ObjectKey{Name: "tight"}, &p); err != nil {
			return err
		}
		want := []vmipamv1.FamilyStatus{
			{Family: vmipamv1.IPv4, Usable: 254, Allocated: 3},
			{Family: vmipamv1.IPv6, Usable: 2, Allocated: 2},
		}
		got := make([]vmipamv1.FamilyStatus, len(p.Status.Families))
		for i, f := range p.Status.Families {
			got[i] = vmipamv1.FamilyStatus{Family: f.Family, Usable: f.Usable, Allocated: f.Allocated}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("families %+v, want %+v", p.Status.Families, want)
		}
		if c := poolCondition(t, "tight", vmipamv1.ConditionExhausted); c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "IPv6: 2 allocated") {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
	for fam, want := range map[string]int{"IPv4": 3, "IPv6": 2} {
		if got := gauge(t, "vmipam_pool_family_addresses", map[string]string{"pool": "tight", "family": fam, "state": "allocated"}); got != want {
			t.Errorf("vmipam_pool_family_addresses{family=%q,state=allocated} = %d, want %d", fam, got, want)
		}
	}
}
