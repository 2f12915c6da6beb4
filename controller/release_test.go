package controller_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/controller"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools/poolstest"
	"github.com/vmipam/vmipam/test/fixture"
)

// TestReleaseRetry: the cooldown must end a whole cooldown after the VM
// can go. When the finalizer's removal fails, the retry releases again and
// the cooldown starts again; when the retry only comes from a cache that
// has not seen the removal yet, the VM is gone and the cooldown stays as it
// was. A fake client, narrowly: what is tested is the controller's choice,
// with the API server's answers forced.
func TestReleaseRetry(t *testing.T) {
	const cooldown = 30 * time.Second
	for _, tt := range []struct {
		name string
		// failPatch fails the first removal of the finalizer; stale makes
		// the second reconcile read the object as it was before it.
		failPatch, stale bool
		restarted        bool
	}{
		{name: "removal failed", failPatch: true, restarted: true},
		{name: "stale cache", stale: true, restarted: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			pool := fixture.Pool("retry", fixture.Stored("uid-pool"), fixture.WithCIDRs("10.97.0.0/28"),
				fixture.WithCooldown(cooldown), fixture.WithPendingTTL(time.Minute))
			var failNext atomic.Bool
			rig := poolstest.NewRig(t, clk, interceptor.Funcs{
				Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
					if failNext.CompareAndSwap(true, false) {
						return errors.New("injected: the API server did not answer")
					}
					return cl.Patch(ctx, obj, p, opts...)
				},
			}, pool)
			c, reg := rig.Client, rig.Registry
			p := reg.Get(pool.Name)
			a, err := p.AllocateFamily(ctx, ipam.Reservation{Token: "token-1"}, vmipamv1.IPv4)
			if err != nil {
				t.Fatal(err)
			}
			vm := poolstest.Admitted("vm-1", "token-1", pool.Name, a)
			if err := c.Create(ctx, vm); err != nil {
				t.Fatal(err)
			}
			// The reader is the cache: it may show an older object.
			reader := &poolstest.StaleReader{Reader: c}
			gc := &controller.AddressGC{Client: c, Reader: reader, APIReader: c, Registry: reg, Kind: kinds.VirtualMachine}
			req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(vm)}
			if _, err := gc.Reconcile(ctx, req); err != nil {
				t.Fatal(err)
			}
			if err := c.Delete(ctx, vm); err != nil {
				t.Fatal(err)
			}
			reader.Remember(ctx, t, req.NamespacedName)
			failNext.Store(tt.failPatch)
			_, err = gc.Reconcile(ctx, req)
			if tt.failPatch != (err != nil) {
				t.Fatalf("first reconcile of the deletion: %v", err)
			}
			_, _, first := p.Lookup(a)
			clk.Step(10 * time.Second)
			reader.Stale = tt.stale
			if _, err := gc.Reconcile(ctx, req); err != nil {
				t.Fatalf("second reconcile of the deletion: %v", err)
			}
			st, _, until := p.Lookup(a)
			if st != ipam.StateCooldown {
				t.Fatalf("%s is %s after the deletion, want cooling down", a, st)
			}
			if want := clk.Now().Add(cooldown); tt.restarted && until.Before(want) {
				t.Errorf("cooldown ends %s, before %s: a cooldown after the retry that removed the finalizer", until.Format(time.TimeOnly), want.Format(time.TimeOnly))
			}
			if !tt.restarted && !until.Equal(first) {
				t.Errorf("cooldown ends %s, want %s as before: the VM was gone, the reconcile saw it from a stale cache", until.Format(time.TimeOnly), first.Format(time.TimeOnly))
			}
		})
	}
}
