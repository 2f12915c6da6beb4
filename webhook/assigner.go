package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
)

// Paths the webhooks serve on; the manifests in deploy/ point at them.
const (
	// AssignerPath serves Assigner.
	AssignerPath = "/mutate-vmipam-io-v1alpha1-virtualmachine"
	// StampGuardPath serves StampGuard.
	StampGuardPath = "/validate-vmipam-io-v1alpha1-virtualmachine"
	// IPPoolValidatorPath serves IPPoolValidator.
	IPPoolValidatorPath = "/validate-vmipam-io-v1alpha1-ippool"
)

// MutatePath is the path the mutating webhook of kind t serves on:
// AssignerPath for vmipam's own kind, and after the same pattern for the
// others (/mutate-vm-neon-tech-v1-virtualmachine).
func MutatePath(t kinds.Kind) string { return "/mutate-" + t.PathName() }

// Assigner gives an object its address on CREATE: it picks the pool,
// reserves an address under a fresh token (the object has no UID yet, and
// no name with generateName), and stamps the address, the pool, the token
// and the releasing finalizer.
//
// The API server calls it once per admission (reinvocationPolicy: Never),
// and any replica may answer: a token already on the object was copied
// from another object and is replaced, never trusted.
type Assigner struct {
	Registry *pools.Registry
	Kind     kinds.Kind
	// Names, if set, tells whether the informer cache of the kind
	// holds an object of a name: a create whose name is already taken
	// there is refused before it reserves anything, since the API server
	// would refuse it after admission.
	Names pools.Names
}

var _ admission.Handler = (*Assigner)(nil)

// Handle implements admission.Handler.
func (d *Assigner) Handle(ctx context.Context, req admission.Request) admission.Response {
	if resp, ok := serves(req, d.Kind, "mutating"); !ok {
		return resp
	}
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	v, resp, ok := readObject(d.Kind, req, req.Object.Raw)
	if !ok {
		return resp
	}
	// Values go on each line, not WithValues: that costs an encoding per
	// request, and these lines are rare.
	invalid := func(errs ...*field.Error) admission.Response { return deny(invalidErr(d.Kind, v, errs)) }

	if n := d.Kind.MaxAddresses(); len(v.Addresses) > n {
		return invalid(field.TooMany(field.NewPath(d.Kind.AddressesPath()), len(v.Addresses), n))
	}
	statics := make([]pools.Static, 0, len(v.Addresses))
	for i, raw := range v.Addresses {
		path := d.addrPath(i)
		a, bits, ferr := parseRequest(path, raw)
		if ferr != nil {
			return invalid(ferr)
		}
		for _, o := range statics {
			if pools.FamilyOf(o.Addr) == pools.FamilyOf(a) {
				return invalid(field.Invalid(path, raw, fmt.Sprintf("a second %s address (with %s): an object holds one address per family", pools.FamilyOf(a), o.Raw)))
			}
		}
		statics = append(statics, pools.Static{Addr: a, Bits: bits, Raw: raw, Path: path})
	}
	create := pools.Create{
		Kind: d.Kind, Namespace: v.Namespace, Name: v.Name, Pool: v.Pool, Ref: v.Describe(),
		Ask:    pools.Ask{Policy: v.FamilyPolicy, Families: v.Families, Statics: statics},
		DryRun: req.DryRun != nil && *req.DryRun, Names: d.Names,
	}
	ad, err := d.Registry.Admit(ctx, create)
	if err != nil {
		return d.refused(ctx, err, v)
	}
	if create.DryRun {
		// Stamp nothing that a real create would reserve.
		return patched(d.Kind.DryRunPatch(v, ad.Pool.Name(), ad.Addrs))
	}
	note := ad.Plan.Note
	if ad.Skipped != nil {
		note = fmt.Sprintf("no %s address: %s", ad.Skipped.Family, ipam.Message(ad.Skipped.Err))
	}
	out := make([]string, len(ad.Addrs))
	for i, a := range ad.Addrs {
		out[i] = a.String()
	}
	ops, err := d.Kind.StampPatch(v, kinds.Stamp{Addrs: out, Pool: ad.Pool.Name(), Token: ad.Token, Holder: d.Registry.HolderLabel(),
		Network: ad.Pool.Network(ad.Addrs...), SingleStack: note})
	if err != nil {
		ad.Pool.Cancel(ad.Token)
		return admission.Errored(http.StatusInternalServerError, err)
	}
	resp = patched(ops)
	if note != "" {
		resp.Warnings = append(resp.Warnings, fmt.Sprintf("%s %s gets one address family (PreferDualStack): %s", d.Kind.GVK.Kind, v.Describe(), note))
	}
	return resp
}

// addrPath is how the i-th address is named in messages.
func (d *Assigner) addrPath(i int) *field.Path {
	if i == 0 {
		return field.NewPath(d.Kind.AddressPath())
	}
	return field.NewPath(d.Kind.AddressesPath()).Index(i)
}

// refused is the answer to a create that Admit refused with err.
func (d *Assigner) refused(ctx context.Context, err error, v *kinds.View) admission.Response {
	var ferr *pools.FieldError
	var fe *pools.FamilyError
	switch {
	case errors.As(err, &ferr):
		return deny(invalidErr(d.Kind, v, ferr.Errs))
	case errors.Is(err, pools.ErrNotReady):
		return deny(apierrors.NewServiceUnavailable(err.Error() + "; retry in a few seconds"))
	case errors.Is(err, pools.ErrNotAllowed):
		return deny(apierrors.NewForbidden(gr(d.Kind), name(v), err))
	case errors.Is(err, pools.ErrNameTaken):
		// The API server would refuse it after admission, and an address
		// reserved for it would only wait out its pending TTL. The cache
		// holds this replica's objects and the unlabelled ones, not other
		// replicas' (see vmipamv1.HolderLabel); a reservation for a name
		// one of those holds is returned by the proof that it was never
		// stored.
		return deny(apierrors.NewAlreadyExists(gr(d.Kind), v.Name))
	case errors.As(err, &fe):
		return d.unassigned(ctx, fe, v)
	default:
		return admission.Errored(http.StatusInternalServerError, err)
	}
}

// unassigned is the answer to a create whose address of family fe.Family
// (a static request fe.Static, or nil) could not be had.
func (d *Assigner) unassigned(ctx context.Context, fe *pools.FamilyError, v *kinds.View) admission.Response {
	err, st, f, pool := fe.Err, fe.Static, fe.Family, fe.Pool
	switch {
	case errors.Is(err, ipam.ErrNotReady):
		return deny(apierrors.NewServiceUnavailable(fmt.Sprintf("IPPool %s is recovering its state; retry in a few seconds", pool)))
	case errors.Is(err, ipam.ErrExhausted):
		return deny(apierrors.NewForbidden(gr(d.Kind), name(v), errors.New(ipam.Message(err))))
	case errors.Is(err, ipam.ErrNoAnswer) && st != nil:
		// The address may well be free with its replica: a retry asks again.
		return deny(apierrors.NewServiceUnavailable(fmt.Sprintf("%s: %s", st.Path, ipam.Message(err))))
	case errors.Is(err, ipam.ErrTooManyPending):
		return deny(apierrors.NewTooManyRequests(ipam.Message(err), 5))
	case st != nil && (errors.Is(err, ipam.ErrInUse) || errors.Is(err, ipam.ErrCoolingDown) || errors.Is(err, ipam.ErrConflict) || errors.Is(err, ipam.ErrOutOfRange)):
		return deny(invalidErr(d.Kind, v, field.ErrorList{field.Invalid(st.Path, st.Raw, ipam.Message(err))}))
	case ctx.Err() != nil:
		return deny(apierrors.NewTimeoutError(fmt.Sprintf("vmipam could not claim an address of IPPool %s before the request's deadline", pool), 1))
	default:
		logf.FromContext(ctx).Error(err, "Allocating address", "object", v.Describe(), "pool", pool, "family", f)
		return admission.Errored(http.StatusInternalServerError, err)
	}
}

// StampGuard keeps what vmipam stamped immutable: the address, the pool,
// the token and the address annotation cannot change once set, and an
// address can only appear on an existing object when vmipam stamped it. On
// CREATE it checks that the address is still the one vmipam stamped: no
// later mutating webhook changed it. It holds no state, so any replica
// answers for any other's admissions.
//
// The manifests no longer register it: the same checks run in the API
// server, as the ValidatingAdmissionPolicy `vmipam manifests` renders for
// each kind (kinds.Kind.PolicyRules), so a VM's create costs one webhook
// call and its updates none. It keeps serving StampGuardPath for an upgrade
// from a version whose ValidatingWebhookConfiguration still calls it.
type StampGuard struct {
	Kind kinds.Kind
}

var _ admission.Handler = (*StampGuard)(nil)

// Handle implements admission.Handler.
func (v *StampGuard) Handle(_ context.Context, req admission.Request) admission.Response {
	if resp, ok := serves(req, v.Kind, "validating"); !ok {
		return resp
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	obj, resp, ok := readObject(v.Kind, req, req.Object.Raw)
	if !ok {
		return resp
	}
	addrPath := field.NewPath(v.Kind.AddressPath())
	ann := field.NewPath("metadata", "annotations")
	var errs field.ErrorList
	switch req.Operation {
	case admissionv1.Create:
		if req.DryRun != nil && *req.DryRun || !obj.HasToken {
			return admission.Allowed("")
		}
		// The address must still be the one vmipam stamped: a later
		// mutating webhook must not have changed or removed it.
		switch {
		case obj.StampedAddress == "":
			errs = append(errs, field.Required(ann.Key(vmipamv1.AddressAnnotation),
				"vmipam stamps the address it reserved here with the token; a later mutating webhook removed it"))
		case len(obj.Addresses) != 1 || obj.Addresses[0] != obj.StampedAddress:
			errs = append(errs, field.Invalid(addrPath, strings.Join(obj.Addresses, ","), fmt.Sprintf(
				"differs from the address vmipam reserved for this object (%s): another mutating webhook changed it; vmipam's address cannot be overridden",
				obj.StampedAddress)))
		}
	case admissionv1.Update:
		old, resp, ok := readObject(v.Kind, req, req.OldObject.Raw)
		if !ok {
			return resp
		}
		switch {
		case len(old.Addresses) > 0 && !slices.Equal(old.Addresses, obj.Addresses):
			errs = append(errs, field.Forbidden(addrPath,
				fmt.Sprintf("is immutable once assigned (was %v); delete and recreate the object to get another address", old.Addresses)))
		case len(old.Addresses) == 0 && len(obj.Addresses) > 0 && (obj.StampedAddress == "" || obj.Addresses[0] != obj.StampedAddress ||
			obj.StampedAddress == old.StampedAddress):
			// Only vmipam's controller adds an address after the create
			// (to an object that bypassed the webhook), stamping it anew.
			errs = append(errs, field.Forbidden(addrPath,
				"addresses are assigned by vmipam when the object is created; to ask for a specific one, delete and recreate the object with it"))
		}
		for _, f := range []struct{ key, was, now string }{
			{vmipamv1.TokenAnnotation, old.Token, obj.Token},
			{vmipamv1.PoolAnnotation, old.StampedPool, obj.StampedPool},
			{vmipamv1.AddressAnnotation, old.StampedAddress, obj.StampedAddress},
		} {
			if f.was != "" && f.was != f.now {
				errs = append(errs, field.Forbidden(ann.Key(f.key), fmt.Sprintf("is immutable once set by vmipam (was %q)", f.was)))
			}
		}
	}
	if len(errs) > 0 {
		return deny(invalidErr(v.Kind, obj, errs))
	}
	return admission.Allowed("")
}

// serves refuses, without any side effect, a review of a kind, resource or
// subresource the webhook does not serve: a misrouted or forged request.
func serves(req admission.Request, t kinds.Kind, which string) (admission.Response, bool) {
	gvk := t.GVK
	if req.Kind.Group == gvk.Group && req.Kind.Version == gvk.Version && req.Kind.Kind == gvk.Kind &&
		req.Resource.Group == gvk.Group && req.Resource.Version == gvk.Version && req.Resource.Resource == t.Resource &&
		req.SubResource == "" {
		return admission.Response{}, true
	}
	return admission.Errored(http.StatusBadRequest, fmt.Errorf(
		"vmipam's %s webhook serves %s.%s/%s (kind %s), not %s.%s/%s%s (kind %s): check the webhook configuration's rules",
		which, t.Resource, gvk.Group, gvk.Version, gvk.Kind,
		req.Resource.Resource, req.Resource.Group, req.Resource.Version, subresource(req.SubResource), req.Kind.Kind)), false
}

func subresource(s string) string {
	if s == "" {
		return ""
	}
	return "/" + s
}

// readObject reads the View of raw, refusing what no API server would
// send: not an object, another kind, another namespace than the request's.
func readObject(t kinds.Kind, req admission.Request, raw []byte) (*kinds.View, admission.Response, bool) {
	if len(raw) == 0 {
		return nil, admission.Errored(http.StatusBadRequest, fmt.Errorf("the request carries no %s", t.GVK.Kind)), false
	}
	v, err := t.Read(raw)
	if err != nil {
		var fe *field.Error
		if v != nil && errors.As(err, &fe) {
			var errs field.ErrorList
			for _, e := range unjoin(err) {
				if errors.As(e, &fe) {
					errs = append(errs, fe)
				}
			}
			return nil, deny(invalidErr(t, v, errs)), false
		}
		return nil, admission.Errored(http.StatusBadRequest, fmt.Errorf("decode %s: %w", t.GVK.Kind, err)), false
	}
	if v.APIVersion != t.GVK.GroupVersion().String() || v.Kind != t.GVK.Kind {
		return nil, admission.Errored(http.StatusBadRequest, fmt.Errorf("the object is a %q %q, not a %s %s",
			v.APIVersion, v.Kind, t.GVK.GroupVersion(), t.GVK.Kind)), false
	}
	switch {
	case v.Namespace == "":
		v.Namespace = req.Namespace
	case req.Namespace != "" && v.Namespace != req.Namespace:
		return nil, admission.Errored(http.StatusBadRequest, fmt.Errorf("the object's namespace %q differs from the request's %q", v.Namespace, req.Namespace)), false
	}
	if v.Name == "" {
		v.Name = req.Name
	}
	return v, admission.Response{}, true
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// parseRequest parses the address a user asks for, alone (10.0.0.5) or
// in interface notation with its prefix length (10.0.0.5/24), and refuses
// any spelling but the canonical one, giving it: ::ffff:10.0.0.5 and
// 10.0.0.5 are one address, and vmipam compares one spelling only. bits
// is the prefix length given, or -1.
func parseRequest(path *field.Path, s string) (a netip.Addr, bits int, ferr *field.Error) {
	bits = -1
	host := s
	if h, l, ok := strings.Cut(s, "/"); ok {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Addr{}, -1, field.Invalid(path, s, "not an IP address, or an address with its prefix length such as 10.0.0.5/24; leave the field empty to be given one")
		}
		host, bits = h, p.Bits()
		if c := ipam.Canonical(p.Addr()); c.Is4() && p.Addr().Is4In6() {
			// ::ffff:10.0.0.5/120 is 10.0.0.5/24.
			return netip.Addr{}, -1, field.Invalid(path, s, fmt.Sprintf(
				"not in canonical form: this is the IPv4-mapped IPv6 form of an IPv4 address; write it as %s", netip.PrefixFrom(c, max(bits-96, 0))))
		}
		if l != strconv.Itoa(bits) {
			return netip.Addr{}, -1, field.Invalid(path, s, fmt.Sprintf("not in canonical form: write it as %s", p))
		}
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, -1, field.Invalid(path, s, "not an IP address; leave the field empty to be given one")
	}
	if c := ipam.Canonical(a); c.String() != host {
		why := "write it as"
		switch {
		case a.Is4In6():
			why = "this is the IPv4-mapped IPv6 form of an IPv4 address; write it as"
		case a.Zone() != "":
			why = "a zone has no meaning here; write"
		}
		return netip.Addr{}, -1, field.Invalid(path, s, fmt.Sprintf("not in canonical form: %s %s", why, c))
	}
	return a, bits, nil
}

// patched allows the request with the JSON patch ops, if any.
func patched(ops []jsonpatch.Operation) admission.Response {
	if len(ops) == 0 {
		return admission.Allowed("")
	}
	pt := admissionv1.PatchTypeJSONPatch
	return admission.Response{
		Patches:           ops,
		AdmissionResponse: admissionv1.AdmissionResponse{Allowed: true, PatchType: &pt},
	}
}

func name(v *kinds.View) string {
	if v.Name != "" {
		return v.Name
	}
	return v.GenerateName
}

func gr(t kinds.Kind) schema.GroupResource { return t.GVR().GroupResource() }

func invalidErr(t kinds.Kind, v *kinds.View, errs field.ErrorList) *apierrors.StatusError {
	return apierrors.NewInvalid(t.GVK.GroupKind(), name(v), errs)
}
