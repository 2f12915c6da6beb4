package app

import (
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/target"
)

// TestShardReader: an object is read from the replica's own cache or from
// the unlabelled one, and a list holds both; one in neither is not found,
// as is every one before the caches are set.
func TestShardReader(t *testing.T) {
	vm := func(name string) *vmipamv1.VirtualMachine {
		return &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	}
	own := fake.NewClientBuilder().WithScheme(Scheme).WithObjects(vm("mine")).Build()
	unlabeled := fake.NewClientBuilder().WithScheme(Scheme).WithObjects(vm("unlabelled")).Build()
	r := &shardReader{}
	if err := r.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: "mine"}, target.VirtualMachine.New()); !apierrors.IsNotFound(err) {
		t.Errorf("Get before the kind is served: %v; want not found", err)
	}
	if l := target.VirtualMachine.NewList(); r.List(t.Context(), l) != nil || len(l.Items) != 0 {
		t.Errorf("List before the kind is served: %d objects", len(l.Items))
	}
	r.set(own, unlabeled)
	for _, tt := range []struct {
		name  string
		found bool
	}{{"mine", true}, {"unlabelled", true}, {"another replica's", false}} {
		obj := target.VirtualMachine.New()
		err := r.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: tt.name}, obj)
		if tt.found && (err != nil || obj.GetName() != tt.name) {
			t.Errorf("Get %s: %v, %q", tt.name, err, obj.GetName())
		}
		if !tt.found && !apierrors.IsNotFound(err) {
			t.Errorf("Get %s: %v; want not found", tt.name, err)
		}
	}
	list := target.VirtualMachine.NewList()
	if err := r.List(t.Context(), list); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range list.Items {
		names = append(names, o.GetName())
	}
	if len(names) != 2 || names[0] != "mine" || names[1] != "unlabelled" {
		t.Errorf("List: %v; want [mine unlabelled]", names)
	}
}
