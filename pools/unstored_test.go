package pools

import (
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	vmipamscheme "github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/test/fixture"
)

// TestLapsedReservationOfAMislabelledVM: a VM stored with its
// reservation's token and address, whose holder label was changed before
// the controller bound it, is in no replica's watch. When the reservation
// lapses, the proof that reads the namespace from the API server finds it:
// it binds the address to it and moves the label back. Before, the address
// only kept its cooldown, and came free while the VM still held it.
func TestLapsedReservationOfAMislabelledVM(t *testing.T) {
	const cooldown, ttl = time.Minute, time.Minute
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	scheme := vmipamscheme.Scheme
	pool := fixture.Pool("lapse", fixture.Stored("uid-lapse"), fixture.WithCIDRs("10.98.0.0/29"),
		fixture.WithCooldown(cooldown), fixture.WithPendingTTL(ttl), fixture.WithWatermarks(0, 1, 1))
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pool.DeepCopy()).Build()
	reg := NewRegistry(Options{Client: c, APIReader: c, Kinds: kinds.Default(), Holder: "vmipam-a", Clock: clk,
		RunInterval: time.Hour, ResyncInterval: time.Hour, StatusInterval: time.Hour, ProveInterval: time.Hour})
	regCtx, stop := context.WithCancel(ctx)
	var done sync.WaitGroup
	done.Go(func() { _ = reg.Start(regCtx) })
	t.Cleanup(func() { stop(); done.Wait() })
	if err := reg.Ensure(ctx, pool); err != nil {
		t.Fatal(err)
	}
	p := reg.Get(pool.Name)
	a, err := p.AllocateFamily(ctx, ipam.Reservation{Token: "token-1", Namespace: "default"}, vmipamv1.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-1", UID: "uid-vm-1",
		Labels:      map[string]string{vmipamv1.HolderLabel: "vmipam-b"},
		Annotations: map[string]string{vmipamv1.TokenAnnotation: "token-1", vmipamv1.PoolAnnotation: pool.Name},
		Finalizers:  []string{vmipamv1.Finalizer}}, Spec: vmipamv1.VirtualMachineSpec{IPPool: pool.Name, Addresses: []string{a.String()}}}
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}

	clk.Step(ttl + clockSkew + time.Second)
	if err := reg.proveUnused(ctx, p); err != nil {
		t.Fatal(err)
	}
	if st, o, until := p.Lookup(a); st != ipam.StateAllocated || o.UID != string(vm.UID) {
		t.Errorf("after the proof, %s is %s (to %+v, until %s); want allocated to %s", a, st, o, until, vm.UID)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
		t.Fatal(err)
	}
	if got := vm.Labels[vmipamv1.HolderLabel]; got != reg.HolderLabel() {
		t.Errorf("%s is labelled %q after the proof; want this replica's %q", vm.Name, got, reg.HolderLabel())
	}
	clk.Step(cooldown + time.Second)
	for i := range 6 {
		if b, err := p.AllocateFamily(ctx, ipam.Reservation{Token: "other-" + string(rune('a'+i)), Namespace: "default"}, vmipamv1.IPv4); err == nil && b == a {
			t.Fatalf("DUPLICATE: %s, on the live %s, handed out again", a, vm.Name)
		}
	}
}
