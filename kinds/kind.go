// Package kinds describes where vmipam finds the pool choice and writes
// the address on the objects it manages, so the webhook and the controller
// work on any kind (vmipam's reference VirtualMachine, or another project's
// kind that keeps its address in a field or an annotation) through
// unstructured objects and configuration rather than Go types.
package kinds

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Kind is a kind vmipam gives addresses to, and where on it the address
// and the pool choice live. Exactly one of AddressesField, AddressField,
// AddressAnnotation and Status says where the address goes; Load builds
// Kinds from a configuration file and checks that.
type Kind struct {
	// GVK is the kind.
	GVK schema.GroupVersionKind
	// Resource is the kind's plural resource name, as admission requests
	// and messages name it.
	Resource string
	// ClusterScoped is set for a kind whose objects have no namespace.
	ClusterScoped bool
	// Condition, if set, is a CEL expression over `object` that selects
	// the objects given an address (for example NeonVM's
	// "has(object.spec.extraNetwork) && object.spec.extraNetwork.enable");
	// the others are left alone. The API server evaluates it as the
	// mutating webhook's match condition, the controller for objects that
	// bypassed the webhook.
	Condition string

	// AddressesField is the path of a string-list field holding the
	// address ("spec.addresses").
	AddressesField []string
	// AddressField is the path of a string field holding the address.
	AddressField []string
	// AddressAnnotation names an annotation holding the address, in the
	// annotations of the object at AnnotationPath (the object's own
	// metadata when empty, or for example spec.template.metadata), written
	// in AnnotationFormat.
	AddressAnnotation string
	AnnotationPath    []string
	AnnotationFormat  Format
	// Status, if set, says that the address goes into status fields after
	// the create (the API server drops status on create for a kind with a
	// status subresource). vmipam records it at admission in
	// vmipamv1.AddressAnnotation, and the controller fills the fields.
	Status *StatusFields

	// NetworkField is the path of an object field given the network
	// identity of the address (vmipamv1.Network: the address with its
	// prefix length, the gateway and the routes of its range);
	// NetworkAnnotation, if set instead, names an annotation given it as
	// JSON, in the annotations of the object at NetworkAnnotationPath (the
	// object's own metadata when empty). With neither, vmipam writes none.
	NetworkField          []string
	NetworkAnnotation     string
	NetworkAnnotationPath []string

	// FamilyPolicyField and FamiliesField, if set, are the paths of the
	// fields that say how many address families an object gets an address
	// of and in which order (vmipamv1.IPFamilyPolicy and a list of
	// vmipamv1.IPFamily); without them, one address of the pool's first
	// family, or of a static request's.
	FamilyPolicyField, FamiliesField []string

	// PoolField is the path of a string field naming the pool, if any;
	// PoolAnnotation, an annotation of the object's metadata naming it.
	PoolField      []string
	PoolAnnotation string
}

// StatusFields are the status fields a kind reads its address from.
type StatusFields struct {
	// Address is the path of the string field given the address
	// ("status.extraNetIP").
	Address []string
	// Mask, if set, is the path of the string field given the prefix of
	// the address's range, in MaskFormat.
	Mask       []string
	MaskFormat MaskFormat
	// RequestAnnotation names the annotation of the object's metadata in
	// which a user asks for a specific address.
	RequestAnnotation string
}

// Format is how an annotation holds addresses.
type Format string

// The annotation formats.
const (
	// FormatPlain is one address: 10.0.0.5.
	FormatPlain Format = "plain"
	// FormatComma is a comma-separated list: 10.0.0.5,fd00::5.
	FormatComma Format = "comma"
	// FormatJSON is a JSON list of strings, as Calico's
	// cni.projectcalico.org/ipAddrs: ["10.0.0.5"].
	FormatJSON Format = "json"
)

// MaskFormat is how a status field holds the prefix of an address.
type MaskFormat string

// The mask formats.
const (
	// MaskDotted is a dotted mask, 255.255.255.0 (IPv4 only; an IPv6
	// range gets its prefix length).
	MaskDotted MaskFormat = "dotted"
	// MaskPrefix is the prefix length, 24.
	MaskPrefix MaskFormat = "prefix"
)

// VirtualMachine is vmipam's reference kind.
var VirtualMachine = Kind{
	GVK:               vmipamv1.GroupVersion.WithKind("VirtualMachine"),
	Resource:          "virtualmachines",
	AddressesField:    []string{"spec", "addresses"},
	NetworkField:      []string{"spec", "network"},
	FamilyPolicyField: []string{"spec", "ipFamilyPolicy"},
	FamiliesField:     []string{"spec", "ipFamilies"},
	PoolField:         []string{"spec", "ipPool"},
}

// MaxAddresses is how many addresses the kind's address location holds:
// one of each family for a list field or an annotation in list format,
// one otherwise.
func (t Kind) MaxAddresses() int {
	_, k := t.location()
	switch {
	case t.Status != nil:
		return 1
	case k == locList:
		return 2
	case k == locAnnotation && t.format() != FormatPlain:
		return 2
	}
	return 1
}

// StampValue is how vmipam's address annotation records addrs: joined by
// commas, the primary family's first.
func StampValue(addrs []string) string { return strings.Join(addrs, ",") }

// StampedAddresses reads vmipam's address annotation: the addresses it
// records, nil when it is empty.
func StampedAddresses(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// networkLocation returns the path the network identity is written to,
// ending in the annotation's key for an annotation, and whether it is an
// annotation; nil when the kind takes none.
func (t Kind) networkLocation() ([]string, bool) {
	switch {
	case len(t.NetworkField) > 0:
		return t.NetworkField, false
	case t.NetworkAnnotation == "":
		return nil, false
	}
	base := t.NetworkAnnotationPath
	if len(base) == 0 {
		base = []string{"metadata"}
	}
	return append(slices.Clip(base), "annotations", t.NetworkAnnotation), true
}

// networkOnMetadata reports whether the network goes into an annotation
// of the object's own metadata, which the stamp writes with vmipam's.
func (t Kind) networkOnMetadata() bool {
	p, ann := t.networkLocation()
	return ann && len(p) == 3 && p[0] == "metadata"
}

// NetworkPath is how the network's location is written in messages, or
// "" when the kind takes none.
func (t Kind) NetworkPath() string {
	p, ann := t.networkLocation()
	if ann {
		return strings.Join(p[:len(p)-1], ".") + "[" + p[len(p)-1] + "]"
	}
	return strings.Join(p, ".")
}

// networkValue is what the network location is given: the object, or
// its JSON for an annotation.
func (t Kind) networkValue(n *vmipamv1.Network) (any, error) {
	raw, err := json.Marshal(n)
	if err != nil {
		return nil, fmt.Errorf("encode the network of %s: %w", t.NetworkPath(), err)
	}
	if _, ann := t.networkLocation(); ann {
		return string(raw), nil
	}
	return json.RawMessage(raw), nil
}

// locKind is what the address location holds.
type locKind int

const (
	locList       locKind = iota // a list of strings
	locString                    // one string
	locAnnotation                // an annotation in Format
)

// location returns the path the address (or, for a status kind, the
// static request) is read from and written to, and what it holds. A path
// under metadata.annotations of the object itself ends in the key.
func (t Kind) location() ([]string, locKind) {
	switch {
	case len(t.AddressesField) > 0:
		return t.AddressesField, locList
	case len(t.AddressField) > 0:
		return t.AddressField, locString
	case t.Status != nil:
		return []string{"metadata", "annotations", t.Status.RequestAnnotation}, locAnnotation
	}
	base := t.AnnotationPath
	if len(base) == 0 {
		base = []string{"metadata"}
	}
	return append(slices.Clip(base), "annotations", t.AddressAnnotation), locAnnotation
}

// onMetadata reports whether the address location is an annotation of the
// object's own metadata, which the stamp writes with vmipam's annotations.
func (t Kind) onMetadata() bool {
	p, k := t.location()
	return k == locAnnotation && len(p) == 3 && p[0] == "metadata"
}

// format is the format of an annotation location.
func (t Kind) format() Format {
	if t.Status != nil || t.AnnotationFormat == "" {
		return FormatPlain
	}
	return t.AnnotationFormat
}

// Render writes addrs as the address location holds them, for a location
// that holds a string.
func (t Kind) Render(addrs []string) string {
	if t.format() == FormatJSON {
		b, _ := json.Marshal(addrs)
		return string(b)
	}
	return strings.Join(addrs, ",")
}

// parse reads the addresses of an annotation or string location's value.
func (t Kind) parse(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	_, k := t.location()
	if k == locString {
		return []string{s}, nil
	}
	switch t.format() {
	case FormatJSON:
		var out []string
		if err := json.Unmarshal([]byte(s), &out); err != nil {
			return nil, fmt.Errorf(`must be a JSON list of strings, for example ["10.0.0.5"]: %w`, err)
		}
		if len(out) > maxAddressItems {
			return nil, fmt.Errorf("holds more than %d addresses", maxAddressItems)
		}
		return out, nil
	case FormatComma:
		if strings.Count(s, ",") >= maxAddressItems {
			return nil, fmt.Errorf("holds more than %d addresses", maxAddressItems)
		}
		parts := strings.Split(s, ",")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		return parts, nil
	}
	return []string{s}, nil
}

// GVR is the kind's group, version and resource.
func (t Kind) GVR() schema.GroupVersionResource {
	return t.GVK.GroupVersion().WithResource(t.Resource)
}

// AddressPath is how the address's location is written in messages to the
// user, such as "spec.addresses[0]".
func (t Kind) AddressPath() string {
	if _, k := t.location(); k == locList {
		return t.AddressesPath() + "[0]"
	}
	return t.AddressesPath()
}

// AddressesPath is how the whole address location is written in
// messages, such as "spec.addresses" or
// "spec.template.metadata.annotations[cni.projectcalico.org/ipAddrs]".
func (t Kind) AddressesPath() string {
	p, k := t.location()
	if k == locAnnotation {
		return strings.Join(p[:len(p)-1], ".") + "[" + p[len(p)-1] + "]"
	}
	return strings.Join(p, ".")
}

// PoolPath is how the pool's location is written in messages.
func (t Kind) PoolPath() string {
	if t.PoolAnnotation != "" {
		return "metadata.annotations[" + t.PoolAnnotation + "]"
	}
	return strings.Join(t.PoolField, ".")
}

// New returns an empty object of the kind.
func (t Kind) New() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(t.GVK)
	return u
}

// NewList returns an empty list of the kind.
func (t Kind) NewList() *unstructured.UnstructuredList {
	u := &unstructured.UnstructuredList{}
	u.SetGroupVersionKind(t.GVK.GroupVersion().WithKind(t.GVK.Kind + "List"))
	return u
}

// Addresses returns the addresses on obj. For a kind whose address goes
// into status, that is the address vmipam recorded at admission, or else
// what the status holds.
func (t Kind) Addresses(obj *unstructured.Unstructured) ([]string, error) {
	if t.Status != nil {
		if a := obj.GetAnnotations()[vmipamv1.AddressAnnotation]; a != "" {
			return StampedAddresses(a), nil
		}
		v, _, err := unstructured.NestedString(obj.Object, t.Status.Address...)
		if err != nil || v == "" {
			return nil, wrapPath(t.Status.Address, err)
		}
		return []string{v}, nil
	}
	p, k := t.location()
	if k == locList {
		v, _, err := unstructured.NestedStringSlice(obj.Object, p...)
		return v, wrapPath(p, err)
	}
	v, _, err := unstructured.NestedString(obj.Object, p...)
	if err != nil {
		return nil, wrapPath(p, err)
	}
	addrs, err := t.parse(v)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", t.AddressesPath(), err)
	}
	return addrs, nil
}

func wrapPath(p []string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("read %s: %w", strings.Join(p, "."), err)
}

// SetAddresses writes the addresses on obj. For a kind whose address goes
// into status, that is vmipam's record of it; the controller fills the
// status fields (StatusPatch).
func (t Kind) SetAddresses(obj *unstructured.Unstructured, addrs []string) error {
	if t.Status != nil {
		SetAnnotation(obj, vmipamv1.AddressAnnotation, StampValue(addrs))
		return nil
	}
	p, k := t.location()
	var err error
	switch k {
	case locList:
		err = unstructured.SetNestedStringSlice(obj.Object, addrs, p...)
	case locString:
		err = unstructured.SetNestedField(obj.Object, strings.Join(addrs, ","), p...)
	default:
		err = unstructured.SetNestedField(obj.Object, t.Render(addrs), p...)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", t.AddressesPath(), err)
	}
	return nil
}

// Pool returns the pool obj names, if any.
func (t Kind) Pool(obj *unstructured.Unstructured) (string, error) {
	if t.PoolAnnotation != "" {
		return obj.GetAnnotations()[t.PoolAnnotation], nil
	}
	if len(t.PoolField) == 0 {
		return "", nil
	}
	v, _, err := unstructured.NestedString(obj.Object, t.PoolField...)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", t.PoolPath(), err)
	}
	return v, nil
}

// Stamp writes st on obj: what vmipam gave it: the addresses, the pool and the
// reservation token, the finalizer that makes deletion release it, and the
// holder label naming the replica that looks after it (none if empty).
func (t Kind) Stamp(obj *unstructured.Unstructured, st Stamp) error {
	if err := t.SetAddresses(obj, st.Addrs); err != nil {
		return err
	}
	if err := t.SetNetwork(obj, st.Network); err != nil {
		return err
	}
	pool, token, holder := st.Pool, st.Token, st.Holder
	if holder != "" {
		SetHolder(obj, holder)
	}
	SetAnnotation(obj, vmipamv1.PoolAnnotation, pool)
	SetAnnotation(obj, vmipamv1.TokenAnnotation, token)
	SetAnnotation(obj, vmipamv1.AddressAnnotation, StampValue(st.Addrs))
	if st.SingleStack != "" {
		SetAnnotation(obj, vmipamv1.SingleStackAnnotation, st.SingleStack)
	}
	controllerutil.AddFinalizer(obj, vmipamv1.Finalizer)
	return nil
}

// SetNetwork writes the network identity n on obj, where the kind takes
// it; a nil n, or a kind that takes none, writes nothing.
func (t Kind) SetNetwork(obj *unstructured.Unstructured, n *vmipamv1.Network) error {
	p, ann := t.networkLocation()
	if n == nil || p == nil {
		return nil
	}
	v, err := t.networkValue(n)
	if err != nil {
		return err
	}
	if !ann {
		var m map[string]any
		if err := json.Unmarshal(v.(json.RawMessage), &m); err != nil {
			return fmt.Errorf("write %s: %w", t.NetworkPath(), err)
		}
		v = m
	}
	if err := unstructured.SetNestedField(obj.Object, v, p...); err != nil {
		return fmt.Errorf("write %s: %w", t.NetworkPath(), err)
	}
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

// StatusFill returns the status fields a kind whose address goes into
// status must hold for addr in subnet prefix, as a merge patch of the
// status subresource, or nil when obj holds them already.
func (t Kind) StatusFill(obj *unstructured.Unstructured, addr netip.Addr, prefix netip.Prefix) map[string]any {
	if t.Status == nil {
		return nil
	}
	want := map[string]string{strings.Join(t.Status.Address, "."): addr.String()}
	if len(t.Status.Mask) > 0 && prefix.IsValid() {
		want[strings.Join(t.Status.Mask, ".")] = FormatMask(prefix, t.Status.MaskFormat)
	}
	patch := map[string]any{}
	for path, v := range want {
		p := strings.Split(path, ".")
		if cur, _, _ := unstructured.NestedString(obj.Object, p...); cur == v {
			continue
		}
		_ = unstructured.SetNestedField(patch, v, p...)
	}
	if len(patch) == 0 {
		return nil
	}
	return patch
}

// FormatMask writes the mask of prefix: 255.255.255.0 or 24. An IPv6
// prefix has no dotted form and gets its length.
func FormatMask(prefix netip.Prefix, f MaskFormat) string {
	if f == MaskDotted && prefix.Addr().Is4() {
		m := net.CIDRMask(prefix.Bits(), 32)
		return net.IP(m).String()
	}
	return strconv.Itoa(prefix.Bits())
}
