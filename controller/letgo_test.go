package controller_test

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/controller"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools/poolstest"
	"github.com/vmipam/vmipam/test/fixture"
)

// records is a pools.Recorder that keeps what it is given.
type records struct {
	mu   sync.Mutex
	recs []vmipamv1.AddressRecord
}

func (r *records) Record(_ context.Context, recs ...vmipamv1.AddressRecord) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, recs...)
	return nil
}

// TestLetGoRecordsTenure: an object being deleted that has nothing to
// release (no replica claims its address, or its pool is gone) still held
// its address until then, and its tenure goes into the history before its
// finalizer goes. Without it, a machine deleted while its address rested
// unclaimed after a takeover had no record (the chaos suite's history
// check found 7 of 562 so).
func TestLetGoRecordsTenure(t *testing.T) {
	for _, tt := range []struct {
		name, pool, addr string
	}{
		{name: "unclaimed address", pool: "letgo", addr: "10.98.0.9"},
		{name: "pool gone", pool: "gone", addr: "10.99.0.9"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			pool := fixture.Pool("letgo", fixture.Stored("uid-pool"), fixture.WithCIDRs("10.98.0.0/28"))
			rec := &records{}
			rig := poolstest.NewRecordingRig(t, clk, interceptor.Funcs{}, rec, pool)
			c := rig.Client
			addr := netip.MustParseAddr(tt.addr)
			// Stored as the webhook admits it, its address claimed by no
			// replica: the claim of a crashed one rested and went back.
			vm := poolstest.Admitted("vm-1", "token-1", tt.pool, addr)
			if err := c.Create(ctx, vm); err != nil {
				t.Fatal(err)
			}
			if err := c.Delete(ctx, vm); err != nil {
				t.Fatal(err)
			}
			gc := &controller.AddressGC{Client: c, APIReader: c, Registry: rig.Registry, Kind: kinds.VirtualMachine}
			if _, err := gc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(vm)}); err != nil {
				t.Fatal(err)
			}
			if err := c.Get(ctx, client.ObjectKeyFromObject(vm), &vmipamv1.VirtualMachine{}); err == nil {
				t.Fatal("the VM is still there: its finalizer was not removed")
			}
			if len(rec.recs) != 1 {
				t.Fatalf("recorded %+v, want vm-1's tenure of %s", rec.recs, addr)
			}
			got := rec.recs[0]
			if got.Address != tt.addr || got.Pool != tt.pool || got.Name != "vm-1" || got.Namespace != "default" ||
				got.UID != "uid-vm-1" || got.Ended != vmipamv1.EndedAllocated || got.Kind != "VirtualMachine.vmipam.io" || got.Holder != "vmipam" {
				t.Errorf("recorded %+v, want vm-1's tenure of %s in pool %s", got, addr, tt.pool)
			}
		})
	}
}
