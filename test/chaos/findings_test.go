package chaos

// Regression tests for what the chaos run found (fixed in db0cbbd), at the
// level of the code at fault: the chaos run hits each only when the timing
// is right, these force the interleaving every time. They would sit as
// well next to that code (pools/, ipam/).

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/controller"
	"github.com/vmipam/vmipam/internal/app"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/target"
)

// TestResyncKeepsAddressBoundDuringItsList: the periodic resync lists the
// VMs and then reconciles the allocator with that list. A VM created and
// bound by the controller between the two is live, yet missing from the
// list; the resync must not release its address. It used to: the address
// went into cooldown and, once the cooldown had passed, was handed to
// another VM while the first still held it.
func TestResyncKeepsAddressBoundDuringItsList(t *testing.T) {
	ctx := t.Context()
	epoch := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakeClock(epoch)
	pool := &vmipamv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "race", UID: "uid-race", Generation: 1},
		Spec: vmipamv1.IPPoolSpec{Ranges: []vmipamv1.IPRange{{CIDR: "10.97.0.0/29"}},
			Cooldown: &metav1.Duration{Duration: cooldown}, PendingTTL: &metav1.Duration{Duration: pendingTTL},
			Watermarks: &vmipamv1.Watermarks{Low: 0, Target: 1, High: 1}},
	}
	// The resync's List of VMs stops once it has its snapshot, until the
	// test lets it go on.
	var armed atomic.Bool
	listed, resume := make(chan struct{}), make(chan struct{})
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(app.Scheme).WithObjects(pool.DeepCopy()).Build(), interceptor.Funcs{
		List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			err := cl.List(ctx, list, opts...)
			if _, vms := list.(*unstructured.UnstructuredList); vms && armed.CompareAndSwap(true, false) {
				close(listed)
				<-resume
			}
			return err
		},
	})
	reg := pools.NewRegistry(pools.Options{Client: c, APIReader: c, Target: target.VirtualMachine, Holder: holder, Clock: clk,
		RunInterval: time.Hour, ResyncInterval: time.Hour, StatusInterval: time.Hour})
	regCtx, stop := context.WithCancel(ctx)
	var regDone sync.WaitGroup
	regDone.Go(func() { _ = reg.Start(regCtx) })
	t.Cleanup(func() { stop(); regDone.Wait() })
	if err := reg.Ensure(ctx, pool); err != nil {
		t.Fatalf("recover the pool: %v", err)
	}
	p := reg.Get(pool.Name)
	m := p

	armed.Store(true)
	resynced := make(chan error, 1)
	go func() { resynced <- reg.Resync(ctx, p) }()
	<-listed
	// Meanwhile a VM is admitted (what VMDefaulter does), stored, and bound
	// by the address controller.
	a, err := m.Allocate(ctx, ipam.Reservation{Token: "token-1"})
	if err != nil {
		t.Fatal(err)
	}
	vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "vm-1", UID: "uid-vm-1",
		Annotations: map[string]string{vmipamv1.TokenAnnotation: "token-1", vmipamv1.PoolAnnotation: pool.Name},
		Finalizers:  []string{vmipamv1.Finalizer}}, Spec: vmipamv1.VirtualMachineSpec{IPPool: pool.Name, Addresses: []string{a.String()}}}
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	gc := &controller.VMReconciler{Client: c, Registry: reg, Target: target.VirtualMachine}
	if _, err := gc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(vm)}); err != nil {
		t.Fatal(err)
	}
	if st, o, _ := m.Lookup(a); st != ipam.StateAllocated || o.UID != string(vm.UID) {
		t.Fatalf("after the bind %s is %s to %+v, want allocated to %s", a, st, o, vm.UID)
	}
	close(resume)
	if err := <-resynced; err != nil {
		t.Fatal(err)
	}

	st, o, until := m.Lookup(a)
	if st != ipam.StateAllocated || o.UID != string(vm.UID) {
		t.Errorf("the resync that listed the VMs before %s was bound released its address: %s is %s (until %s), want allocated to %s. "+
			"pools.Registry.Resync takes the list, then Manager.Resync puts into cooldown every allocated address whose UID the list lacks, "+
			"including VMs bound after the list was taken", vm.Name, a, st, until.Format(time.RFC3339), vm.UID)
	}
	// The consequence: after the cooldown the address goes to another VM.
	clk.Step(cooldown + time.Second)
	b, err := m.Allocate(ctx, ipam.Reservation{Token: "token-2"})
	if err == nil && b == a {
		t.Errorf("DUPLICATE: %s, still on the live %s, handed out again for another VM", a, vm.Name)
	}
}

// failingStore is a Store whose writes can be made to fail, counting them.
type failingStore struct {
	*ipam.MemoryStore
	fail atomic.Bool
	puts atomic.Int64
}

func (s *failingStore) Put(ctx context.Context, b ipam.Block) (string, error) {
	s.puts.Add(1)
	if s.fail.Load() {
		return "", errors.New("connection refused")
	}
	return s.MemoryStore.Put(ctx, b)
}

// TestRunWaitsAfterAFailedWrite: Manager.Run retries failed background
// writes on its next round, every interval. With the free list above the
// high watermark while the store is unreachable (the API server away), it
// must not retry without pause. It used to: advance() kicks Run on each
// pass while the list is too long and the failed give-back puts the
// addresses back, so Run looped at once, writing and logging as fast as it
// could (over a hundred failed writes a second in the chaos run).
func TestRunWaitsAfterAFailedWrite(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	ranges, err := ipam.ParseRanges([]ipam.RangeSpec{{CIDR: "10.96.0.0/24"}})
	if err != nil {
		t.Fatal(err)
	}
	store := &failingStore{MemoryStore: ipam.NewMemoryStore()}
	m, err := ipam.NewManager(ipam.Config{Pool: "loop", Holder: holder, Ranges: ranges, Cooldown: cooldown, PendingTTL: pendingTTL,
		LowWatermark: 1, TargetFree: 2, HighWatermark: 4, Store: store, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Recover(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// Ten VMs come and go: ten addresses cool down, then all are free at
	// once, well above the high watermark, just as the store goes away.
	var addrs []netip.Addr
	for i := range 10 {
		a, err := m.Allocate(ctx, ipam.Reservation{Token: "t" + string(rune('a'+i))})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Bind(ipam.Owner{Token: "t" + string(rune('a'+i)), UID: "u" + string(rune('a'+i))}); err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, a)
	}
	for i, a := range addrs {
		if err := m.Release(a, ipam.Owner{UID: "u" + string(rune('a'+i))}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	store.fail.Store(true)
	clk.Step(cooldown + time.Second)
	before := store.puts.Load()
	var failures atomic.Int64
	runCtx, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	m.Run(runCtx, time.Second, func(error) { failures.Add(1) })
	writes := store.puts.Load() - before
	// Two rounds in two seconds, a kick or two, a few retries each.
	if writes > 50 {
		t.Errorf("HOT LOOP: with the store failing and %d free addresses above the high watermark of 4, Run attempted %d writes and reported %d failures in 2s "+
			"(interval 1s): it retries at once instead of on its next round", m.Snapshot().Free, writes, failures.Load())
	}
}
