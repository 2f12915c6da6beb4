package replicas

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools"
)

// TestStaticFromAnotherReplica asks, REPLICAS_STATICS times (40), for a
// static address that the IPBlocks show claimed by some replica, not
// cooling down, and that no VM holds (free there, armed or not; armed
// every other time when it can), through the proxy, which sends the
// create to any replica: every request is granted,
// and those that another replica answered (the VM's holder label names
// the replica that stamped it) are hand-overs, timed.
func TestStaticFromAnotherReplica(t *testing.T) {
	s := newSuite(t)
	s.startReplicas(3)
	n := envInt(t, "REPLICAS_STATICS", 40, 1)
	prefix, _ := s.createPool(poolSpec{name: "static", cidr: "10.70.0.0/24", cooldown: time.Minute, pendingTTL: time.Minute})
	// Let every replica claim its share. Nothing else allocates in the
	// pool: the addresses of these and of the test's own VMs are the only
	// ones in use, whatever the blocks' last writes show.
	used := map[netip.Addr]bool{}
	for i := range 6 {
		vm, err := s.create(s.ctx, fmt.Sprintf("warm-%d", i), "static")
		if err != nil {
			t.Fatal(err)
		}
		used[netip.MustParseAddr(vm.Spec.Addresses[0])] = true
	}
	var handovers, local []time.Duration
	for i := range n {
		bs, err := s.blocks(s.ctx, "static")
		if err != nil {
			t.Fatal(err)
		}
		a, holder, armed := freeIn(bs, prefix, used, i)
		if !a.IsValid() {
			t.Fatalf("request %d: the blocks show no address free at any replica", i)
		}
		used[a] = true
		vm := &vmipamv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: fmt.Sprintf("static-%03d", i)},
			Spec:       vmipamv1.VirtualMachineSpec{IPPool: "static", Image: "replicas", CPUs: 1, Addresses: []string{a.String()}},
		}
		began := time.Now()
		if err := s.c.Create(s.ctx, vm); err != nil {
			t.Errorf("request %d: %s, free at %s (armed %v): %v", i, a, holder, armed, err)
			continue
		}
		took := time.Since(began)
		if got := vm.Spec.Addresses; len(got) != 1 || got[0] != a.String() {
			t.Errorf("request %d: asked for %s, got %v", i, a, got)
		}
		if vm.Labels[vmipamv1.HolderLabel] == pools.HolderLabelValue(holder) {
			local = append(local, took)
		} else {
			handovers = append(handovers, took)
		}
	}
	pct := func(d []time.Duration, p int) time.Duration {
		if len(d) == 0 {
			return 0
		}
		slices.Sort(d)
		return d[min(len(d)-1, len(d)*p/100)].Round(100 * time.Microsecond)
	}
	t.Logf("| static creates | answered by the holder | p50 | p99 | handed over by another replica | p50 | p99 |\n|---|---|---|---|---|---|---|\n| %d | %d | %v | %v | %d | %v | %v |",
		n, len(local), pct(local, 50), pct(local, 99), len(handovers), pct(handovers, 50), pct(handovers, 99))
	if len(handovers) == 0 {
		t.Error("no request was answered by a replica other than the address's holder: nothing was handed over")
	}
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
				a := addrAt(b.Prefix, off)
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
