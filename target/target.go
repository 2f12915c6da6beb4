// Package target describes where vmipam finds the pool choice and writes
// the address on the objects it manages, so the webhook and the controller
// work on any kind (vmipam's reference VirtualMachine, or another project's
// kind that keeps its address in a field or an annotation) through
// unstructured objects and configuration rather than Go types.
package target

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Target is a kind vmipam gives addresses to, and where on it the address
// and the pool choice live.
type Target struct {
	// GVK is the kind.
	GVK schema.GroupVersionKind
	// Resource is the kind's plural resource name, as admission requests
	// and messages name it.
	Resource string
	// AddressesField is the path of a string-list field holding the
	// addresses ("spec.addresses"); AddressAnnotation, used when the field
	// is empty, names an annotation holding one address instead.
	AddressesField    []string
	AddressAnnotation string
	// PoolField is the path of a string field naming the pool, if any.
	PoolField []string
}

// VirtualMachine is vmipam's reference kind.
var VirtualMachine = Target{
	GVK:            vmipamv1.GroupVersion.WithKind("VirtualMachine"),
	Resource:       "virtualmachines",
	AddressesField: []string{"spec", "addresses"},
	PoolField:      []string{"spec", "ipPool"},
}

// GVR is the kind's group, version and resource.
func (t Target) GVR() schema.GroupVersionResource {
	return t.GVK.GroupVersion().WithResource(t.Resource)
}

// AddressPath is how the address's location is written in messages to the
// user, such as "spec.addresses[0]".
func (t Target) AddressPath() string {
	if len(t.AddressesField) > 0 {
		return strings.Join(t.AddressesField, ".") + "[0]"
	}
	return "metadata.annotations[" + t.AddressAnnotation + "]"
}

// AddressesPath is how the whole address field is written in messages,
// such as "spec.addresses".
func (t Target) AddressesPath() string {
	if len(t.AddressesField) > 0 {
		return strings.Join(t.AddressesField, ".")
	}
	return "metadata.annotations[" + t.AddressAnnotation + "]"
}

// PoolPath is how the pool field is written in messages.
func (t Target) PoolPath() string { return strings.Join(t.PoolField, ".") }

// New returns an empty object of the target's kind.
func (t Target) New() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(t.GVK)
	return u
}

// NewList returns an empty list of the target's kind.
func (t Target) NewList() *unstructured.UnstructuredList {
	u := &unstructured.UnstructuredList{}
	u.SetGroupVersionKind(t.GVK.GroupVersion().WithKind(t.GVK.Kind + "List"))
	return u
}

// Addresses returns the addresses on obj.
func (t Target) Addresses(obj *unstructured.Unstructured) ([]string, error) {
	if len(t.AddressesField) > 0 {
		v, _, err := unstructured.NestedStringSlice(obj.Object, t.AddressesField...)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", strings.Join(t.AddressesField, "."), err)
		}
		return v, nil
	}
	if a := obj.GetAnnotations()[t.AddressAnnotation]; a != "" {
		return []string{a}, nil
	}
	return nil, nil
}

// SetAddresses writes the addresses on obj.
func (t Target) SetAddresses(obj *unstructured.Unstructured, addrs []string) error {
	if len(t.AddressesField) > 0 {
		if err := unstructured.SetNestedStringSlice(obj.Object, addrs, t.AddressesField...); err != nil {
			return fmt.Errorf("write %s: %w", strings.Join(t.AddressesField, "."), err)
		}
		return nil
	}
	SetAnnotation(obj, t.AddressAnnotation, strings.Join(addrs, ","))
	return nil
}

// Pool returns the pool obj names, if any.
func (t Target) Pool(obj *unstructured.Unstructured) (string, error) {
	if len(t.PoolField) == 0 {
		return "", nil
	}
	v, _, err := unstructured.NestedString(obj.Object, t.PoolField...)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", t.PoolPath(), err)
	}
	return v, nil
}

// Stamp records what vmipam gave obj: the address, the pool and the
// reservation token, the finalizer that makes deletion release it, and the
// holder label naming the replica that looks after it (none if empty).
func (t Target) Stamp(obj *unstructured.Unstructured, addr, pool, token, holder string) error {
	if err := t.SetAddresses(obj, []string{addr}); err != nil {
		return err
	}
	if holder != "" {
		SetHolder(obj, holder)
	}
	SetAnnotation(obj, vmipamv1.PoolAnnotation, pool)
	SetAnnotation(obj, vmipamv1.TokenAnnotation, token)
	SetAnnotation(obj, vmipamv1.AddressAnnotation, addr)
	AddFinalizer(obj)
	return nil
}

// SetHolder sets vmipam's holder label on obj; it reports whether that
// changed it.
func SetHolder(obj *unstructured.Unstructured, holder string) bool {
	l := obj.GetLabels()
	if l[vmipamv1.HolderLabel] == holder {
		return false
	}
	if l == nil {
		l = map[string]string{}
	}
	l[vmipamv1.HolderLabel] = holder
	obj.SetLabels(l)
	return true
}

// AddFinalizer adds vmipam's finalizer to obj if missing.
func AddFinalizer(obj *unstructured.Unstructured) bool {
	for _, f := range obj.GetFinalizers() {
		if f == vmipamv1.Finalizer {
			return false
		}
	}
	obj.SetFinalizers(append(obj.GetFinalizers(), vmipamv1.Finalizer))
	return true
}

// HasFinalizer reports whether obj carries vmipam's finalizer.
func HasFinalizer(obj *unstructured.Unstructured) bool {
	for _, f := range obj.GetFinalizers() {
		if f == vmipamv1.Finalizer {
			return true
		}
	}
	return false
}

// RemoveFinalizer drops vmipam's finalizer from obj.
func RemoveFinalizer(obj *unstructured.Unstructured) {
	var keep []string
	for _, f := range obj.GetFinalizers() {
		if f != vmipamv1.Finalizer {
			keep = append(keep, f)
		}
	}
	obj.SetFinalizers(keep)
}

// SetAnnotation sets one annotation on obj.
func SetAnnotation(obj *unstructured.Unstructured, k, v string) {
	a := obj.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[k] = v
	obj.SetAnnotations(a)
}

// RemoveAnnotation removes annotation k from obj, if present.
// (GetAnnotations returns a copy, so deleting from it changes nothing.)
func RemoveAnnotation(obj *unstructured.Unstructured, k string) {
	a := obj.GetAnnotations()
	if _, ok := a[k]; !ok {
		return
	}
	delete(a, k)
	obj.SetAnnotations(a)
}
