package app

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
)

// TestShardReader: an object is read from the replica's own cache (held as
// metadata, and rebuilt from vmipam's stamp) or from the unlabelled one;
// one of its own without a stamp is read whole from the API server; one in
// neither cache is not found, as is every one before the caches are set.
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
	api := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(stamped.DeepCopy(), adopted.DeepCopy()).Build()
	unlabeled := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(vm("unlabelled", nil, "10.0.0.7")).Build()
	r := &shardReader{kind: kinds.VirtualMachine, api: api}
	if err := r.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: "mine"}, kinds.VirtualMachine.New()); !apierrors.IsNotFound(err) {
		t.Errorf("Get before the kind is served: %v; want not found", err)
	}
	r.set(own, unlabeled)
	for _, tt := range []struct {
		name  string
		found bool
		addr  string
	}{{"mine", true, "10.0.0.5"}, {"adopted", true, "10.0.0.6"}, {"unlabelled", true, "10.0.0.7"}, {"another replica's", false, ""}} {
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
			!controllerutil.ContainsFinalizer(obj, vmipamv1.Finalizer) || obj.GetLabels()[vmipamv1.HolderLabel] != "h" {
			t.Errorf("Get %s: %v, %+v", tt.name, err, obj.Object)
		}
	}
}

// TestEachCached: a resync reads every object of both caches once: the
// own ones from their metadata, one of them without a stamp whole from
// the API server, the unlabelled ones whole.
func TestEachCached(t *testing.T) {
	vm := func(name string, labels, ann map[string]string, addrs ...string) *vmipamv1.VirtualMachine {
		return &vmipamv1.VirtualMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: "uid-" + types.UID(name), Annotations: ann, Labels: labels,
				Finalizers: []string{vmipamv1.Finalizer}},
			Spec: vmipamv1.VirtualMachineSpec{Addresses: addrs},
		}
	}
	mine := map[string]string{vmipamv1.HolderLabel: "h"}
	stamped := vm("mine", mine, map[string]string{vmipamv1.AddressAnnotation: "10.0.0.5", vmipamv1.PoolAnnotation: "p", vmipamv1.TokenAnnotation: "t"}, "10.0.0.5")
	adopted := vm("adopted", mine, nil, "10.0.0.6")
	own := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(stamped, adopted).Build()
	api := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(stamped.DeepCopy(), adopted.DeepCopy()).Build()
	unlabeled := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(vm("unlabelled", nil, nil, "10.0.0.7")).Build()
	r := &shardReader{kind: kinds.VirtualMachine, api: api, holder: "h"}
	if ok, err := r.EachCached(t.Context(), func(*pools.Object) { t.Error("an object before the caches are set") }); ok || err != nil {
		t.Errorf("EachCached before the caches are set: %v, %v; want false", ok, err)
	}
	r.set(own, unlabeled)
	got := map[string]string{}
	ok, err := r.EachCached(t.Context(), func(o *pools.Object) {
		got[o.Name] = fmt.Sprintf("%v %s %s %s %v", o.Addresses, o.Holder, o.Pool, o.UID, o.Finalized)
	})
	want := map[string]string{
		"mine": "[10.0.0.5] h p uid-mine true", "adopted": "[10.0.0.6] h  uid-adopted true", "unlabelled": "[10.0.0.7]   uid-unlabelled true",
	}
	if !ok || err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("EachCached: %v, %v, read %v; want %v", ok, err, got, want)
	}
}

// indexedInformers serves one informer per object type, as a cache's
// GetInformer would (cacheindex.Informers).
type indexedInformers map[reflect.Type]toolscache.SharedIndexInformer

func (i indexedInformers) GetInformer(_ context.Context, obj client.Object, _ ...cache.InformerGetOption) (cache.Informer, error) {
	return i[reflect.TypeOf(obj)], nil
}

// listedInformer is an informer whose list is list and whose watch never
// sends an event.
func listedInformer(list runtime.Object, obj runtime.Object) toolscache.SharedIndexInformer {
	return toolscache.NewSharedIndexInformer(&toolscache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) { return list, nil },
		WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents != nil && *o.SendInitialEvents {
				return nil, errors.New("streaming lists are not served")
			}
			return watch.NewFake(), nil
		},
	}, obj, 0, toolscache.Indexers{})
}

// failingList is a cache whose List fails.
type failingList struct{ client.Reader }

func (failingList) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("listed through the client")
}

// TestEachCachedFromIndexes: once the caches' informers have synced, a
// resync reads their objects from the indexes, not through the caches'
// List (which fails here), and reads the same as through it: the
// unlabelled objects, which an index holds without their kind, included.
// Before the sync it lists through the caches, which wait for it.
func TestEachCachedFromIndexes(t *testing.T) {
	mine := map[string]string{vmipamv1.HolderLabel: "h"}
	meta := func(name string, ann map[string]string) metav1.PartialObjectMetadata {
		return metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: "uid-" + types.UID(name),
			Annotations: ann, Labels: mine, Finalizers: []string{vmipamv1.Finalizer}}}
	}
	own := &metav1.PartialObjectMetadataList{Items: []metav1.PartialObjectMetadata{
		meta("mine", map[string]string{vmipamv1.AddressAnnotation: "10.0.0.5", vmipamv1.PoolAnnotation: "p", vmipamv1.TokenAnnotation: "t"}),
		meta("adopted", nil),
	}}
	adopted := &vmipamv1.VirtualMachine{ObjectMeta: own.Items[1].ObjectMeta, Spec: vmipamv1.VirtualMachineSpec{Addresses: []string{"10.0.0.6"}}}
	api := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(adopted).Build()
	// As rawwatch decodes it: no apiVersion, no kind.
	unlabelled := &unstructured.UnstructuredList{Items: []unstructured.Unstructured{{Object: map[string]any{
		"metadata": map[string]any{"namespace": "ns", "name": "unlabelled", "uid": "uid-unlabelled", "finalizers": []any{vmipamv1.Finalizer}},
		"spec":     map[string]any{"addresses": []any{"10.0.0.7"}},
	}}}}
	informers := indexedInformers{
		reflect.TypeFor[*metav1.PartialObjectMetadata](): listedInformer(own, &metav1.PartialObjectMetadata{}),
		reflect.TypeFor[*unstructured.Unstructured]():    listedInformer(unlabelled, &unstructured.Unstructured{}),
	}
	r := &shardReader{kind: kinds.VirtualMachine, api: api, holder: "h"}
	r.set(failingList{}, failingList{})
	if err := r.setIndexes(t.Context(), informers, informers); err != nil {
		t.Fatal(err)
	}
	if _, err := r.EachCached(t.Context(), func(*pools.Object) {}); err == nil {
		t.Error("EachCached before the informers synced read the indexes")
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for _, inf := range informers {
		go inf.RunWithContext(ctx)
		if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			t.Fatal("no sync")
		}
	}
	got := map[string]string{}
	ok, err := r.EachCached(t.Context(), func(o *pools.Object) {
		got[o.Name] = fmt.Sprintf("%v %s %s %s %v %s", o.Addresses, o.Holder, o.Pool, o.UID, o.Finalized, o.GVK.Kind)
	})
	want := map[string]string{
		"mine":       "[10.0.0.5] h p uid-mine true VirtualMachine",
		"adopted":    "[10.0.0.6] h  uid-adopted true VirtualMachine",
		"unlabelled": "[10.0.0.7]   uid-unlabelled true VirtualMachine",
	}
	if !ok || err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("EachCached: %v, %v, read %v; want %v", ok, err, got, want)
	}
}
