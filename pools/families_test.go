package pools_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools/poolstest"
	"github.com/vmipam/vmipam/test/fixture"
)

// TestPoolOfBothFamilies: a pool with ranges of both families hands out
// each family's addresses under one token, counts each family apart, says
// which family ran out, takes back both reservations of a refused
// admission at once, and, recovered by another replica over the same
// store, finds each address of a live VM (one of each family) allocated
// to it, in its family's allocator, without one family's blocks mistaken
// for the other's.
func TestPoolOfBothFamilies(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	pool := fixture.Pool("dual", fixture.Stored("uid-dual"), fixture.WithCIDRs("fd00::/126", "10.0.0.0/29"),
		fixture.WithCooldown(time.Hour), fixture.WithPendingTTL(time.Minute))
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(pool.DeepCopy()).Build()
	reg := poolstest.Start(t, c, clk, "vmipam", pool)
	p := reg.Get("dual")
	if got := p.Families(); len(got) != 2 || got[0] != vmipamv1.IPv4 || got[1] != vmipamv1.IPv6 {
		t.Fatalf("Families() = %v, want [IPv4 IPv6]", got)
	}
	r := ipam.Reservation{Token: "t1", Namespace: "ns", Ref: "ns/vm-1"}
	a4, err := p.AllocateFamily(ctx, r, vmipamv1.IPv4)
	if err != nil || !a4.Is4() {
		t.Fatalf("IPv4 allocation: %s, %v", a4, err)
	}
	a6, err := p.AllocateFamily(ctx, r, vmipamv1.IPv6)
	if err != nil || !a6.Is6() {
		t.Fatalf("IPv6 allocation under the same token: %s, %v", a6, err)
	}
	for _, f := range []struct {
		fam    vmipamv1.IPFamily
		usable uint64
	}{{vmipamv1.IPv4, 6}, {vmipamv1.IPv6, 3}} {
		if c, ok := p.FamilySnapshot(f.fam); !ok || c.Pending != 1 || c.Usable != f.usable {
			t.Errorf("%s counts %+v, %v; want 1 pending of %d usable", f.fam, c, ok, f.usable)
		}
	}
	if c := p.Snapshot(); c.Pending != 2 || c.Usable != 9 {
		t.Errorf("pool counts %+v; want 2 pending of 9 usable", c)
	}
	// Both are bound under the token, each in its family.
	owner := ipam.Owner{Token: "t1", UID: "uid-1", Ref: "ns/vm-1"}
	for _, a := range []netip.Addr{a4, a6} {
		if got, err := p.Bind(a, owner); err != nil || got != a {
			t.Fatalf("Bind(%s) = %s, %v", a, got, err)
		}
	}
	// A refused dual admission takes both back, without a cooldown.
	r2 := ipam.Reservation{Token: "t2", Namespace: "ns", Ref: "ns/vm-2"}
	b4, err4 := p.AllocateFamily(ctx, r2, vmipamv1.IPv4)
	b6, err6 := p.AllocateFamily(ctx, r2, vmipamv1.IPv6)
	if err := errors.Join(err4, err6); err != nil {
		t.Fatal(err)
	}
	if back := p.Cancel("t2"); len(back) != 2 || back[0] != b4 || back[1] != b6 {
		t.Errorf("Cancel(t2) = %v, want [%s %s]", back, b4, b6)
	}
	for _, a := range []netip.Addr{b4, b6} {
		if st, _, _ := p.Lookup(a); st != ipam.StateFree {
			t.Errorf("%s is %s after the cancel, want free", a, st)
		}
	}
	// Two more IPv6 addresses, then IPv6 is out, and the message says so
	// with IPv6's figures, while IPv4 goes on.
	for _, tok := range []string{"t3", "t4"} {
		if _, err := p.AllocateFamily(ctx, ipam.Reservation{Token: tok, Namespace: "ns"}, vmipamv1.IPv6); err != nil {
			t.Fatal(err)
		}
	}
	_, err = p.AllocateFamily(ctx, ipam.Reservation{Token: "t5", Namespace: "ns"}, vmipamv1.IPv6)
	if !errors.Is(err, ipam.ErrExhausted) || !strings.Contains(err.Error(), `pool "dual" has no IPv6 address left: 1 of 3 usable IPv6 addresses allocated, 2 pending`) {
		t.Errorf("IPv6 exhausted: %v", err)
	}
	if _, err := p.AllocateFamily(ctx, ipam.Reservation{Token: "t5", Namespace: "ns"}, vmipamv1.IPv4); err != nil {
		t.Errorf("IPv4 after IPv6 ran out: %v", err)
	}
	// Another replica recovers the pool over the same store, with the VM
	// of both addresses live: each is allocated to it.
	vm := &vmipamv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm-1", UID: "uid-1", Annotations: map[string]string{
			vmipamv1.TokenAnnotation: "t1", vmipamv1.PoolAnnotation: "dual"}, Finalizers: []string{vmipamv1.Finalizer}},
		Spec: vmipamv1.VirtualMachineSpec{Addresses: []string{a4.String(), a6.String()}},
	}
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	if err := reg.Remove(ctx, "dual"); err != nil {
		t.Fatal(err)
	}
	// Twice: what the first recovery writes back must keep the other
	// family's claims.
	for i := range 2 {
		other := poolstest.Start(t, c, clk, "vmipam", poolFrom(t, c, "dual"))
		q := other.Get("dual")
		for _, a := range []netip.Addr{a4, a6} {
			if st, o, _ := q.Lookup(a); st != ipam.StateAllocated || o.UID != "uid-1" {
				t.Errorf("after recovery %d %s is %s %+v, want allocated to uid-1", i+1, a, st, o)
			}
		}
		if c := q.Snapshot(); c.Claimed == 0 {
			t.Errorf("after recovery %d nothing is claimed", i+1)
		}
		if err := other.Remove(ctx, "dual"); err != nil {
			t.Fatal(err)
		}
		var blocks vmipamv1.IPBlockList
		if err := c.List(ctx, &blocks); err != nil {
			t.Fatal(err)
		}
		if len(blocks.Items) != 2 {
			t.Errorf("after recovery %d the store holds %d blocks, want one of each family", i+1, len(blocks.Items))
		}
	}
}

// poolFrom reads the IPPool name from c.
func poolFrom(t *testing.T, c client.Client, name string) *vmipamv1.IPPool {
	t.Helper()
	p := &vmipamv1.IPPool{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: name}, p); err != nil {
		t.Fatal(err)
	}
	return p
}
