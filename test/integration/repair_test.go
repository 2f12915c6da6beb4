package integration

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
)

// bypassMutation removes vmipam's mutating webhook until the test ends, as
// when it was excluded or down while objects were created.
func bypassMutation(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var l admissionregv1.MutatingWebhookConfigurationList
	if err := k8sClient.List(ctx, &l); err != nil {
		t.Fatal(err)
	}
	var saved []admissionregv1.MutatingWebhookConfiguration
	for _, c := range l.Items {
		saved = append(saved, c)
		if err := k8sClient.Delete(ctx, &c); err != nil {
			t.Fatal(err)
		}
	}
	// An object that bypasses the webhook (the wiring not applied yet, or
	// removed by an administrator) bypasses vmipam's admission policy too:
	// with it, an object in scope cannot carry an address vmipam did not
	// stamp.
	var bindings admissionregv1.ValidatingAdmissionPolicyBindingList
	if err := k8sClient.List(ctx, &bindings); err != nil {
		t.Fatal(err)
	}
	for _, b := range bindings.Items {
		if err := k8sClient.Delete(ctx, &b); err != nil {
			t.Fatal(err)
		}
	}
	harness.Eventually(t, 30*time.Second, "the admission policy to be gone", func() error {
		probe := vm("default", "bypass-probe", "nope", "192.0.2.1")
		if err := k8sClient.Create(ctx, probe); err != nil {
			return err
		}
		return k8sClient.Delete(ctx, probe)
	})
	t.Cleanup(func() {
		for _, b := range bindings.Items {
			b.ResourceVersion = ""
			if err := k8sClient.Create(ctx, &b); err != nil {
				t.Errorf("restore admission policy binding %s: %v", b.Name, err)
			}
		}
		for _, c := range saved {
			c.ResourceVersion = ""
			if err := k8sClient.Create(ctx, &c); err != nil {
				t.Errorf("restore mutating webhook %s: %v", c.Name, err)
			}
		}
		// Wait until the API server calls it again.
		harness.Eventually(t, 30*time.Second, "the mutating webhook to be back", func() error {
			probe := vm("default", "probe", "nope")
			err := k8sClient.Create(ctx, probe, client.DryRunAll)
			if err != nil && strings.Contains(err.Error(), "mvirtualmachine.vmipam.io") {
				return nil
			}
			return fmt.Errorf("dry run not seen by the webhook: %w", err)
		})
	})
	// The API server drops the configuration asynchronously.
	harness.Eventually(t, 30*time.Second, "the mutating webhook to be gone", func() error {
		err := k8sClient.Create(ctx, vm("default", "probe", "nope"), client.DryRunAll)
		if err == nil {
			return nil
		}
		return fmt.Errorf("still called: %w", err)
	})
}

func TestRepairs(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "repair", []vmipamv1.IPRange{{CIDR: "10.80.0.0/24"}})
	newPool(t, v, "repair-dual", []vmipamv1.IPRange{{CIDR: "10.82.0.0/24"}, {CIDR: "fd00:82::/120"}})
	ctx := t.Context()
	m := v.reg.Get("repair")

	// Released from the watch's deletion, or else by the resync (every
	// second here); TestGoneFromTheWatch, with no resync, proves the first.
	t.Run("force-removed finalizer is caught", func(t *testing.T) {
		obj := vm(ns, "forced", "repair")
		a := createBound(t, m, obj)
		deleteByForce(t, obj)
		harness.Eventually(t, 15*time.Second, "the address released", func() error { return wantState(m, a, ipam.StateCooldown) })
	})

	bypassMutation(t)
	t.Run("an object created without the webhook gets an address", func(t *testing.T) {
		obj := vm(ns, "bypassed", "repair")
		if err := k8sClient.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		if len(obj.Spec.Addresses) != 0 {
			t.Fatalf("the webhook was not bypassed: %v", obj.Spec.Addresses)
		}
		harness.Eventually(t, 15*time.Second, "the controller to assign an address", func() error {
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				return err
			}
			if len(obj.Spec.Addresses) != 1 || len(obj.Finalizers) != 1 {
				return fmt.Errorf("addresses %v finalizers %v", obj.Spec.Addresses, obj.Finalizers)
			}
			return wantState(m, netip.MustParseAddr(obj.Spec.Addresses[0]), ipam.StateAllocated)
		})
	})
	t.Run("objects outside every pool stay out of the queue; a pool added later adopts them", func(t *testing.T) {
		before := reconciles(t, "address-gc")
		const n = 24
		outside := make([]*vmipamv1.VirtualMachine, n)
		for i := range outside {
			outside[i] = vm(ns, fmt.Sprintf("outside-%d", i), "", fmt.Sprintf("10.81.0.%d", 10+i))
			if err := k8sClient.Create(ctx, outside[i]); err != nil {
				t.Fatal(err)
			}
		}
		// One object after them that the controller must act on: once it
		// has an address, their events went past the controller too.
		marker := vm(ns, "after-outside", "repair")
		if err := k8sClient.Create(ctx, marker); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 15*time.Second, "the controller to assign the marker an address", func() error {
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(marker), marker); err != nil {
				return err
			}
			if len(marker.Spec.Addresses) != 1 {
				return fmt.Errorf("addresses %v", marker.Spec.Addresses)
			}
			return nil
		})
		// The marker's own reconciles, and the earlier objects' looks
		// again, are a few; one per object outside the pools would be n
		// more.
		if got := reconciles(t, "address-gc") - before; got >= n {
			t.Errorf("%d reconciles for %d objects outside every pool and one to assign", got, n)
		}
		late := newPool(t, v, "late", []vmipamv1.IPRange{{CIDR: "10.81.0.0/24"}})
		harness.Eventually(t, 15*time.Second, "the new pool to hold each object's address", func() error {
			for _, obj := range outside {
				st, o, _ := v.reg.Get(late.Name).Lookup(netip.MustParseAddr(obj.Spec.Addresses[0]))
				if st != ipam.StateAllocated || o.UID != string(obj.UID) {
					return fmt.Errorf("%s of %s is %s to %+v", obj.Spec.Addresses[0], obj.Name, st, o)
				}
			}
			return nil
		})
	})
	t.Run("a dual-stack object created without the webhook gets both families", func(t *testing.T) {
		obj := vm(ns, "bypassed-dual", "repair-dual")
		obj.Spec.IPFamilyPolicy = ptr.To(vmipamv1.RequireDualStack)
		obj.Spec.IPFamilies = []vmipamv1.IPFamily{vmipamv1.IPv6}
		if err := k8sClient.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		dual := v.reg.Get("repair-dual")
		harness.Eventually(t, 15*time.Second, "the controller to assign both addresses", func() error {
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
				return err
			}
			if len(obj.Spec.Addresses) != 2 || !netip.MustParseAddr(obj.Spec.Addresses[0]).Is6() || !netip.MustParseAddr(obj.Spec.Addresses[1]).Is4() {
				return fmt.Errorf("addresses %v, want IPv6 then IPv4", obj.Spec.Addresses)
			}
			for _, s := range obj.Spec.Addresses {
				if err := wantState(dual, netip.MustParseAddr(s), ipam.StateAllocated); err != nil {
					return err
				}
			}
			return nil
		})
	})
	t.Run("two live objects on one address are reported, never papered over", func(t *testing.T) {
		first, second := vm(ns, "dup-1", "repair", "10.80.0.200"), vm(ns, "dup-2", "repair", "10.80.0.200")
		if err := k8sClient.Create(ctx, first); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 10*time.Second, "dup-1 adopted", func() error {
			st, o, _ := m.Lookup(netip.MustParseAddr("10.80.0.200"))
			if st != ipam.StateAllocated || o.UID != string(first.UID) {
				return fmt.Errorf("%s %+v", st, o)
			}
			return nil
		})
		if err := k8sClient.Create(ctx, second); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 15*time.Second, "the DuplicateAddress condition", func() error {
			c := poolCondition(t, "repair", vmipamv1.ConditionDuplicateAddress)
			if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "10.80.0.200") {
				return fmt.Errorf("condition %+v", c)
			}
			return nil
		})
		harness.Eventually(t, 10*time.Second, "a DuplicateAddress event on dup-2", func() error {
			return wantEvent(ctx, ns, "dup-2", "DuplicateAddress")
		})
		// The first keeps it.
		if st, o, _ := m.Lookup(netip.MustParseAddr("10.80.0.200")); st != ipam.StateAllocated || o.UID != string(first.UID) {
			t.Fatalf("after the conflict: %s %+v, want still allocated to dup-1", st, o)
		}
	})
}

// createBound creates obj through the webhook and waits until pool m has
// its address bound to it; obj is read back, as stored.
func createBound(t *testing.T, m *pools.Pool, obj *vmipamv1.VirtualMachine) netip.Addr {
	t.Helper()
	ctx := t.Context()
	if err := k8sClient.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr(obj.Spec.Addresses[0])
	harness.Eventually(t, 10*time.Second, "bound", func() error { return wantState(m, a, ipam.StateAllocated) })
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		t.Fatal(err)
	}
	return a
}

// deleteByForce removes vmipam's finalizer from obj, as an administrator
// might, and deletes it: it goes at once, its address not released.
func deleteByForce(t *testing.T, obj *vmipamv1.VirtualMachine) {
	t.Helper()
	ctx := t.Context()
	obj.Finalizers = nil
	if err := k8sClient.Update(ctx, obj); err != nil {
		t.Fatalf("remove the finalizer by force: %v", err)
	}
	if err := k8sClient.Delete(ctx, obj); err != nil {
		t.Fatal(err)
	}
}

func wantState(m *pools.Pool, a netip.Addr, want ipam.State) error {
	if st, _, _ := m.Lookup(a); st != want {
		return fmt.Errorf("%s is %s, want %s", a, st, want)
	}
	return nil
}

func wantEvent(ctx context.Context, ns, name, reason string) error {
	var l eventsv1.EventList
	if err := k8sClient.List(ctx, &l, client.InNamespace(ns)); err != nil {
		return err
	}
	for _, e := range l.Items {
		if e.Regarding.Name == name && e.Reason == reason {
			return nil
		}
	}
	return fmt.Errorf("no %s event on %s among %d", reason, name, len(l.Items))
}

// TestIPPoolValidation: the schema (CEL) and the validating webhook refuse
// bad pools with messages that name the field.
func TestIPPoolValidation(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	newPool(t, v, "existing", []vmipamv1.IPRange{{CIDR: "10.90.0.0/24"}})
	tests := map[string]struct {
		ranges []vmipamv1.IPRange
		mutate func(*vmipamv1.IPPool)
		want   []string
	}{
		"bad CIDR":               {[]vmipamv1.IPRange{{CIDR: "10.0.0/24"}}, nil, []string{"spec.ranges[0].cidr", "must be a CIDR"}},
		"IPv6 typo":              {[]vmipamv1.IPRange{{CIDR: "fd00::g/64"}}, nil, []string{"spec.ranges[0].cidr", "must be a CIDR"}},
		"host bits":              {[]vmipamv1.IPRange{{CIDR: "10.1.0.1/24"}}, nil, []string{"spec.ranges[0].cidr", "host bits are set"}},
		"first after last":       {[]vmipamv1.IPRange{{CIDR: "10.1.0.0/24", First: "10.1.0.9", Last: "10.1.0.2"}}, nil, []string{"spec.ranges[0].first", "after last"}},
		"first outside":          {[]vmipamv1.IPRange{{CIDR: "10.1.0.0/24", First: "10.2.0.9"}}, nil, []string{"spec.ranges[0]", "first must lie inside cidr"}},
		"exclude outside":        {[]vmipamv1.IPRange{{CIDR: "10.1.0.0/24", Exclude: []string{"10.9.0.1"}}}, nil, []string{"spec.ranges[0].exclude[0]", "outside the range's CIDR"}},
		"overlap in pool":        {[]vmipamv1.IPRange{{CIDR: "10.1.0.0/24"}, {CIDR: "10.1.0.128/25"}}, nil, []string{"spec.ranges[1].cidr", "overlaps"}},
		"overlap of pools":       {[]vmipamv1.IPRange{{CIDR: "10.90.0.0/25"}}, nil, []string{"spec.ranges[0].cidr", `IPPool "existing"`}},
		"gateway outside":        {[]vmipamv1.IPRange{{CIDR: "10.1.0.0/24", Gateway: "10.2.0.1"}}, nil, []string{"spec.ranges[0].gateway", "must lie inside cidr"}},
		"gateway not an address": {[]vmipamv1.IPRange{{CIDR: "10.1.0.0/24", Gateway: "gw"}}, nil, []string{"spec.ranges[0].gateway", "must be an IP address"}},
		"route without via or gateway": {[]vmipamv1.IPRange{{CIDR: "10.1.0.0/24", Routes: []vmipamv1.Route{{Destination: "10.200.0.0/16"}}}}, nil,
			[]string{"spec.ranges[0].routes", "set gateway, or via on every route"}},
		"route via outside": {[]vmipamv1.IPRange{{CIDR: "10.1.0.0/24", Routes: []vmipamv1.Route{{Destination: "10.200.0.0/16", Via: "10.3.0.1"}}}}, nil,
			[]string{"spec.ranges[0].routes[0].via", "outside the range's CIDR 10.1.0.0/24"}},
		"route of the other family": {[]vmipamv1.IPRange{{CIDR: "10.1.0.0/24", Gateway: "10.1.0.1", Routes: []vmipamv1.Route{{Destination: "fd10::/64"}}}}, nil,
			[]string{"spec.ranges[0].routes[0].destination", "not of the family"}},
		"bad watermarks": {[]vmipamv1.IPRange{{CIDR: "10.1.0.0/24"}}, func(p *vmipamv1.IPPool) {
			p.Spec.Watermarks = &vmipamv1.Watermarks{Low: 10, Target: 5, High: 20}
		}, []string{"low <= target <= high"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := fixture.Pool("", fixture.WithGenerateName("bad-"), fixture.WithRanges(tc.ranges...))
			if tc.mutate != nil {
				tc.mutate(p)
			}
			err := k8sClient.Create(t.Context(), p)
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create: %v; want Invalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// TestPoolNotReady: an IPPool whose spec the allocator cannot apply (here
// created while the validating webhook was away) shows Ready=False with
// the reason and the allocator's message, instead of nothing.
func TestPoolNotReady(t *testing.T) {
	ctx := t.Context()
	v := startVMIPAM(t, clocktesting.NewFakeClock(epoch))
	var l admissionregv1.ValidatingWebhookConfigurationList
	if err := k8sClient.List(ctx, &l); err != nil {
		t.Fatal(err)
	}
	newOverlapping := func() *vmipamv1.IPPool {
		return fixture.Pool("overlapping", fixture.WithCIDRs("10.81.0.0/24", "10.81.0.0/25"))
	}
	for _, c := range l.Items {
		if err := k8sClient.Delete(ctx, &c); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.ResourceVersion = ""
			if err := k8sClient.Create(context.Background(), &c); err != nil {
				t.Errorf("restore validating webhook %s: %v", c.Name, err)
			}
			harness.Eventually(t, 30*time.Second, "the validating webhook to be back", func() error {
				if k8sClient.Create(context.Background(), newOverlapping(), client.DryRunAll) == nil {
					return errors.New("an overlapping pool is still accepted")
				}
				return nil
			})
		})
	}
	pool := newOverlapping()
	// The API server drops the configuration asynchronously: retry until
	// the webhook no longer refuses the pool.
	harness.Eventually(t, 30*time.Second, "the pool to be created without the webhook", func() error {
		return k8sClient.Create(ctx, pool)
	})
	t.Cleanup(func() {
		_ = k8sClient.Delete(context.Background(), pool)
	})
	harness.Eventually(t, 30*time.Second, "Ready=False with the reason", func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
			return err
		}
		c := meta.FindStatusCondition(pool.Status.Conditions, vmipamv1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "InvalidSpec" || !strings.Contains(c.Message, "spec.ranges") {
			return fmt.Errorf("Ready condition %+v", c)
		}
		return nil
	})
	if v.reg.Get("overlapping") != nil {
		t.Errorf("an allocator serves a pool whose spec is invalid")
	}
}
