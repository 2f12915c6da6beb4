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
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools"
)

// ippoolMinPendingTTL is the shortest spec.pendingTTL accepted: the API
// server's default request timeout, during which a create the webhook has
// admitted may still be stored.
const ippoolMinPendingTTL = 60 * time.Second

// Bounds on what one response says, so that it stays small however many
// addresses two pools share: the API server and kubectl print it whole, and
// truncate long lists of warnings.
const (
	ippoolMaxRangeErrors     = 64
	ippoolMaxRemovedWarnings = 5
	ippoolMaxOverlapErrors   = 8
	ippoolMaxSharedShown     = 4
)

// ippoolCheckEvery is how many steps of work (ranges, exclusions and
// shared runs) pass between two looks at the request's context.
const ippoolCheckEvery = 4096

// ippoolGroupKind names IPPools in denial messages, as kubectl prints them:
// IPPool.vmipam.io "x" is invalid: ...
var ippoolGroupKind = schema.GroupKind{Group: vmipamv1.GroupVersion.Group, Kind: "IPPool"}

// The kind and resource the webhook serves; a review of anything else is a
// misrouting by the webhook configuration.
var (
	ippoolGVK = metav1.GroupVersionKind{Group: vmipamv1.GroupVersion.Group, Version: vmipamv1.GroupVersion.Version, Kind: "IPPool"}
	ippoolGVR = metav1.GroupVersionResource{Group: vmipamv1.GroupVersion.Group, Version: vmipamv1.GroupVersion.Version, Resource: "ippools"}
)

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
	parsed  parsedRanges
}

// parsedRanges keeps the other pools' ranges parsed, by UID and
// generation, so that a validation against many large pools costs their
// overlap check, not a parse of each on every request.
type parsedRanges struct {
	mu sync.Mutex
	m  map[types.UID]parsedPool
}

type parsedPool struct {
	generation int64
	ranges     *ipam.Ranges
	err        error
}

// get returns pool's parsed ranges.
func (c *parsedRanges) get(pool *vmipamv1.IPPool) (*ipam.Ranges, error) {
	if pool.UID == "" {
		return ipam.ParseRanges(pools.RangeSpecs(pool.Spec.Ranges))
	}
	c.mu.Lock()
	e, ok := c.m[pool.UID]
	c.mu.Unlock()
	if ok && e.generation == pool.Generation {
		return e.ranges, e.err
	}
	r, err := ipam.ParseRanges(pools.RangeSpecs(pool.Spec.Ranges))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[types.UID]parsedPool{}
	}
	c.m[pool.UID] = parsedPool{generation: pool.Generation, ranges: r, err: err}
	return r, err
}

// keep forgets the pools not in the list, so the cache holds no more
// than the cluster's pools.
func (c *parsedRanges) keep(pools []vmipamv1.IPPool) {
	live := make(map[types.UID]bool, len(pools))
	for i := range pools {
		live[pools[i].UID] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid := range c.m {
		if !live[uid] {
			delete(c.m, uid)
		}
	}
}

var _ admission.Handler = (*IPPoolValidator)(nil)

// NewIPPoolValidator returns a validator that lists IPPools with reader and
// decodes admission requests with scheme, which must know vmipam's types.
func NewIPPoolValidator(reader client.Reader, scheme *runtime.Scheme) *IPPoolValidator {
	return &IPPoolValidator{Reader: reader, decoder: admission.NewDecoder(scheme)}
}

// Handle admits or denies one IPPool CREATE or UPDATE; other operations
// are allowed. A denial carries a 422 Invalid status listing every bad
// field, as the API server's own validation would; a review of another kind,
// resource or a subresource is refused with 400, and one whose request ended
// before validation finished with 504.
func (v *IPPoolValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if err := ippoolMisrouted(req); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
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
		if ctx.Err() != nil {
			return ippoolTimedOut(ctx, pool)
		}
		logf.FromContext(ctx).Error(err, "Listing IPPools to validate one", "ippool", pool.Name)
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("list IPPools: %w", err))
	}
	errs, ranges := ippoolValidate(ctx, pool, others.Items, v.parsed.get)
	v.parsed.keep(others.Items)
	if ctx.Err() != nil {
		return ippoolTimedOut(ctx, pool)
	}
	if len(errs) > 0 {
		status := apierrors.NewInvalid(ippoolGroupKind, pool.Name, errs).Status()
		return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{Allowed: false, Result: &status}}
	}
	resp := admission.Allowed("")
	if old != nil {
		warnings := ippoolUpdateWarnings(ctx, old, ranges)
		if ctx.Err() != nil {
			return ippoolTimedOut(ctx, pool)
		}
		resp = resp.WithWarnings(warnings...)
	}
	return resp
}

// ippoolMisrouted refuses a review the webhook does not serve, naming what
// it does serve, so that a wrong rule in the webhook configuration shows.
func ippoolMisrouted(req admission.Request) error {
	if req.Kind == ippoolGVK && req.Resource == ippoolGVR && req.SubResource == "" {
		return nil
	}
	sub := ""
	if req.SubResource != "" {
		sub = "/" + req.SubResource
	}
	kind := func(k metav1.GroupVersionKind) string {
		return schema.GroupVersion{Group: k.Group, Version: k.Version}.String() + " " + k.Kind
	}
	return fmt.Errorf("vmipam's IPPool validating webhook serves %s.%s/%s (kind %s), not %s.%s/%s%s (kind %s): check the webhook configuration's rules",
		ippoolGVR.Resource, ippoolGVR.Group, ippoolGVR.Version, kind(ippoolGVK),
		req.Resource.Resource, req.Resource.Group, req.Resource.Version, sub, kind(req.Kind))
}

// ippoolTimedOut answers a review whose request ended while it was being
// validated: the API server has given up on it, and nothing was admitted.
func ippoolTimedOut(ctx context.Context, pool *vmipamv1.IPPool) admission.Response {
	err := context.Cause(ctx)
	logf.FromContext(ctx).Info("Giving up validating an IPPool: its admission request ended", "ippool", pool.Name, "cause", err.Error())
	return admission.Errored(http.StatusGatewayTimeout, fmt.Errorf(
		"validate IPPool %q: the admission request ended before validation finished (%w); nothing was admitted: retry", pool.Name, err))
}

// ValidateIPPool returns every problem of pool, given the other IPPools of
// the cluster (pool itself among them, matched by name, is ignored). It
// reads nothing, so it can be tested without an API server. It looks at ctx
// as it goes; once ctx is done it stops and returns a single internal error
// saying so.
func ValidateIPPool(ctx context.Context, pool *vmipamv1.IPPool, others []vmipamv1.IPPool) field.ErrorList {
	errs, _ := ippoolValidate(ctx, pool, others, func(p *vmipamv1.IPPool) (*ipam.Ranges, error) {
		return ipam.ParseRanges(pools.RangeSpecs(p.Spec.Ranges))
	})
	return errs
}

// ippoolValidate is ValidateIPPool, also returning the pool's ranges when
// they parse.
func ippoolValidate(ctx context.Context, pool *vmipamv1.IPPool, others []vmipamv1.IPPool,
	parse func(*vmipamv1.IPPool) (*ipam.Ranges, error)) (field.ErrorList, *ipam.Ranges) {
	spec := field.NewPath("spec")
	stopped := func() field.ErrorList {
		return field.ErrorList{field.InternalError(spec, fmt.Errorf(
			"validation stopped before it finished, because the admission request ended (%w); the pool was not checked: retry", context.Cause(ctx)))}
	}
	if ctx.Err() != nil {
		return stopped(), nil
	}
	sorted := ippoolSortedOthers(pool, others)
	ranges, errs := ippoolValidateRanges(spec, pool.Spec.Ranges)
	errs = append(errs, ippoolValidateOverlaps(&ippoolDeadline{ctx: ctx}, spec.Child("ranges"), pool, ranges, sorted, parse)...)
	errs = append(errs, ippoolValidateDefault(spec.Child("default"), pool, sorted)...)
	errs = append(errs, ippoolValidateTiming(spec, &pool.Spec)...)
	if p := pool.Spec.MaxPendingPerNamespace; p != nil && *p < 1 {
		errs = append(errs, field.Invalid(spec.Child("maxPendingPerNamespace"), *p,
			"must be at least 1: it bounds the reservations of one namespace that wait for their VirtualMachine to be stored; "+
				"leave it out for an eighth of the pool's usable addresses, and at least 64"))
	}
	if a := pool.Spec.AllowedNamespaces; a != nil {
		errs = append(errs, ippoolValidateAllowedNamespaces(spec.Child("allowedNamespaces"), a)...)
	}
	if w := pool.Spec.Watermarks; w != nil {
		errs = append(errs, ippoolValidateWatermarks(spec.Child("watermarks"), w)...)
	}
	if sel := pool.Spec.NamespaceSelector; sel != nil {
		errs = append(errs, ippoolValidateSelector(spec.Child("namespaceSelector"), sel)...)
	}
	if ctx.Err() != nil {
		return stopped(), nil
	}
	return errs, ranges
}

// ippoolDeadline looks at the request's context every ippoolCheckEvery
// steps of work, so that a validation the API server has given up on stops
// instead of burning CPU.
type ippoolDeadline struct {
	ctx   context.Context
	steps int
}

// spend counts n steps and reports whether to stop.
func (d *ippoolDeadline) spend(n int) bool {
	if d.steps += n; d.steps < ippoolCheckEvery {
		return false
	}
	d.steps = 0
	return d.ctx.Err() != nil
}

// ippoolValidateRanges runs the allocator's own parser, so that the webhook
// accepts exactly the ranges the allocator can build, and moves its errors
// under spec. It returns the ranges when they parse.
func ippoolValidateRanges(spec *field.Path, ranges []vmipamv1.IPRange) (*ipam.Ranges, field.ErrorList) {
	r, err := ipam.ParseRanges(pools.RangeSpecs(ranges))
	if err == nil {
		return r, nil
	}
	var ferrs ipam.FieldErrors
	if !errors.As(err, &ferrs) {
		return nil, field.ErrorList{field.InternalError(spec.Child("ranges"), fmt.Errorf("parse ranges: %w", err))}
	}
	errs := make(field.ErrorList, 0, min(len(ferrs), ippoolMaxRangeErrors+1))
	for i, fe := range ferrs {
		if i == ippoolMaxRangeErrors {
			errs = append(errs, field.Invalid(spec.Child("ranges"), field.OmitValueType{},
				fmt.Sprintf("and %d more problems in the ranges, not listed", len(ferrs)-i)))
			break
		}
		path := ippoolFieldPath(spec, fe.Path)
		switch {
		case fe.Type == ipam.ErrorTypeRequired:
			errs = append(errs, field.Required(path, fe.Detail))
		case fe.Value == "":
			errs = append(errs, field.Invalid(path, field.OmitValueType{}, fe.Detail))
		default:
			errs = append(errs, field.Invalid(path, fe.Value, fe.Detail))
		}
	}
	return nil, errs
}

// ippoolFieldPath puts an allocator path such as ranges[1].exclude[0] under
// root.
func ippoolFieldPath(root *field.Path, p ipam.Path) *field.Path {
	for _, s := range p {
		root = root.Child(s.Field)
		if s.Indexed {
			root = root.Index(s.Index)
		}
	}
	return root
}

// ippoolPart is some of a pool's ranges as the allocator reads them, and
// the index of the first of them in the pool's spec.
type ippoolPart struct {
	ranges *ipam.Ranges
	first  int
}

// ippoolParts returns the pool's ranges to check against other pools: all
// of them when they parse, else each range that parses alone, so that an
// overlap is reported together with the pool's other mistakes.
func ippoolParts(pool *vmipamv1.IPPool, ranges *ipam.Ranges) []ippoolPart {
	if ranges != nil {
		return []ippoolPart{{ranges: ranges}}
	}
	var parts []ippoolPart
	for i, s := range pools.RangeSpecs(pool.Spec.Ranges) {
		if r, err := ipam.ParseRanges([]ipam.RangeSpec{s}); err == nil {
			parts = append(parts, ippoolPart{ranges: r, first: i})
		}
	}
	return parts
}

// ippoolShared is what one range of the pool shares with one range of
// another pool.
type ippoolShared struct {
	index      int // of the pool's range
	other      *vmipamv1.IPPool
	otherIndex int
	runs       []string // the first ippoolMaxSharedShown
	n          int
}

// ippoolValidateOverlaps reports every range of pool that shares an
// address with a range of another pool: the addresses handed out, so two
// pools may split one subnet with first/last or by excluding each other's
// part. Another pool whose ranges do not parse is skipped: its allocator
// cannot build it either, so it hands nothing out, and its own next update
// is checked against this pool. The first ippoolMaxOverlapErrors pairs of
// ranges are listed, then how many more there are.
func ippoolValidateOverlaps(d *ippoolDeadline, path *field.Path, pool *vmipamv1.IPPool, ranges *ipam.Ranges, sorted []*vmipamv1.IPPool,
	parse func(*vmipamv1.IPPool) (*ipam.Ranges, error)) field.ErrorList {
	parts := ippoolParts(pool, ranges)
	if len(parts) == 0 {
		return nil
	}
	var listed []*ippoolShared
	var unlisted ippoolShared
	var routerErrs field.ErrorList
	more := 0
	for _, other := range sorted {
		steps := 1
		for _, r := range other.Spec.Ranges {
			steps += 1 + len(r.Exclude)
		}
		if d.spend(steps) {
			return nil
		}
		or, err := parse(other)
		if err != nil {
			continue
		}
		routerErrs = append(routerErrs, ippoolValidateRouters(path, pool, ranges, other, or)...)
		for _, part := range parts {
			var cur *ippoolShared
			// The runs one pair of ranges shares come one after another:
			// each range is one stretch of addresses.
			for o := range part.ranges.Overlaps(or) {
				if d.spend(1) {
					return nil
				}
				i := part.first + o.Range
				if cur == nil || cur.index != i || cur.otherIndex != o.OtherRange {
					if len(listed) < ippoolMaxOverlapErrors {
						cur = &ippoolShared{index: i, other: other, otherIndex: o.OtherRange}
						listed = append(listed, cur)
					} else {
						unlisted, cur = ippoolShared{index: i, otherIndex: o.OtherRange}, &unlisted
						more++
					}
				}
				if cur.n++; cur.n <= ippoolMaxSharedShown && cur != &unlisted {
					cur.runs = append(cur.runs, o.String())
				}
			}
		}
	}
	slices.SortStableFunc(listed, func(a, b *ippoolShared) int { return a.index - b.index })
	var errs field.ErrorList
	for _, s := range listed {
		shared := strings.Join(s.runs, ", ")
		if s.n > len(s.runs) {
			shared += fmt.Sprintf(" and %d more", s.n-len(s.runs))
		}
		errs = append(errs, field.Invalid(path.Index(s.index).Child("cidr"), pool.Spec.Ranges[s.index].CIDR,
			fmt.Sprintf("overlaps range %s of IPPool %q (shared: %s); pools must not share addresses: narrow one of them with first/last, exclude the shared addresses from one, or use another subnet",
				strings.TrimSpace(s.other.Spec.Ranges[s.otherIndex].CIDR), s.other.Name, shared)))
	}
	if more > 0 {
		errs = append(errs, field.Invalid(path, field.OmitValueType{},
			fmt.Sprintf("and %d more pairs of a range of this pool and a range of another IPPool share addresses, not listed", more)))
	}
	return append(errs, routerErrs...)
}

// ippoolValidateRouters refuses a gateway or next hop of pool that other
// hands out, and a pool that would hand out one of other's: a router is
// never given to a VM, whichever pool splits its subnet.
func ippoolValidateRouters(path *field.Path, pool *vmipamv1.IPPool, ranges *ipam.Ranges, other *vmipamv1.IPPool, or *ipam.Ranges) field.ErrorList {
	var errs field.ErrorList
	for i, r := range pool.Spec.Ranges {
		hops := []struct {
			p *field.Path
			v string
		}{{path.Index(i).Child("gateway"), r.Gateway}}
		for j, rt := range r.Routes {
			hops = append(hops, struct {
				p *field.Path
				v string
			}{path.Index(i).Child("routes").Index(j).Child("via"), rt.Via})
		}
		for _, h := range hops {
			if a, err := netip.ParseAddr(h.v); err == nil && or.Contains(a) {
				errs = append(errs, field.Invalid(h.p, h.v, fmt.Sprintf(
					"IPPool %q hands it out: a router must not be given to a VM; exclude it from that pool", other.Name)))
			}
		}
	}
	if ranges == nil {
		return errs
	}
	for _, a := range or.Routers() {
		if ranges.Contains(a) {
			errs = append(errs, field.Invalid(path, a.String(), fmt.Sprintf(
				"is a gateway or next hop of IPPool %q, and this pool would hand it out; exclude it", other.Name)))
		}
	}
	return errs
}

// ippoolValidateDefault allows spec.default on at most one pool.
func ippoolValidateDefault(path *field.Path, pool *vmipamv1.IPPool, sorted []*vmipamv1.IPPool) field.ErrorList {
	if !pool.Spec.Default {
		return nil
	}
	var names []string
	for _, other := range sorted {
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

// ippoolValidateTiming checks cooldown and pendingTTL. Only a missing field
// takes the default: a cooldown of 0s means none, and a pendingTTL of 0s is
// too short.
func ippoolValidateTiming(spec *field.Path, s *vmipamv1.IPPoolSpec) field.ErrorList {
	var errs field.ErrorList
	if s.Cooldown != nil && s.Cooldown.Duration < 0 {
		errs = append(errs, field.Invalid(spec.Child("cooldown"), s.Cooldown.Duration.String(),
			fmt.Sprintf("must not be negative: it is how long a released address rests before reuse; 0s means no cooldown, and leaving the field out takes the default, %s",
				ipam.DefaultCooldown)))
	}
	if s.PendingTTL != nil && s.PendingTTL.Duration < ippoolMinPendingTTL {
		errs = append(errs, field.Invalid(spec.Child("pendingTTL"), s.PendingTTL.Duration.String(),
			fmt.Sprintf("must be at least 60s, the API server's default request timeout; an address reserved at admission waits this long for its VirtualMachine "+
				"to be stored, and the create may still be in flight (the default is %s)", ipam.DefaultPendingTTL)))
	}
	return errs
}

// ippoolValidateAllowedNamespaces checks the namespaces allowed to draw from
// the pool: some must be named or selected.
func ippoolValidateAllowedNamespaces(path *field.Path, a *vmipamv1.NamespaceRestriction) field.ErrorList {
	if len(a.Names) == 0 && a.Selector == nil {
		return field.ErrorList{field.Required(path,
			"name namespaces in names or give a selector; to allow every namespace, leave allowedNamespaces out")}
	}
	var errs field.ErrorList
	seen := make(map[string]bool, len(a.Names))
	for i, n := range a.Names {
		if msgs := validation.IsDNS1123Label(n); len(msgs) > 0 {
			errs = append(errs, field.Invalid(path.Child("names").Index(i), n, "not a namespace name: "+strings.Join(msgs, "; ")))
		} else if seen[n] {
			errs = append(errs, field.Duplicate(path.Child("names").Index(i), n))
		}
		seen[n] = true
	}
	if a.Selector != nil {
		errs = append(errs, ippoolValidateSelector(path.Child("selector"), a.Selector)...)
	}
	return errs
}

func ippoolValidateSelector(path *field.Path, sel *metav1.LabelSelector) field.ErrorList {
	if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
		return field.ErrorList{field.Invalid(path, sel, fmt.Sprintf("not a valid label selector: %v", err))}
	}
	return nil
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

// ippoolUpdateWarnings tells the user which addresses an update to ranges
// takes out of the pool. It is a warning, not a denial: shrinking a pool is
// legitimate, but the VirtualMachines holding those addresses keep them. An
// old spec that does not parse handed nothing out, so it takes nothing.
func ippoolUpdateWarnings(ctx context.Context, old *vmipamv1.IPPool, ranges *ipam.Ranges) []string {
	was, err := ipam.ParseRanges(pools.RangeSpecs(old.Spec.Ranges))
	if err != nil {
		return nil
	}
	d := &ippoolDeadline{ctx: ctx}
	var warnings []string
	n := 0
	for iv := range was.Difference(ranges) {
		if d.spend(1) {
			return nil
		}
		if n++; n <= ippoolMaxRemovedWarnings {
			warnings = append(warnings, fmt.Sprintf(
				"spec.ranges: the update takes %s out of the pool; VirtualMachines that hold these addresses keep them, but vmipam no longer hands them out", iv))
		}
	}
	if n > ippoolMaxRemovedWarnings {
		warnings = append(warnings, fmt.Sprintf("spec.ranges: the update takes %d more address spans out of the pool", n-ippoolMaxRemovedWarnings))
	}
	return warnings
}
