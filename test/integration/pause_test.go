package integration

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/test/harness"
)

// pausePatch sets spec.paused of the IPPool name.
func pausePatch(t *testing.T, name string, paused bool) {
	t.Helper()
	raw := fmt.Appendf(nil, `{"spec":{"paused":%t}}`, paused)
	if err := k8sClient.Patch(context.Background(), &vmipamv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}},
		client.RawPatch(types.MergePatchType, raw)); err != nil {
		t.Fatalf("set spec.paused of IPPool %s to %t: %v", name, paused, err)
	}
}

// pauseWantCondition waits until the IPPool name's Paused condition has
// status want.
func pauseWantCondition(t *testing.T, name string, want metav1.ConditionStatus) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, fmt.Sprintf("IPPool %s Paused=%s", name, want), func() error {
		if c := poolCondition(t, name, vmipamv1.ConditionPaused); c == nil || c.Status != want {
			return fmt.Errorf("Paused condition %+v", c)
		}
		return nil
	})
}

// pauseWantRefused checks that err is the refusal of a create from the
// paused IPPool pool: Invalid, on spec.ipPool, saying why and the way out.
func pauseWantRefused(t *testing.T, what string, err error, pool string) {
	t.Helper()
	if !apierrors.IsInvalid(err) {
		t.Fatalf("%s from paused IPPool %s: %v; want Invalid", what, pool, err)
	}
	for _, want := range []string{
		"spec.ipPool: Forbidden", `IPPool "` + pool + `" is paused (spec.paused)`, "hands out no new addresses",
		"name another pool in spec.ipPool", "kubectl patch ippools.vmipam.io " + pool + " --type merge",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s from paused IPPool %s: %q does not say %q", what, pool, err.Error(), want)
		}
	}
}

// TestPausedPool: through the API server, a paused pool refuses creates,
// dynamic, static and dry runs, whether named or the default, with a
// message that names the pool, spec.paused and the way out; its VMs can
// still be deleted, their address going into cooldown; the pool shows
// Paused=True and the trend; the allocator is not rebuilt; once
// unpaused, creates go through again. An object that bypassed the webhook
// is not given an address from it either: an event says why.
func TestPausedPool(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "pausable", []vmipamv1.IPRange{{CIDR: "10.71.0.0/28"}}, func(p *vmipamv1.IPPool) {
		p.Spec.Cooldown.Duration = 10 * time.Minute
	})
	ctx := t.Context()
	m := v.reg.Get("pausable")
	before := vm(ns, "before", "pausable")
	if err := k8sClient.Create(ctx, before); err != nil {
		t.Fatal(err)
	}
	held := netip.MustParseAddr(before.Spec.Addresses[0])
	harness.Eventually(t, 10*time.Second, "before bound", func() error { return wantState(m, held, ipam.StateAllocated) })
	pauseWantCondition(t, "pausable", metav1.ConditionFalse)

	pausePatch(t, "pausable", true)
	pauseWantCondition(t, "pausable", metav1.ConditionTrue)
	if q := v.reg.Get("pausable"); q != m {
		t.Error("the pause rebuilt the pool's allocator")
	}
	err := k8sClient.Create(ctx, vm(ns, "dynamic", "pausable"))
	pauseWantRefused(t, "a create", err, "pausable")
	err = k8sClient.Create(ctx, vm(ns, "static", "pausable", "10.71.0.9"))
	pauseWantRefused(t, "a static request", err, "pausable")
	err = k8sClient.Create(ctx, vm(ns, "dry", "pausable", "10.71.0.10"), client.DryRunAll)
	pauseWantRefused(t, "a dry run", err, "pausable")
	if c := m.Snapshot(); c.Pending != 0 || c.Allocated != 1 {
		t.Errorf("counts of the paused pool %+v, want the one VM from before and nothing pending", c)
	}

	// The pool's VM goes, its address into cooldown.
	if err := k8sClient.Delete(ctx, before); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "before gone", func() error {
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(before), &vmipamv1.VirtualMachine{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %w", err)
	})
	if err := wantState(m, held, ipam.StateCooldown); err != nil {
		t.Errorf("the address of a VM of the paused pool, deleted: %v", err)
	}
	harness.Eventually(t, 10*time.Second, "the status to count the cooldown, with a trend", func() error {
		p := &vmipamv1.IPPool{}
		if err := k8sClient.Get(ctx, client.ObjectKey{Name: "pausable"}, p); err != nil {
			return err
		}
		if p.Status.Cooldown != 1 || p.Status.Allocated != 0 || p.Status.Trend == nil {
			return fmt.Errorf("status %+v", p.Status)
		}
		return nil
	})
	cond := poolCondition(t, "pausable", vmipamv1.ConditionPaused)
	if cond.Reason != "Paused" || !strings.Contains(cond.Message, "hands out no new addresses") {
		t.Errorf("Paused condition %+v", cond)
	}

	// The default pool paused refuses too, rather than giving way.
	newPool(t, v, "pause-default", []vmipamv1.IPRange{{CIDR: "10.71.1.0/28"}}, func(p *vmipamv1.IPPool) {
		p.Spec.Default, p.Spec.Paused = true, true
	})
	err = k8sClient.Create(ctx, vm(ns, "by-default", ""))
	pauseWantRefused(t, "a create drawing from the default pool", err, "pause-default")

	// Unpaused: served again, by the same allocator.
	pausePatch(t, "pausable", false)
	pauseWantCondition(t, "pausable", metav1.ConditionFalse)
	after := vm(ns, "after", "pausable")
	if err := k8sClient.Create(ctx, after); err != nil {
		t.Fatalf("create once unpaused: %v", err)
	}
	if q := v.reg.Get("pausable"); q != m {
		t.Error("unpausing rebuilt the pool's allocator")
	}

	// Without the webhook, the garbage collector gives no address from a
	// paused pool, and says why.
	pausePatch(t, "pausable", true)
	pauseWantCondition(t, "pausable", metav1.ConditionTrue)
	bypassMutation(t)
	bypassed := vm(ns, "bypassed", "pausable")
	if err := k8sClient.Create(ctx, bypassed); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "an event on the bypassed VM saying the pool is paused", func() error {
		var l eventsv1.EventList
		if err := k8sClient.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range l.Items {
			if e.Regarding.Name == "bypassed" && strings.Contains(e.Note, `IPPool "pausable" is paused (spec.paused)`) {
				return nil
			}
		}
		return errors.New("none yet")
	})
	got := &vmipamv1.VirtualMachine{}
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(bypassed), got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.Addresses) != 0 {
		t.Errorf("an object that bypassed the webhook got %v from the paused pool", got.Spec.Addresses)
	}
	if err := k8sClient.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
}
