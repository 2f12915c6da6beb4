package integration

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/history"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/harness"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// listVMs returns the pool's live VirtualMachines in ns, from the API server.
func listVMs(t *testing.T, ns string) []vmipamv1.VirtualMachine {
	t.Helper()
	var l vmipamv1.VirtualMachineList
	if err := k8sClient.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		t.Fatalf("list VirtualMachines: %v", err)
	}
	return l.Items
}

// checkDistinct fails if two VMs share an address or one lacks it.
func checkDistinct(t *testing.T, vms []vmipamv1.VirtualMachine, prefix netip.Prefix) map[netip.Addr]string {
	t.Helper()
	seen := map[netip.Addr]string{}
	for _, v := range vms {
		if len(v.Spec.Addresses) != 1 {
			t.Errorf("VirtualMachine %s has addresses %v, want one", v.Name, v.Spec.Addresses)
			continue
		}
		a := netip.MustParseAddr(v.Spec.Addresses[0])
		if !prefix.Contains(a) {
			t.Errorf("VirtualMachine %s has %s outside its pool %s", v.Name, a, prefix)
		}
		if other, dup := seen[a]; dup {
			t.Errorf("DUPLICATE: %s on %s and %s", a, other, v.Name)
		}
		seen[a] = v.Name
	}
	return seen
}

func TestConcurrentCreates(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "concurrent", []vmipamv1.IPRange{{CIDR: "10.10.0.0/22"}})
	const clients, perClient = 32, 16 // 512 VirtualMachines
	var wg sync.WaitGroup
	errs := make(chan error, clients*perClient)
	for c := range clients {
		wg.Go(func() {
			for i := range perClient {
				if err := createWithRetry(t.Context(), vm(ns, fmt.Sprintf("vm-%02d-%02d", c, i), "concurrent")); err != nil {
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
	vms := listVMs(t, ns)
	if len(vms) != clients*perClient {
		t.Fatalf("%d VirtualMachines, want %d", len(vms), clients*perClient)
	}
	checkDistinct(t, vms, netip.MustParsePrefix("10.10.0.0/22"))
	for _, vm := range vms {
		if vm.Annotations[vmipamv1.PoolAnnotation] != "concurrent" || vm.Annotations[vmipamv1.TokenAnnotation] == "" || len(vm.Finalizers) != 1 {
			t.Fatalf("VirtualMachine %s not fully stamped: %v %v", vm.Name, vm.Annotations, vm.Finalizers)
		}
	}
	// The controller binds every reservation, and the status shows it.
	harness.Eventually(t, 30*time.Second, "every reservation bound", func() error {
		p := &vmipamv1.IPPool{}
		if err := k8sClient.Get(t.Context(), client.ObjectKey{Name: "concurrent"}, p); err != nil {
			return err
		}
		if p.Status.Allocated != int64(clients*perClient) || p.Status.Pending != 0 {
			return fmt.Errorf("status allocated=%d pending=%d", p.Status.Allocated, p.Status.Pending)
		}
		return nil
	})
	// The metrics say the same.
	if got := gauge(t, "vmipam_pool_addresses", map[string]string{"pool": "concurrent", "state": "allocated"}); got != clients*perClient {
		t.Errorf("vmipam_pool_addresses{state=allocated} = %v, want %d", got, clients*perClient)
	}
	if n := histogramCount(t, "vmipam_admission_duration_seconds", map[string]string{"webhook": "virtualmachine-mutating", "outcome": "allowed"}); n < clients*perClient {
		t.Errorf("admission latency observed %d times, want at least %d", n, clients*perClient)
	}
}

func TestDeleteCooldown(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "cooldown", []vmipamv1.IPRange{{CIDR: "10.20.0.0/29"}}, func(p *vmipamv1.IPPool) {
		p.Spec.Cooldown.Duration = 10 * time.Minute
	})
	ctx := t.Context()
	var first string
	for i := range 6 {
		obj := vm(ns, fmt.Sprintf("vm-%d", i), "cooldown")
		if err := k8sClient.Create(ctx, obj); err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		if i == 0 {
			first = obj.Spec.Addresses[0]
		}
	}
	victim := &vmipamv1.VirtualMachine{}
	if err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm-0"}, victim); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "vm-0 bound", func() error {
		if st, _, _ := v.reg.Get("cooldown").Lookup(netip.MustParseAddr(first)); st != ipam.StateAllocated {
			return fmt.Errorf("state %s", st)
		}
		return nil
	})
	if err := k8sClient.Delete(ctx, victim); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "vm-0 gone", func() error {
		err := k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "vm-0"}, &vmipamv1.VirtualMachine{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %w", err)
	})
	// Its tenure is in the history, stored before the finalizer went.
	recs, err := history.Read(ctx, k8sClient, netip.MustParseAddr(first))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].UID != string(victim.UID) || recs[0].Name != "vm-0" || recs[0].Namespace != ns ||
		recs[0].Kind != "VirtualMachine.vmipam.io" || recs[0].Pool != "cooldown" || recs[0].Ended != vmipamv1.EndedAllocated ||
		recs[0].From == nil || !recs[0].From.Equal(&victim.CreationTimestamp) || recs[0].To.IsZero() {
		t.Fatalf("history of %s = %+v, want vm-0's tenure (uid %s, from %s)", first, recs, victim.UID, victim.CreationTimestamp)
	}
	// The release reaches the store with the next batched flush (its claim
	// was stored before it was handed out, so the object need not wait).
	harness.Eventually(t, 10*time.Second, "the cooldown persisted", func() error {
		blocks, err := kubestore.Read(ctx, k8sClient, "cooldown")
		if err != nil {
			return err
		}
		if len(blocks) != 1 || len(blocks[0].Cooldowns) == 0 {
			return fmt.Errorf("blocks of pool cooldown: %+v", blocks)
		}
		return nil
	})
	// Inside the cooldown: exhausted, and the message says when it frees.
	clk.Step(9 * time.Minute)
	err = k8sClient.Create(ctx, vm(ns, "too-early", "cooldown"))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exhausted") || !strings.Contains(err.Error(), "the next address frees at 2026-01-01T00:10:00Z") {
		t.Fatalf("create inside the cooldown: %v; want a denial saying the pool is exhausted and when the next address frees", err)
	}
	// Asking for it by name says it cools down, and until when.
	err = k8sClient.Create(ctx, vm(ns, "static-early", "cooldown", first))
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.addresses[0]") || !strings.Contains(err.Error(), "cools down until 2026-01-01T00:10:00Z") {
		t.Fatalf("static request inside the cooldown: %v", err)
	}
	clk.Step(time.Minute)
	late := vm(ns, "after", "cooldown")
	if err := k8sClient.Create(ctx, late); err != nil {
		t.Fatalf("create after the cooldown: %v", err)
	}
	if late.Spec.Addresses[0] != first {
		t.Fatalf("after the cooldown got %s, want the released %s", late.Spec.Addresses[0], first)
	}
}

func TestDryRunAndGenerateName(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "dryrun", []vmipamv1.IPRange{{CIDR: "10.30.0.0/24"}})
	ctx := t.Context()
	before := v.reg.Get("dryrun").Snapshot()
	dry := vm(ns, "dry", "dryrun")
	if err := k8sClient.Create(ctx, dry, client.DryRunAll); err != nil {
		t.Fatalf("dry-run create: %v", err)
	}
	if len(dry.Spec.Addresses) != 0 || dry.Annotations[vmipamv1.TokenAnnotation] != "" {
		t.Fatalf("dry run reserved something: %v %v", dry.Spec.Addresses, dry.Annotations)
	}
	if after := v.reg.Get("dryrun").Snapshot(); after.Pending != before.Pending || after.Allocated != before.Allocated {
		t.Fatalf("dry run changed the pool: %+v -> %+v", before, after)
	}
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dry), &vmipamv1.VirtualMachine{}); !apierrors.IsNotFound(err) {
		t.Fatalf("dry run left an object: %v", err)
	}
	// A token copied from another object does not survive a dry run
	// either: the real create would replace it with a fresh one.
	copied := vm(ns, "copied", "dryrun")
	copied.Annotations = map[string]string{vmipamv1.TokenAnnotation: "copied-token", "keep": "me"}
	if err := k8sClient.Create(ctx, copied, client.DryRunAll); err != nil {
		t.Fatalf("dry-run create with a copied token: %v", err)
	}
	if _, ok := copied.Annotations[vmipamv1.TokenAnnotation]; ok || copied.Annotations["keep"] != "me" || copied.Annotations[vmipamv1.PoolAnnotation] != "dryrun" {
		t.Fatalf("dry run with a copied token answered annotations %v; want the token gone, the pool stamped, the rest kept", copied.Annotations)
	}
	gen := vm(ns, "", "dryrun")
	gen.GenerateName = "web-"
	if err := k8sClient.Create(ctx, gen); err != nil {
		t.Fatalf("create with generateName: %v", err)
	}
	if !strings.HasPrefix(gen.Name, "web-") || len(gen.Spec.Addresses) != 1 {
		t.Fatalf("generateName create: name %q addresses %v", gen.Name, gen.Spec.Addresses)
	}
	if gen.Spec.Addresses[0] != "10.30.0.1" {
		t.Fatalf("got %s, want the first address 10.30.0.1 (the dry run must not have used it)", gen.Spec.Addresses[0])
	}
}

func TestStaticRequests(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "static", []vmipamv1.IPRange{{CIDR: "10.40.0.0/28"}})
	ctx := t.Context()
	a := vm(ns, "a", "static", "10.40.0.9")
	if err := k8sClient.Create(ctx, a); err != nil {
		t.Fatalf("static request for a free address: %v", err)
	}
	if a.Spec.Addresses[0] != "10.40.0.9" || a.Annotations[vmipamv1.TokenAnnotation] == "" {
		t.Fatalf("static request stamped %v %v", a.Spec.Addresses, a.Annotations)
	}
	harness.Eventually(t, 10*time.Second, "a bound", func() error {
		if st, _, _ := v.reg.Get("static").Lookup(netip.MustParseAddr("10.40.0.9")); st != ipam.StateAllocated {
			return fmt.Errorf("state %s", st)
		}
		return nil
	})
	tests := map[string]struct {
		obj  *vmipamv1.VirtualMachine
		want []string
	}{
		"taken": {vm(ns, "b", "static", "10.40.0.9"), []string{"spec.addresses[0]", "10.40.0.9", "allocated to " + ns + "/a (UID " + string(a.UID) + ")"}},
		"outside the pool": {vm(ns, "c", "static", "10.41.0.1"),
			[]string{"spec.addresses[0]", "outside IPPool static (usable: 10.40.0.1-10.40.0.14)"}},
		"broadcast":      {vm(ns, "d", "static", "10.40.0.15"), []string{"spec.addresses[0]", "outside IPPool static"}},
		"not an address": {vm(ns, "e", "static", "10.40.0.x"), []string{"spec.addresses[0]", "not an IP address"}},
		"unknown pool":   {vm(ns, "f", "nope"), []string{"spec.ipPool", `IPPool "nope" does not exist`}},
		"two addresses":  {vm(ns, "g", "static", "10.40.0.2", "10.40.0.3"), []string{"spec.addresses"}},
		"dry run, taken": {vm(ns, "h", "static", "10.40.0.9"), []string{"allocated to " + ns + "/a"}},
		"copied stamp": {func() *vmipamv1.VirtualMachine {
			c := vm(ns, "copy", "static", "10.40.0.9")
			c.Annotations = map[string]string{vmipamv1.TokenAnnotation: a.Annotations[vmipamv1.TokenAnnotation], vmipamv1.PoolAnnotation: "static"}
			return c
		}(), []string{"spec.addresses[0]", "allocated to " + ns + "/a (UID " + string(a.UID) + ")"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var opts []client.CreateOption
			if strings.HasPrefix(name, "dry run") {
				opts = append(opts, client.DryRunAll)
			}
			err := k8sClient.Create(ctx, tc.obj, opts...)
			if err == nil {
				t.Fatalf("created %s with %v; want a denial", tc.obj.Name, tc.obj.Spec.Addresses)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	// The address and the stamp are immutable: the API server says so
	// (the CRD's rule and vmipam's ValidatingAdmissionPolicy).
	refused := func(err error) bool { return apierrors.IsInvalid(err) || apierrors.IsForbidden(err) }
	t.Run("immutable", func(t *testing.T) {
		cur := &vmipamv1.VirtualMachine{}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(a), cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.Addresses = []string{"10.40.0.10"}
		if err := k8sClient.Update(ctx, cur); !refused(err) || !strings.Contains(err.Error(), "immutable") {
			t.Fatalf("changing the address: %v", err)
		}
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(a), cur)
		cur.Annotations[vmipamv1.TokenAnnotation] = "forged"
		if err := k8sClient.Update(ctx, cur); !refused(err) || !strings.Contains(err.Error(), vmipamv1.TokenAnnotation) {
			t.Fatalf("changing the token: %v", err)
		}
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(a), cur)
		cur.Annotations = nil
		if err := k8sClient.Update(ctx, cur); !refused(err) || !strings.Contains(err.Error(), "immutable once set") {
			t.Fatalf("removing the annotations: %v", err)
		}
	})
	// No update of a VM calls vmipam: the API server refuses those that
	// change what vmipam stamped, and lets the others through.
	t.Run("updates call no webhook", func(t *testing.T) {
		updates := []struct {
			name    string
			change  func(*vmipamv1.VirtualMachine)
			refused bool
		}{
			{"label", func(v *vmipamv1.VirtualMachine) { v.Labels["tier"] = "db" }, false},
			{"other annotation", func(v *vmipamv1.VirtualMachine) { v.Annotations["note"] = "x" }, false},
			{"spec beside the address", func(v *vmipamv1.VirtualMachine) { v.Spec.Image = "other" }, false},
			{"finalizers (added)", func(v *vmipamv1.VirtualMachine) { v.Finalizers = append(v.Finalizers, "example.com/other") }, false},
			{"finalizers (removed)", func(v *vmipamv1.VirtualMachine) { v.Finalizers = v.Finalizers[:len(v.Finalizers)-1] }, false},
			{"address", func(v *vmipamv1.VirtualMachine) { v.Spec.Addresses = []string{"10.40.0.11"} }, true},
			{"no address", func(v *vmipamv1.VirtualMachine) { v.Spec.Addresses = nil }, true},
			{"pool", func(v *vmipamv1.VirtualMachine) { v.Annotations[vmipamv1.PoolAnnotation] = "other" }, true},
		}
		for _, u := range updates {
			cur := &vmipamv1.VirtualMachine{}
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(a), cur); err != nil {
				t.Fatal(err)
			}
			before := admissions(t, "virtualmachine-validating") + admissions(t, "virtualmachine-mutating")
			u.change(cur)
			err := k8sClient.Update(ctx, cur)
			calls := admissions(t, "virtualmachine-validating") + admissions(t, "virtualmachine-mutating") - before
			switch {
			case calls != 0:
				t.Errorf("update of the %s: %d webhook calls; want none", u.name, calls)
			case u.refused && !refused(err):
				t.Errorf("update of the %s: %v; want it refused by the API server", u.name, err)
			case !u.refused && err != nil:
				t.Errorf("update of the %s: %v; want success", u.name, err)
			}
		}
	})
}

func TestExhaustion(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "tiny", []vmipamv1.IPRange{{CIDR: "10.50.0.0/30"}})
	ctx := t.Context()
	for i := range 2 {
		if err := k8sClient.Create(ctx, vm(ns, fmt.Sprintf("vm-%d", i), "tiny")); err != nil {
			t.Fatal(err)
		}
	}
	err := k8sClient.Create(ctx, vm(ns, "third", "tiny"))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `pool "tiny" is exhausted`) {
		t.Fatalf("third create in a /30: %v", err)
	}
	harness.Eventually(t, 10*time.Second, "the Exhausted condition", func() error {
		if c := poolCondition(t, "tiny", vmipamv1.ConditionExhausted); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("condition %+v", c)
		}
		return nil
	})
}

// TestRestart restarts vmipam in the middle of a create/delete run, as a
// crash would, and checks from the API server that no two VMs share an
// address, every VM has one, and no address was reused inside its cooldown
// (the fake clock never advances, so no cooldown ends: no address may be
// handed out twice at all).
func TestRestart(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "restart", []vmipamv1.IPRange{{CIDR: "10.70.0.0/19"}})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// No cooldown ends, so every create uses up an address for good: each
	// of the three runs (before, between and after the restarts) may create
	// at most perRun VMs, so that a fast machine cannot exhaust the pool
	// (8190 usable) and every run still creates.
	const perRun = 2000
	var budget atomic.Int64
	budget.Store(perRun)
	var mu sync.Mutex
	everHanded := map[string]string{} // address -> first VM given it
	var failures []error
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				if budget.Add(-1) < 0 {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				obj := vm(ns, fmt.Sprintf("r-%d-%d", c, i), "restart")
				if err := createWithRetry(ctx, obj); err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						failures = append(failures, err)
						mu.Unlock()
					}
					return
				}
				mu.Lock()
				if prev, ok := everHanded[obj.Spec.Addresses[0]]; ok {
					failures = append(failures, fmt.Errorf("REUSE: %s given to %s after %s, inside its cooldown", obj.Spec.Addresses[0], obj.Name, prev))
				}
				everHanded[obj.Spec.Addresses[0]] = obj.Name
				mu.Unlock()
				if i%2 == 1 {
					if err := k8sClient.Delete(ctx, obj); err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) {
						mu.Lock()
						failures = append(failures, err)
						mu.Unlock()
						return
					}
				}
			}
		})
	}
	for range 2 {
		time.Sleep(1500 * time.Millisecond)
		v.stop()
		time.Sleep(300 * time.Millisecond)
		v = startVMIPAM(t, clk)
		budget.Store(perRun)
	}
	time.Sleep(1500 * time.Millisecond)
	cancel()
	wg.Wait()
	for _, err := range failures {
		t.Error(err)
	}
	if len(everHanded) < 50 {
		t.Fatalf("only %d creates went through; the test proves little", len(everHanded))
	}
	// Deleted objects go once their address is released.
	harness.Eventually(t, 30*time.Second, "deletions to finish", func() error {
		for _, vm := range listVMs(t, ns) {
			if vm.DeletionTimestamp != nil {
				return fmt.Errorf("%s still deleting", vm.Name)
			}
		}
		return nil
	})
	vms := listVMs(t, ns)
	checkDistinct(t, vms, netip.MustParsePrefix("10.70.0.0/19"))
	harness.Eventually(t, 30*time.Second, "the allocator to match the cluster", func() error {
		p := v.reg.Get("restart")
		if c := p.Snapshot(); c.Allocated != len(vms) {
			return fmt.Errorf("allocated %d, %d live VMs; %s", c.Allocated, len(vms), strangeAllocations(p, vms, netip.MustParsePrefix("10.70.0.0/19")))
		}
		return nil
	})
	t.Logf("%d creates, %d live after 2 restarts", len(everHanded), len(vms))
}

// strangeAllocations names the addresses of prefix that the pool's
// allocator holds allocated to an object other than the live VM carrying
// the address, so that a failure says which ones and to whom.
func strangeAllocations(p *pools.Pool, vms []vmipamv1.VirtualMachine, prefix netip.Prefix) string {
	uidAt := map[netip.Addr]string{}
	for _, vm := range vms {
		for _, s := range vm.Spec.Addresses {
			if a, err := netip.ParseAddr(s); err == nil {
				uidAt[a] = string(vm.UID)
			}
		}
	}
	var out []string
	byState := map[ipam.State]int{}
	for a := prefix.Addr(); prefix.Contains(a); a = a.Next() {
		st, o, at := p.Lookup(a)
		byState[st]++
		if st == ipam.StateAllocated && o.UID != uidAt[a] {
			out = append(out, fmt.Sprintf("%s allocated to %s (uid %q, since %s) but carried by uid %q", a, o.Ref, o.UID, at.Format(time.RFC3339Nano), uidAt[a]))
		}
	}
	out = append(out, fmt.Sprintf("looked up one by one: %v; counted: %+v", byState, p.Snapshot()))
	return strings.Join(out, "; ")
}

var errDenied = errors.New("denied by the test's policy")

// TestNetworkIdentity: a VirtualMachine gets, beside its address, what its
// guest needs to configure the interface (spec.network: the address with
// its prefix length, the range's gateway and routes); a static request may
// carry the prefix length, and is stored without it; the gateway and the
// routes' next hops are never handed out; and the API server keeps
// spec.network as vmipam wrote it.
func TestNetworkIdentity(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "identity", []vmipamv1.IPRange{{CIDR: "10.91.0.0/29", Gateway: "10.91.0.1",
		Routes: []vmipamv1.Route{{Destination: "10.200.0.0/16"}, {Destination: "192.168.0.0/16", Via: "10.91.0.6"}}}})
	ctx := t.Context()
	routes := []vmipamv1.Route{{Destination: "10.200.0.0/16", Via: "10.91.0.1"}, {Destination: "192.168.0.0/16", Via: "10.91.0.6"}}

	static := vm(ns, "static", "identity", "10.91.0.4/29")
	if err := k8sClient.Create(ctx, static); err != nil {
		t.Fatalf("static request with its prefix length: %v", err)
	}
	want := &vmipamv1.Network{Addresses: []string{"10.91.0.4/29"}, Gateways: []string{"10.91.0.1"}, Routes: routes}
	if !slices.Equal(static.Spec.Addresses, []string{"10.91.0.4"}) || !reflect.DeepEqual(static.Spec.Network, want) {
		t.Fatalf("static request stored as %v with network %+v; want [10.91.0.4] and %+v", static.Spec.Addresses, static.Spec.Network, want)
	}
	// 10.91.0.1 is the gateway and .6 a next hop: .2, .3 and .5 are left.
	got := map[string]bool{"10.91.0.4": true}
	for i := range 3 {
		d := vm(ns, fmt.Sprintf("dyn-%d", i), "identity")
		if err := k8sClient.Create(ctx, d); err != nil {
			t.Fatalf("create %s: %v", d.Name, err)
		}
		a := d.Spec.Addresses[0]
		want := &vmipamv1.Network{Addresses: []string{a + "/29"}, Gateways: []string{"10.91.0.1"}, Routes: routes}
		if !reflect.DeepEqual(d.Spec.Network, want) {
			t.Errorf("%s: network %+v, want %+v", d.Name, d.Spec.Network, want)
		}
		got[a] = true
	}
	if !reflect.DeepEqual(got, map[string]bool{"10.91.0.2": true, "10.91.0.3": true, "10.91.0.4": true, "10.91.0.5": true}) {
		t.Errorf("addresses handed out %v; want .2 to .5, never the gateway .1 or the next hop .6", got)
	}
	for name, tc := range map[string]struct {
		obj  *vmipamv1.VirtualMachine
		want []string
	}{
		"the gateway":          {vm(ns, "gw", "identity", "10.91.0.1"), []string{"spec.addresses[0]", "gateway or a route's next hop of IPPool identity"}},
		"another prefix":       {vm(ns, "other", "identity", "10.91.0.4/24"), []string{"spec.addresses[0]", "/24 differs from the subnet 10.91.0.0/29", "write 10.91.0.4/29"}},
		"a route's next hop":   {vm(ns, "hop", "identity", "10.91.0.6"), []string{"spec.addresses[0]", "gateway or a route's next hop"}},
		"prefix, wrong family": {vm(ns, "fam", "identity", "fd00::4/64"), []string{"spec.addresses[0]", "outside IPPool identity"}},
	} {
		t.Run(name, func(t *testing.T) {
			err := k8sClient.Create(ctx, tc.obj)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create: %v; want Invalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	// The API server keeps spec.network as vmipam wrote it.
	edit := static.DeepCopy()
	edit.Spec.Network.Gateways = []string{"10.91.0.3"}
	if err := k8sClient.Update(ctx, edit); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.network is written by vmipam") {
		t.Errorf("update of spec.network: %v; want it refused, naming spec.network", err)
	}
	edit = static.DeepCopy()
	edit.Spec.Network = nil
	if err := k8sClient.Update(ctx, edit); !apierrors.IsInvalid(err) {
		t.Errorf("removal of spec.network: %v; want it refused", err)
	}
}
