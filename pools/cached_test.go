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

func (s shardCache) EachCached(ctx context.Context, fn func(obj *unstructured.Unstructured)) (bool, error) {
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
			fn(&l.Items[i])
		}
	}
	return true, nil
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
			clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			pool := fixture.Pool("cached", fixture.Stored("uid-cached"), fixture.WithCIDRs("10.99.0.0/24"),
				fixture.WithCooldown(time.Minute), fixture.WithPendingTTL(time.Minute))
			inner := fake.NewClientBuilder().WithScheme(vmipamscheme.Scheme).WithObjects(pool.DeepCopy()).Build()
			var lists, gets atomic.Int32
			counting := atomic.Bool{}
			c := interceptor.NewClient(inner, interceptor.Funcs{
				List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					switch list.(type) {
					case *unstructured.UnstructuredList, *metav1.PartialObjectMetadataList:
						if counting.Load() {
							lists.Add(1)
						}
					}
					return cl.List(ctx, list, opts...)
				},
				Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if _, vm := obj.(*unstructured.Unstructured); vm && counting.Load() {
						gets.Add(1)
					}
					return cl.Get(ctx, key, obj, opts...)
				},
			})
			const mine = "vmipam-a"
			reg := NewRegistry(Options{Client: c, APIReader: c, Kinds: kinds.Default(), Holder: mine, Clock: clk,
				RunInterval: time.Hour, ResyncInterval: time.Hour, StatusInterval: time.Hour, ProveInterval: time.Hour})
			reg.MarkServed(kinds.VirtualMachine.GVK)
			reg.SetCached(kinds.VirtualMachine.GVK, shardCache{c: inner, holder: mine})
			regCtx, stop := context.WithCancel(ctx)
			var done sync.WaitGroup
			done.Go(func() { _ = reg.Start(regCtx) })
			t.Cleanup(func() { stop(); done.Wait() })
			if err := reg.Ensure(ctx, pool); err != nil {
				t.Fatal(err)
			}
			p := reg.Get(pool.Name)

			count := n
			if tt.goneAll {
				count = maxConfirms + 1
			}
			vms := make([]*vmipamv1.VirtualMachine, count)
			addrs := make([]netip.Addr, count)
			for i := range vms {
				name, token := fmt.Sprintf("vm-%d", i), fmt.Sprintf("token-%d", i)
				a, err := p.AllocateFamily(ctx, ipam.Reservation{Token: token, Namespace: "default"}, vmipamv1.IPv4)
				if err != nil {
					t.Fatal(err)
				}
				vms[i] = &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name),
					Labels:      map[string]string{vmipamv1.HolderLabel: mine},
					Annotations: map[string]string{vmipamv1.TokenAnnotation: token, vmipamv1.PoolAnnotation: pool.Name, vmipamv1.AddressAnnotation: a.String()},
					Finalizers:  []string{vmipamv1.Finalizer}}, Spec: vmipamv1.VirtualMachineSpec{IPPool: pool.Name, Addresses: []string{a.String()}}}
				if err := inner.Create(ctx, vms[i]); err != nil {
					t.Fatal(err)
				}
				if _, err := p.Bind(a, ipam.Owner{Token: token, UID: string(vms[i].UID), Ref: "default/" + name}); err != nil {
					t.Fatal(err)
				}
				addrs[i] = a
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
