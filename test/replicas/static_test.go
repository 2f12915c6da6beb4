package replicas

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
)

// TestStaticFromAnotherReplica asks, REPLICAS_STATICS times (40), for a
// static address that the IPBlocks show claimed by some replica, not
// cooling down, and that no VM holds (free there, armed or not; armed
// every other time when it can), through the proxy, which sends the
// create to any replica, in a pool of IPv4 and in one of both families
// (a RequireDualStack VM asking for one address of each, which may sit
// with two replicas): every request is granted,
// and those that another replica answered (the VM's holder label names
// the replica that stamped it) are hand-overs, timed.
func TestStaticFromAnotherReplica(t *testing.T) {
	s := newSuite(t)
	s.startReplicas(3)
	n := envInt(t, "REPLICAS_STATICS", 40, 1)
	var rows []string
	for _, row := range []struct {
		name     string
		prefixes []netip.Prefix // the pool's ranges; two: a VM of both families
	}{
		{name: "IPv4", prefixes: []netip.Prefix{netip.MustParsePrefix("10.70.0.0/24")}},
		{name: "dual-stack", prefixes: []netip.Prefix{netip.MustParsePrefix("10.71.0.0/24"), netip.MustParsePrefix("fd00:71::/120")}},
	} {
		pool := "static-" + strings.ToLower(strings.ReplaceAll(row.name, "-", ""))
		var cidrs []string
		for _, p := range row.prefixes {
			cidrs = append(cidrs, p.String())
		}
		if err := s.c.Create(s.ctx, fixture.Pool(pool, fixture.WithCIDRs(cidrs...), fixture.WithCooldown(time.Minute), fixture.WithPendingTTL(time.Minute))); err != nil {
			t.Fatalf("create IPPool %s: %v", pool, err)
		}
		s.pools = append(s.pools, pool)
		s.waitServing(pool, 60*time.Second)
		vmOf := func(name string, addrs []string) *vmipamv1.VirtualMachine {
			vm := &vmipamv1.VirtualMachine{
				ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: name},
				Spec:       vmipamv1.VirtualMachineSpec{IPPool: pool, Image: "replicas", CPUs: 1, Addresses: addrs},
			}
			if len(row.prefixes) > 1 {
				vm.Spec.IPFamilyPolicy = ptr.To(vmipamv1.RequireDualStack)
			}
			return vm
		}
		// Let every replica claim its share. Nothing else allocates in
		// the pool: the addresses of these and of the test's own VMs are
		// the only ones in use, whatever the blocks' last writes show.
		used := map[netip.Addr]bool{}
		for i := range 6 {
			vm := vmOf(fmt.Sprintf("%s-warm-%d", pool, i), nil)
			if err := s.c.Create(s.ctx, vm); err != nil {
				t.Fatal(err)
			}
			for _, a := range vm.Spec.Addresses {
				used[netip.MustParseAddr(a)] = true
			}
		}
		var handovers, local []time.Duration
		for i := range n {
			bs, err := s.blocks(s.ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			var addrs, holders, where []string
			for _, prefix := range row.prefixes {
				a, holder, armed := freeIn(bs, prefix, used, i)
				if !a.IsValid() {
					t.Fatalf("%s request %d: the blocks show no address of %s free at any replica", row.name, i, prefix)
				}
				used[a] = true
				addrs = append(addrs, a.String())
				holders = append(holders, holder)
				where = append(where, fmt.Sprintf("%s (armed %v)", holder, armed))
			}
			vm := vmOf(fmt.Sprintf("%s-%03d", pool, i), addrs)
			began := time.Now()
			if err := s.c.Create(s.ctx, vm); err != nil {
				t.Errorf("%s request %d: %v, free at %v: %v", row.name, i, addrs, where, err)
				continue
			}
			took := time.Since(began)
			if !slices.Equal(vm.Spec.Addresses, addrs) {
				t.Errorf("%s request %d: asked for %v, got %v", row.name, i, addrs, vm.Spec.Addresses)
			}
			// Handed over when the replica that answered holds none of
			// them (dual-stack: not both).
			answeredBy := vm.Labels[vmipamv1.HolderLabel]
			own := true
			for _, h := range holders {
				own = own && pools.HolderLabelValue(h) == answeredBy
			}
			if own {
				local = append(local, took)
			} else {
				handovers = append(handovers, took)
			}
		}
		rows = append(rows, fmt.Sprintf("| %s | %d | %d | %v | %v | %d | %v | %v |", row.name,
			n, len(local), quantile(local, 50), quantile(local, 99), len(handovers), quantile(handovers, 50), quantile(handovers, 99)))
		if len(handovers) == 0 {
			t.Errorf("%s: no request was answered by a replica other than the addresses' holders: nothing was handed over", row.name)
		}
	}
	t.Logf("| pool | static creates | answered by the holder | p50 | p99 | handed over by another replica | p50 | p99 |\n|---|---|---|---|---|---|---|---|\n%s",
		strings.Join(rows, "\n"))
}

// freeIn picks an address of the blocks that a holder claims, not in used
// and not cooling down; the i-th request prefers
// an armed one every other time. It returns the address, its holder and
// whether it was armed.
func freeIn(bs blockState, prefix netip.Prefix, used map[netip.Addr]bool, i int) (netip.Addr, string, bool) {
	now := time.Now()
	var pick netip.Addr
	var holder string
	var armed bool
	for _, b := range bs.blocks {
		for h, bm := range b.Claims {
			for off := range ipam.BlockSize {
				a := harness.AddrAt(b.Prefix, off)
				if !bm.Has(off) || used[a] || !prefix.Contains(a) {
					continue
				}
				if d, ok := b.Cooldowns[a]; ok && d.After(now) {
					continue
				}
				isArmed := has(b.Armed, h, off)
				if !pick.IsValid() || isArmed == (i%2 == 0) && armed != isArmed {
					pick, holder, armed = a, h, isArmed
				}
			}
		}
	}
	return pick, holder, armed
}

func has(m map[string]*ipam.Bitmap, h string, off int) bool {
	bm := m[h]
	return bm != nil && bm.Has(off)
}
