package controller_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/controller"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools/poolstest"
	"github.com/vmipam/vmipam/test/fixture"
)

// TestReconcileBeforeThePoolIsSeen: a VM without an address, created by a
// user who bypassed the webhook right after the IPPool that applies to its
// namespace, is reconciled before this replica's cache shows the pool. The
// pool is not missing, only not seen yet: the controller looks again in a
// second, and warns of nothing, for the VM's first minute. It used to
// record a NoPool warning on the VM and look again a minute later.
func TestReconcileBeforeThePoolIsSeen(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	team := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}
	for _, tt := range []struct {
		name string
		pool bool          // a default pool is in the API server (never in the cache)
		age  time.Duration // of the VM
		want time.Duration
		warn string
	}{
		{name: "a default pool the cache has not seen", pool: true, age: 5 * time.Second, want: time.Second},
		// The same refusal a minute on may last (a lease lost, a
		// recovery that keeps failing): the VM's owner hears why.
		{name: "a default pool the cache has not seen, an old VM", pool: true, age: 2 * time.Minute, want: time.Minute, warn: "NoPool"},
		{name: "no pool", age: 5 * time.Second, want: time.Minute, warn: "NoPool"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(team.DeepCopy()).Build()
			if tt.pool {
				if err := api.Create(ctx, fixture.Pool("fresh", fixture.WithDefault(), fixture.WithCIDRs("10.0.0.0/28"))); err != nil {
					t.Fatal(err)
				}
			}
			reg := poolstest.StartUnseen(t, api, clk)
			vm := &vmipamv1.VirtualMachine{
				ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "bypassed", UID: "uid-bypassed", CreationTimestamp: metav1.NewTime(clk.Now().Add(-tt.age))},
				Spec:       vmipamv1.VirtualMachineSpec{Image: "registry.example/vm:1", CPUs: 1, Memory: "1Gi"},
			}
			if err := api.Create(ctx, vm); err != nil {
				t.Fatal(err)
			}
			rec := events.NewFakeRecorder(10)
			gc := &controller.AddressGC{Client: api, Registry: reg, Kind: kinds.VirtualMachine, Recorder: rec, Clock: clk}
			res, err := gc.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(vm)})
			if err != nil {
				t.Fatal(err)
			}
			if res.RequeueAfter != tt.want {
				t.Errorf("looks again after %v, want %v", res.RequeueAfter, tt.want)
			}
			var got string
			select {
			case got = <-rec.Events:
			default:
			}
			if tt.warn == "" && got != "" || tt.warn != "" && !strings.Contains(got, tt.warn) {
				t.Errorf("event %q, want %q", got, tt.warn)
			}
		})
	}
}
