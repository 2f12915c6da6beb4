package controller

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools/poolstest"
	"github.com/vmipam/vmipam/test/fixture"
)

// TestBindOnCreate: the create of an object this replica stamped binds its
// reservation without a reconcile; every other event, and a create that
// needs more than the bind, goes to the work queue as before, the bind
// left undone.
func TestBindOnCreate(t *testing.T) {
	ctx := t.Context()
	pool := fixture.Pool("p", fixture.Stored("uid-pool"), fixture.WithCIDRs("10.98.0.0/28"))
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(pool.DeepCopy()).Build()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	reg := poolstest.Start(t, c, clk, "vmipam", pool)
	p := reg.Get(pool.Name)
	r := &AddressGC{Registry: reg, Kind: kinds.VirtualMachine}
	h := &bindOnCreate{bind: r.bindCreated}

	stamped := func(token string) *metav1.PartialObjectMetadata {
		a, err := p.AllocateFamily(ctx, ipam.Reservation{Token: token}, vmipamv1.IPv4)
		if err != nil {
			t.Fatal(err)
		}
		m := kinds.VirtualMachine.NewMetadata()
		m.ObjectMeta = metav1.ObjectMeta{Namespace: "n", Name: token, UID: "uid-" + types.UID(token),
			Annotations: map[string]string{vmipamv1.TokenAnnotation: token, vmipamv1.PoolAnnotation: "p", vmipamv1.AddressAnnotation: a.String()},
			Labels:      map[string]string{vmipamv1.HolderLabel: reg.HolderLabel()}, Finalizers: []string{vmipamv1.Finalizer}}
		return m
	}
	now := metav1.Now()
	n := 0
	for name, tc := range map[string]struct {
		change      func(m *metav1.PartialObjectMetadata)
		initialList bool
		bound       bool
	}{
		"stamped by this replica":        {bound: true},
		"in the initial list":            {initialList: true},
		"another replica's label":        {change: func(m *metav1.PartialObjectMetadata) { m.Labels[vmipamv1.HolderLabel] = "other" }},
		"without the finalizer":          {change: func(m *metav1.PartialObjectMetadata) { m.Finalizers = nil }},
		"being deleted":                  {change: func(m *metav1.PartialObjectMetadata) { m.DeletionTimestamp = &now }},
		"another token":                  {change: func(m *metav1.PartialObjectMetadata) { m.Annotations[vmipamv1.TokenAnnotation] = "forged" }},
		"another address":                {change: func(m *metav1.PartialObjectMetadata) { m.Annotations[vmipamv1.AddressAnnotation] = "10.98.0.14" }},
		"an unknown pool":                {change: func(m *metav1.PartialObjectMetadata) { m.Annotations[vmipamv1.PoolAnnotation] = "nope" }},
		"an address that does not parse": {change: func(m *metav1.PartialObjectMetadata) { m.Annotations[vmipamv1.AddressAnnotation] = "x" }},
	} {
		t.Run(name, func(t *testing.T) {
			n++
			m := stamped(fmt.Sprint("token-", n))
			addr := netip.MustParseAddr(m.Annotations[vmipamv1.AddressAnnotation])
			if tc.change != nil {
				tc.change(m)
			}
			q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
			defer q.ShutDown()
			h.Create(ctx, event.TypedCreateEvent[*metav1.PartialObjectMetadata]{Object: m, IsInInitialList: tc.initialList}, q)
			if queued := q.Len() == 1; queued == tc.bound {
				t.Errorf("queued %v, bound without a reconcile %v", queued, tc.bound)
			}
			st, o, _ := p.Lookup(addr)
			if tc.bound && (st != ipam.StateAllocated || o.UID != string(m.UID)) {
				t.Errorf("%s is %s for %q, want allocated to %s", addr, st, o.UID, m.UID)
			}
			if !tc.bound && st != ipam.StatePending {
				t.Errorf("%s is %s, want still pending for the reconcile", addr, st)
			}
			// Updates and deletes always go to the queue.
			h.Update(ctx, event.TypedUpdateEvent[*metav1.PartialObjectMetadata]{ObjectOld: m, ObjectNew: m}, q)
			if q.Len() == 0 {
				t.Error("an update was not queued")
			}
		})
	}
}
