package kinds

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	"k8s.io/apimachinery/pkg/util/validation/field"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/lib/jsonscan"
)

// maxAddressItems bounds the address list decoded from a request: a
// longer one is refused before any of it is decoded.
const maxAddressItems = 16

// View is what vmipam reads of an object in an admission request: its
// identity, vmipam's annotations and finalizer, the addresses and the pool
// it names. It is read from the request's raw JSON without decoding the
// rest, so an object's size costs a scan, never memory: a VirtualMachine
// whose status holds a quarter of a million conditions is read in one pass
// that decodes none of them.
type View struct {
	APIVersion, Kind                   string
	Name, GenerateName, Namespace, UID string
	Token, StampedPool, StampedAddress string
	// Holder is the value of vmipam's holder label.
	Holder       string
	HasToken     bool
	HasFinalizer bool
	Addresses    []string
	Pool         string
	// FamilyPolicy and Families are what the object asks of the address
	// families (see Kind.FamilyPolicyField), empty when it says nothing.
	FamilyPolicy                         string
	Families                             []string
	hasMetadata, hasAnnotations, hasFins bool
	hasLabels                            bool
	addrPresent                          bool
	// rawAddress is the address location's value, when it holds a string.
	rawAddress string
	// addrDepth counts the leading elements of the address location
	// present as objects, for the patch that adds it; netDepth, those of
	// the network location.
	addrDepth, netDepth int
}

// Path indexes into View's extraction list.
const (
	pAPIVersion = iota
	pKind
	pMetadata
	pName
	pGenerateName
	pNamespace
	pUID
	pAnnotations
	pToken
	pStampedPool
	pStampedAddress
	pFinalizers
	pLabels
	pHolder
	pAddress
	pPool
	pFamilyPolicy
	pFamilies
	pFixed // the prefixes of the address location follow, then the network location's
)

// Read reads the View of the object raw, which must be valid JSON (the
// admission server checks it). A field of the wrong type is a
// *field.Error naming it; anything else that is not an object is a plain
// error.
func (t Kind) Read(raw []byte) (*View, error) {
	if jsonscan.KindOf(raw) != jsonscan.KindObject {
		return nil, errors.New("the object is not a JSON object")
	}
	loc, kind := t.location()
	paths := [][]string{
		pAPIVersion: {"apiVersion"}, pKind: {"kind"}, pMetadata: {"metadata"},
		pName: {"metadata", "name"}, pGenerateName: {"metadata", "generateName"},
		pNamespace: {"metadata", "namespace"}, pUID: {"metadata", "uid"},
		pAnnotations:    {"metadata", "annotations"},
		pToken:          {"metadata", "annotations", vmipamv1.TokenAnnotation},
		pStampedPool:    {"metadata", "annotations", vmipamv1.PoolAnnotation},
		pStampedAddress: {"metadata", "annotations", vmipamv1.AddressAnnotation},
		pFinalizers:     {"metadata", "finalizers"},
		pLabels:         {"metadata", "labels"},
		pHolder:         {"metadata", "labels", vmipamv1.HolderLabel},
		pAddress:        loc,
		pPool:           t.poolLocation(),
		pFamilyPolicy:   t.FamilyPolicyField,
		pFamilies:       t.FamiliesField,
	}
	for i := 1; i < len(loc); i++ {
		paths = append(paths, loc[:i])
	}
	nloc, _ := t.networkLocation()
	pNet := len(paths)
	for i := 1; i < len(nloc); i++ {
		paths = append(paths, nloc[:i])
	}
	vals := jsonscan.Extract(raw, paths...)
	v := &View{}
	var errs []error
	str := func(i int, p *field.Path, dst *string) bool {
		if vals[i] == nil || jsonscan.KindOf(vals[i]) == jsonscan.KindNull {
			return false
		}
		s, err := jsonscan.String(vals[i])
		if err != nil {
			errs = append(errs, field.Invalid(p, nil, "must be a string"))
			return false
		}
		*dst = s
		return true
	}
	meta := field.NewPath("metadata")
	str(pAPIVersion, field.NewPath("apiVersion"), &v.APIVersion)
	str(pKind, field.NewPath("kind"), &v.Kind)
	v.hasMetadata = isObject(vals[pMetadata])
	if vals[pMetadata] != nil && !v.hasMetadata && jsonscan.KindOf(vals[pMetadata]) != jsonscan.KindNull {
		errs = append(errs, field.Invalid(meta, nil, "must be an object"))
	}
	str(pName, meta.Child("name"), &v.Name)
	str(pGenerateName, meta.Child("generateName"), &v.GenerateName)
	str(pNamespace, meta.Child("namespace"), &v.Namespace)
	str(pUID, meta.Child("uid"), &v.UID)
	v.hasAnnotations = isObject(vals[pAnnotations])
	annPath := meta.Child("annotations")
	v.HasToken = str(pToken, annPath.Key(vmipamv1.TokenAnnotation), &v.Token)
	str(pStampedPool, annPath.Key(vmipamv1.PoolAnnotation), &v.StampedPool)
	str(pStampedAddress, annPath.Key(vmipamv1.AddressAnnotation), &v.StampedAddress)
	v.hasLabels = isObject(vals[pLabels])
	str(pHolder, meta.Child("labels").Key(vmipamv1.HolderLabel), &v.Holder)
	if f := vals[pFinalizers]; f != nil && jsonscan.KindOf(f) != jsonscan.KindNull {
		v.hasFins = true
		err := jsonscan.Each(f, func(_ int, elem []byte) bool {
			if s, err := jsonscan.String(elem); err == nil && s == vmipamv1.Finalizer {
				v.HasFinalizer = true
				return false
			}
			return true
		})
		if err != nil {
			errs = append(errs, field.Invalid(meta.Child("finalizers"), nil, "must be a list of strings"))
		}
	}
	shared := 0 // parents of the network location that the address location's checks cover
	if !t.onMetadata() {
		v.addrDepth = depth(loc, vals[pFixed:], 0, &errs)
		shared = commonPrefix(loc[:len(loc)-1], nloc[:max(len(nloc)-1, 0)])
	}
	if len(nloc) > 0 && !t.networkOnMetadata() {
		v.netDepth = depth(nloc, vals[pNet:], shared, &errs)
	}
	addrsPath := field.NewPath(t.AddressesPath())
	switch a := vals[pAddress]; {
	case a == nil || jsonscan.KindOf(a) == jsonscan.KindNull:
	case kind == locList:
		v.addrPresent = true
		addrs, err := jsonscan.Strings(a, maxAddressItems)
		if err != nil {
			errs = append(errs, field.Invalid(addrsPath, nil,
				fmt.Sprintf(`must be a list holding one IP address, for example ["10.0.0.5"], or be left out to be given one (%v)`, err)))
		}
		v.Addresses = addrs
	default:
		s, err := jsonscan.String(a)
		if err != nil {
			errs = append(errs, field.Invalid(addrsPath, nil, "must be a string"))
			break
		}
		v.addrPresent, v.rawAddress = true, s
		addrs, err := t.parse(s)
		if err != nil {
			errs = append(errs, field.Invalid(addrsPath, s, err.Error()+"; or leave it out to be given an address"))
		}
		v.Addresses = addrs
	}
	if p := t.poolLocation(); len(p) > 0 {
		str(pPool, field.NewPath(t.PoolPath()), &v.Pool)
	}
	if len(t.FamilyPolicyField) > 0 {
		str(pFamilyPolicy, field.NewPath(strings.Join(t.FamilyPolicyField, ".")), &v.FamilyPolicy)
	}
	if f := vals[pFamilies]; len(t.FamiliesField) > 0 && f != nil && jsonscan.KindOf(f) != jsonscan.KindNull {
		fams, err := jsonscan.Strings(f, 2)
		if err != nil {
			errs = append(errs, field.Invalid(field.NewPath(strings.Join(t.FamiliesField, ".")), nil,
				fmt.Sprintf("must be a list of at most two families, such as [IPv4, IPv6] (%v)", err)))
		}
		v.Families = fams
	}
	if len(errs) > 0 {
		return v, errors.Join(errs...)
	}
	return v, nil
}

// depth counts the leading elements of the parents of loc that are
// objects, given the values of loc[:1], loc[:2] and so on; a parent
// present as anything else, beyond the first checked ones, is an error in
// errs: a patch would replace it.
func depth(loc []string, vals [][]byte, checked int, errs *[]error) int {
	for i := 1; i < len(loc); i++ {
		pv := vals[i-1]
		if !isObject(pv) {
			if i > checked && pv != nil && jsonscan.KindOf(pv) != jsonscan.KindNull {
				*errs = append(*errs, field.Invalid(field.NewPath(loc[0], loc[1:i]...), nil, "must be an object"))
			}
			return i - 1
		}
	}
	return len(loc) - 1
}

// poolLocation is the path Read extracts the pool from, if any.
func (t Kind) poolLocation() []string {
	if t.PoolAnnotation != "" {
		return []string{"metadata", "annotations", t.PoolAnnotation}
	}
	return t.PoolField
}

func isObject(raw []byte) bool { return jsonscan.KindOf(raw) == jsonscan.KindObject }

// Describe names the object for logs and messages, even without a name:
// namespace/name, or namespace/generateName* before the name is known.
func (v *View) Describe() string {
	name := v.Name
	if name == "" {
		name = v.GenerateName + "*"
	}
	if v.Namespace == "" {
		return name
	}
	return v.Namespace + "/" + name
}

// Stamp is what vmipam writes on an object it gives addresses to.
type Stamp struct {
	// Addrs are the addresses, the primary family's first.
	Addrs []string
	// Pool and Token are the pool and the reservation token; Holder names
	// the replica that looks after the object (no label when empty).
	Pool, Token, Holder string
	// Network is the addresses' network identity, where the kind takes
	// one (none when nil).
	Network *vmipamv1.Network
	// SingleStack, if set, says why an object that preferred both
	// families got one (vmipamv1.SingleStackAnnotation).
	SingleStack string
}

// StampPatch returns the JSON patch (RFC 6902) that writes st on the
// object v was read from: the addresses (in their field and as vmipam's
// address annotation), their network identity, the pool and the
// reservation token, vmipam's finalizer, and the holder label. It is built
// from v alone: the object is never copied or re-encoded.
func (t Kind) StampPatch(v *View, st Stamp) ([]jsonpatch.Operation, error) {
	addrs, holder, n := st.Addrs, st.Holder, st.Network
	set := map[string]string{vmipamv1.PoolAnnotation: st.Pool, vmipamv1.TokenAnnotation: st.Token, vmipamv1.AddressAnnotation: StampValue(addrs)}
	if st.SingleStack != "" {
		set[vmipamv1.SingleStackAnnotation] = st.SingleStack
	}
	want := t.Render(addrs)
	if t.onMetadata() && t.Status == nil {
		set[t.AddressAnnotation] = want
	}
	nloc, _ := t.networkLocation()
	var nv any
	if n != nil && nloc != nil {
		var err error
		if nv, err = t.networkValue(n); err != nil {
			return nil, err
		}
		if t.networkOnMetadata() {
			set[t.NetworkAnnotation] = nv.(string)
			nloc = nil
		}
	}
	ops := t.metadataOps(v, set, false)
	if holder != "" && v.Holder != holder {
		ops = append(ops, holderOp(v, holder))
	}
	// The parents of the address location that exist once the address is
	// written, for the network's patch.
	loc, _ := t.location()
	made := v.addrDepth
	if v.addrPresent {
		made = len(loc) - 1
	}
	if t.Status == nil && !t.onMetadata() {
		if op, ok := t.addressOpFor(v, addrs); ok {
			ops = append(ops, op)
			made = len(loc) - 1
		}
	} else {
		made = 2 // metadata.annotations: metadataOps made them
	}
	if nv != nil && nloc != nil {
		d := max(v.netDepth, min(made, commonPrefix(loc[:len(loc)-1], nloc[:len(nloc)-1])))
		ops = append(ops, addOp(nloc, d, nv))
	}
	return ops, nil
}

// commonPrefix is the length of the common prefix of a and b.
func commonPrefix(a, b []string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// DryRunPatch returns the patch a dry run gets: the pool it would draw
// from and the finalizer, and no token or address annotation (a dry run
// reserves nothing). A static request, if valid, is written as the stamp
// would write it (without the prefix length it may have been given), so
// that the dry run passes the same validation as the create.
func (t Kind) DryRunPatch(v *View, pool string, statics []netip.Addr) []jsonpatch.Operation {
	set := map[string]string{vmipamv1.PoolAnnotation: pool}
	addrs := make([]string, len(statics))
	for i, a := range statics {
		addrs[i] = a.String()
	}
	if len(addrs) > 0 && t.Status == nil && t.onMetadata() {
		set[t.AddressAnnotation] = t.Render(addrs)
	}
	ops := t.metadataOps(v, set, true)
	if len(addrs) > 0 && t.Status == nil && !t.onMetadata() {
		if op, ok := t.addressOpFor(v, addrs); ok {
			ops = append(ops, op)
		}
	}
	return ops
}

// addressOpFor returns the operation that writes addrs in the address
// location of a kind whose address goes into a field or an annotation
// not of its own metadata, and false when the location holds it already.
func (t Kind) addressOpFor(v *View, addrs []string) (jsonpatch.Operation, bool) {
	_, kind := t.location()
	want := t.Render(addrs)
	var value any = want
	if kind == locList {
		value = addrs
	}
	if v.addrPresent && (kind == locList && slices.Equal(v.Addresses, addrs) || kind != locList && v.rawAddress == want) {
		return jsonpatch.Operation{}, false
	}
	return t.addressOp(v, value), true
}

// FinalizerPatch returns the patch that adds vmipam's finalizer, if the
// object lacks it.
func (t Kind) FinalizerPatch(v *View) []jsonpatch.Operation {
	return t.metadataOps(v, nil, false)
}

// holderOp sets the holder label, creating the labels on its way. It
// follows metadataOps, which creates the metadata when it is missing.
func holderOp(v *View, holder string) jsonpatch.Operation {
	if !v.hasLabels {
		return jsonpatch.NewOperation("add", "/metadata/labels", map[string]string{vmipamv1.HolderLabel: holder})
	}
	return jsonpatch.NewOperation("add", "/metadata/labels/"+EscapePointer(vmipamv1.HolderLabel), holder)
}

func (t Kind) metadataOps(v *View, set map[string]string, dropToken bool) []jsonpatch.Operation {
	var ops []jsonpatch.Operation
	if !v.hasMetadata {
		md := map[string]any{}
		if len(set) > 0 {
			md["annotations"] = set
		}
		if !v.HasFinalizer {
			md["finalizers"] = []string{vmipamv1.Finalizer}
		}
		if len(md) == 0 {
			return nil
		}
		return append(ops, jsonpatch.NewOperation("add", "/metadata", md))
	}
	if len(set) > 0 && !v.hasAnnotations {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/annotations", set))
	} else {
		for _, k := range slices.Sorted(maps.Keys(set)) {
			if k == vmipamv1.TokenAnnotation && v.HasToken && v.Token == set[k] ||
				k == vmipamv1.PoolAnnotation && v.StampedPool == set[k] ||
				k == vmipamv1.AddressAnnotation && v.StampedAddress == set[k] ||
				k == t.AddressAnnotation && k != "" && v.addrPresent && v.rawAddress == set[k] {
				continue
			}
			ops = append(ops, jsonpatch.NewOperation("add", "/metadata/annotations/"+EscapePointer(k), set[k]))
		}
	}
	if dropToken && v.HasToken {
		ops = append(ops, jsonpatch.NewOperation("remove", "/metadata/annotations/"+EscapePointer(vmipamv1.TokenAnnotation), nil))
	}
	if dropToken && v.StampedAddress != "" {
		ops = append(ops, jsonpatch.NewOperation("remove", "/metadata/annotations/"+EscapePointer(vmipamv1.AddressAnnotation), nil))
	}
	if !v.HasFinalizer {
		if v.hasFins {
			ops = append(ops, jsonpatch.NewOperation("add", "/metadata/finalizers/-", vmipamv1.Finalizer))
		} else {
			ops = append(ops, jsonpatch.NewOperation("add", "/metadata/finalizers", []string{vmipamv1.Finalizer}))
		}
	}
	return ops
}

// addressOp sets the address location to value, creating the objects on
// its way.
func (t Kind) addressOp(v *View, value any) jsonpatch.Operation {
	f, _ := t.location()
	if v.addrPresent {
		return jsonpatch.NewOperation("replace", pointer(f), value)
	}
	return addOp(f, v.addrDepth, value)
}

// addOp sets the location f, of whose parents the first depth exist, to
// value, creating the others on its way; an "add" replaces a value there.
func addOp(f []string, depth int, value any) jsonpatch.Operation {
	for i := len(f) - 1; i > depth; i-- {
		value = map[string]any{f[i]: value}
	}
	return jsonpatch.NewOperation("add", pointer(f[:depth+1]), value)
}

func pointer(path []string) string {
	var b strings.Builder
	for _, p := range path {
		b.WriteByte('/')
		b.WriteString(EscapePointer(p))
	}
	return b.String()
}

// pointerEscaper escapes a key for a JSON pointer (RFC 6901).
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// EscapePointer escapes a key for a JSON pointer (RFC 6901).
func EscapePointer(k string) string {
	if !strings.ContainsAny(k, "~/") {
		return k
	}
	return pointerEscaper.Replace(k)
}
