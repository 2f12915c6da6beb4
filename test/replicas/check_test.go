package replicas

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/harness"
)

// liveState is the test namespace's VirtualMachines as the API server
// lists them, checked against each other.
type liveState struct {
	vms []vmipamv1.VirtualMachine
	// byAddr maps each address to the VM holding it.
	byAddr map[netip.Addr]string
	// dups: two VMs (terminating ones included) on one address; noAddr:
	// a VM without exactly one address of the pool; unstamped: a VM
	// lacking the pool and token annotations or the finalizer.
	dups, noAddr, unstamped []string
}

// live lists the namespace's VMs of pool (spec.ipPool) and checks their
// addresses.
func (s *suite) live(ctx context.Context, pool string, prefix netip.Prefix) (liveState, error) {
	var l vmipamv1.VirtualMachineList
	if err := s.c.List(ctx, &l, client.InNamespace(s.ns)); err != nil {
		return liveState{}, fmt.Errorf("list VirtualMachines: %w", err)
	}
	st := liveState{byAddr: map[netip.Addr]string{}}
	for i := range l.Items {
		if l.Items[i].Spec.IPPool == pool {
			st.vms = append(st.vms, l.Items[i])
		}
	}
	for i := range st.vms {
		vm := &st.vms[i]
		if len(vm.Spec.Addresses) != 1 {
			st.noAddr = append(st.noAddr, fmt.Sprintf("%s has addresses %v", vm.Name, vm.Spec.Addresses))
			continue
		}
		a, err := netip.ParseAddr(vm.Spec.Addresses[0])
		if err != nil || !prefix.Contains(a) {
			st.noAddr = append(st.noAddr, fmt.Sprintf("%s has %q, not an address of %s", vm.Name, vm.Spec.Addresses[0], prefix))
			continue
		}
		if other, dup := st.byAddr[a]; dup {
			st.dups = append(st.dups, fmt.Sprintf("%s on %s and %s%s", a, other, vm.Name, terminating(vm)))
		}
		st.byAddr[a] = vm.Name
		if vm.Annotations[vmipamv1.PoolAnnotation] != pool || vm.Annotations[vmipamv1.TokenAnnotation] == "" || !slices.Contains(vm.Finalizers, vmipamv1.Finalizer) {
			st.unstamped = append(st.unstamped, fmt.Sprintf("%s: annotations %v, finalizers %v", vm.Name, vm.Annotations, vm.Finalizers))
		}
	}
	sort.Strings(st.dups)
	return st, nil
}

func terminating(vm *vmipamv1.VirtualMachine) string {
	if vm.DeletionTimestamp != nil {
		return " (terminating)"
	}
	return ""
}

// checkLive fails the test on duplicates, VMs without an address and
// unstamped VMs; it returns the state.
func (s *suite) checkLive(when, pool string, prefix netip.Prefix) liveState {
	s.t.Helper()
	st, err := s.live(s.ctx, pool, prefix)
	if err != nil {
		s.t.Fatal(err)
	}
	if len(st.dups) > 0 {
		s.t.Errorf("DUPLICATES %s: %d addresses on two VMs:\n%s", when, len(st.dups), summarize(st.dups, 20))
	}
	if len(st.noAddr) > 0 {
		s.t.Errorf("VMs WITHOUT AN ADDRESS %s: %d:\n%s", when, len(st.noAddr), summarize(st.noAddr, 20))
	}
	if len(st.unstamped) > 0 {
		s.t.Errorf("UNSTAMPED VMs %s: %d:\n%s", when, len(st.unstamped), summarize(st.unstamped, 20))
	}
	return st
}

// blockState is a pool's IPBlocks, decoded.
type blockState struct {
	blocks []ipam.Block
	// claimedBy maps each claimed address to its holder.
	claimedBy map[netip.Addr]string
	// byHolder counts claims, inUse, armed and requests per holder.
	claims, inUse, armed map[string]int
	requests             map[string]bool
}

// blocks reads the pool's IPBlocks, each merged with its holders' shares.
func (s *suite) blocks(ctx context.Context, pool string) (blockState, error) {
	l, err := kubestore.Read(ctx, s.c, pool)
	if err != nil {
		return blockState{}, fmt.Errorf("read IPBlocks of %s: %w", pool, err)
	}
	bs := blockState{claimedBy: map[netip.Addr]string{}, claims: map[string]int{}, inUse: map[string]int{}, armed: map[string]int{}, requests: map[string]bool{}}
	for _, b := range l {
		bs.blocks = append(bs.blocks, b)
		for h, bm := range b.Claims {
			for off := range ipam.BlockSize {
				if bm.Has(off) {
					bs.claimedBy[harness.AddrAt(b.Prefix, off)] = h
					bs.claims[h]++
				}
			}
		}
		for _, f := range []struct {
			in  map[string]*ipam.Bitmap
			out map[string]int
		}{{b.InUse, bs.inUse}, {b.Armed, bs.armed}} {
			for h, bm := range f.in {
				for off := range ipam.BlockSize {
					if bm.Has(off) {
						f.out[h]++
					}
				}
			}
		}
		for h := range b.Requests {
			bs.requests[h] = true
		}
	}
	return bs, nil
}

// names reports whether the blocks name holder anywhere, and where.
func (bs blockState) names(holder string) []string {
	var where []string
	if n := bs.claims[holder]; n > 0 {
		where = append(where, fmt.Sprintf("claims (%d addresses)", n))
	}
	if n := bs.inUse[holder]; n > 0 {
		where = append(where, fmt.Sprintf("inUse (%d)", n))
	}
	if n := bs.armed[holder]; n > 0 {
		where = append(where, fmt.Sprintf("armed (%d)", n))
	}
	if bs.requests[holder] {
		where = append(where, "requests")
	}
	return where
}

// futureCooldowns lists the cooldown deadlines still ahead of now.
func (bs blockState) futureCooldowns(now time.Time) []string {
	var out []string
	for _, b := range bs.blocks {
		for a, until := range b.Cooldowns {
			if until.After(now) {
				out = append(out, fmt.Sprintf("%s until %s", a, until.Format(stamp)))
			}
		}
	}
	sort.Strings(out)
	return out
}

// fill creates want VMs in pool, named <prefix>-0000 on, each of which
// must get an address, and then one more, which must be refused
// (harness.Fill).
func (s *suite) fill(pool, prefix string, want int, led *harness.Ledger) harness.FillResult {
	return harness.Fill(s.ctx, harness.FillOptions{Want: want, Prefix: prefix, Ledger: led, Exhausted: isExhausted,
		Create: func(ctx context.Context, name string) (*vmipamv1.VirtualMachine, error) {
			return s.create(ctx, name, pool)
		}})
}

// checkLabels fails the test unless, within 15s, every VM of pool carries
// the holder label of the replica that claims its address (the only one
// whose watch delivers it): after a takeover, the taker relabels the VMs
// of the replica that left.
func (s *suite) checkLabels(when, pool string, prefix netip.Prefix) {
	s.t.Helper()
	var wrong []string
	err := harness.Poll(s.ctx, 500*time.Millisecond, 15*time.Second, func() error {
		st, err := s.live(s.ctx, pool, prefix)
		if err != nil {
			return err
		}
		bs, err := s.blocks(s.ctx, pool)
		if err != nil {
			return err
		}
		wrong = wrong[:0]
		for i := range st.vms {
			vm := &st.vms[i]
			if len(vm.Spec.Addresses) != 1 {
				continue
			}
			a, err := netip.ParseAddr(vm.Spec.Addresses[0])
			if err != nil {
				continue
			}
			holder, claimed := bs.claimedBy[a]
			if got := vm.Labels[vmipamv1.HolderLabel]; !claimed || got != pools.HolderLabelValue(holder) {
				wrong = append(wrong, fmt.Sprintf("%s%s on %s: labelled %q, claimed by %q", vm.Name, terminating(vm), a, got, holder))
			}
		}
		if len(wrong) > 0 {
			return fmt.Errorf("%d VMs", len(wrong))
		}
		return nil
	})
	if err != nil {
		s.t.Errorf("MISLABELLED VMs %s, 15s on (no replica's watch sees them): %v:\n%s", when, err, summarize(wrong, 20))
	}
}
