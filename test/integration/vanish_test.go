package integration

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/internal/app"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/test/harness"
)

// TestGoneFromTheWatch: with no resync in sight (an interval of an hour),
// a VM whose finalizer someone removed by force gives its address back as
// soon as the watch reports it gone, into its cooldown, recorded as
// vanished. A VM that only left this replica's watch (its holder label
// changed, which the filtered watch also reports as a deletion) keeps its
// address.
func TestGoneFromTheWatch(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk, func(o *app.Options) { o.ResyncInterval = time.Hour })
	ns := namespace(t)
	newPool(t, v, "gone", []vmipamv1.IPRange{{CIDR: "10.85.0.0/24"}})
	ctx := t.Context()
	p := v.reg.Get("gone")
	t.Run("finalizer removed by force", func(t *testing.T) {
		obj := vm(ns, "forced", "gone")
		a := createBound(t, p, obj)
		deleteByForce(t, obj)
		harness.Eventually(t, 10*time.Second, "the address released from the watch's deletion", func() error {
			return wantState(p, a, ipam.StateCooldown)
		})
	})

	t.Run("relabelled, still there", func(t *testing.T) {
		obj := vm(ns, "moved", "gone")
		a := createBound(t, p, obj)
		obj.Labels[vmipamv1.HolderLabel] = "another-replica"
		if err := k8sClient.Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
		// The watch's deletion comes before the create of a VM made
		// after the relabel; its reconcile, which asks the API server,
		// within moments.
		createBound(t, p, vm(ns, "after", "gone"))
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if err := wantState(p, a, ipam.StateAllocated); err != nil {
				t.Fatalf("the relabelled VM's address: %v", err)
			}
		}
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			t.Fatal(err)
		}
		obj.Labels[vmipamv1.HolderLabel] = v.reg.HolderLabel()
		if err := k8sClient.Update(ctx, obj); err != nil {
			t.Fatal(err)
		}
	})
}
