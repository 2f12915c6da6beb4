package pools

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	vmipamscheme "github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
)

// liveVM is a VirtualMachine named name holding addr (none when empty),
// labelled for holder (none when empty), with vmipam's stamp (token, pool
// and address annotations) when stamped.
func liveVM(name, addr, holder string, stamped bool) *vmipamv1.VirtualMachine {
	vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)}}
	if addr != "" {
		vm.Spec.Addresses = []string{addr}
	}
	if holder != "" {
		vm.Labels = map[string]string{vmipamv1.HolderLabel: holder}
	}
	if stamped {
		vm.Annotations = map[string]string{vmipamv1.TokenAnnotation: "token-" + name, vmipamv1.PoolAnnotation: "p", vmipamv1.AddressAnnotation: addr}
		vm.Finalizers = []string{vmipamv1.Finalizer}
	}
	return vm
}

// TestEachLiveInTwoPasses: a listing of the live objects reads the
// stamped ones from their metadata and the others whole, and sees each
// object once, whatever its label: unlabelled (bypassed the webhook),
// labelled without vmipam's stamp (adopted), unlabelled between the two
// passes (so in neither list's whole objects), or more of those than are
// read one by one.
func TestEachLiveInTwoPasses(t *testing.T) {
	for _, tt := range []struct {
		name string
		vms  []*vmipamv1.VirtualMachine
		// unlabel loses its holder label after the first pass, which
		// lists the unlabelled objects.
		unlabel string
		// wantLists of whole objects and of metadata, and Gets.
		wantWhole, wantMeta, wantGets int
	}{{
		name: "stamped only",
		vms: []*vmipamv1.VirtualMachine{
			liveVM("a", "10.0.0.1", "vmipam-a", true), liveVM("b", "10.0.0.2", "vmipam-b", true),
			liveVM("c", "10.0.0.3", "vmipam-a", true),
		},
		wantWhole: 1, wantMeta: 1,
	}, {
		name: "every sort",
		vms: []*vmipamv1.VirtualMachine{
			liveVM("stamped", "10.0.0.1", "vmipam-a", true),
			liveVM("bypassed", "10.0.0.2", "", false),
			liveVM("adopted", "10.0.0.3", "vmipam-b", false),
			liveVM("unmanaged", "", "", false),
			liveVM("moved", "10.0.0.5", "vmipam-b", false),
		},
		unlabel:   "moved",
		wantWhole: 1, wantMeta: 1, wantGets: 2,
	}, {
		name:      "many adopted",
		vms:       adoptedVMs(maxWholeReads + 1),
		wantWhole: 2, wantMeta: 1,
	}} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			objs := make([]client.Object, len(tt.vms))
			for i, vm := range tt.vms {
				objs[i] = vm
			}
			var whole, meta, gets atomic.Int32
			c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(vmipamscheme.Scheme).WithObjects(objs...).Build(), interceptor.Funcs{
				List: func(ctx context.Context, cl client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					switch list.(type) {
					case *unstructured.UnstructuredList:
						whole.Add(1)
					case *metav1.PartialObjectMetadataList:
						meta.Add(1)
					}
					if err := cl.List(ctx, list, opts...); err != nil {
						return err
					}
					if _, ok := list.(*unstructured.UnstructuredList); ok && tt.unlabel != "" && whole.Load() == 1 {
						vm := &vmipamv1.VirtualMachine{}
						if err := cl.Get(ctx, client.ObjectKey{Namespace: "default", Name: tt.unlabel}, vm); err != nil {
							return err
						}
						vm.Labels = nil
						return cl.Update(ctx, vm)
					}
					return nil
				},
				Get: func(ctx context.Context, cl client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					gets.Add(1)
					return cl.Get(ctx, key, obj, opts...)
				},
			})
			r := NewRegistry(Options{Client: c, APIReader: c, Kinds: kinds.Default(), Holder: "vmipam-a"})
			got := map[netip.Addr][]string{}
			if err := r.eachLive(ctx, func(o *Object, h ipam.Holding) {
				got[h.Addr] = append(got[h.Addr], h.Owner.UID)
				if o.Name == "stamped" && (o.Pool != "p" || h.Owner.Token != "token-stamped" || o.Holder != "vmipam-a") {
					t.Errorf("stamped VM read as %+v, token %q", o, h.Owner.Token)
				}
			}); err != nil {
				t.Fatal(err)
			}
			want := map[netip.Addr][]string{}
			for _, vm := range tt.vms {
				if len(vm.Spec.Addresses) > 0 {
					a := netip.MustParseAddr(vm.Spec.Addresses[0])
					want[a] = append(want[a], string(vm.UID))
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("live holdings %v, want %v", got, want)
			}
			if whole.Load() != int32(tt.wantWhole) || meta.Load() != int32(tt.wantMeta) || gets.Load() != int32(tt.wantGets) {
				t.Errorf("%d lists of whole objects, %d of metadata, %d gets; want %d, %d, %d",
					whole.Load(), meta.Load(), gets.Load(), tt.wantWhole, tt.wantMeta, tt.wantGets)
			}
		})
	}
}

// adoptedVMs are n VMs labelled for a replica without vmipam's stamp.
func adoptedVMs(n int) []*vmipamv1.VirtualMachine {
	out := make([]*vmipamv1.VirtualMachine, n)
	for i := range out {
		out[i] = liveVM(fmt.Sprintf("adopted-%03d", i), fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), "vmipam-b", false)
	}
	return out
}

// TestMetadataObject: what a resync reads of an object from its metadata
// is what it reads of the object rebuilt from that metadata, for a list's
// metadata (FromMetadata) and an own cache's (OwnFromMetadata), however
// the labels, the deletion, the finalizers and the stamp stand.
func TestMetadataObject(t *testing.T) {
	now := metav1.Now()
	stamp := map[string]string{vmipamv1.AddressAnnotation: "10.0.0.5,fd00::5", vmipamv1.TokenAnnotation: "t", vmipamv1.PoolAnnotation: "p"}
	for name, meta := range map[string]metav1.ObjectMeta{
		"no labels":          {Annotations: stamp},
		"labelled":           {Annotations: stamp, Labels: map[string]string{vmipamv1.HolderLabel: "other"}},
		"labels empty":       {Annotations: stamp, Labels: map[string]string{}},
		"another label":      {Annotations: stamp, Labels: map[string]string{"app": "x"}},
		"deleting":           {Annotations: stamp, DeletionTimestamp: &now, Finalizers: []string{"x", vmipamv1.Finalizer}},
		"deleting, released": {Annotations: stamp, DeletionTimestamp: &now, Finalizers: []string{"x"}},
		"no pool":            {Annotations: map[string]string{vmipamv1.AddressAnnotation: "10.0.0.5"}},
		"not an address":     {Annotations: map[string]string{vmipamv1.AddressAnnotation: "ten"}},
		"no stamp":           {Annotations: map[string]string{vmipamv1.TokenAnnotation: "t"}},
	} {
		for _, holder := range []string{"", "h"} {
			t.Run(name+"/holder "+holder, func(t *testing.T) {
				m := kinds.VirtualMachine.NewMetadata()
				m.ObjectMeta = meta
				m.Namespace, m.Name, m.UID = "ns", "vm", "uid-vm"
				got, gotOK := MetadataObject(kinds.VirtualMachine, m, holder)
				whole, wantOK := kinds.VirtualMachine.FromMetadata(m)
				if holder != "" {
					whole, wantOK = kinds.VirtualMachine.OwnFromMetadata(m, holder)
				}
				if gotOK != wantOK {
					t.Fatalf("MetadataObject reports %v, rebuilding %v", gotOK, wantOK)
				}
				if !wantOK {
					return
				}
				want := ObjectOf(kinds.VirtualMachine, whole)
				if !reflect.DeepEqual(got, want) {
					t.Errorf("MetadataObject = %+v, want %+v", got, want)
				}
				if g, w := fmt.Sprint(got.holdings()), fmt.Sprint(want.holdings()); g != w {
					t.Errorf("holdings %s, want %s", g, w)
				}
			})
		}
	}
}

// BenchmarkResyncRead: what a resync spends on each object the replica
// looks after before it reaches the allocator: read from its metadata
// (MetadataObject), against rebuilding it whole first (OwnFromMetadata,
// then ObjectOf), as resyncs did before.
func BenchmarkResyncRead(b *testing.B) {
	m := kinds.VirtualMachine.NewMetadata()
	m.Namespace, m.Name, m.UID, m.ResourceVersion, m.Generation = "bench-with", "fleet-000123", "0b6e7d4e-5b1c-4b8e-9d2f-3c1a2b4c5d6e", "1234567", 1
	m.CreationTimestamp, m.Finalizers = metav1.Now(), []string{vmipamv1.Finalizer}
	m.Annotations = map[string]string{vmipamv1.AddressAnnotation: "10.64.12.34", vmipamv1.PoolAnnotation: "bench", vmipamv1.TokenAnnotation: "Zq3x9Lr2Vb7Nc1Md5Kf8Hs"}
	for _, tc := range []struct {
		name string
		read func() Object
	}{
		{"metadata", func() Object { o, _ := MetadataObject(kinds.VirtualMachine, m, "vmipam-1"); return o }},
		{"rebuilt", func() Object {
			whole, _ := kinds.VirtualMachine.OwnFromMetadata(m, "vmipam-1")
			return ObjectOf(kinds.VirtualMachine, whole)
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				o := tc.read()
				if len(o.holdings()) != 1 {
					b.Fatal("no holding")
				}
			}
		})
	}
}

// TestCollectorSized: a collection of a pool's holdings starts with room
// for as many as the last one found there, and a pool never collected
// starts empty.
func TestCollectorSized(t *testing.T) {
	ranges, err := ipam.ParseRanges([]ipam.RangeSpec{{CIDR: "10.0.0.0/24"}})
	if err != nil {
		t.Fatal(err)
	}
	r := &Registry{holderLabel: "h"}
	c := r.newCollector(map[string]*ipam.Ranges{"a": ranges})
	for i := range 3 {
		o := &Object{Name: fmt.Sprint(i), Holder: "h", Addresses: []string{fmt.Sprintf("10.0.0.%d", i+1)}}
		eachHeld(o, c.add)
	}
	if got := len(c.done()["a"].holdings); got != 3 {
		t.Fatalf("collected %d holdings; want 3", got)
	}
	c = r.newCollector(map[string]*ipam.Ranges{"a": ranges, "b": ranges})
	if got := cap(c.out["a"].holdings); got != 3 {
		t.Errorf("the next collection of pool a has room for %d; want 3", got)
	}
	if got := cap(c.out["b"].holdings); got != 0 {
		t.Errorf("the first collection of pool b has room for %d; want 0", got)
	}
}
