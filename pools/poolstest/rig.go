package poolstest

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
)

// Rig is a Registry over a fake API server whose answers the test forces:
// the rig of the tests that drive a race or a failure between the
// registry and the layers above it, which add their own reconciler.
type Rig struct {
	// Client is the fake client through the test's interceptors; the
	// registry reads and writes through it.
	Client client.WithWatch
	// Registry is started for holder "vmipam" until the test ends.
	Registry *pools.Registry
}

// NewRig returns a Rig whose fake client holds ps and whose calls go
// through funcs, with a registry on clock clk that recovered each of ps.
func NewRig(t testing.TB, clk ipam.Clock, funcs interceptor.Funcs, ps ...*vmipamv1.IPPool) *Rig {
	t.Helper()
	return NewRecordingRig(t, clk, funcs, nil, ps...)
}

// NewRecordingRig is NewRig with a registry that records the address
// history in rec (none when nil).
func NewRecordingRig(t testing.TB, clk ipam.Clock, funcs interceptor.Funcs, rec pools.Recorder, ps ...*vmipamv1.IPPool) *Rig {
	t.Helper()
	b := fake.NewClientBuilder().WithScheme(scheme.Scheme)
	for _, p := range ps {
		b = b.WithObjects(p.DeepCopy())
	}
	c := interceptor.NewClient(b.Build(), funcs)
	return &Rig{Client: c, Registry: start(t, pools.Options{Client: c, APIReader: c, Kinds: kinds.Default(), Holder: "vmipam",
		Clock: clk, History: rec}, ps...)}
}

// Admitted is a VirtualMachine named name in namespace "default" (UID
// "uid-" and its name) as the webhook admits it: stamped with the
// reservation's token and pool, its addresses, and vmipam's finalizer.
func Admitted(name, token, pool string, addrs ...netip.Addr) *vmipamv1.VirtualMachine {
	vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name),
		Annotations: map[string]string{vmipamv1.TokenAnnotation: token, vmipamv1.PoolAnnotation: pool},
		Finalizers:  []string{vmipamv1.Finalizer}}, Spec: vmipamv1.VirtualMachineSpec{IPPool: pool}}
	for _, a := range addrs {
		vm.Spec.Addresses = append(vm.Spec.Addresses, a.String())
	}
	return vm
}

// StaleReader reads VirtualMachines through Reader, or, when Stale, answers
// with the one it remembered: a cache that has not seen the latest write.
type StaleReader struct {
	client.Reader
	Stale bool
	old   *unstructured.Unstructured
}

// Remember reads the VirtualMachine key now, to answer with when Stale.
func (r *StaleReader) Remember(ctx context.Context, t testing.TB, key client.ObjectKey) {
	t.Helper()
	obj := kinds.VirtualMachine.New()
	if err := r.Reader.Get(ctx, key, obj); err != nil {
		t.Fatal(err)
	}
	r.old = obj
}

// Get implements client.Reader.
func (r *StaleReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if r.Stale && r.old != nil {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return errors.New("the stale reader reads unstructured objects only")
		}
		r.old.DeepCopyInto(u)
		return nil
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}
