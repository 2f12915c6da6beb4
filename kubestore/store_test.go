package kubestore_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/test/harness"
)

// k8s talks to the envtest API server directly, without a cache: it serves
// both as the Store's writer and as its reader, as mgr.GetAPIReader() would.
var k8s client.Client

// TestMain starts a kube-apiserver and etcd with vmipam's CRDs; under
// -short it starts none and only the tests that need none run.
func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, func() (func(bool) error, error) {
		env, err := harness.StartEnv(harness.EnvOptions{CRDs: []string{filepath.Join("..", "deploy", "crd")}})
		if err != nil {
			return nil, err
		}
		k8s = env.Client
		return func(bool) error { return env.Stop() }, nil
	}))
}

// pools numbers the pools created, so that names stay unique under -count.
var pools atomic.Int64

// newPool creates an IPPool, so that blocks have a real owner with a UID. Its
// name is base behind a unique number, cut to the longest name allowed.
func newPool(t *testing.T, base string) *v1alpha1.IPPool {
	t.Helper()
	name := fmt.Sprintf("%d-%s", pools.Add(1), base)
	name = name[:min(len(name), validation.DNS1123SubdomainMaxLength)]
	pool := &v1alpha1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.IPPoolSpec{Ranges: []v1alpha1.IPRange{{CIDR: "10.0.0.0/8"}}},
	}
	if err := k8s.Create(t.Context(), pool); err != nil {
		t.Fatalf("create IPPool %s: %v", name, err)
	}
	return pool
}

// newStore returns a Store of pool that keeps no share: its Puts write the
// IPBlock as given. holderStore's are a replica's.
func newStore(pool *v1alpha1.IPPool) *kubestore.Store { return kubestore.New(k8s, k8s, pool, "") }

func holderStore(pool *v1alpha1.IPPool, holder string) *kubestore.Store {
	return kubestore.New(k8s, k8s, pool, holder)
}

// at returns the address at offset off of block p.
func at(p netip.Prefix, off int) netip.Addr {
	b := p.Addr().As16()
	b[14] |= byte(off >> 8)
	b[15] |= byte(off)
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		a = a.Unmap()
	}
	return a
}

func bitmap(offs ...int) *ipam.Bitmap {
	bm := new(ipam.Bitmap)
	for _, o := range offs {
		bm.Set(o)
	}
	return bm
}

// diffBlock describes how got differs from want, or returns "". Deadlines
// are compared after rounding want up to the second, as the encoding does;
// empty claim bitmaps are not persisted and not compared.
func diffBlock(got, want ipam.Block) string {
	var d []string
	if got.Prefix != want.Prefix {
		d = append(d, fmt.Sprintf("prefix %s, want %s", got.Prefix, want.Prefix))
	}
	if want.Version != "" && got.Version != want.Version {
		d = append(d, fmt.Sprintf("version %q, want %q", got.Version, want.Version))
	}
	nonEmpty := func(c map[string]*ipam.Bitmap) map[string]*ipam.Bitmap {
		out := map[string]*ipam.Bitmap{}
		for h, bm := range c {
			if !bm.Empty() {
				out[h] = bm
			}
		}
		return out
	}
	gc, wc := nonEmpty(got.Claims), nonEmpty(want.Claims)
	for h, bm := range wc {
		if g, ok := gc[h]; !ok || *g != *bm {
			d = append(d, fmt.Sprintf("claims of holder %q differ", h))
		}
	}
	for h := range gc {
		if _, ok := wc[h]; !ok {
			d = append(d, fmt.Sprintf("unexpected claims of holder %q", h))
		}
	}
	if len(got.Cooldowns) != len(want.Cooldowns) {
		d = append(d, fmt.Sprintf("%d cooldowns, want %d", len(got.Cooldowns), len(want.Cooldowns)))
	}
	for a, w := range want.Cooldowns {
		w = ceilSecond(w)
		if g, ok := got.Cooldowns[a]; !ok || !g.Equal(w) {
			d = append(d, fmt.Sprintf("cooldown of %s until %v, want %v", a, g, w))
		}
	}
	return strings.Join(d, "; ")
}

func ceilSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second)
	}
	return t
}

func TestBlockName(t *testing.T) {
	long := strings.Repeat("p", 253)
	tests := map[string]struct {
		pool   string
		prefix string
		want   string // empty: only check validity and distinctness
	}{
		"ipv4":                             {pool: "pool-a", prefix: "10.0.0.0/20", want: "pool-a.10-0-0-0-20"},
		"ipv4 next block":                  {pool: "pool-a", prefix: "10.0.16.0/20", want: "pool-a.10-0-16-0-20"},
		"ipv4 zero":                        {pool: "pool-a", prefix: "0.0.0.0/20", want: "pool-a.0-0-0-0-20"},
		"ipv4 top":                         {pool: "pool-a", prefix: "255.255.240.0/20"},
		"ipv6":                             {pool: "pool-a", prefix: "fd00::/116", want: "pool-a.fd00---116"},
		"ipv6 unspecified":                 {pool: "pool-a", prefix: "::/116", want: "pool-a.0---116"},
		"ipv6 low":                         {pool: "pool-a", prefix: "::1:0/116"},
		"ipv6 inner":                       {pool: "pool-a", prefix: "fd00::1000/116"},
		"ipv6 top":                         {pool: "pool-a", prefix: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:f000/116"},
		"ipv4-mapped ipv6":                 {pool: "pool-a", prefix: "::ffff:10.0.0.0/116"},
		"ipv6 that reads like ipv4-mapped": {pool: "pool-a", prefix: "::ffff:10:0:0:0/116"},
		"other pool":                       {pool: "pool-b", prefix: "10.0.0.0/20", want: "pool-b.10-0-0-0-20"},
		"dotted pool":                      {pool: "pool.a", prefix: "10.0.0.0/20", want: "pool.a.10-0-0-0-20"},
		"longest pool ipv4":                {pool: long, prefix: "10.0.0.0/20"},
		"longest pool ipv6":                {pool: long, prefix: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:f000/116"},
		"longest pool, other last letter":  {pool: long[:252] + "q", prefix: "10.0.0.0/20"},
		"pool cut at a dot":                {pool: strings.Repeat("a", 193) + "." + strings.Repeat("b", 59), prefix: "::ffff:10.0.0.0/116"},
	}
	seen := map[string]string{}
	for name, tc := range tests {
		p := netip.MustParsePrefix(tc.prefix)
		got := kubestore.BlockName(tc.pool, p)
		if other, dup := seen[got]; dup {
			t.Errorf("cases %q and %q both name %s", name, other, got)
		}
		seen[got] = name
		t.Run(name, func(t *testing.T) {
			if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
				t.Errorf("BlockName(%q, %s) = %q: not a DNS-1123 subdomain: %v", tc.pool, p, got, errs)
			}
			if tc.want != "" && got != tc.want {
				t.Errorf("BlockName(%q, %s) = %q, want %q", tc.pool, p, got, tc.want)
			}
			if again := kubestore.BlockName(tc.pool, p); again != got {
				t.Errorf("BlockName is not deterministic: %q then %q", got, again)
			}
			if errs := validation.IsValidLabelValue(kubestore.PoolLabelValue(tc.pool)); len(errs) > 0 {
				t.Errorf("PoolLabelValue(%q) = %q: not a label value: %v", tc.pool, kubestore.PoolLabelValue(tc.pool), errs)
			}
		})
	}
}

func TestPutGet(t *testing.T) {
	harness.NeedControlPlane(t)
	s := newStore(newPool(t, "putget"))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	v4, v6 := netip.MustParsePrefix("10.0.0.0/20"), netip.MustParsePrefix("fd00::/116")
	all := new(ipam.Bitmap)
	allCooling := map[netip.Addr]time.Time{}
	full := netip.MustParsePrefix("10.0.48.0/20")
	for off := range ipam.BlockSize {
		all.Set(off)
		allCooling[at(full, off)] = t0.Add(time.Duration(off) * time.Second)
	}
	tests := map[string]ipam.Block{
		"empty block":                   {Prefix: netip.MustParsePrefix("10.0.32.0/20")},
		"claims of two holders":         {Prefix: v4, Claims: map[string]*ipam.Bitmap{"replica-0": bitmap(0, 1, 4095), "replica-1": bitmap(2, 63, 64)}},
		"empty bitmap is not persisted": {Prefix: netip.MustParsePrefix("10.0.64.0/20"), Claims: map[string]*ipam.Bitmap{"replica-0": bitmap(7), "replica-1": bitmap()}},
		"cooldowns rounded up to the second": {
			Prefix: netip.MustParsePrefix("10.0.16.0/20"),
			Claims: map[string]*ipam.Bitmap{"replica-0": bitmap(5, 6)},
			Cooldowns: map[netip.Addr]time.Time{
				at(netip.MustParsePrefix("10.0.16.0/20"), 5): t0.Add(1200 * time.Millisecond),
				at(netip.MustParsePrefix("10.0.16.0/20"), 6): t0.Add(time.Hour),
			},
		},
		"ipv6 block": {
			Prefix:    v6,
			Claims:    map[string]*ipam.Bitmap{"replica-0": bitmap(1, 4095)},
			Cooldowns: map[netip.Addr]time.Time{at(v6, 4095): t0.Add(time.Minute)},
		},
		"ipv6 unspecified block":     {Prefix: netip.MustParsePrefix("::/116"), Claims: map[string]*ipam.Bitmap{"replica-0": bitmap(0)}},
		"every address cooling down": {Prefix: full, Claims: map[string]*ipam.Bitmap{"replica-0": all}, Cooldowns: allCooling},
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			if got, err := s.Get(ctx, b.Prefix); err != nil || got.Version != "" || got.Prefix != b.Prefix {
				t.Fatalf("Get(%s) before Put = %+v, %v; want an empty block with no version", b.Prefix, got, err)
			}
			ver, err := s.Put(ctx, b)
			if err != nil {
				t.Fatalf("Put(%s) = %v", b.Prefix, err)
			}
			if ver == "" {
				t.Fatalf("Put(%s) returned an empty version", b.Prefix)
			}
			want := b
			want.Version = ver
			got, err := s.Get(ctx, b.Prefix)
			if err != nil {
				t.Fatalf("Get(%s) = %v", b.Prefix, err)
			}
			if d := diffBlock(got, want); d != "" {
				t.Errorf("Get(%s) after Put: %s", b.Prefix, d)
			}

			// An update at the current version succeeds and moves it on.
			next := got.Clone()
			next.Claims["replica-2"] = bitmap(100)
			ver2, err := s.Put(ctx, next)
			if err != nil {
				t.Fatalf("Put(%s) at current version %s = %v", b.Prefix, got.Version, err)
			}
			if ver2 == ver {
				t.Errorf("Put(%s) that changed the block kept version %s", b.Prefix, ver)
			}
			next.Version = ver2
			if got, err := s.Get(ctx, b.Prefix); err != nil {
				t.Fatalf("Get(%s) = %v", b.Prefix, err)
			} else if d := diffBlock(got, next); d != "" {
				t.Errorf("Get(%s) after update: %s", b.Prefix, d)
			}
		})
	}
}

func TestPutConflict(t *testing.T) {
	harness.NeedControlPlane(t)
	pool := newPool(t, "conflict")
	s := newStore(pool)
	tests := map[string]struct {
		prefix string
		// setup writes the block's state and returns it, with its version,
		// and the version the conflicting Put uses.
		setup func(t *testing.T, p netip.Prefix) (stored ipam.Block, putVersion string)
	}{
		"stale version": {
			prefix: "10.1.0.0/20",
			setup: func(t *testing.T, p netip.Prefix) (ipam.Block, string) {
				v1 := mustPut(t, s, ipam.Block{Prefix: p, Claims: map[string]*ipam.Bitmap{"a": bitmap(1)}})
				b := ipam.Block{Prefix: p, Version: v1, Claims: map[string]*ipam.Bitmap{"b": bitmap(2)}}
				b.Version = mustPut(t, s, b)
				return b, v1
			},
		},
		"create over an existing block": {
			prefix: "10.1.16.0/20",
			setup: func(t *testing.T, p netip.Prefix) (ipam.Block, string) {
				b := ipam.Block{Prefix: p, Claims: map[string]*ipam.Bitmap{"a": bitmap(1)}}
				b.Version = mustPut(t, s, b)
				return b, ""
			},
		},
		"update of a block that does not exist": {
			prefix: "fd01::/116",
			setup: func(t *testing.T, p netip.Prefix) (ipam.Block, string) {
				return ipam.Block{Prefix: p}, "12345"
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			p := netip.MustParsePrefix(tc.prefix)
			stored, putVersion := tc.setup(t, p)
			attempt := ipam.Block{Prefix: p, Version: putVersion, Claims: map[string]*ipam.Bitmap{"intruder": bitmap(3)}}
			ver, err := s.Put(ctx, attempt)
			if !errors.Is(err, ipam.ErrStoreConflict) {
				t.Fatalf("Put(%s) at version %q = %q, %v; want an error matching ipam.ErrStoreConflict", p, putVersion, ver, err)
			}
			if name := kubestore.BlockName(pool.Name, p); !strings.Contains(err.Error(), name) {
				t.Errorf("error %q does not name IPBlock %s", err, name)
			}
			got, err := s.Get(ctx, p)
			if err != nil {
				t.Fatalf("Get(%s) = %v", p, err)
			}
			if got.Version != stored.Version {
				t.Errorf("after the refused Put, version is %q, want %q", got.Version, stored.Version)
			}
			if d := diffBlock(got, stored); d != "" {
				t.Errorf("the refused Put wrote something: %s", d)
			}
		})
	}
}

// TestDelete: a block goes only at its current version; a stale version
// is a conflict that deletes nothing, and a block already gone is no error.
func TestDelete(t *testing.T) {
	harness.NeedControlPlane(t)
	pool := newPool(t, "delete")
	s := newStore(pool)
	ctx := t.Context()
	p := netip.MustParsePrefix("10.2.0.0/20")
	v1 := mustPut(t, s, ipam.Block{Prefix: p, Claims: map[string]*ipam.Bitmap{"a": bitmap(1)}})
	v2 := mustPut(t, s, ipam.Block{Prefix: p, Version: v1, Claims: map[string]*ipam.Bitmap{"a": bitmap(2)}})
	err := s.Delete(ctx, p, v1)
	if !errors.Is(err, ipam.ErrStoreConflict) || !strings.Contains(err.Error(), kubestore.BlockName(pool.Name, p)) {
		t.Fatalf("Delete at a stale version = %v; want a conflict naming the IPBlock", err)
	}
	if got, err := s.Get(ctx, p); err != nil || got.Version != v2 {
		t.Fatalf("after the refused Delete: %+v, %v; want the block at version %s", got, err, v2)
	}
	if err := s.Delete(ctx, p, v2); err != nil {
		t.Fatalf("Delete at the current version = %v", err)
	}
	if got, err := s.Get(ctx, p); err != nil || got.Version != "" {
		t.Fatalf("after Delete: %+v, %v; want no block", got, err)
	}
	if err := s.Delete(ctx, p, v2); err != nil {
		t.Fatalf("Delete of a block already gone = %v; want none", err)
	}
}

func mustPut(t *testing.T, s *kubestore.Store, b ipam.Block) string {
	t.Helper()
	v, err := s.Put(t.Context(), b)
	if err != nil {
		t.Fatalf("Put(%s) at version %q = %v", b.Prefix, b.Version, err)
	}
	return v
}

func TestOwnerAndLabel(t *testing.T) {
	harness.NeedControlPlane(t)
	tests := map[string]string{
		"short pool name":                "owned",
		"pool name longer than a label":  "owned-" + strings.Repeat("l", 80),
		"pool name as long as it may be": "owned-" + strings.Repeat("x", 247),
	}
	for name, base := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			pool := newPool(t, base)
			poolName := pool.Name
			s := newStore(pool)
			p := netip.MustParsePrefix("fd00::/116")
			v := mustPut(t, s, ipam.Block{Prefix: p, Claims: map[string]*ipam.Bitmap{"a": bitmap(1)}})
			// The update path rewrites metadata: check it after both.
			v = mustPut(t, s, ipam.Block{Prefix: p, Version: v, Claims: map[string]*ipam.Bitmap{"a": bitmap(1, 2)}})

			var obj v1alpha1.IPBlock
			if err := k8s.Get(ctx, client.ObjectKey{Name: kubestore.BlockName(poolName, p)}, &obj); err != nil {
				t.Fatalf("get IPBlock %s: %v", kubestore.BlockName(poolName, p), err)
			}
			if obj.ResourceVersion != v {
				t.Errorf("resourceVersion %s, Put returned %s", obj.ResourceVersion, v)
			}
			if got, want := obj.Labels[v1alpha1.PoolLabel], kubestore.PoolLabelValue(poolName); got != want {
				t.Errorf("label %s = %q, want %q", v1alpha1.PoolLabel, got, want)
			}
			if len(poolName) <= validation.LabelValueMaxLength && obj.Labels[v1alpha1.PoolLabel] != poolName {
				t.Errorf("label %s = %q, want the pool name", v1alpha1.PoolLabel, obj.Labels[v1alpha1.PoolLabel])
			}
			if obj.Spec.Pool != poolName || obj.Spec.Prefix != p.String() {
				t.Errorf("spec pool %q prefix %q, want %q %q", obj.Spec.Pool, obj.Spec.Prefix, poolName, p)
			}
			refs := obj.OwnerReferences
			if len(refs) != 1 {
				t.Fatalf("owner references %+v, want exactly the pool", refs)
			}
			r := refs[0]
			if r.APIVersion != v1alpha1.GroupVersion.String() || r.Kind != "IPPool" || r.Name != poolName || r.UID != pool.UID {
				t.Errorf("owner reference %+v, want IPPool %s with UID %s", r, poolName, pool.UID)
			}
			if r.Controller == nil || !*r.Controller || r.BlockOwnerDeletion == nil || !*r.BlockOwnerDeletion {
				t.Errorf("owner reference %+v is not a controller reference blocking owner deletion", r)
			}
			blocks, err := s.List(ctx)
			if err != nil || len(blocks) != 1 || blocks[0].Prefix != p || blocks[0].Version != v {
				t.Errorf("List = %+v, %v; want the one block at version %s", blocks, err, v)
			}
		})
	}
}

func TestList(t *testing.T) {
	harness.NeedControlPlane(t)
	ctx := t.Context()
	a, b := newPool(t, "list-a"), newPool(t, "list-b")
	sa, sb := newStore(a), newStore(b)
	if blocks, err := sa.List(ctx); err != nil || len(blocks) != 0 {
		t.Fatalf("List of a pool without blocks = %+v, %v; want none", blocks, err)
	}
	shared := netip.MustParsePrefix("10.2.0.0/20")
	want := map[*kubestore.Store][]ipam.Block{
		sa: {
			{Prefix: shared, Claims: map[string]*ipam.Bitmap{"a": bitmap(1)}},
			{Prefix: netip.MustParsePrefix("fd00::/116"), Claims: map[string]*ipam.Bitmap{"a": bitmap(2)}},
		},
		sb: {
			{Prefix: shared, Claims: map[string]*ipam.Bitmap{"b": bitmap(3)}},
			{Prefix: netip.MustParsePrefix("10.2.16.0/20"), Claims: map[string]*ipam.Bitmap{"b": bitmap(4)}},
			{Prefix: netip.MustParsePrefix("::/116"), Claims: map[string]*ipam.Bitmap{"b": bitmap(5)}},
		},
	}
	for s, blocks := range want {
		for i := range blocks {
			blocks[i].Version = mustPut(t, s, blocks[i])
		}
	}
	// An object carrying pool a's label but naming another pool is not a's.
	stray := &v1alpha1.IPBlock{
		ObjectMeta: metav1.ObjectMeta{Name: a.Name + ".stray", Labels: map[string]string{v1alpha1.PoolLabel: a.Name}},
		Spec:       v1alpha1.IPBlockSpec{Pool: "someone-else", Prefix: "10.2.32.0/20"},
	}
	if err := k8s.Create(ctx, stray); err != nil {
		t.Fatalf("create IPBlock stray: %v", err)
	}
	for s, blocks := range want {
		got, err := s.List(ctx)
		if err != nil {
			t.Fatalf("List = %v", err)
		}
		if len(got) != len(blocks) {
			t.Fatalf("List = %d blocks (%+v), want %d", len(got), got, len(blocks))
		}
		slices.SortFunc(blocks, func(x, y ipam.Block) int { return x.Prefix.Compare(y.Prefix) })
		for i := range got {
			if d := diffBlock(got[i], blocks[i]); d != "" {
				t.Errorf("List()[%d]: %s", i, d)
			}
		}
	}
}

func TestListRefusesBadBlocks(t *testing.T) {
	harness.NeedControlPlane(t)
	tests := map[string]struct {
		// objName names the object in the pool.
		objName func(pool string) string
		spec    v1alpha1.IPBlockSpec
	}{
		"prefix not a block": {
			objName: func(pool string) string { return pool + ".10-3-0-0-24" },
			spec:    v1alpha1.IPBlockSpec{Prefix: "10.3.0.0/24"},
		},
		"claims not base64": {
			objName: func(pool string) string { return kubestore.BlockName(pool, netip.MustParsePrefix("10.3.0.0/20")) },
			spec:    v1alpha1.IPBlockSpec{Prefix: "10.3.0.0/20", Claims: map[string]string{"a": "!!"}},
		},
		"block under a name vmipam does not give it": {
			objName: func(pool string) string { return pool + ".by-hand" },
			spec:    v1alpha1.IPBlockSpec{Prefix: "10.3.0.0/20"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			pool := newPool(t, "bad")
			s := newStore(pool)
			tc.spec.Pool = pool.Name
			obj := &v1alpha1.IPBlock{
				ObjectMeta: metav1.ObjectMeta{Name: tc.objName(pool.Name), Labels: map[string]string{v1alpha1.PoolLabel: pool.Name}},
				Spec:       tc.spec,
			}
			if err := k8s.Create(ctx, obj); err != nil {
				t.Fatalf("create IPBlock %s: %v", obj.Name, err)
			}
			blocks, err := s.List(ctx)
			if err == nil {
				t.Fatalf("List = %+v, nil; want an error naming IPBlock %s", blocks, obj.Name)
			}
			if !strings.Contains(err.Error(), obj.Name) {
				t.Errorf("List error %q does not name IPBlock %s", err, obj.Name)
			}
		})
	}
}

func TestGetRefusesOtherPoolsBlock(t *testing.T) {
	harness.NeedControlPlane(t)
	ctx := t.Context()
	pool := newPool(t, "get-owner")
	s := newStore(pool)
	p := netip.MustParsePrefix("10.4.0.0/20")
	// Only a hash collision, or a hand-made object, puts another pool's
	// block under this pool's name; it must not be taken for this pool's.
	obj := &v1alpha1.IPBlock{
		ObjectMeta: metav1.ObjectMeta{Name: kubestore.BlockName(pool.Name, p)},
		Spec:       v1alpha1.IPBlockSpec{Pool: "another", Prefix: p.String()},
	}
	if err := k8s.Create(ctx, obj); err != nil {
		t.Fatalf("create IPBlock %s: %v", obj.Name, err)
	}
	if b, err := s.Get(ctx, p); err == nil {
		t.Errorf("Get(%s) = %+v, nil; want an error: the IPBlock belongs to another pool", p, b)
	}
}

func TestPutRefusesNonBlockPrefix(t *testing.T) {
	harness.NeedControlPlane(t)
	s := newStore(newPool(t, "non-block"))
	for _, p := range []string{"10.5.0.0/24", "10.5.0.1/20", "fd00::/64"} {
		if _, err := s.Put(t.Context(), ipam.Block{Prefix: netip.MustParsePrefix(p)}); err == nil {
			t.Errorf("Put(%s) = nil error; want a refusal, it is not a block", p)
		}
	}
}

// TestManagerRecovery runs a Manager on the Store, "crashes" it and checks
// that its successor, recovered from the API server alone, honours what the
// first one handed out and released.
func TestManagerRecovery(t *testing.T) {
	harness.NeedControlPlane(t)
	ctx := t.Context()
	pool := newPool(t, "recovery")
	ranges, err := ipam.ParseRanges([]ipam.RangeSpec{{CIDR: "10.20.0.0/24"}})
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 500_000_000, time.UTC))
	cfg := ipam.Config{
		Pool: pool.Name, Holder: "replica-0", Ranges: ranges,
		Cooldown: time.Hour, PendingTTL: time.Minute,
		LowWatermark: 1, TargetFree: 4, HighWatermark: 8,
		Store: holderStore(pool, "replica-0"), Clock: clk,
	}
	m1, err := ipam.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m1.Recover(ctx, nil); err != nil {
		t.Fatalf("Recover on an empty pool = %v", err)
	}
	allocate := func(m *ipam.Manager, token string) netip.Addr {
		t.Helper()
		a, err := m.Allocate(ctx, ipam.Reservation{Token: token})
		if err != nil {
			t.Fatalf("Allocate(%s) = %v", token, err)
		}
		return a
	}
	bound := allocate(m1, "tok-bound")
	if _, err := m1.Bind(ipam.Owner{Token: "tok-bound", UID: "uid-bound"}); err != nil {
		t.Fatal(err)
	}
	pending := allocate(m1, "tok-pending") // handed out, its VM never stored
	released := allocate(m1, "tok-released")
	if _, err := m1.Bind(ipam.Owner{Token: "tok-released", UID: "uid-released"}); err != nil {
		t.Fatal(err)
	}
	if err := m1.Release(released, ipam.Owner{UID: "uid-released"}); err != nil {
		t.Fatal(err)
	}
	releasedUntil := ceilSecond(clk.Now().Add(time.Hour))
	if err := m1.Flush(ctx); err != nil {
		t.Fatalf("Flush = %v", err)
	}

	// What reached the API server: the claims and the cooldown.
	blk, err := newStore(pool).Get(ctx, ipam.BlockOf(bound))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{bound, pending, released} {
		if !blk.Claims["replica-0"].Has(int(a.As4()[3])) {
			t.Errorf("stored block %s has no claim of replica-0 on %s", blk.Prefix, a)
		}
	}
	if got := blk.Cooldowns[released]; !got.Equal(releasedUntil) {
		t.Errorf("stored cooldown of %s until %v, want %v", released, got, releasedUntil)
	}

	// Crash. The successor runs with a shorter cooldown: the persisted
	// deadline must still hold.
	clk.Step(10 * time.Second)
	cfg.Store = holderStore(pool, "replica-0")
	cfg.Cooldown = time.Minute
	m2, err := ipam.NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := m2.Recover(ctx, []ipam.Holding{{Addr: bound, Owner: ipam.Owner{Token: "tok-bound", UID: "uid-bound"}}})
	if err != nil {
		t.Fatalf("Recover = %v", err)
	}
	if rep.Allocated != 1 || rep.Cooldown < 2 {
		t.Errorf("Recover report %+v, want 1 allocated and at least the pending and released addresses cooling down", rep)
	}
	// Handed out since the last write: it rests for the longer of the
	// pending TTL (its machine may still be stored) and the cooldown.
	rest := ceilSecond(clk.Now().Add(max(cfg.PendingTTL, cfg.Cooldown)))
	tests := map[string]struct {
		addr      netip.Addr
		wantState ipam.State
		wantUntil time.Time
	}{
		"bound address stays allocated":                 {addr: bound, wantState: ipam.StateAllocated},
		"address handed out before the crash cools":     {addr: pending, wantState: ipam.StateCooldown, wantUntil: clk.Now().Add(max(cfg.PendingTTL, cfg.Cooldown))},
		"released address keeps its persisted deadline": {addr: released, wantState: ipam.StateCooldown, wantUntil: releasedUntil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			state, owner, until := m2.Lookup(tc.addr)
			if state != tc.wantState {
				t.Fatalf("Lookup(%s) = %s, want %s", tc.addr, state, tc.wantState)
			}
			if tc.wantState == ipam.StateAllocated && owner.UID != "uid-bound" {
				t.Errorf("Lookup(%s) owner %+v, want UID uid-bound", tc.addr, owner)
			}
			if tc.wantState == ipam.StateCooldown && !until.Truncate(time.Second).Equal(tc.wantUntil.Truncate(time.Second)) {
				t.Errorf("Lookup(%s) cools down until %v, want %v", tc.addr, until, tc.wantUntil)
			}
		})
	}
	fresh := allocate(m2, "tok-fresh")
	if fresh == bound || fresh == pending || fresh == released {
		t.Errorf("Allocate after recovery = %s, an address the crashed Manager handed out", fresh)
	}

	// The successor persists the cooldowns it derived.
	if err := m2.Flush(ctx); err != nil {
		t.Fatalf("Flush = %v", err)
	}
	blk, err = newStore(pool).Get(ctx, ipam.BlockOf(bound))
	if err != nil {
		t.Fatal(err)
	}
	if got := blk.Cooldowns[pending]; !got.Equal(rest) {
		t.Errorf("stored cooldown of %s until %v, want %v", pending, got, rest)
	}
	if got := blk.Cooldowns[released]; !got.Equal(releasedUntil) {
		t.Errorf("stored cooldown of %s until %v, want %v", released, got, releasedUntil)
	}
}

// TestConcurrentManagers has two replicas of one pool allocate at once
// through the API server; resourceVersion compare-and-swap is all that keeps
// them apart.
func TestConcurrentManagers(t *testing.T) {
	harness.NeedControlPlane(t)
	pool := newPool(t, "race")
	// 107 addresses across the boundary of two blocks.
	ranges, err := ipam.ParseRanges([]ipam.RangeSpec{{CIDR: "10.1.0.0/16", First: "10.1.15.200", Last: "10.1.16.50"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var running sync.WaitGroup
	defer func() {
		cancel()
		running.Wait()
	}()
	holders := []string{"replica-a", "replica-b"}
	mgrs := make([]*ipam.Manager, len(holders))
	for i, h := range holders {
		m, err := ipam.NewManager(ipam.Config{
			Pool: pool.Name, Holder: h, Ranges: ranges,
			LowWatermark: 1, TargetFree: 4, HighWatermark: 8,
			Store: holderStore(pool, h),
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Recover(ctx, nil); err != nil {
			t.Fatalf("Recover %s = %v", h, err)
		}
		mgrs[i] = m
		running.Go(func() {
			m.Run(ctx, 5*time.Millisecond, func(err error) { t.Logf("%s: background: %v", h, err) })
		})
	}

	const workers, perWorker = 4, 10 // 80 of 107: each free list can hold 8 more
	type alloc struct {
		holder, token string
		addr          netip.Addr
	}
	var (
		mu      sync.Mutex
		allocs  []alloc
		retries int
		wg      sync.WaitGroup
	)
	for i, m := range mgrs {
		for w := range workers {
			wg.Go(func() {
				for n := range perWorker {
					token := fmt.Sprintf("%s-%d-%d", holders[i], w, n)
					var a netip.Addr
					var err error
					// The Manager retries conflicts a bounded number of
					// times; a caller (the webhook's client) retries the rest.
					for range 10 {
						if a, err = m.Allocate(ctx, ipam.Reservation{Token: token}); !errors.Is(err, ipam.ErrStoreConflict) {
							break
						}
						mu.Lock()
						retries++
						mu.Unlock()
					}
					if err != nil {
						t.Errorf("%s: Allocate(%s) = %v", holders[i], token, err)
						return
					}
					mu.Lock()
					allocs = append(allocs, alloc{holders[i], token, a})
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	cancel()
	running.Wait()

	owner := map[netip.Addr]alloc{}
	for _, a := range allocs {
		if prev, dup := owner[a.addr]; dup {
			t.Errorf("%s handed to both %s (%s) and %s (%s)", a.addr, prev.token, prev.holder, a.token, a.holder)
		}
		owner[a.addr] = a
	}
	if len(allocs) != len(mgrs)*workers*perWorker {
		t.Errorf("%d allocations, want %d", len(allocs), len(mgrs)*workers*perWorker)
	}

	// Every address handed out was claimed in the API server by the
	// replica that handed it out, and no offset has two claimants.
	blocks, err := newStore(pool).List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	claimant := map[netip.Addr]string{}
	for _, b := range blocks {
		for h, bm := range b.Claims {
			for off := range ipam.BlockSize {
				if !bm.Has(off) {
					continue
				}
				a := at(b.Prefix, off)
				if other, ok := claimant[a]; ok {
					t.Errorf("%s is claimed by both %s and %s", a, other, h)
				}
				claimant[a] = h
			}
		}
	}
	for _, a := range allocs {
		if claimant[a.addr] != a.holder {
			t.Errorf("%s was handed out by %s but is claimed in the store by %q", a.addr, a.holder, claimant[a.addr])
		}
	}
	var conflicts, writes uint64
	for _, m := range mgrs {
		st := m.Stats()
		conflicts += st.StoreConflicts
		writes += st.StoreWrites
	}
	t.Logf("%d allocations over %d blocks: %d store writes, %d store conflicts, %d caller retries", len(allocs), len(blocks), writes, conflicts, retries)
	if conflicts == 0 {
		t.Errorf("no store conflicts in %d writes: the replicas never raced, so the test proved nothing about compare-and-swap", writes)
	}
}
