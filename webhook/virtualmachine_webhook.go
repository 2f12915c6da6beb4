package webhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/target"
)

// Paths the webhooks serve on; the manifests in deploy/ point at them.
const (
	// DefaulterPath serves VMDefaulter.
	DefaulterPath = "/mutate-vmipam-io-v1alpha1-virtualmachine"
	// ValidatorPath serves VMValidator.
	ValidatorPath = "/validate-vmipam-io-v1alpha1-virtualmachine"
	// IPPoolValidatorPath serves IPPoolValidator.
	IPPoolValidatorPath = "/validate-vmipam-io-v1alpha1-ippool"
)

// +kubebuilder:webhook:path=/mutate-vmipam-io-v1alpha1-virtualmachine,mutating=true,failurePolicy=fail,sideEffects=NoneOnDryRun,groups=vmipam.io,resources=virtualmachines,verbs=create,versions=v1alpha1,name=mvirtualmachine.vmipam.io,admissionReviewVersions=v1,timeoutSeconds=5,reinvocationPolicy=IfNeeded

// VMDefaulter gives an object its address on CREATE: it picks the pool,
// reserves an address under a fresh token (the object has no UID yet, and
// no name with generateName), and stamps the address, the pool, the token
// and the releasing finalizer.
type VMDefaulter struct {
	Registry *pools.Registry
	Target   target.Target
}

var _ admission.Handler = (*VMDefaulter)(nil)

// Handle implements admission.Handler.
func (d *VMDefaulter) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create {
		return admission.Allowed("")
	}
	obj := &unstructured.Unstructured{}
	if err := json.Unmarshal(req.Object.Raw, &obj.Object); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode %s: %w", d.Target.GVK.Kind, err))
	}
	if obj.Object == nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode %s: the object is null", d.Target.GVK.Kind))
	}
	// The object as it came, for the patch.
	orig := runtime.DeepCopyJSON(obj.Object)
	// Values go on each line, not WithValues: that costs an encoding per
	// request, and these lines are rare.
	log := logf.FromContext(ctx)
	addrPath := field.NewPath(d.Target.AddressPath())
	invalid := func(errs ...*field.Error) admission.Response { return deny(invalidErr(d.Target.GVK, obj, errs)) }

	addrs, err := d.Target.Addresses(obj)
	if err != nil {
		return invalid(field.Invalid(field.NewPath(d.Target.AddressesPath()), nil,
			`must be a list holding one IP address, for example ["10.0.0.5"], or be left out to be given one`))
	}
	if len(addrs) > 1 {
		return invalid(field.TooMany(field.NewPath(d.Target.AddressesPath()), len(addrs), 1))
	}
	pool, err := d.Registry.Select(ctx, obj)
	if errors.Is(err, pools.ErrNotReady) {
		return deny(apierrors.NewServiceUnavailable(err.Error() + "; retry in a few seconds"))
	}
	if err != nil {
		return invalid(field.Invalid(field.NewPath(d.Target.PoolPath()), poolValue(d.Target, obj), err.Error()))
	}
	m := pool.Manager
	if !m.Ready() {
		return deny(apierrors.NewServiceUnavailable(fmt.Sprintf("IPPool %s is recovering its state; retry in a few seconds", pool.Name)))
	}
	ann := obj.GetAnnotations()
	var static netip.Addr
	if len(addrs) == 1 {
		if static, err = netip.ParseAddr(addrs[0]); err != nil {
			return invalid(field.Invalid(addrPath, addrs[0], "not an IP address; leave the field empty to be given one"))
		}
		// Reinvoked in the same admission: our stamp is present and its
		// reservation still pending. Anything else in our annotations was
		// copied from another object and is not trusted.
		if tok := ann[vmipamv1.TokenAnnotation]; tok != "" && ann[vmipamv1.PoolAnnotation] == pool.Name {
			if st, o, _ := m.Lookup(static); st == ipam.StatePending && o.Token == tok {
				return patch(orig, obj, target.AddFinalizer(obj))
			}
		}
		if !m.Ranges().Contains(static) {
			return invalid(field.Invalid(addrPath, addrs[0],
				fmt.Sprintf("outside IPPool %s (usable: %s); ask for an address inside it, or leave the field empty", pool.Name, m.Ranges())))
		}
	}
	if req.DryRun != nil && *req.DryRun {
		// No side effect: say whether a static address could be had, stamp
		// nothing that a real create would reserve.
		if static.IsValid() {
			if st, o, until := m.Lookup(static); st == ipam.StatePending || st == ipam.StateAllocated || st == ipam.StateCooldown {
				reason := ipam.ErrInUse
				if st == ipam.StateCooldown {
					reason = ipam.ErrCoolingDown
				}
				return invalid(field.Invalid(addrPath, addrs[0], (&ipam.AddressError{Addr: static, Reason: reason, State: st, Owner: o, Until: until}).Error()))
			}
		}
		target.SetAnnotation(obj, vmipamv1.PoolAnnotation, pool.Name)
		target.RemoveAnnotation(obj, vmipamv1.TokenAnnotation)
		target.AddFinalizer(obj)
		return patch(orig, obj, true)
	}

	token, err := newToken()
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	a := static
	if static.IsValid() {
		log.V(1).Info("Reserving address", "object", describe(obj), "pool", pool.Name, "address", static)
		err = m.Reserve(ctx, token, static)
	} else {
		log.V(1).Info("Allocating address", "object", describe(obj), "pool", pool.Name)
		a, err = m.Allocate(ctx, token)
	}
	switch {
	case err == nil:
	case errors.Is(err, ipam.ErrNotReady):
		return deny(apierrors.NewServiceUnavailable(fmt.Sprintf("IPPool %s is recovering its state; retry in a few seconds", pool.Name)))
	case errors.Is(err, ipam.ErrExhausted):
		return deny(apierrors.NewForbidden(gr(d.Target.GVK), obj.GetName(), errors.New(unwrapMessage(err))))
	case errors.Is(err, ipam.ErrInUse), errors.Is(err, ipam.ErrCoolingDown), errors.Is(err, ipam.ErrConflict), errors.Is(err, ipam.ErrOutOfRange):
		return invalid(field.Invalid(addrPath, addrs[0], unwrapMessage(err)))
	default:
		log.Error(err, "Allocating address", "object", describe(obj), "pool", pool.Name)
		return admission.Errored(http.StatusInternalServerError, err)
	}
	if err := d.Target.Stamp(obj, a.String(), pool.Name, token); err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return patch(orig, obj, true)
}

// +kubebuilder:webhook:path=/validate-vmipam-io-v1alpha1-virtualmachine,mutating=false,failurePolicy=fail,sideEffects=None,groups=vmipam.io,resources=virtualmachines,verbs=create;update,versions=v1alpha1,name=vvirtualmachine.vmipam.io,admissionReviewVersions=v1,timeoutSeconds=5,patch=`{"matchConditions":[{"name":"guarded-fields-change","expression":"request.operation != 'UPDATE' || (has(object.spec) && has(object.spec.addresses) ? object.spec.addresses : []) != (has(oldObject.spec) && has(oldObject.spec.addresses) ? oldObject.spec.addresses : []) || (has(object.metadata.annotations) && 'vmipam.io/token' in object.metadata.annotations ? object.metadata.annotations['vmipam.io/token'] : '') != (has(oldObject.metadata.annotations) && 'vmipam.io/token' in oldObject.metadata.annotations ? oldObject.metadata.annotations['vmipam.io/token'] : '') || (has(object.metadata.annotations) && 'vmipam.io/pool' in object.metadata.annotations ? object.metadata.annotations['vmipam.io/pool'] : '') != (has(oldObject.metadata.annotations) && 'vmipam.io/pool' in oldObject.metadata.annotations ? oldObject.metadata.annotations['vmipam.io/pool'] : '')"}]}`

// VMValidator keeps what vmipam stamped immutable: the address, the pool
// and the token cannot change once set, and an address can only appear on
// an existing object when vmipam reserved it for that object.
//
// The API server calls it for every CREATE, but for an UPDATE only when the
// addresses, the token or the pool annotation change (the match condition
// in its marker): the other updates of a VM's life, the removal of its
// finalizer included, cost no webhook call and do not fail while vmipam is
// unreachable.
type VMValidator struct {
	Registry *pools.Registry
	Target   target.Target
}

var _ admission.Handler = (*VMValidator)(nil)

// Handle implements admission.Handler.
func (v *VMValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	obj := &unstructured.Unstructured{}
	if err := json.Unmarshal(req.Object.Raw, &obj.Object); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode %s: %w", v.Target.GVK.Kind, err))
	}
	addrPath := field.NewPath(v.Target.AddressPath())
	addrs, err := v.Target.Addresses(obj)
	if err != nil {
		return deny(invalidErr(v.Target.GVK, obj, field.ErrorList{field.Invalid(field.NewPath(v.Target.AddressesPath()), nil,
			`must be a list holding one IP address, for example ["10.0.0.5"]`)}))
	}
	ann := obj.GetAnnotations()
	var errs field.ErrorList
	switch req.Operation {
	case admissionv1.Create:
		if req.DryRun != nil && *req.DryRun || len(addrs) == 0 || ann[vmipamv1.TokenAnnotation] == "" {
			return admission.Allowed("")
		}
		// The address must still be the one vmipam reserved for this
		// object: a later mutating webhook must not have changed it.
		switch st := v.reservation(ctx, obj, addrs[0]); st {
		case reserved:
		case reservationUnknown:
			return deny(apierrors.NewServiceUnavailable("vmipam is still recovering its pools; retry in a few seconds"))
		case reservationLost:
			return deny(apierrors.NewServiceUnavailable(fmt.Sprintf(
				"vmipam no longer holds the reservation of %s for this object (it restarted during the admission, or the request outlived the pool's pendingTTL); retry the create", addrs[0])))
		default:
			errs = append(errs, field.Invalid(addrPath, addrs[0],
				"differs from the address vmipam reserved for this object: another mutating webhook changed it; vmipam's address cannot be overridden"))
		}
	case admissionv1.Update:
		old := &unstructured.Unstructured{}
		if err := json.Unmarshal(req.OldObject.Raw, &old.Object); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode old %s: %w", v.Target.GVK.Kind, err))
		}
		oldAddrs, _ := v.Target.Addresses(old)
		oldAnn := old.GetAnnotations()
		switch {
		case len(oldAddrs) > 0 && !equal(oldAddrs, addrs):
			errs = append(errs, field.Forbidden(addrPath,
				fmt.Sprintf("is immutable once assigned (was %v); delete and recreate the object to get another address", oldAddrs)))
		case len(oldAddrs) == 0 && len(addrs) > 0 && v.reservation(ctx, obj, addrs[0]) != reserved:
			errs = append(errs, field.Forbidden(addrPath,
				"addresses are assigned by vmipam when the object is created; to ask for a specific one, delete and recreate the object with it"))
		}
		for _, key := range []string{vmipamv1.TokenAnnotation, vmipamv1.PoolAnnotation} {
			if oldAnn[key] != "" && oldAnn[key] != ann[key] {
				errs = append(errs, field.Forbidden(field.NewPath("metadata", "annotations").Key(key),
					fmt.Sprintf("is immutable once set by vmipam (was %q)", oldAnn[key])))
			}
		}
	default:
		return admission.Allowed("")
	}
	if len(errs) > 0 {
		return deny(invalidErr(v.Target.GVK, obj, errs))
	}
	return admission.Allowed("")
}

type reservationState int

const (
	// reserved: the pool holds the address for this object.
	reserved reservationState = iota
	// reservationLost: nobody holds it; this object's reservation lapsed.
	reservationLost
	// reservedElsewhere: another object holds it, or it is not the pool's.
	reservedElsewhere
	// reservationUnknown: the pool is still recovering.
	reservationUnknown
)

// reservation says whether the pool stamped on obj holds addr pending for
// obj's token or allocated to its UID.
func (v *VMValidator) reservation(ctx context.Context, obj *unstructured.Unstructured, addr string) reservationState {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return reservedElsewhere
	}
	ann := obj.GetAnnotations()
	p := v.Registry.Get(ann[vmipamv1.PoolAnnotation])
	switch {
	case p == nil && v.Registry.Ready(ctx) != nil, p != nil && !p.Manager.Ready():
		return reservationUnknown
	case p == nil || !p.Manager.Ranges().Contains(a):
		return reservedElsewhere
	}
	st, o, _ := p.Manager.Lookup(a)
	switch {
	case st == ipam.StatePending && o.Token != "" && o.Token == ann[vmipamv1.TokenAnnotation],
		st == ipam.StateAllocated && o.UID != "" && o.UID == string(obj.GetUID()):
		return reserved
	case st == ipam.StatePending || st == ipam.StateAllocated:
		return reservedElsewhere
	}
	return reservationLost
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// newToken returns a fresh reservation token.
func newToken() (string, error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make reservation token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// patch allows the request with the JSON patch from orig, the object as it
// came, to obj as the handler left it.
func patch(orig map[string]any, obj *unstructured.Unstructured, changed bool) admission.Response {
	if !changed {
		return admission.Allowed("")
	}
	ops := diff(orig, obj.Object)
	if len(ops) == 0 {
		return admission.Allowed("")
	}
	pt := admissionv1.PatchTypeJSONPatch
	return admission.Response{
		Patches:           ops,
		AdmissionResponse: admissionv1.AdmissionResponse{Allowed: true, PatchType: &pt},
	}
}

func poolValue(t target.Target, obj *unstructured.Unstructured) string {
	p, _ := t.Pool(obj)
	return p
}

// describe names an object for logs and messages, even without a name.
func describe(obj *unstructured.Unstructured) string {
	name := obj.GetName()
	if name == "" {
		name = obj.GetGenerateName() + "*"
	}
	return obj.GetNamespace() + "/" + name
}

func gr(gvk schema.GroupVersionKind) schema.GroupResource {
	return schema.GroupResource{Group: gvk.Group, Resource: resourceOf(gvk.Kind)}
}

// resourceOf guesses the plural resource of a kind for messages.
func resourceOf(kind string) string {
	b := []byte(kind)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b) + "s"
}

func invalidErr(gvk schema.GroupVersionKind, obj *unstructured.Unstructured, errs field.ErrorList) *apierrors.StatusError {
	name := obj.GetName()
	if name == "" {
		name = obj.GetGenerateName()
	}
	return apierrors.NewInvalid(gvk.GroupKind(), name, errs)
}

// deny turns a StatusError into a denial that keeps its code and details,
// so kubectl prints the field and the reason.
func deny(err *apierrors.StatusError) admission.Response {
	st := err.Status()
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &st}}
}

// unwrapMessage drops the "allocate from pool ..." context that ipam puts
// before its user-facing explanation, which the message already names.
func unwrapMessage(err error) string {
	var ex *ipam.ExhaustedError
	if errors.As(err, &ex) {
		return ex.Error()
	}
	var ae *ipam.AddressError
	if errors.As(err, &ae) {
		return ae.Error()
	}
	return err.Error()
}
