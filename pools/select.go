package pools

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
)

// ErrNotAllowed means the object's namespace may not draw from the pool
// it names or that would apply: see IPPool spec.allowedNamespaces.
var ErrNotAllowed = errors.New("namespace not allowed to use the pool")

// Select picks the pool for an object of namespace ns that names the pool
// named (empty when it names none): the one it names, else the one whose
// namespace selector matches ns, else the default pool. The choice is made
// on the IPPools as the cache holds them now, so a pool that is
// recovering, being deleted, re-created under its name, or whose spec
// cannot be applied refuses only the objects that draw from it, with its
// own reason; ErrNotReady when a retry will do. A pool that ns may not use
// is refused with the reason, and a paused one with a *PausedError. t is
// the object's kind, whose pool field the messages name.
func (r *Registry) Select(ctx context.Context, t kinds.Kind, ns, named string) (*Pool, error) {
	where := "the pool field of the kinds configuration"
	if p := t.PoolPath(); p != "" {
		where = p
	}
	if err := r.leaseReady(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotReady, err)
	}
	if named != "" {
		pool, err := r.pool(ctx, named)
		if apierrors.IsNotFound(err) {
			// Created a moment before the object (kubectl apply of both),
			// and not in the cache yet: see justCreated.
			if r.opts.APIReader.Get(ctx, client.ObjectKey{Name: named}, &vmipamv1.IPPool{}) == nil {
				return nil, fmt.Errorf("%w: IPPool %s was just created, and this replica has not seen it yet", ErrNotReady, named)
			}
			return nil, fmt.Errorf("IPPool %q does not exist; create it or name an existing pool", named)
		} else if err != nil {
			return nil, fmt.Errorf("read IPPool %s: %w", named, err)
		}
		p, err := r.serving(pool)
		if err != nil {
			return nil, err
		}
		nsObj, err := r.namespace(ctx, ns)
		if err != nil {
			return nil, err
		}
		return p, r.usable(p, nsObj, where)
	}
	nsObj, err := r.namespace(ctx, ns)
	if err != nil {
		return nil, err
	}
	// Every admission that names no pool lists them: read the cache's
	// objects in place, not a copy of each.
	var list vmipamv1.IPPoolList
	if err := r.opts.Client.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list IPPools: %w", err)
	}
	matched, chosen, def := r.applying(list.Items, nsObj)
	switch {
	case len(matched) > 1:
		slices.Sort(matched)
		return nil, fmt.Errorf("namespace %s matches the namespaceSelector of several IPPools (%s); name one in %s",
			ns, strings.Join(matched, ", "), where)
	case chosen == nil && def == nil:
		if r.justCreated(ctx, nsObj) {
			return nil, fmt.Errorf("%w: an IPPool that applies to namespace %s was just created, and this replica has not seen it yet", ErrNotReady, ns)
		}
		return nil, errors.New("no IPPool applies: name one in " + where +
			", give a pool a namespaceSelector matching namespace " + ns + ", or mark one pool spec.default: true")
	case chosen == nil:
		chosen = def
	}
	p, err := r.serving(chosen)
	if err != nil {
		return nil, err
	}
	// A paused pool chosen by its namespace selector or as the default
	// refuses too, rather than giving way to the next pool in line: that
	// pool may be another network the namespace's workloads were never
	// meant to join, and the operator who paused the pool decides where
	// they go next (name a pool, or move the selector or the default).
	return p, r.usable(p, nsObj, where)
}

// applying returns, of pools, the names of those whose namespace selector
// matches nsObj, the last of them, and the default pool: by name, as the
// registry's pools were, the last default pool (more than one matching
// pool is refused, named in order).
func (r *Registry) applying(pools []vmipamv1.IPPool, nsObj *corev1.Namespace) (matched []string, chosen, def *vmipamv1.IPPool) {
	for i := range pools {
		pool := &pools[i]
		if pool.Spec.Default && (def == nil || pool.Name > def.Name) {
			def = pool
		}
		if sel := r.selectorOf(pool); sel != nil && !sel.Empty() && sel.Matches(labels.Set(nsObj.Labels)) {
			matched = append(matched, pool.Name)
			chosen = pool
		}
	}
	return matched, chosen, def
}

// justCreated tells, before an admission is refused because the cache
// shows no pool that applies to namespace nsObj, whether the API server
// shows one: a pool created a moment before the object (kubectl apply of
// both) that the cache has not seen yet. The admission is then refused as
// not ready, which the client retries, instead of as invalid. It costs one
// read of the API server, on a refusal only; when that read fails, the
// cache's answer stands. Select reads a pool it is named the same way.
func (r *Registry) justCreated(ctx context.Context, nsObj *corev1.Namespace) bool {
	var fresh vmipamv1.IPPoolList
	if err := r.opts.APIReader.List(ctx, &fresh); err != nil {
		return false
	}
	_, chosen, def := r.applying(fresh.Items, nsObj)
	return chosen != nil || def != nil
}

// serving returns the allocator that serves pool, as the cache holds it
// now, or why none does: the pool is recovering (ErrNotReady: retry),
// re-created under its name and not recovered yet (ErrNotReady), or its
// current version could not be applied (the reason the last try gave).
// An allocator of an older generation of the same pool serves until its
// rebuild, as an update of the pool is applied.
func (r *Registry) serving(pool *vmipamv1.IPPool) (*Pool, error) {
	p, problem := r.stateOf(pool)
	switch {
	case p != nil:
		return p, nil
	case errors.Is(problem, ipam.ErrInvalid):
		return nil, fmt.Errorf("IPPool %s cannot be served: %w; fix the pool's spec, or name another pool", pool.Name, problem)
	case problem != nil:
		return nil, fmt.Errorf("%w: IPPool %s could not be recovered (%w), and is tried again", ErrNotReady, pool.Name, problem)
	}
	return nil, fmt.Errorf("%w: IPPool %s is not recovered yet", ErrNotReady, pool.Name)
}

// stateOf returns the ready allocator of pool (this UID, of any
// generation: an update is applied by a rebuild), or nil; and why the last
// try to serve this version of pool failed, or nil. The allocator's locks
// are taken outside the registry's.
func (r *Registry) stateOf(pool *vmipamv1.IPPool) (*Pool, error) {
	r.mu.RLock()
	p, pr := r.pools[pool.Name], r.problems[pool.Name]
	r.mu.RUnlock()
	if p != nil && (p.uid != pool.UID || !p.Ready()) {
		p = nil
	}
	if pr.uid != pool.UID || pr.generation != pool.Generation {
		pr.err = nil
	}
	return p, pr.err
}

// selectorOf is pool's namespace selector: the allocator's, parsed when it
// was built from this version of the pool, else parsed now (a pool not
// served yet); nil when it has none or it cannot be parsed (the IPPool
// webhook refuses such a selector, and the pool cannot be served).
func (r *Registry) selectorOf(pool *vmipamv1.IPPool) labels.Selector {
	if pool.Spec.NamespaceSelector == nil {
		return nil
	}
	if p := r.Get(pool.Name); p != nil && p.uid == pool.UID && p.observedGeneration() == pool.Generation {
		return p.selector
	}
	sel, err := metav1.LabelSelectorAsSelector(pool.Spec.NamespaceSelector)
	if err != nil {
		return nil
	}
	return sel
}

// usable says why the pool cannot serve the namespace, if it cannot;
// where is the object's pool field, for the messages.
func (r *Registry) usable(p *Pool, ns *corev1.Namespace, where string) error {
	switch {
	case p.Deleting():
		return fmt.Errorf("IPPool %q is being deleted and hands out no more addresses; name another pool", p.name)
	case !p.Allows(ns):
		return fmt.Errorf("%w: IPPool %q allows only the namespaces its spec.allowedNamespaces lists or selects, and %s is not one of them; "+
			"name another pool, or ask the pool's owner to allow this namespace", ErrNotAllowed, p.name, ns.Name)
	case p.Paused():
		return &PausedError{Pool: p.name, Field: where}
	}
	return nil
}

// pool reads the IPPool name from the cache, as a NotFound error when it
// has none. The pool returned is the cache's own: read it, never change
// it.
func (r *Registry) pool(ctx context.Context, name string) (*vmipamv1.IPPool, error) {
	if idx := r.ippools.Load(); idx != nil {
		if cached, found, synced := idx.Get("", name); synced {
			if p, ok := cached.(*vmipamv1.IPPool); found && ok {
				return p, nil
			}
			return nil, apierrors.NewNotFound(vmipamv1.GroupVersion.WithResource("ippools").GroupResource(), name)
		}
	}
	// Read only, so the cache's own copy will do.
	pool := &vmipamv1.IPPool{}
	if err := r.opts.Client.Get(ctx, client.ObjectKey{Name: name}, pool, &client.GetOptions{UnsafeDisableDeepCopy: ptr.To(true)}); err != nil {
		return nil, err
	}
	return pool, nil
}

// namespace reads ns from the cache; a namespace not found has no labels.
// The namespace returned shares the cache's maps: read it, never change it.
func (r *Registry) namespace(ctx context.Context, ns string) (*corev1.Namespace, error) {
	obj := &corev1.Namespace{}
	if ns == "" {
		return obj, nil
	}
	if idx := r.namespaces.Load(); idx != nil {
		if cached, found, synced := idx.Get("", ns); synced {
			if c, ok := cached.(*corev1.Namespace); found && ok {
				return c, nil
			}
			obj.Name = ns
			return obj, nil
		}
	}
	// Read only, so the cache's own copy will do: a deep copy of the
	// namespace (its managed fields included) was 5% of vmipam's CPU per
	// create in make bench's profile.
	if err := r.opts.Client.Get(ctx, client.ObjectKey{Name: ns}, obj, &client.GetOptions{UnsafeDisableDeepCopy: ptr.To(true)}); err != nil {
		if apierrors.IsNotFound(err) {
			obj.Name = ns
			return obj, nil
		}
		return nil, fmt.Errorf("read namespace %s: %w", ns, err)
	}
	return obj, nil
}

// PoolFor returns the pool whose ranges contain a, or nil.
func (r *Registry) PoolFor(a netip.Addr) *Pool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.poolForLocked(a)
}

// poolForLocked is PoolFor, with r.mu held.
func (r *Registry) poolForLocked(a netip.Addr) *Pool {
	for _, p := range r.pools {
		if p.ranges.Contains(a) {
			return p
		}
	}
	return nil
}

// Covers reports whether one of addrs is in the ranges of a pool this
// replica serves (PoolFor), or of one whose allocator it is building. An
// object that vmipam never stamped, whose addresses it does not cover,
// is not vmipam's to look after: the controller leaves its events out of
// its queue.
//
// A pool's ranges count from before its recovery reads the objects, not
// from when PoolFor finds it: an object stored after that read, whose
// event comes before the pool is served, is then looked at again once it
// is (where it was dropped as outside every pool).
func (r *Registry) Covers(addrs ...netip.Addr) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, a := range addrs {
		if r.poolForLocked(a) != nil {
			return true
		}
		for _, rs := range r.coming {
			if rs.Contains(a) {
				return true
			}
		}
	}
	return false
}
