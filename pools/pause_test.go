package pools_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/pools/poolstest"
	"github.com/vmipam/vmipam/test/fixture"
)

// pauseVersion returns pool at its next generation with spec.paused set to
// paused, stored in c, as the IPPool controller would hand it to Ensure.
func pauseVersion(t *testing.T, c client.Client, pool *vmipamv1.IPPool, paused bool) *vmipamv1.IPPool {
	t.Helper()
	next := pool.DeepCopy()
	next.Spec.Paused = paused
	next.Generation++
	stored := &vmipamv1.IPPool{}
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(pool), stored); err != nil {
		t.Fatal(err)
	}
	stored.Spec.Paused, stored.Generation = paused, next.Generation
	if err := c.Update(t.Context(), stored); err != nil {
		t.Fatal(err)
	}
	return next
}

// TestPausedPoolRefuses: a paused pool hands out nothing, whether the
// create names it, its namespace selector chose it, or it is the default,
// for dynamic and static requests and dry runs alike; the refusal is a
// Forbidden on the kind's pool field naming the pool, spec.paused and the
// way out, and reserves nothing. A pool that is not paused beside it
// serves as before.
func TestPausedPoolRefuses(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	def := fixture.Pool("def", fixture.Stored("uid-def"), fixture.WithCIDRs("10.0.0.0/28"), fixture.WithDefault())
	sel := fixture.Pool("sel", fixture.Stored("uid-sel"), fixture.WithCIDRs("10.0.1.0/28"))
	sel.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "s"}}
	open := fixture.Pool("open", fixture.Stored("uid-open"), fixture.WithCIDRs("10.0.2.0/28"))
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(def.DeepCopy(), sel.DeepCopy(), open.DeepCopy(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-s", Labels: map[string]string{"team": "s"}}}).Build()
	reg := poolstest.Start(t, c, clk, "vmipam", def, sel, open)
	for _, p := range []*vmipamv1.IPPool{def, sel} {
		if err := reg.Ensure(ctx, pauseVersion(t, c, p, true)); err != nil {
			t.Fatal(err)
		}
	}
	vm := kinds.VirtualMachine
	statics := func(s string) []pools.Static {
		return []pools.Static{{Addr: netip.MustParseAddr(s), Bits: -1, Raw: s, Path: field.NewPath("spec", "address")}}
	}
	tests := map[string]struct {
		ns, named string
		statics   []pools.Static
		dryRun    bool
		paused    string // the pool named in the refusal; "" when admitted
	}{
		"default pool, dynamic":          {ns: "team-a", paused: "def"},
		"default pool, static":           {ns: "team-a", statics: statics("10.0.0.5"), paused: "def"},
		"default pool, dry run":          {ns: "team-a", dryRun: true, paused: "def"},
		"default pool, static dry run":   {ns: "team-a", statics: statics("10.0.0.5"), dryRun: true, paused: "def"},
		"selected pool, dynamic":         {ns: "team-s", paused: "sel"},
		"selected pool, static":          {ns: "team-s", statics: statics("10.0.1.5"), paused: "sel"},
		"named paused pool":              {ns: "team-a", named: "sel", paused: "sel"},
		"named paused pool, static":      {ns: "team-s", named: "def", statics: statics("10.0.0.6"), paused: "def"},
		"named open pool beside them":    {ns: "team-s", named: "open"},
		"named open pool, static":        {ns: "team-a", named: "open", statics: statics("10.0.2.5")},
		"named open pool, static dryRun": {ns: "team-a", named: "open", statics: statics("10.0.2.6"), dryRun: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ad, err := reg.Admit(ctx, pools.Create{Kind: vm, Namespace: tc.ns, Name: "vm", Pool: tc.named, Ref: tc.ns + "/vm",
				Ask: pools.Ask{Statics: tc.statics}, DryRun: tc.dryRun})
			if tc.paused == "" {
				if err != nil || ad.Pool.Name() != tc.named {
					t.Fatalf("Admit = %v, %v; want admitted by %s", ad.Pool, err, tc.named)
				}
				return
			}
			var fe *pools.FieldError
			if !errors.As(err, &fe) || len(fe.Errs) != 1 {
				t.Fatalf("Admit from a paused pool: %v (%T), want one *pools.FieldError", err, err)
			}
			got := fe.Errs[0]
			if got.Type != field.ErrorTypeForbidden || got.Field != vm.PoolPath() {
				t.Errorf("refusal %v: type %s on %q, want Forbidden on %q", got, got.Type, got.Field, vm.PoolPath())
			}
			for _, want := range []string{
				`IPPool "` + tc.paused + `" is paused (spec.paused)`, "hands out no new addresses",
				"name another pool in " + vm.PoolPath(),
				`kubectl patch ippools.vmipam.io ` + tc.paused + ` --type merge -p '{"spec":{"paused":false}}'`,
			} {
				if !strings.Contains(got.Detail, want) {
					t.Errorf("refusal %q does not say %q", got.Detail, want)
				}
			}
			if c := reg.Get(tc.paused).Snapshot(); c.Pending != 0 || c.Allocated != 0 {
				t.Errorf("paused pool %s reserved something: %+v", tc.paused, c)
			}
		})
	}
}

// TestPauseKeepsAllocator: pausing and unpausing flip the pool's flag
// without rebuilding its allocator (no recovery, no resting of addresses);
// while paused, the addresses already handed out are bound and released
// into their cooldown as before, and the garbage collector's Assign is
// refused with a *PausedError; once unpaused, creates are served again.
// A change of the ranges with the pause still rebuilds, paused.
func TestPauseKeepsAllocator(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	pool := fixture.Pool("p", fixture.Stored("uid-p"), fixture.WithCIDRs("10.0.0.0/28"), fixture.WithDefault())
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(pool.DeepCopy(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}).Build()
	reg := poolstest.Start(t, c, clk, "vmipam", pool)
	p := reg.Get("p")
	admit := func(name string) (pools.Admitted, error) {
		return reg.Admit(ctx, pools.Create{Kind: kinds.VirtualMachine, Namespace: "ns", Name: name, Ref: "ns/" + name})
	}
	bound, err := admit("bound")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Bind(bound.Addrs[0], ipam.Owner{Token: bound.Token, UID: "uid-bound"}); err != nil {
		t.Fatal(err)
	}
	pending, err := admit("pending")
	if err != nil {
		t.Fatal(err)
	}

	paused := pauseVersion(t, c, pool, true)
	if err := reg.Ensure(ctx, paused); err != nil {
		t.Fatal(err)
	}
	if q := reg.Get("p"); q != p || !q.Paused() {
		t.Fatalf("after a pause: the same allocator %v, paused %v; want the same one, paused", q == p, q.Paused())
	}
	if _, err := admit("refused"); err == nil {
		t.Fatal("Admit from a paused pool succeeded")
	}
	var pe *pools.PausedError
	if _, err := p.Assign(ctx, ipam.Reservation{Token: "uid-gc", Namespace: "ns"}, pools.Plan{Families: []vmipamv1.IPFamily{vmipamv1.IPv4}}); !errors.As(err, &pe) || pe.Pool != "p" {
		t.Errorf("Assign (the garbage collector's) from a paused pool: %v, want a *pools.PausedError of p", err)
	}
	// What was handed out before the pause goes on.
	if _, err := p.Bind(pending.Addrs[0], ipam.Owner{Token: pending.Token, UID: "uid-pending"}); err != nil {
		t.Errorf("Bind of an address reserved before the pause: %v", err)
	}
	if err := p.Release(ctx, bound.Addrs[0], ipam.Owner{Token: bound.Token, UID: "uid-bound"}); err != nil {
		t.Errorf("Release while paused: %v", err)
	}
	if st, _, until := p.Lookup(bound.Addrs[0]); st != ipam.StateCooldown || until.IsZero() {
		t.Errorf("released while paused: state %v until %v, want a cooldown", st, until)
	}
	if st, o, _ := p.Lookup(pending.Addrs[0]); st != ipam.StateAllocated || o.UID != "uid-pending" {
		t.Errorf("bound while paused: state %v owner %+v, want allocated to uid-pending", st, o)
	}

	unpaused := pauseVersion(t, c, paused, false)
	if err := reg.Ensure(ctx, unpaused); err != nil {
		t.Fatal(err)
	}
	if q := reg.Get("p"); q != p || q.Paused() {
		t.Fatalf("after unpausing: the same allocator %v, paused %v; want the same one, not paused", q == p, q.Paused())
	}
	if ad, err := admit("again"); err != nil || ad.Pool != p {
		t.Errorf("Admit once unpaused: %v, %v", ad.Pool, err)
	}

	// The ranges change along with a pause: rebuilt, and paused.
	wider := pauseVersion(t, c, unpaused, true)
	wider.Spec.Ranges = []vmipamv1.IPRange{{CIDR: "10.0.0.0/27"}}
	if err := reg.Ensure(ctx, wider); err != nil {
		t.Fatal(err)
	}
	if q := reg.Get("p"); q == p || !q.Paused() {
		t.Errorf("after a change of ranges and a pause: rebuilt %v, paused %v; want both", q != p, q.Paused())
	}
}
