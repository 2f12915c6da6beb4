package pools_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools/poolstest"
	"github.com/vmipam/vmipam/test/fixture"
)

// TestNoListYetIsNotAnEmptyList: a replica that recovers a pool before its
// first list of the holder Leases (a replacement taking its slot in a
// rollout) counts every other holder as running until a list says
// otherwise. Before, it was handed an empty list, took every other holder
// for one that is not running, and refused creates as exhausted with the
// pool "held by vmipam replicas that are not running".
func TestNoListYetIsNotAnEmptyList(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	pool := fixture.Pool("p", fixture.Stored("uid-p"), fixture.WithCIDRs("10.0.0.0/29"), fixture.WithDefault())
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(pool.DeepCopy()).Build()

	// Another replica holds every address (the /29's six), each pending.
	other := poolstest.Start(t, c, clk, "other", pool).Get("p")
	const usable = 6
	for i := range usable {
		if _, err := other.AllocateFamily(ctx, ipam.Reservation{Token: fmt.Sprint("other-", i)}, vmipamv1.IPv4); err != nil {
			t.Fatalf("the other replica's allocation %d of %d: %v", i+1, usable, err)
		}
	}

	// This replica's lists of the holder Leases all fail: it has none.
	noList := interceptor.NewClient(c, interceptor.Funcs{
		List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*coordinationv1.LeaseList); ok {
				return errors.New("no list of the holder Leases yet")
			}
			return cl.List(ctx, list, opts...)
		},
	})
	p := poolstest.Start(t, noList, clk, "vmipam", pool).Get("p")
	_, err := p.AllocateFamily(ctx, ipam.Reservation{Token: "mine"}, vmipamv1.IPv4)
	if !errors.Is(err, ipam.ErrExhausted) {
		t.Fatalf("allocation with every address pending at another replica: %v; want ErrExhausted", err)
	}
	if strings.Contains(err.Error(), "not running") {
		t.Errorf("before any list of the holder Leases, the refusal calls the other replica not running: %v", err)
	}
	// The store shows what the other replica last wrote: some of its
	// addresses in use, the rest armed, which this replica asked for.
	if want := "1 other replicas"; !strings.Contains(err.Error(), want) {
		t.Errorf("refusal %q; want it to say %q", err, want)
	}
}
