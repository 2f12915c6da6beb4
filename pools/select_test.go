package pools_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/pools/poolstest"
	"github.com/vmipam/vmipam/test/fixture"
)

// TestPoolTroubleStaysInPool: a pool that is not recovered yet, whose
// spec cannot be applied, or that was re-created under its name refuses
// only the objects that draw from it, each with its own reason, while
// every other pool serves; and the replica's readiness waits only until it
// has tried every pool once, not until every pool can serve.
func TestPoolTroubleStaysInPool(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	pool := func(name, uid, cidr string, selector map[string]string) *vmipamv1.IPPool {
		p := fixture.Pool(name, fixture.Stored(uid), fixture.WithCIDRs(cidr))
		if selector == nil {
			p.Spec.Default = true
		} else {
			p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: selector}
		}
		return p
	}
	good := pool("good", "uid-good", "10.0.0.0/28", nil)
	// A spec that bypassed the IPPool webhook: no allocator can be built.
	broken := pool("broken", "uid-broken", "10.0.1.0/33", map[string]string{"team": "b"})
	late := pool("late", "uid-late", "10.0.2.0/28", map[string]string{"team": "c"})
	ns := func(name, team string) *corev1.Namespace {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if team != "" {
			n.Labels = map[string]string{"team": team}
		}
		return n
	}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).
		WithObjects(good.DeepCopy(), broken.DeepCopy(), late.DeepCopy(), ns("team-a", ""), ns("team-b", "b"), ns("team-c", "c")).Build()
	reg := poolstest.Start(t, c, clk, "vmipam", good)
	if err := reg.Ensure(ctx, broken); err == nil {
		t.Fatal("Ensure of a pool whose range is 10.0.1.0/33 succeeded")
	}
	vm := kinds.VirtualMachine
	if err := reg.Serving(ctx); err == nil || !strings.Contains(err.Error(), "late") {
		t.Errorf("Serving before the pool late was tried: %v, want it not ready for late", err)
	}

	tests := map[string]struct {
		ns, named string
		want      string // the pool chosen, or "" for a refusal
		notReady  bool   // the refusal is ErrNotReady (retry)
		says      string // what the refusal names
	}{
		"default pool, beside a broken and a late one": {ns: "team-a", want: "good"},
		"the good pool named":                          {ns: "team-b", named: "good", want: "good"},
		"selected by a broken pool":                    {ns: "team-b", says: "IPPool broken cannot be served"},
		"naming the broken pool":                       {ns: "team-a", named: "broken", says: "IPPool broken cannot be served"},
		"selected by a pool not recovered yet":         {ns: "team-c", notReady: true, says: "IPPool late is not recovered yet"},
		"naming a pool not recovered yet":              {ns: "team-a", named: "late", notReady: true, says: "IPPool late is not recovered yet"},
		"naming a pool that does not exist":            {ns: "team-a", named: "nope", says: `IPPool "nope" does not exist`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p, err := reg.Select(ctx, vm, tc.ns, tc.named)
			if tc.want != "" {
				if err != nil || p == nil || p.Name() != tc.want {
					t.Fatalf("Select = %v, %v; want pool %s", p, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Select chose %s, want a refusal saying %q", p.Name(), tc.says)
			}
			if errors.Is(err, pools.ErrNotReady) != tc.notReady {
				t.Errorf("Select: %v; ErrNotReady %v, want %v", err, errors.Is(err, pools.ErrNotReady), tc.notReady)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Select: %v; want it to say %q", err, tc.says)
			}
		})
	}

	// Tried every pool: ready, though broken cannot serve.
	if err := reg.Ensure(ctx, late); err != nil {
		t.Fatal(err)
	}
	if err := reg.Serving(ctx); err != nil {
		t.Errorf("Serving once every pool was tried, broken failing: %v", err)
	}

	// good deleted and created again under its name: the old allocator
	// serves nothing of the new pool.
	if err := c.Delete(ctx, good); err != nil {
		t.Fatal(err)
	}
	again := pool("good", "uid-good-2", "10.0.0.0/28", nil)
	if err := c.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Select(context.Background(), vm, "team-a", ""); !errors.Is(err, pools.ErrNotReady) || !strings.Contains(err.Error(), "IPPool good") {
		t.Errorf("Select of a pool re-created under its name, not recovered yet: %v, want ErrNotReady naming good", err)
	}
	if p, err := reg.Select(ctx, vm, "team-c", ""); err != nil || p.Name() != "late" {
		t.Errorf("Select of another pool meanwhile: %v, %v; want late", p, err)
	}
}

// TestLostAllocatorRebuilt: an allocator whose claims another holder took
// over (the store shows that holder on an address it held) serves nothing
// and can write nothing; the next Ensure of its pool rebuilds it from the
// store. Before, the rebuild first tried to flush the lost allocator,
// failed, and left the pool unserved at every retry.
func TestLostAllocatorRebuilt(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	pool := fixture.Pool("p", fixture.Stored("uid-p"), fixture.WithCIDRs("10.0.0.0/28"), fixture.WithDefault())
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(pool.DeepCopy()).Build()
	reg := poolstest.Start(t, c, clk, "vmipam", pool)
	p := reg.Get("p")
	a, err := p.AllocateFamily(ctx, ipam.Reservation{Token: "t1"}, vmipamv1.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	// Released: its cooldown waits for the next flush (the block is
	// dirty), since the store already protects it.
	if err := p.Release(ctx, a, ipam.Owner{Token: "t1"}); err != nil {
		t.Fatal(err)
	}
	// Another holder takes every claim of the block over, as a takeover
	// of a holder judged gone does.
	var blocks vmipamv1.IPBlockList
	if err := c.List(ctx, &blocks); err != nil || len(blocks.Items) != 1 {
		t.Fatalf("IPBlocks: %v, %v", blocks.Items, err)
	}
	blk := &blocks.Items[0]
	blk.Spec.Claims = map[string]string{"taker": blk.Spec.Claims["vmipam"]}
	blk.Spec.InUse = map[string]string{"taker": blk.Spec.InUse["vmipam"]}
	blk.Spec.Armed = nil
	if err := c.Update(ctx, blk); err != nil {
		t.Fatal(err)
	}
	// The taker's write deletes the share of the holder it took over.
	var shares vmipamv1.IPBlockShareList
	if err := c.List(ctx, &shares); err != nil || len(shares.Items) != 1 {
		t.Fatalf("IPBlockShares: %v, %v", shares.Items, err)
	}
	if err := c.Delete(ctx, &shares.Items[0]); err != nil {
		t.Fatal(err)
	}
	// The allocator's next write (the arming or claim of an allocation
	// once its ready list runs dry) finds the takeover.
	for i := 0; p.Ready(); i++ {
		if i == 20 {
			t.Fatalf("20 allocations after the takeover of its claims (the first %s), and the allocator still serves", a)
		}
		_, _ = p.AllocateFamily(ctx, ipam.Reservation{Token: fmt.Sprint("more-", i)}, vmipamv1.IPv4)
	}
	// No IPPool event comes: the registry rebuilds the lost allocator of
	// its own, by the next renewal of its Lease at the latest.
	deadline := time.Now().Add(30 * time.Second)
	for q := reg.Get("p"); q == p || !q.Ready(); q = reg.Get("p") {
		if time.Now().After(deadline) {
			t.Fatalf("30s after its claims were taken over, the pool's allocator is the lost one (%v) or not ready (%v)", q == p, q.Ready())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := reg.Ensure(ctx, pool); err != nil {
		t.Fatalf("Ensure of a pool whose allocator was rebuilt: %v", err)
	}
}

// TestSelectPoolTheCacheHasNotSeen: an object created a moment after its
// pool (kubectl apply of both) can reach the webhook before the replica's
// cache shows the pool. Its admission is refused as not ready, which the
// client retries, not as invalid ("no IPPool applies", "does not exist"),
// once the API server shows a pool that applies; with none there either,
// the refusal stands as before.
func TestSelectPoolTheCacheHasNotSeen(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	team := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team", Labels: map[string]string{"team": "t"}}}
	for _, tt := range []struct {
		name  string
		pool  *vmipamv1.IPPool // created in the API server only; nil for none
		named string
		says  string
		ready bool // the refusal is ErrNotReady
	}{
		{name: "a default pool", pool: fixture.Pool("fresh", fixture.WithDefault(), fixture.WithCIDRs("10.0.0.0/28")),
			ready: true, says: "an IPPool that applies to namespace team was just created"},
		{name: "a pool selecting the namespace", pool: func() *vmipamv1.IPPool {
			p := fixture.Pool("fresh", fixture.WithCIDRs("10.0.0.0/28"))
			p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "t"}}
			return p
		}(), ready: true, says: "was just created"},
		{name: "the pool named", pool: fixture.Pool("fresh", fixture.WithCIDRs("10.0.0.0/28")), named: "fresh",
			ready: true, says: "IPPool fresh was just created"},
		{name: "a pool that does not apply", pool: func() *vmipamv1.IPPool {
			p := fixture.Pool("fresh", fixture.WithCIDRs("10.0.0.0/28"))
			p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "other"}}
			return p
		}(), says: "no IPPool applies"},
		{name: "no pool, none named", says: "no IPPool applies"},
		{name: "no pool, one named", named: "nope", says: `IPPool "nope" does not exist`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(team.DeepCopy()).Build()
			if tt.pool != nil {
				if err := api.Create(ctx, tt.pool); err != nil {
					t.Fatal(err)
				}
			}
			// The cache: the API server's objects, but no IPPool yet.
			reg := poolstest.StartUnseen(t, api, clk)
			_, err := reg.Select(ctx, kinds.VirtualMachine, "team", tt.named)
			if err == nil || !strings.Contains(err.Error(), tt.says) || errors.Is(err, pools.ErrNotReady) != tt.ready {
				t.Errorf("Select: %v; want a refusal saying %q, ErrNotReady %t", err, tt.says, tt.ready)
			}
		})
	}
}
