package pools

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	vmipamscheme "github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/test/fixture"
)

// shardCache stands for a replica's two caches of VirtualMachines (see
// internal/app's shardReader): it lists, from the store behind the fake
// API server but not through it, the VMs labelled for holder and the
// unlabelled ones.
type shardCache struct {
	c      client.Reader
	holder string
}

func (s shardCache) EachCached(ctx context.Context, fn func(o *Object)) (bool, error) {
	unlabelled, err := Unlabelled()
	if err != nil {
		return false, err
	}
	for _, opt := range []client.ListOption{client.MatchingLabels{vmipamv1.HolderLabel: s.holder}, client.MatchingLabelsSelector{Selector: unlabelled}} {
		l := kinds.VirtualMachine.NewList()
		if err := s.c.List(ctx, l, opt); err != nil {
			return false, err
		}
		for i := range l.Items {
			o := ObjectOf(kinds.VirtualMachine, &l.Items[i])
			fn(&o)
		}
	}
	return true, nil
}

// cachedHolder is the holder of the replica that newCachedFixture makes.
const cachedHolder = "vmipam-a"

// cachedFixture is a replica's registry of one pool, 10.99.0.0/24 with a
// cooldown of a minute, whose resyncs read the caches that newCachedFixture
// was given, and the fake API server behind them, which counts the lists
// and Gets of VMs made while counting is set.
type cachedFixture struct {
	inner client.Client
	// c is the API server as the registries see it, counting.
	c        client.Client
	reg      *Registry
	stop     func()
	p        *Pool
	clk      *clocktesting.FakeClock
	pool     *vmipamv1.IPPool
	lists    atomic.Int32
	gets     atomic.Int32
	counting atomic.Bool
}

func newCachedFixture(t *testing.T, cache func(inner client.Client) Cached) *cachedFixture {
	t.Helper()
	ctx := t.Context()
	f := &cachedFixture{clk: clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	f.pool = fixture.Pool("cached", fixture.Stored("uid-cached"), fixture.WithCIDRs("10.99.0.0/24"),
		fixture.WithCooldown(time.Minute), fixture.WithPendingTTL(time.Minute))
	f.inner = fake.NewClientBuilder().WithScheme(vmipamscheme.Scheme).WithObjects(f.pool.DeepCopy()).Build()
	c := interceptor.NewClient(f.inner.(client.WithWatch), interceptor.Funcs{
		List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			switch list.(type) {
			case *unstructured.UnstructuredList, *metav1.PartialObjectMetadataList:
				if f.counting.Load() {
					f.lists.Add(1)
				}
			}
			return cl.List(ctx, list, opts...)
		},
		Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, vm := obj.(*unstructured.Unstructured); vm && f.counting.Load() {
				f.gets.Add(1)
			}
			return cl.Get(ctx, key, obj, opts...)
		},
	})
	f.c = c
	f.reg, f.stop = f.start(t, cache(f.inner))
	if err := f.reg.Ensure(ctx, f.pool); err != nil {
		t.Fatal(err)
	}
	f.p = f.reg.Get(f.pool.Name)
	return f
}

// start starts a registry of cachedHolder whose resyncs read cache, and
// returns it with what stops it as a replica stops: it seals its pools
// and releases its Lease.
func (f *cachedFixture) start(t testing.TB, cache Cached) (*Registry, func()) {
	t.Helper()
	reg := NewRegistry(Options{Client: f.c, APIReader: f.c, Kinds: kinds.Default(), Holder: cachedHolder, Clock: f.clk,
		RunInterval: time.Hour, ResyncInterval: time.Hour, StatusInterval: time.Hour, ProveInterval: time.Hour})
	reg.MarkServed(kinds.VirtualMachine.GVK)
	reg.SetCached(kinds.VirtualMachine.GVK, cache)
	regCtx, cancel := context.WithCancel(t.Context())
	var done sync.WaitGroup
	done.Go(func() { _ = reg.Start(regCtx) })
	stop := sync.OnceFunc(func() { cancel(); done.Wait() })
	t.Cleanup(stop)
	return reg, stop
}

// newVM makes VM name as the webhook and the controller would: its
// address allocated and stamped, the VM created labelled for cachedHolder,
// and, if bound, the address bound to it.
func (f *cachedFixture) newVM(t *testing.T, name string, bound bool) (*vmipamv1.VirtualMachine, netip.Addr) {
	t.Helper()
	ctx := t.Context()
	token := "token-" + name
	a, err := f.p.AllocateFamily(ctx, ipam.Reservation{Token: token, Namespace: "default"}, vmipamv1.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name),
		Labels:      map[string]string{vmipamv1.HolderLabel: cachedHolder},
		Annotations: map[string]string{vmipamv1.TokenAnnotation: token, vmipamv1.PoolAnnotation: f.pool.Name, vmipamv1.AddressAnnotation: a.String()},
		Finalizers:  []string{vmipamv1.Finalizer}}, Spec: vmipamv1.VirtualMachineSpec{IPPool: f.pool.Name, Addresses: []string{a.String()}}}
	if err := f.inner.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	if !bound {
		return vm, a
	}
	if _, err := f.p.Bind(a, ipam.Owner{Token: token, UID: string(vm.UID), Ref: "default/" + name}); err != nil {
		t.Fatal(err)
	}
	return vm, a
}

// TestResyncFromTheCaches: between its full lists, a resync reads the
// replica's caches and, from the API server, only the VMs that hold an
// address allocated here and that the caches lack: a VM whose finalizer
// was removed by force is released with one Get and no list, and a VM
// labelled for another replica, or for none, keeps its address and gets
// its label back. With more VMs lacking than it reads one by one, or when
// asked for a full resync, it lists every VM instead, and releases the
// same.
func TestResyncFromTheCaches(t *testing.T) {
	const n = 6
	const mine = cachedHolder
	for _, tt := range []struct {
		name string
		// change is done to the VMs before the resync: "gone" (its
		// finalizer removed by force), "elsewhere" (labelled for another
		// replica), "unlabelled".
		change map[int]string
		// goneAll deletes every VM, more than the resync reads one by one.
		goneAll bool
		full    bool
		// wantLists of VMs and Gets from the API server.
		wantLists, wantGets int
	}{{
		name: "nothing changed",
	}, {
		name:     "finalizer removed by force",
		change:   map[int]string{1: "gone", 4: "gone"},
		wantGets: 2,
	}, {
		name:     "labelled elsewhere or not at all",
		change:   map[int]string{0: "elsewhere", 2: "unlabelled", 3: "gone"},
		wantGets: 2,
	}, {
		name:      "more lacking than read one by one",
		goneAll:   true,
		wantLists: 2,
	}, {
		name:      "full",
		change:    map[int]string{1: "gone", 2: "elsewhere"},
		full:      true,
		wantLists: 2, wantGets: 0,
	}} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			f := newCachedFixture(t, func(inner client.Client) Cached { return shardCache{c: inner, holder: mine} })
			inner, p, reg := f.inner, f.p, f.reg
			lists, gets, counting := &f.lists, &f.gets, &f.counting

			count := n
			if tt.goneAll {
				count = maxConfirms + 1
			}
			vms := make([]*vmipamv1.VirtualMachine, count)
			addrs := make([]netip.Addr, count)
			for i := range vms {
				vms[i], addrs[i] = f.newVM(t, fmt.Sprintf("vm-%d", i), true)
			}
			if err := p.flush(ctx); err != nil {
				t.Fatal(err)
			}
			gone := map[int]bool{}
			for i, vm := range vms {
				what := tt.change[i]
				if tt.goneAll {
					what = "gone"
				}
				switch what {
				case "gone":
					gone[i] = true
					vm.Finalizers = nil
					if err := inner.Update(ctx, vm); err != nil {
						t.Fatal(err)
					}
					if err := inner.Delete(ctx, vm); err != nil {
						t.Fatal(err)
					}
				case "elsewhere", "unlabelled":
					vm.Labels = map[string]string{vmipamv1.HolderLabel: "vmipam-b"}
					if what == "unlabelled" {
						vm.Labels = nil
					}
					if err := inner.Update(ctx, vm); err != nil {
						t.Fatal(err)
					}
				}
			}

			counting.Store(true)
			listed, err := reg.resync(ctx, []*Pool{p}, tt.full)
			counting.Store(false)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := listed, tt.wantLists > 0; got != want {
				t.Errorf("the resync listed every VM: %t, want %t", got, want)
			}
			if lists.Load() != int32(tt.wantLists) || gets.Load() != int32(tt.wantGets) {
				t.Errorf("the resync made %d lists of VMs and %d gets, want %d and %d", lists.Load(), gets.Load(), tt.wantLists, tt.wantGets)
			}
			for i, vm := range vms {
				st, o, _ := p.Lookup(addrs[i])
				switch {
				case gone[i] && st != ipam.StateCooldown:
					t.Errorf("%s of the deleted %s is %s to %+v, want cooling down", addrs[i], vm.Name, st, o)
				case !gone[i] && (st != ipam.StateAllocated || o.UID != string(vm.UID)):
					t.Errorf("%s of the live %s is %s to %+v, want allocated to it", addrs[i], vm.Name, st, o)
				}
				if gone[i] {
					continue
				}
				got := &vmipamv1.VirtualMachine{}
				if err := inner.Get(ctx, client.ObjectKeyFromObject(vm), got); err != nil {
					t.Fatal(err)
				}
				if l := got.Labels[vmipamv1.HolderLabel]; l != mine {
					t.Errorf("%s is labelled %q after the resync, want %q", vm.Name, l, mine)
				}
			}
		})
	}
}

// snapshotCache stands for caches that lag the API server: it holds
// copies of the VMs that the store held when it was taken.
type snapshotCache []*unstructured.Unstructured

func takeSnapshot(t *testing.T, c client.Reader) snapshotCache {
	t.Helper()
	l := kinds.VirtualMachine.NewList()
	if err := c.List(t.Context(), l); err != nil {
		t.Fatal(err)
	}
	out := make(snapshotCache, len(l.Items))
	for i := range l.Items {
		out[i] = l.Items[i].DeepCopy()
	}
	return out
}

func (s *snapshotCache) EachCached(_ context.Context, fn func(o *Object)) (bool, error) {
	for _, obj := range *s {
		o := ObjectOf(kinds.VirtualMachine, obj)
		fn(&o)
	}
	return true, nil
}

// TestResyncFromCachesThatLag: what a resync from the caches would adopt
// it reads again from the API server, since the caches may be older than
// its mark, as a list is not. After an outage of the API server a chaos
// run saw a replica's caches lag it by seconds: a VM was deleted, its
// address released and its cooldown over, and the resync, from caches
// that still showed the VM, gave the free address back to it; its
// deletion, seen later, released it again, and the address history
// showed the VM's tenure twice, the second "Vanished".
func TestResyncFromCachesThatLag(t *testing.T) {
	for _, tt := range []struct {
		name string
		// seenGoing: the caches saw the VM's deletion begin, not end.
		seenGoing bool
		// deleted: the VM is deleted, and its address released, after the
		// caches' view; else the caches are current, and the VM's address
		// was never bound to it (its create was not seen).
		deleted   bool
		wantState ipam.State
	}{
		{name: "deletion seen begun, not ended", seenGoing: true, deleted: true, wantState: ipam.StateFree},
		{name: "deletion not seen", deleted: true, wantState: ipam.StateFree},
		{name: "create not seen, caches current", wantState: ipam.StateAllocated},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			var cache snapshotCache
			f := newCachedFixture(t, func(client.Client) Cached { return &cache })
			vm, a := f.newVM(t, "vm-0", tt.deleted)
			if err := f.p.flush(ctx); err != nil {
				t.Fatal(err)
			}
			if tt.seenGoing {
				// Its finalizer keeps it while the controller releases.
				if err := f.inner.Delete(ctx, vm); err != nil {
					t.Fatal(err)
				}
			}
			cache = takeSnapshot(t, f.inner)
			if tt.deleted {
				owner := ipam.Owner{Token: "token-" + vm.Name, UID: string(vm.UID), Ref: "default/" + vm.Name}
				if err := f.p.Release(ctx, a, owner); err != nil {
					t.Fatal(err)
				}
				if err := f.inner.Get(ctx, client.ObjectKeyFromObject(vm), vm); err != nil {
					t.Fatal(err)
				}
				vm.Finalizers = nil
				if err := f.inner.Update(ctx, vm); err != nil {
					t.Fatal(err)
				}
				if !tt.seenGoing {
					if err := f.inner.Delete(ctx, vm); err != nil {
						t.Fatal(err)
					}
				}
				f.p.Gone(a, owner)
				f.clk.Step(2 * time.Minute)
				if st, _, _ := f.p.Lookup(a); st != ipam.StateFree {
					t.Fatalf("%s is %s after its cooldown, want free", a, st)
				}
			}

			f.counting.Store(true)
			listed, err := f.reg.resync(ctx, []*Pool{f.p}, false)
			f.counting.Store(false)
			if err != nil {
				t.Fatal(err)
			}
			if listed || f.lists.Load() != 0 || f.gets.Load() != 1 {
				t.Errorf("the resync listed every VM: %t, with %d lists of VMs and %d gets; want it from the caches, with 0 lists and 1 get",
					listed, f.lists.Load(), f.gets.Load())
			}
			if st, o, _ := f.p.Lookup(a); st != tt.wantState {
				t.Errorf("%s is %s (to %+v) after the resync, want %s", a, st, o, tt.wantState)
			}
		})
	}
}

// TestRecoverFromTheCaches: a replica that starts recovers a pool from its
// caches, without listing a VM, when they hold every address its holder's
// last process left in use (it sealed them); when they lack one (a VM in
// use labelled for another replica, one whose finalizer was removed by
// force while no process ran), it lists every VM, and comes to what a
// list shows.
func TestRecoverFromTheCaches(t *testing.T) {
	const n = 4
	for _, tt := range []struct {
		name string
		// change is done to VM i after the first process stopped:
		// "elsewhere" (labelled for another replica), "gone" (its
		// finalizer removed by force, and deleted).
		change map[int]string
		// bypassed: a VM created without the webhook holds 10.99.0.200,
		// which no replica claims.
		bypassed  bool
		wantLists int
	}{
		{name: "sealed, every VM in the caches"},
		{name: "a VM that bypassed the webhook", bypassed: true},
		{name: "a VM labelled for another replica", change: map[int]string{1: "elsewhere"}, wantLists: 2},
		{name: "a VM gone while no process ran", change: map[int]string{2: "gone"}, wantLists: 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			f := newCachedFixture(t, func(inner client.Client) Cached { return shardCache{c: inner, holder: cachedHolder} })
			vms := make([]*vmipamv1.VirtualMachine, n)
			addrs := make([]netip.Addr, n)
			for i := range vms {
				// The last one is pending: created, not bound yet.
				vms[i], addrs[i] = f.newVM(t, fmt.Sprintf("vm-%d", i), i < n-1)
			}
			f.stop()

			gone := map[int]bool{}
			for i, what := range tt.change {
				vm := &vmipamv1.VirtualMachine{}
				if err := f.inner.Get(ctx, client.ObjectKeyFromObject(vms[i]), vm); err != nil {
					t.Fatal(err)
				}
				switch what {
				case "elsewhere":
					vm.Labels = map[string]string{vmipamv1.HolderLabel: "vmipam-b"}
					if err := f.inner.Update(ctx, vm); err != nil {
						t.Fatal(err)
					}
				case "gone":
					gone[i] = true
					vm.Finalizers = nil
					if err := f.inner.Update(ctx, vm); err != nil {
						t.Fatal(err)
					}
					if err := f.inner.Delete(ctx, vm); err != nil {
						t.Fatal(err)
					}
				}
			}
			bypassed := netip.MustParseAddr("10.99.0.200")
			if tt.bypassed {
				vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bypassed", UID: "uid-bypassed"},
					Spec: vmipamv1.VirtualMachineSpec{Addresses: []string{bypassed.String()}}}
				if err := f.inner.Create(ctx, vm); err != nil {
					t.Fatal(err)
				}
			}

			reg, _ := f.start(t, shardCache{c: f.inner, holder: cachedHolder})
			f.counting.Store(true)
			err := reg.Ensure(ctx, f.pool)
			f.counting.Store(false)
			if err != nil {
				t.Fatal(err)
			}
			if got := f.lists.Load(); got != int32(tt.wantLists) {
				t.Errorf("the recovery made %d lists of VMs, want %d", got, tt.wantLists)
			}
			p := reg.Get(f.pool.Name)
			for i, vm := range vms {
				st, o, _ := p.Lookup(addrs[i])
				switch {
				case gone[i] && st != ipam.StateCooldown:
					t.Errorf("%s of the deleted %s is %s to %+v, want resting", addrs[i], vm.Name, st, o)
				case !gone[i] && (st != ipam.StateAllocated || o.UID != string(vm.UID)):
					t.Errorf("%s of %s is %s to %+v, want allocated to it", addrs[i], vm.Name, st, o)
				}
			}
			if st, o, _ := p.Lookup(bypassed); tt.bypassed && (st != ipam.StateAllocated || o.UID != "uid-bypassed") {
				t.Errorf("%s of the VM that bypassed the webhook is %s to %+v, want allocated to it", bypassed, st, o)
			}
		})
	}
}

// metaCache stands for a replica's own cache of VMs held as metadata,
// trimmed as kinds.Kind.TrimOwn trims them: read as internal/app's
// shardReader reads them (MetadataObject).
type metaCache struct {
	items  []metav1.PartialObjectMetadata
	holder string
}

func (c *metaCache) EachCached(_ context.Context, fn func(o *Object)) (bool, error) {
	for i := range c.items {
		if o, ok := MetadataObject(kinds.VirtualMachine, &c.items[i], c.holder); ok {
			fn(&o)
		}
	}
	return true, nil
}

// BenchmarkResyncFromCaches: one resync of a replica's share of make
// bench-scale's fleet (33,334 VMs, each bound here) from its caches, where
// nothing changed: what each replica spends every --resync-interval. The
// API server is not called.
func BenchmarkResyncFromCaches(b *testing.B) {
	const n = 33334
	ctx := b.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	pool := fixture.Pool("fleet", fixture.Stored("uid-fleet"), fixture.WithCIDRs("10.100.0.0/16"), fixture.WithCooldown(time.Minute))
	var calls atomic.Int32
	c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(vmipamscheme.Scheme).WithObjects(pool.DeepCopy()).Build(), interceptor.Funcs{
		List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, vms := list.(*metav1.PartialObjectMetadataList); vms {
				calls.Add(1)
			}
			return cl.List(ctx, list, opts...)
		},
	})
	cache := &metaCache{holder: cachedHolder}
	reg, _ := (&cachedFixture{c: c, clk: clk}).start(b, cache)
	if err := reg.Ensure(ctx, pool); err != nil {
		b.Fatal(err)
	}
	p := reg.Get(pool.Name)
	for i := range n {
		name := fmt.Sprintf("fleet-%06d", i)
		token := "token-" + name
		a, err := p.AllocateFamily(ctx, ipam.Reservation{Token: token, Namespace: "bench"}, vmipamv1.IPv4)
		if err != nil {
			b.Fatal(err)
		}
		uid := types.UID(fmt.Sprintf("0b6e7d4e-5b1c-4b8e-9d2f-%012d", i))
		if _, err := p.Bind(a, ipam.Owner{Token: token, UID: string(uid), Ref: "bench/" + name}); err != nil {
			b.Fatal(err)
		}
		m := metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name, UID: uid, ResourceVersion: "1",
			Finalizers:  []string{vmipamv1.Finalizer},
			Annotations: map[string]string{vmipamv1.TokenAnnotation: token, vmipamv1.PoolAnnotation: pool.Name, vmipamv1.AddressAnnotation: a.String()}}}
		cache.items = append(cache.items, m)
	}
	calls.Store(0)
	b.ReportAllocs()
	for b.Loop() {
		listed, err := reg.resync(ctx, []*Pool{p}, false)
		if err != nil || listed {
			b.Fatalf("resync: listed %v, %v", listed, err)
		}
	}
	if calls.Load() != 0 {
		b.Errorf("%d lists of VMs; a resync from the caches lists none", calls.Load())
	}
	if st := p.Stats(); st.Releases != 0 {
		b.Errorf("%d addresses released; every VM is live", st.Releases)
	}
}
