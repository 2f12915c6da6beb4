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
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
)

// ippoolMinPendingTTL is the shortest spec.pendingTTL accepted.
const ippoolMinPendingTTL = 30 * time.Second

// ippoolMaxRemovedWarnings bounds the warnings about addresses leaving a
// pool: the API server truncates long lists of warnings anyway.
const ippoolMaxRemovedWarnings = 5

// ippoolGroupKind names IPPools in denial messages, as kubectl prints them:
// IPPool.vmipam.io "x" is invalid: ...
var ippoolGroupKind = schema.GroupKind{Group: vmipamv1.GroupVersion.Group, Kind: "IPPool"}

// +kubebuilder:webhook:path=/validate-vmipam-io-v1alpha1-ippool,mutating=false,failurePolicy=fail,sideEffects=None,groups=vmipam.io,resources=ippools,verbs=create;update,versions=v1alpha1,name=vippool.vmipam.io,admissionReviewVersions=v1,timeoutSeconds=5
// +kubebuilder:rbac:groups=vmipam.io,resources=ippools,verbs=get;list;watch

// IPPoolValidator admits IPPool creates and updates whose ranges parse,
// share no address with another pool, and whose tuning is sane; it warns
// when an update takes addresses out of a pool. It never changes anything.
//
// The checks against other pools read Reader, so two pools created at the
// same moment can both pass; the allocators remain the last line of defence
// (their claims are objects named by address, which the API server keeps
// unique).
type IPPoolValidator struct {
	// Reader lists the other IPPools. The manager's cached client will
	// do; its API reader narrows the window for concurrent creates.
	Reader  client.Reader
	decoder admission.Decoder
}

var _ admission.Handler = (*IPPoolValidator)(nil)

// NewIPPoolValidator returns a validator that lists IPPools with reader and
// decodes admission requests with scheme, which must know vmipam's types.
func NewIPPoolValidator(reader client.Reader, scheme *runtime.Scheme) *IPPoolValidator {
	return &IPPoolValidator{Reader: reader, decoder: admission.NewDecoder(scheme)}
}

// Handle admits or denies one IPPool CREATE or UPDATE; other operations
// are allowed. A denial carries a 422 Invalid status listing every bad
// field, as the API server's own validation would.
func (v *IPPoolValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	pool := &vmipamv1.IPPool{}
	if err := v.decoder.Decode(req, pool); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode IPPool: %w", err))
	}
	var old *vmipamv1.IPPool
	if req.Operation == admissionv1.Update {
		old = &vmipamv1.IPPool{}
		if err := v.decoder.DecodeRaw(req.OldObject, old); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decode old IPPool: %w", err))
		}
		// Let metadata-only updates through even if the stored spec is
		// invalid (two pools created in a race, say): denying them would
		// leave the pool's finalizer stuck.
		if equality.Semantic.DeepEqual(old.Spec, pool.Spec) {
			return admission.Allowed("")
		}
	}
	var others vmipamv1.IPPoolList
	if err := v.Reader.List(ctx, &others); err != nil {
		logf.FromContext(ctx).Error(err, "Listing IPPools to validate one", "ippool", pool.Name)
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("list IPPools: %w", err))
	}
	if errs := ValidateIPPool(pool, others.Items); len(errs) > 0 {
		status := apierrors.NewInvalid(ippoolGroupKind, pool.Name, errs).Status()
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
	}
	resp := admission.Allowed("")
	if old != nil {
		resp = resp.WithWarnings(ippoolUpdateWarnings(old, pool)...)
	}
	return resp
}

// ValidateIPPool returns every problem of pool, given the other IPPools of
// the cluster (pool itself among them, matched by name, is ignored). It
// reads nothing, so it can be tested without an API server.
func ValidateIPPool(pool *vmipamv1.IPPool, others []vmipamv1.IPPool) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	errs = append(errs, ippoolValidateRanges(spec, pool.Spec.Ranges)...)
	errs = append(errs, ippoolValidateOverlaps(spec.Child("ranges"), pool, others)...)
	errs = append(errs, ippoolValidateDefault(spec.Child("default"), pool, others)...)
	errs = append(errs, ippoolValidateTiming(spec, &pool.Spec)...)
	if w := pool.Spec.Watermarks; w != nil {
		errs = append(errs, ippoolValidateWatermarks(spec.Child("watermarks"), w)...)
	}
	if sel := pool.Spec.NamespaceSelector; sel != nil {
		if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
			errs = append(errs, field.Invalid(spec.Child("namespaceSelector"), sel,
				fmt.Sprintf("not a valid label selector: %v", err)))
		}
	}
	return errs
}

// ippoolValidateRanges runs the allocator's own parser, so that the webhook
// accepts exactly the ranges the allocator can build, and moves its errors
// under spec.
func ippoolValidateRanges(spec *field.Path, ranges []vmipamv1.IPRange) field.ErrorList {
	specs := make([]ipam.RangeSpec, len(ranges))
	for i, r := range ranges {
		specs[i] = ipam.RangeSpec{CIDR: r.CIDR, First: r.First, Last: r.Last, Exclude: r.Exclude}
	}
	_, err := ipam.ParseRanges(specs)
	if err == nil {
		return nil
	}
	var ferrs ipam.FieldErrors
	if !errors.As(err, &ferrs) {
		return field.ErrorList{field.InternalError(spec.Child("ranges"), fmt.Errorf("parse ranges: %w", err))}
	}
	errs := make(field.ErrorList, 0, len(ferrs))
	for _, fe := range ferrs {
		path, ok := ippoolFieldPath(spec, fe.Field())
		detail := fe.Detail
		if !ok {
			path, detail = spec, fe.Field()+": "+detail
		}
		switch {
		case fe.Value == "" && strings.Contains(detail, "required"):
			errs = append(errs, field.Required(path, detail))
		case fe.Value == "":
			errs = append(errs, field.Invalid(path, field.OmitValueType{}, detail))
		default:
			errs = append(errs, field.Invalid(path, fe.Value, detail))
		}
	}
	return errs
}

// ippoolFieldPath turns an ipam field such as "ranges[1].exclude[0]" into a
// path under root. It reports false for anything it cannot read, rather
// than guess.
func ippoolFieldPath(root *field.Path, s string) (*field.Path, bool) {
	path := root
	for seg := range strings.SplitSeq(s, ".") {
		name, rest, _ := strings.Cut(seg, "[")
		if name == "" {
			return nil, false
		}
		path = path.Child(name)
		if len(seg) > len(name) {
			rest = "[" + rest
		}
		for rest != "" {
			end := strings.IndexByte(rest, ']')
			if rest[0] != '[' || end < 0 {
				return nil, false
			}
			if n, err := strconv.Atoi(rest[1:end]); err == nil && n >= 0 {
				path = path.Index(n)
			} else {
				path = path.Key(rest[1:end])
			}
			rest = rest[end+1:]
		}
	}
	return path, true
}

// ippoolValidateOverlaps reports every range of pool that shares an
// address with a range of another pool. It compares the addresses handed
// out, so two pools may split one subnet with first/last; exclusions do not
// count, since a pool may drop them later.
func ippoolValidateOverlaps(ranges *field.Path, pool *vmipamv1.IPPool, others []vmipamv1.IPPool) field.ErrorList {
	sorted := ippoolSortedOthers(pool, others)
	var errs field.ErrorList
	for i, r := range pool.Spec.Ranges {
		sp, ok := ippoolRangeSpan(r)
		if !ok {
			continue // ipam has reported it
		}
		for _, other := range sorted {
			for _, or := range other.Spec.Ranges {
				osp, ok := ippoolRangeSpan(or)
				if !ok {
					continue
				}
				shared, ok := sp.intersect(osp)
				if !ok {
					continue
				}
				errs = append(errs, field.Invalid(ranges.Index(i).Child("cidr"), r.CIDR,
					fmt.Sprintf("overlaps range %s of IPPool %q (shared: %s); pools must not share addresses: narrow one of them with first/last or use another subnet",
						or.CIDR, other.Name, shared)))
			}
		}
	}
	return errs
}

// ippoolValidateDefault allows spec.default on at most one pool.
func ippoolValidateDefault(path *field.Path, pool *vmipamv1.IPPool, others []vmipamv1.IPPool) field.ErrorList {
	if !pool.Spec.Default {
		return nil
	}
	var names []string
	for _, other := range ippoolSortedOthers(pool, others) {
		if other.Spec.Default {
			names = append(names, strconv.Quote(other.Name))
		}
	}
	if len(names) == 0 {
		return nil
	}
	return field.ErrorList{field.Invalid(path, true,
		fmt.Sprintf("IPPool %s is already the default and at most one pool may be; unset default there first, or leave it unset here",
			strings.Join(names, ", ")))}
}

// ippoolValidateTiming checks cooldown and pendingTTL. Zero means the
// allocator's default for both, which is what a Go client sends when it
// leaves them unset.
func ippoolValidateTiming(spec *field.Path, s *vmipamv1.IPPoolSpec) field.ErrorList {
	var errs field.ErrorList
	if s.Cooldown != nil && s.Cooldown.Duration < 0 {
		d := s.Cooldown.Duration
		errs = append(errs, field.Invalid(spec.Child("cooldown"), d.String(),
			fmt.Sprintf("must not be negative; it is how long a released address rests before reuse, for example %s", ipam.DefaultCooldown)))
	}
	if d := s.PendingTTL.Duration; d != 0 && d < ippoolMinPendingTTL {
		errs = append(errs, field.Invalid(spec.Child("pendingTTL"), d.String(),
			fmt.Sprintf("must be at least %s, and should exceed the API server's request timeout (60s by default): an address reserved at admission "+
				"waits this long for its VirtualMachine to be stored, and the create request may still be in flight; the default is %s",
				ippoolMinPendingTTL, ipam.DefaultPendingTTL)))
	}
	return errs
}

// ippoolValidateWatermarks checks the free-list bounds the allocator needs:
// 0 <= low <= target <= high, and target no larger than a claimed block.
func ippoolValidateWatermarks(path *field.Path, w *vmipamv1.Watermarks) field.ErrorList {
	var errs field.ErrorList
	if w.Low < 0 {
		errs = append(errs, field.Invalid(path.Child("low"), w.Low,
			"must not be negative; below low free addresses the allocator claims more, up to target"))
	}
	if w.Target < 1 || w.Target > ipam.BlockSize {
		errs = append(errs, field.Invalid(path.Child("target"), w.Target,
			fmt.Sprintf("must be between 1 and %d (the size of an address block); the default is %d", ipam.BlockSize, ipam.DefaultTargetFree)))
	}
	if w.Low >= 0 && w.Target >= 1 && w.Low > w.Target {
		errs = append(errs, field.Invalid(path.Child("low"), w.Low,
			fmt.Sprintf("must not exceed target (%d): the allocator refills the free list to target once it drops below low", w.Target)))
	}
	if w.Target >= 1 && w.High < w.Target {
		errs = append(errs, field.Invalid(path.Child("high"), w.High,
			fmt.Sprintf("must be at least target (%d): the allocator trims the free list to target once it grows above high", w.Target)))
	}
	return errs
}

// ippoolSortedOthers returns the pools other than pool, by name, so that
// errors come out in a stable order.
func ippoolSortedOthers(pool *vmipamv1.IPPool, others []vmipamv1.IPPool) []*vmipamv1.IPPool {
	out := make([]*vmipamv1.IPPool, 0, len(others))
	for i := range others {
		if pool.Name != "" && others[i].Name == pool.Name {
			continue
		}
		out = append(out, &others[i])
	}
	slices.SortFunc(out, func(a, b *vmipamv1.IPPool) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// ippoolUpdateWarnings tells the user which addresses an update takes out of
// the pool. It is a warning, not a denial: shrinking a pool is legitimate,
// but the VirtualMachines holding those addresses keep them.
func ippoolUpdateWarnings(old, pool *vmipamv1.IPPool) []string {
	removed := ippoolUsable(old.Spec.Ranges)
	for _, sp := range ippoolUsable(pool.Spec.Ranges) {
		removed = ippoolSubtract(removed, sp)
	}
	var warnings []string
	for i, sp := range removed {
		if i == ippoolMaxRemovedWarnings {
			warnings = append(warnings, fmt.Sprintf("spec.ranges: the update takes %d more address spans out of the pool", len(removed)-i))
			break
		}
		warnings = append(warnings, fmt.Sprintf(
			"spec.ranges: the update takes %s out of the pool; VirtualMachines that hold these addresses keep them, but vmipam no longer hands them out", sp))
	}
	return warnings
}

// ippoolSpan is the contiguous addresses [lo, hi] of one family.
type ippoolSpan struct{ lo, hi netip.Addr }

func (s ippoolSpan) String() string {
	if s.lo == s.hi {
		return s.lo.String()
	}
	return s.lo.String() + "-" + s.hi.String()
}

// intersect returns the addresses s and t share, and false if none.
func (s ippoolSpan) intersect(t ippoolSpan) (ippoolSpan, bool) {
	if s.lo.Is4() != t.lo.Is4() || s.lo.Compare(t.hi) > 0 || t.lo.Compare(s.hi) > 0 {
		return ippoolSpan{}, false
	}
	out := s
	if t.lo.Compare(out.lo) > 0 {
		out.lo = t.lo
	}
	if t.hi.Compare(out.hi) < 0 {
		out.hi = t.hi
	}
	return out, true
}

// ippoolRangeSpan returns the addresses a range hands out before its
// exclusions, by the rules of ipam.ParseRanges: the network address, and the
// broadcast address of an IPv4 subnet, are skipped unless the subnet is a
// /31, /32, /127 or /128. It reports false for a range ipam would refuse.
func ippoolRangeSpan(r vmipamv1.IPRange) (ippoolSpan, bool) {
	p, err := netip.ParsePrefix(strings.TrimSpace(r.CIDR))
	if err != nil || p.Addr().Zone() != "" || p.Addr().Is4In6() || p.Masked() != p {
		return ippoolSpan{}, false
	}
	sp := ippoolSpan{lo: p.Addr(), hi: ippoolLastAddr(p)}
	if p.Addr().BitLen()-p.Bits() >= 2 {
		sp.lo = sp.lo.Next()
		if p.Addr().Is4() {
			sp.hi = sp.hi.Prev()
		}
	}
	usable, ok := sp, true
	narrow := func(raw string, to *netip.Addr) {
		if raw == "" {
			return
		}
		a, err := netip.ParseAddr(strings.TrimSpace(raw))
		if err != nil || a.Is4() != p.Addr().Is4() || a.Compare(usable.lo) < 0 || a.Compare(usable.hi) > 0 {
			ok = false
			return
		}
		*to = a
	}
	narrow(r.First, &sp.lo)
	narrow(r.Last, &sp.hi)
	if !ok || sp.lo.Compare(sp.hi) > 0 {
		return ippoolSpan{}, false
	}
	return sp, true
}

// ippoolLastAddr returns the highest address of the masked prefix p.
func ippoolLastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := range b {
		switch inPrefix := p.Bits() - 8*i; {
		case inPrefix <= 0:
			b[i] = 0xff
		case inPrefix < 8:
			b[i] |= 0xff >> inPrefix
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// ippoolUsable returns the addresses the ranges hand out, exclusions
// removed; ranges that do not parse are skipped.
func ippoolUsable(ranges []vmipamv1.IPRange) []ippoolSpan {
	var out []ippoolSpan
	for _, r := range ranges {
		sp, ok := ippoolRangeSpan(r)
		if !ok {
			continue
		}
		pieces := []ippoolSpan{sp}
		for _, x := range r.Exclude {
			if xs, ok := ippoolExcludeSpan(x); ok {
				pieces = ippoolSubtract(pieces, xs)
			}
		}
		out = append(out, pieces...)
	}
	return out
}

// ippoolExcludeSpan reads an exclusion: a CIDR or a single address.
func ippoolExcludeSpan(x string) (ippoolSpan, bool) {
	x = strings.TrimSpace(x)
	if strings.Contains(x, "/") {
		p, err := netip.ParsePrefix(x)
		if err != nil || p.Masked() != p {
			return ippoolSpan{}, false
		}
		return ippoolSpan{lo: p.Addr(), hi: ippoolLastAddr(p)}, true
	}
	a, err := netip.ParseAddr(x)
	if err != nil {
		return ippoolSpan{}, false
	}
	return ippoolSpan{lo: a, hi: a}, true
}

// ippoolSubtract returns spans without the addresses of x.
func ippoolSubtract(spans []ippoolSpan, x ippoolSpan) []ippoolSpan {
	var out []ippoolSpan
	for _, s := range spans {
		cut, ok := s.intersect(x)
		if !ok {
			out = append(out, s)
			continue
		}
		// cut.lo > s.lo means cut.lo has a predecessor, and cut.hi < s.hi a
		// successor, so Prev and Next cannot run off the address space.
		if cut.lo.Compare(s.lo) > 0 {
			out = append(out, ippoolSpan{lo: s.lo, hi: cut.lo.Prev()})
		}
		if cut.hi.Compare(s.hi) < 0 {
			out = append(out, ippoolSpan{lo: cut.hi.Next(), hi: s.hi})
		}
	}
	return out
}
