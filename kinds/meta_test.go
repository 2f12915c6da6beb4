package kinds

import (
	"maps"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// TestFromMetadata: an object watched as metadata, trimmed, reads as the
// object it is the metadata of: its address where its kind keeps it (in
// the form vmipam stamps), its finalizers, vmipam's annotations and its
// holder label. Without vmipam's address annotation it must be read whole;
// a status kind is never watched as metadata.
func TestFromMetadata(t *testing.T) {
	kubevirt := kubevirtLike
	kubevirt.GVK = deep.GVK
	stamp := map[string]string{vmipamv1.AddressAnnotation: "10.0.0.5", vmipamv1.TokenAnnotation: "t", vmipamv1.PoolAnnotation: "p", "other": "o"}
	for name, tg := range map[string]Kind{
		"vmipam's": VirtualMachine, "annotation": byAnnotation, "deep list": deep, "string": oneString,
		"json on metadata": jsonOnMetadata, "json in the template": kubevirt,
	} {
		t.Run(name, func(t *testing.T) {
			if !tg.MetadataSuffices() {
				t.Fatal("metadata does not suffice")
			}
			now := metav1.Now()
			m := tg.NewMetadata()
			m.ObjectMeta = metav1.ObjectMeta{
				Name: "a", Namespace: "n", UID: "u", ResourceVersion: "7", DeletionTimestamp: &now, Finalizers: []string{vmipamv1.Finalizer, "x"},
				Annotations: maps.Clone(stamp), Labels: map[string]string{vmipamv1.HolderLabel: "h", "app": "y"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			}
			trimmed, err := tg.TrimMetadata(m)
			if err != nil {
				t.Fatal(err)
			}
			tm := trimmed.(*metav1.PartialObjectMetadata)
			if tm.ManagedFields != nil || len(tm.Annotations) != 3 || len(tm.Labels) != 1 || tm.GroupVersionKind() != tg.GVK {
				t.Errorf("trimmed to %+v", tm)
			}
			u, ok := tg.FromMetadata(tm)
			if !ok {
				t.Fatal("FromMetadata: not rebuilt")
			}
			addrs, err := tg.Addresses(u)
			if err != nil || !slices.Equal(addrs, []string{"10.0.0.5"}) {
				t.Errorf("addresses %v, %v", addrs, err)
			}
			if u.GroupVersionKind() != tg.GVK || u.GetName() != "a" || u.GetNamespace() != "n" || u.GetUID() != "u" || u.GetResourceVersion() != "7" ||
				!u.GetDeletionTimestamp().Equal(&metav1.Time{Time: now.Truncate(time.Second)}) || !controllerutil.ContainsFinalizer(u, vmipamv1.Finalizer) || u.GetLabels()[vmipamv1.HolderLabel] != "h" || u.GetAnnotations()[vmipamv1.TokenAnnotation] != "t" {
				t.Errorf("rebuilt %+v", u.Object)
			}
			// Rebuilding copies: changing the object leaves the cache's alone.
			controllerutil.RemoveFinalizer(u, vmipamv1.Finalizer)
			SetHolder(u, "other")
			if len(tm.Finalizers) != 2 || tm.Labels[vmipamv1.HolderLabel] != "h" {
				t.Errorf("the cached metadata changed: %+v", tm.ObjectMeta)
			}
			delete(tm.Annotations, vmipamv1.AddressAnnotation)
			if _, ok := tg.FromMetadata(tm); ok {
				t.Error("rebuilt without vmipam's address annotation")
			}
		})
	}
	if neonLike.MetadataSuffices() {
		t.Error("metadata suffices for a status kind")
	}
}
