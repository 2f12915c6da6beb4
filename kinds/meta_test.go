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

// TestTrimUnlabelled: an object without a holder label, watched as
// metadata, keeps the labels and annotations vmipam may read: its own and
// the kind's pool annotation, and every one but the last-applied
// configuration for a kind with a condition.
func TestTrimUnlabelled(t *testing.T) {
	conditional := VirtualMachine
	conditional.Condition = "has(object.spec)"
	pooled := VirtualMachine
	pooled.PoolAnnotation = "example.com/pool"
	for name, tc := range map[string]struct {
		kind                Kind
		labels, annotations []string
	}{
		"no condition":     {kind: VirtualMachine, annotations: []string{vmipamv1.TokenAnnotation}},
		"pool annotation":  {kind: pooled, annotations: []string{"example.com/pool", vmipamv1.TokenAnnotation}},
		"with a condition": {kind: conditional, labels: []string{"app"}, annotations: []string{"example.com/pool", "note", vmipamv1.TokenAnnotation}},
	} {
		t.Run(name, func(t *testing.T) {
			m := tc.kind.NewMetadata()
			m.ObjectMeta = metav1.ObjectMeta{
				Name: "a", Namespace: "n", UID: "u", Generation: 2, Finalizers: []string{"x"},
				Labels: map[string]string{"app": "y"},
				Annotations: map[string]string{vmipamv1.TokenAnnotation: "t", "example.com/pool": "p", "note": "n",
					"kubectl.kubernetes.io/last-applied-configuration": "{}"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
			}
			out, err := tc.kind.TrimUnlabelled(m)
			if err != nil {
				t.Fatal(err)
			}
			tm := out.(*metav1.PartialObjectMetadata)
			if tm.ManagedFields != nil || tm.Generation != 2 || tm.UID != "u" || len(tm.Finalizers) != 1 {
				t.Errorf("trimmed to %+v", tm.ObjectMeta)
			}
			if got := slices.Sorted(maps.Keys(tm.Labels)); !slices.Equal(got, tc.labels) {
				t.Errorf("labels %v, want %v", got, tc.labels)
			}
			if got := slices.Sorted(maps.Keys(tm.Annotations)); !slices.Equal(got, tc.annotations) {
				t.Errorf("annotations %v, want %v", got, tc.annotations)
			}
		})
	}
}
