package controller

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools/poolstest"
	"github.com/vmipam/vmipam/test/fixture"
)

// unlabelled is a VirtualMachine without vmipam's holder label, as the
// unlabelled cache holds it, carrying addrs, changed by each of with.
func unlabelled(t *testing.T, name string, addrs []string, with ...func(*vmipamv1.VirtualMachine)) *unstructured.Unstructured {
	t.Helper()
	vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec: vmipamv1.VirtualMachineSpec{Addresses: addrs, Image: "debian-13", CPUs: 1, Memory: "1Gi"}}
	for _, f := range with {
		f(vm)
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vm)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(kinds.VirtualMachine.GVK)
	return u
}

// TestUnmanaged: which events of objects without vmipam's holder label
// stay out of the queue. Only those whose reconcile would do nothing.
func TestUnmanaged(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	pool := fixture.Pool("p", fixture.Stored("uid-p"), fixture.WithCIDRs("10.97.0.0/29"))
	rig := poolstest.NewRig(t, clk, interceptor.Funcs{}, pool)
	gc := &AddressGC{Client: rig.Client, Registry: rig.Registry, Kind: kinds.VirtualMachine, Clock: clk}
	annotate := func(k string) func(*vmipamv1.VirtualMachine) {
		return func(vm *vmipamv1.VirtualMachine) { vm.Annotations = map[string]string{k: "x"} }
	}
	for _, tc := range []struct {
		name  string
		addrs []string
		with  []func(*vmipamv1.VirtualMachine)
		want  bool
	}{
		{name: "an address outside every pool", addrs: []string{"192.0.2.7"}, want: true},
		{name: "an address outside every pool, the object going", addrs: []string{"192.0.2.7"},
			with: []func(*vmipamv1.VirtualMachine){func(vm *vmipamv1.VirtualMachine) {
				vm.DeletionTimestamp = &metav1.Time{Time: clk.Now()}
				vm.Finalizers = []string{"example.com/other"}
			}}, want: true},
		{name: "two addresses outside every pool", addrs: []string{"192.0.2.7", "2001:db8::7"}, want: true},
		{name: "an address in a pool", addrs: []string{"10.97.0.3"}},
		{name: "an address in a pool, spelt otherwise", addrs: []string{"::ffff:10.97.0.3"}},
		{name: "a second address in a pool", addrs: []string{"2001:db8::7", "10.97.0.3"}},
		{name: "an address that does not parse", addrs: []string{"10.97.0.300"}},
		{name: "no address", addrs: nil},
		{name: "vmipam's token", addrs: []string{"192.0.2.7"}, with: []func(*vmipamv1.VirtualMachine){annotate(vmipamv1.TokenAnnotation)}},
		{name: "vmipam's pool annotation", addrs: []string{"192.0.2.7"}, with: []func(*vmipamv1.VirtualMachine){annotate(vmipamv1.PoolAnnotation)}},
		{name: "vmipam's finalizer", addrs: []string{"192.0.2.7"},
			with: []func(*vmipamv1.VirtualMachine){func(vm *vmipamv1.VirtualMachine) { vm.Finalizers = []string{vmipamv1.Finalizer} }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := gc.unmanaged(unlabelled(t, "vm", tc.addrs, tc.with...)); got != tc.want {
				t.Errorf("unmanaged = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestStoredDuringItsPoolsRecovery: an object with an address in a pool
// being added, stored after that pool's recovery read the objects and
// seen before the pool is served. Its event must reach the queue, and its
// reconcile must look again until the pool is served, then adopt it: the
// recovery did not see it, and nothing else would until the next resync.
func TestStoredDuringItsPoolsRecovery(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	late := unlabelled(t, "late", []string{"10.98.0.5"})
	var once, resumed sync.Once
	stored, resume := make(chan struct{}), make(chan struct{})
	// However the test ends, the recovery's list goes on.
	letGo := func() { resumed.Do(func() { close(resume) }) }
	t.Cleanup(letGo)
	var armed bool
	var mu sync.Mutex
	rig := poolstest.NewRig(t, clk, interceptor.Funcs{
		List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := cl.List(ctx, list, opts...); err != nil {
				return err
			}
			mu.Lock()
			on := armed
			mu.Unlock()
			if !on {
				return nil
			}
			// Every list of the recovery is from before the object was
			// stored: it is left out of each.
			items, err := meta.ExtractList(list)
			if err != nil {
				return err
			}
			kept := items[:0]
			for _, o := range items {
				if m, err := meta.Accessor(o); err != nil || m.GetName() != late.GetName() {
					kept = append(kept, o)
				}
			}
			if err := meta.SetList(list, kept); err != nil {
				return err
			}
			once.Do(func() {
				if err := cl.Create(ctx, late.DeepCopy()); err != nil {
					t.Error(err)
				}
				close(stored)
				<-resume
			})
			return nil
		},
	})
	reg := rig.Registry
	gc := &AddressGC{Client: rig.Client, Registry: reg, Kind: kinds.VirtualMachine, Clock: clk}
	a := netip.MustParseAddr("10.98.0.5")
	if !gc.unmanaged(late) {
		t.Fatal("before the pool: not left out of the queue")
	}

	mu.Lock()
	armed = true
	mu.Unlock()
	pool := fixture.Pool("late", fixture.Stored("uid-late"), fixture.WithCIDRs("10.98.0.0/29"))
	if err := rig.Client.Create(ctx, pool.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	ensured := make(chan error, 1)
	go func() { ensured <- reg.Ensure(ctx, pool) }()
	select {
	case <-stored:
	case err := <-ensured:
		t.Fatalf("the recovery listed no objects (Ensure: %v)", err)
	}
	if reg.PoolFor(a) != nil {
		t.Fatal("the pool is served before its recovery ended")
	}
	if gc.unmanaged(late) {
		t.Error("an object stored during its pool's recovery is left out of the queue")
	}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "late"}}
	res, err := gc.Reconcile(ctx, req)
	if err != nil || res.RequeueAfter != time.Second {
		t.Errorf("reconcile while its pool recovers: %+v, %v; want to look again in a second", res, err)
	}
	letGo()
	if err := <-ensured; err != nil {
		t.Fatal(err)
	}
	if st, _, _ := reg.Get("late").Lookup(a); st == ipam.StateAllocated {
		t.Fatalf("after the recovery %s is %s: the recovery saw the object", a, st)
	}
	if _, err := gc.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if st, o, _ := reg.Get("late").Lookup(a); st != ipam.StateAllocated || o.UID != string(late.GetUID()) {
		t.Errorf("after the reconcile %s is %s to %+v, want allocated to %s", a, st, o, late.GetUID())
	}
}
