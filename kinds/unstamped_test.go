package kinds

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// getter is a client.Reader that answers Gets from objects, and with err
// for the keys in failing.
type getter struct {
	client.Reader
	objects map[client.ObjectKey]bool
	failing map[client.ObjectKey]error
}

func (g getter) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	if err := g.failing[key]; err != nil {
		return err
	}
	if !g.objects[key] {
		return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
	}
	obj.SetNamespace(key.Namespace)
	obj.SetName(key.Name)
	return nil
}

// TestReadUnstamped: the objects whose metadata carries no stamp are read
// whole, one gone since skipped; any other failure to read one stops the
// read, and its error names the object.
func TestReadUnstamped(t *testing.T) {
	a, gone, b := client.ObjectKey{Namespace: "n", Name: "a"}, client.ObjectKey{Namespace: "n", Name: "gone"}, client.ObjectKey{Namespace: "n", Name: "b"}
	boom := errors.New("boom")
	for _, tt := range []struct {
		name    string
		failing map[client.ObjectKey]error
		want    []string
		wantErr string
	}{
		{name: "one gone", want: []string{"a", "b"}},
		{name: "a failure", failing: map[client.ObjectKey]error{b: boom}, want: []string{"a"}, wantErr: "read virtualmachines.vmipam.io n/b, which carries no stamp of vmipam's: boom"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := getter{objects: map[client.ObjectKey]bool{a: true, b: true}, failing: tt.failing}
			var got []string
			err := VirtualMachine.ReadUnstamped(context.Background(), r, []client.ObjectKey{a, gone, b}, func(obj *unstructured.Unstructured) {
				if obj.GroupVersionKind() != VirtualMachine.GVK {
					t.Errorf("%s read as a %s", obj.GetName(), obj.GroupVersionKind())
				}
				got = append(got, obj.GetName())
			})
			if !slices.Equal(got, tt.want) {
				t.Errorf("read %v; want %v", got, tt.want)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("error %v; want none", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, boom)):
				t.Errorf("error %v; want one saying %q and wrapping %v", err, tt.wantErr, boom)
			}
		})
	}
}
