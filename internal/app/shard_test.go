package app

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/kinds"
)

// TestShardReader: an object is read from the replica's own cache (held as
// metadata, and rebuilt from vmipam's stamp); one of its own without a
// stamp, and one in the unlabelled cache (metadata too), are read whole from
// the API server, the unlabelled ones by one list at the first read unless
// changed since; one in neither cache is not found, as is every one before
// the caches are set.
func TestShardReader(t *testing.T) {
	vm := func(name string, ann map[string]string, addrs ...string) *vmipamv1.VirtualMachine {
		return &vmipamv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: "uid-" + types.UID(name), Annotations: ann,
				Labels: map[string]string{vmipamv1.HolderLabel: "h", "app": "x"}, Finalizers: []string{vmipamv1.Finalizer}},
			Spec: vmipamv1.VirtualMachineSpec{Addresses: addrs, Image: "debian"},
		}
	}
	stamped := vm("mine", map[string]string{vmipamv1.AddressAnnotation: "10.0.0.5", vmipamv1.TokenAnnotation: "t", "other": "o"}, "10.0.0.5")
	adopted := vm("adopted", nil, "10.0.0.6")
	own := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(stamped, adopted).Build()
	// The unlabelled cache holds what the watch saw; the API server has a
	// later spec, which is what reads of it must see.
	// Another changed since the list that reads them all at the first
	// read: it is read again.
	unlabelled := func(addr string) *vmipamv1.VirtualMachine {
		o := vm("unlabelled", nil, addr)
		delete(o.Labels, vmipamv1.HolderLabel)
		return o
	}
	changed, changedCached := unlabelled("10.0.0.8"), unlabelled("10.0.0.8")
	changed.Name, changedCached.Name, changed.UID, changedCached.UID = "changed", "changed", "uid-changed", "uid-changed"
	changedCached.ResourceVersion = "1000"
	var lists, gets atomic.Int32
	api := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(stamped.DeepCopy(), adopted.DeepCopy(), unlabelled("10.0.0.7"), changed).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				gets.Add(1)
				return c.Get(ctx, key, obj, opts...)
			},
			List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
				lists.Add(1)
				return c.List(ctx, list, opts...)
			},
		}).Build()
	unlabeled := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(unlabelled("10.0.0.3"), changedCached).Build()
	r := &shardReader{kind: kinds.VirtualMachine, api: api}
	if err := r.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: "mine"}, kinds.VirtualMachine.New()); !apierrors.IsNotFound(err) {
		t.Errorf("Get before the kind is served: %v; want not found", err)
	}
	r.set(own, unlabeled)
	for _, tt := range []struct {
		name   string
		found  bool
		addr   string
		holder string
	}{{"mine", true, "10.0.0.5", "h"}, {"adopted", true, "10.0.0.6", "h"}, {"unlabelled", true, "10.0.0.7", ""}, {"changed", true, "10.0.0.8", ""}, {"another replica's", false, "", ""}} {
		obj := kinds.VirtualMachine.New()
		err := r.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: tt.name}, obj)
		if !tt.found {
			if !apierrors.IsNotFound(err) {
				t.Errorf("Get %s: %v; want not found", tt.name, err)
			}
			continue
		}
		addrs, aerr := kinds.VirtualMachine.Addresses(obj)
		if err != nil || obj.GetName() != tt.name || obj.GetUID() != types.UID("uid-"+tt.name) || aerr != nil || !slices.Equal(addrs, []string{tt.addr}) ||
			!controllerutil.ContainsFinalizer(obj, vmipamv1.Finalizer) || obj.GetLabels()[vmipamv1.HolderLabel] != tt.holder {
			t.Errorf("Get %s: %v, %+v", tt.name, err, obj.Object)
		}
	}
	// One list for the unlabelled ones; a read each of the adopted one and
	// the one changed since.
	if lists.Load() != 1 || gets.Load() != 2 {
		t.Errorf("%d lists and %d reads from the API server, want 1 and 2", lists.Load(), gets.Load())
	}
}
