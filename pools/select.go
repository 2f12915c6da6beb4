package pools

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/target"
)

// ErrNotAllowed means the object's namespace may not draw from the pool
// it names or that would apply: see IPPool spec.allowedNamespaces.
var ErrNotAllowed = errors.New("namespace not allowed to use the pool")

// Select picks the pool for an object of namespace ns that names the pool
// named (empty when it names none): the one it names, else the one whose
// namespace selector matches ns, else the default pool. A pool that ns may
// not use, or that is being deleted, is refused with the reason. t is the
// object's kind, whose pool field the messages name.
func (r *Registry) Select(ctx context.Context, t target.Target, ns, named string) (*Pool, error) {
	where := "the pool field of the kinds configuration"
	if p := t.PoolPath(); p != "" {
		where = p
	}
	if named != "" {
		p := r.Get(named)
		if p == nil {
			if err := r.Ready(ctx); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrNotReady, err)
			}
			return nil, fmt.Errorf("IPPool %q does not exist; create it or name an existing pool", named)
		}
		nsObj, err := r.namespace(ctx, ns)
		if err != nil {
			return nil, err
		}
		return p, r.usable(p, nsObj)
	}
	if err := r.Ready(ctx); err != nil {
		// A pool that would match may not be loaded yet.
		return nil, fmt.Errorf("%w: %w", ErrNotReady, err)
	}
	nsObj, err := r.namespace(ctx, ns)
	if err != nil {
		return nil, err
	}
	var matched []string
	var chosen, def *Pool
	for _, p := range r.list() {
		if p.spec.Default {
			def = p
		}
		if p.selector != nil && !p.selector.Empty() && p.selector.Matches(labels.Set(nsObj.Labels)) {
			matched = append(matched, p.name)
			if chosen == nil {
				chosen = p
			}
		}
	}
	switch {
	case len(matched) > 1:
		return nil, fmt.Errorf("namespace %s matches the namespaceSelector of several IPPools (%s); name one in %s",
			ns, strings.Join(matched, ", "), where)
	case chosen != nil:
		return chosen, r.usable(chosen, nsObj)
	case def != nil:
		return def, r.usable(def, nsObj)
	}
	return nil, errors.New("no IPPool applies: name one in " + where +
		", give a pool a namespaceSelector matching namespace " + ns + ", or mark one pool spec.default: true")
}

// usable says why the pool cannot serve the namespace, if it cannot.
func (r *Registry) usable(p *Pool, ns *corev1.Namespace) error {
	switch {
	case p.Deleting():
		return fmt.Errorf("IPPool %q is being deleted and hands out no more addresses; name another pool", p.name)
	case !p.Allows(ns):
		return fmt.Errorf("%w: IPPool %q allows only the namespaces its spec.allowedNamespaces lists or selects, and %s is not one of them; "+
			"name another pool, or ask the pool's owner to allow this namespace", ErrNotAllowed, p.name, ns.Name)
	}
	return nil
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
	for _, p := range r.pools {
		if p.ranges.Contains(a) {
			return p
		}
	}
	return nil
}
