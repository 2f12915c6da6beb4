package controller_test

// A regression test for a race the chaos suite (test/chaos) found, fixed in
// db0cbbd: the chaos run hits it only when the timing is right, this test
// forces the interleaving every time, with a fake client.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/controller"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/pools/poolstest"
	"github.com/vmipam/vmipam/test/fixture"
)

// TestResyncKeepsAddressBoundDuringItsList: the periodic resync lists the
// VMs and then reconciles the allocator with that list. A VM created and
// bound by the controller between the two is live, yet missing from the
// list; the resync must not release its address. It used to: the address
// went into cooldown and, once the cooldown had passed, was handed to
// another VM while the first still held it.
func TestResyncKeepsAddressBoundDuringItsList(t *testing.T) {
	const cooldown = 5 * time.Second
	ctx := t.Context()
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(epoch)
	pool := fixture.Pool("race", fixture.Stored("uid-race"), fixture.WithCIDRs("10.97.0.0/29"),
		fixture.WithCooldown(cooldown), fixture.WithPendingTTL(time.Minute), fixture.WithWatermarks(0, 1, 1))
	// The resync's List of VMs stops once it has its snapshot, until the
	// test lets it go on.
	var armed atomic.Bool
	listed, resume := make(chan struct{}), make(chan struct{})
	rig := poolstest.NewRig(t, clk, interceptor.Funcs{
		List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			err := cl.List(ctx, list, opts...)
			// The list of every VM, as metadata: the resync's last.
			if _, vms := list.(*metav1.PartialObjectMetadataList); vms && armed.CompareAndSwap(true, false) {
				close(listed)
				<-resume
			}
			return err
		},
	}, pool)
	c, reg := rig.Client, rig.Registry
	p := reg.Get(pool.Name)

	armed.Store(true)
	resynced := make(chan error, 1)
	go func() { resynced <- reg.Resync(ctx, p) }()
	<-listed
	// Meanwhile a VM is admitted (what Assigner does), stored, and bound
	// by the address controller.
	a, err := p.AllocateFamily(ctx, ipam.Reservation{Token: "token-1"}, vmipamv1.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	vm := poolstest.Admitted("vm-1", "token-1", pool.Name, a)
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	gc := &controller.AddressGC{Client: c, Registry: reg, Kind: kinds.VirtualMachine}
	if _, err := gc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(vm)}); err != nil {
		t.Fatal(err)
	}
	if st, o, _ := p.Lookup(a); st != ipam.StateAllocated || o.UID != string(vm.UID) {
		t.Fatalf("after the bind %s is %s to %+v, want allocated to %s", a, st, o, vm.UID)
	}
	close(resume)
	if err := <-resynced; err != nil {
		t.Fatal(err)
	}

	st, o, until := p.Lookup(a)
	if st != ipam.StateAllocated || o.UID != string(vm.UID) {
		t.Errorf("the resync that listed the VMs before %s was bound released its address: %s is %s (until %s), want allocated to %s. "+
			"pools.Registry.Resync takes the list, then Manager.Resync puts into cooldown every allocated address whose UID the list lacks, "+
			"including VMs bound after the list was taken", vm.Name, a, st, until.Format(time.RFC3339), vm.UID)
	}
	// The consequence: after the cooldown the address goes to another VM.
	clk.Step(cooldown + time.Second)
	b, err := p.AllocateFamily(ctx, ipam.Reservation{Token: "token-2"}, vmipamv1.IPv4)
	if err == nil && b == a {
		t.Errorf("DUPLICATE: %s, still on the live %s, handed out again for another VM", a, vm.Name)
	}
}

// TestResyncObserved: every resync reports its duration, whether it listed
// the objects, and whether it failed (vmipam_resync_duration_seconds).
func TestResyncObserved(t *testing.T) {
	for _, tc := range []struct {
		name    string
		listErr error
	}{
		{"listed", nil},
		{"the list fails", errors.New("the API server is away")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := fixture.Pool("observed", fixture.Stored("uid-observed"), fixture.WithCIDRs("10.97.1.0/29"))
			// The recovery at the start lists too; only the resync's fails.
			var fail atomic.Bool
			c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(pool.DeepCopy()).Build(), interceptor.Funcs{
				List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					if _, vms := list.(*metav1.PartialObjectMetadataList); vms && fail.Load() {
						return tc.listErr
					}
					return cl.List(ctx, list, opts...)
				},
			})
			type observed struct {
				listed bool
				err    error
			}
			var got []observed
			var mu sync.Mutex
			reg := poolstest.StartWith(t, pools.Options{Client: c, APIReader: c, Kinds: kinds.Default(), Holder: "vmipam",
				Clock: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
				ObserveResync: func(listed bool, _ time.Duration, err error) {
					mu.Lock()
					defer mu.Unlock()
					got = append(got, observed{listed, err})
				}}, pool)
			fail.Store(tc.listErr != nil)
			err := reg.Resync(t.Context(), reg.Get(pool.Name))
			if !errors.Is(err, tc.listErr) {
				t.Fatalf("Resync: %v, want %v", err, tc.listErr)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 1 || !got[0].listed || !errors.Is(got[0].err, tc.listErr) {
				t.Errorf("observed %+v, want one resync that listed, with error %v", got, tc.listErr)
			}
		})
	}
}
