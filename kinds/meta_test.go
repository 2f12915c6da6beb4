package kinds

import (
	"maps"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

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

// TestTrimOwn: a replica's own object, as its cache keeps it, drops the
// holder label that selects it (and only that one) and gets it back when
// read; the strings every object shares are shared, not copied per object.
func TestTrimOwn(t *testing.T) {
	decoded := func(holder string) *metav1.PartialObjectMetadata {
		m := VirtualMachine.NewMetadata()
		m.ObjectMeta = metav1.ObjectMeta{
			Name: "a", Namespace: string([]byte("team-a")), UID: "u", Finalizers: []string{string([]byte(vmipamv1.Finalizer))},
			Annotations: map[string]string{string([]byte(vmipamv1.AddressAnnotation)): "10.0.0.5", vmipamv1.TokenAnnotation: "t", vmipamv1.PoolAnnotation: string([]byte("p"))},
			Labels:      map[string]string{string([]byte(vmipamv1.HolderLabel)): holder},
		}
		return m
	}
	trim := VirtualMachine.TrimOwn("slot-0")
	var got []*metav1.PartialObjectMetadata
	for range 2 {
		out, err := trim(decoded("slot-0"))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, out.(*metav1.PartialObjectMetadata))
	}
	if got[0].Labels != nil {
		t.Errorf("labels %v kept", got[0].Labels)
	}
	u, ok := VirtualMachine.OwnFromMetadata(got[0], "slot-0")
	if !ok || u.GetLabels()[vmipamv1.HolderLabel] != "slot-0" || u.GetAnnotations()[vmipamv1.TokenAnnotation] != "t" {
		t.Errorf("read back as %+v", u.Object)
	}
	// A cache's list may leave the items' kind out: the kind's is put in.
	bare := got[0].DeepCopy()
	bare.TypeMeta = metav1.TypeMeta{}
	if u, ok := VirtualMachine.OwnFromMetadata(bare, "slot-0"); !ok || u.GroupVersionKind() != VirtualMachine.GVK {
		t.Errorf("read back without a kind as %+v", u)
	}
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	if !same(got[0].Namespace, got[1].Namespace) || !same(got[0].Finalizers[0], got[1].Finalizers[0]) ||
		!same(got[0].Annotations[vmipamv1.PoolAnnotation], got[1].Annotations[vmipamv1.PoolAnnotation]) {
		t.Error("the namespace, the finalizer or the pool are copies, not shared")
	}
	for k := range got[0].Annotations {
		for k2 := range got[1].Annotations {
			if k == k2 && !same(k, k2) {
				t.Errorf("annotation key %s is a copy, not shared", k)
			}
		}
	}
	// Another replica's label (a relabel on its way) stays.
	out, err := trim(decoded("slot-1"))
	if err != nil {
		t.Fatal(err)
	}
	if m := out.(*metav1.PartialObjectMetadata); m.Labels[vmipamv1.HolderLabel] != "slot-1" {
		t.Errorf("labels %v", m.Labels)
	}
}

// BenchmarkOwnCacheObject reports what a replica's own cache keeps of each
// object it looks after (bytes of heap per object), decoded from protobuf
// as the watch decodes it and trimmed as the cache trims it.
func BenchmarkOwnCacheObject(b *testing.B) {
	src := fleetVM()
	src.Labels = map[string]string{vmipamv1.HolderLabel: "slot-0", "app.kubernetes.io/name": "e2ebench"}
	src.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "e2ebench", Operation: metav1.ManagedFieldsOperationUpdate}}
	raw, err := src.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	trim := VirtualMachine.TrimOwn("slot-0")
	const n = 10000
	keep := make([]any, n)
	var before, after runtime.MemStats
	b.ResetTimer()
	for range b.N {
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range keep {
			m := &metav1.PartialObjectMetadata{}
			if err := m.Unmarshal(raw); err != nil {
				b.Fatal(err)
			}
			if keep[i], err = trim(m); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/object")
		clear(keep)
	}
}

// BenchmarkOwnFromMetadata reads an object of a replica's own cache whole,
// as far as vmipam reads it: every Get of the controller and, for each
// object the replica looks after, every resync from the caches.
func BenchmarkOwnFromMetadata(b *testing.B) {
	m := fleetVM() // as TrimOwn leaves it: no labels
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := VirtualMachine.OwnFromMetadata(m, "slot-0"); !ok {
			b.Fatal("not read")
		}
	}
}

// fleetVM is the metadata of a VM of make bench-scale's fleet as vmipam
// stamped it, without labels.
func fleetVM() *metav1.PartialObjectMetadata {
	m := VirtualMachine.NewMetadata()
	m.ObjectMeta = metav1.ObjectMeta{
		Name: "fleet-000123", Namespace: "bench-with", UID: "0b6e7d4e-5b1c-4b8e-9d2f-3c1a2b4c5d6e", ResourceVersion: "1234567", Generation: 1,
		CreationTimestamp: metav1.Now(), Finalizers: []string{vmipamv1.Finalizer},
		Annotations: map[string]string{vmipamv1.AddressAnnotation: "10.64.12.34", vmipamv1.TokenAnnotation: "Zq3x9Lr2Vb7Nc1Md5Kf8Hs",
			vmipamv1.PoolAnnotation: "bench"},
	}
	return m
}

// TestMetadataAddresses: the addresses read from an object's metadata are
// those read from the object FromMetadata rebuilds, for every way a kind
// keeps its address, whatever the stamp holds.
func TestMetadataAddresses(t *testing.T) {
	kubevirt := kubevirtLike
	kubevirt.GVK = deep.GVK
	kinds := map[string]Kind{
		"vmipam's": VirtualMachine, "annotation": byAnnotation, "deep list": deep, "string": oneString,
		"json on metadata": jsonOnMetadata, "json in the template": kubevirt, "status": neonLike,
	}
	stamps := map[string]string{
		"none": "", "one": "10.0.0.5", "two": "10.0.0.5,fd00::5", "not an address": "ten", "padded": " 10.0.0.5 , fd00::5",
		"too many": strings.Repeat("10.0.0.5,", 40) + "10.0.0.6", "quoted": `"10.0.0.5"`,
	}
	for kn, tg := range kinds {
		for sn, stamp := range stamps {
			t.Run(kn+"/"+sn, func(t *testing.T) {
				m := tg.NewMetadata()
				m.ObjectMeta = metav1.ObjectMeta{Name: "a", Namespace: "n", UID: "u", Annotations: map[string]string{vmipamv1.AddressAnnotation: stamp}}
				got, gotOK := tg.MetadataAddresses(m)
				var want []string
				u, wantOK := tg.FromMetadata(m)
				if wantOK {
					want, _ = tg.Addresses(u)
				}
				if gotOK != wantOK || !slices.Equal(got, want) {
					t.Errorf("MetadataAddresses = %q, %v; FromMetadata then Addresses = %q, %v", got, gotOK, want, wantOK)
				}
			})
		}
	}
}
