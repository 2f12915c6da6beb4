package pools

import (
	"context"
	"fmt"
	"net/netip"
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
			if err := r.eachLive(ctx, func(obj *unstructured.Unstructured, h ipam.Holding, stamped string) {
				got[h.Addr] = append(got[h.Addr], h.Owner.UID)
				if obj.GetName() == "stamped" && (stamped != "p" || h.Owner.Token != "token-stamped" || obj.GetLabels()[vmipamv1.HolderLabel] != "vmipam-a") {
					t.Errorf("stamped VM read as %v, pool %q, token %q", obj.Object, stamped, h.Owner.Token)
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
