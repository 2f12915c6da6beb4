package pools

import (
	"context"
	"fmt"
	"net/netip"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/target"
)

// liveHoldings returns the addresses of the pool on live objects, read from
// the informer cache: those stamped with the pool, and unstamped ones
// inside its ranges. Objects being deleted still hold their address until
// the controller releases it.
func (r *Registry) liveHoldings(ctx context.Context, pool string, ranges *ipam.Ranges) ([]ipam.Holding, error) {
	var out []ipam.Holding
	err := r.eachLive(ctx, func(obj *unstructured.Unstructured, h ipam.Holding, stamped string) {
		if stamped == pool || stamped == "" && ranges.Contains(h.Addr) {
			out = append(out, h)
		}
	})
	return out, err
}

// eachLive calls fn with every live object of the target kind that carries
// an address, its holding and the pool stamped on it.
func (r *Registry) eachLive(ctx context.Context, fn func(obj *unstructured.Unstructured, h ipam.Holding, stamped string)) error {
	list := r.opts.Target.NewList()
	if err := r.opts.Client.List(ctx, list); err != nil {
		return fmt.Errorf("list %s: %w", r.opts.Target.GVK.Kind, err)
	}
	for i := range list.Items {
		obj := &list.Items[i]
		if obj.GetDeletionTimestamp() != nil && !target.HasFinalizer(obj) {
			continue
		}
		if h, stamped, ok := r.holding(obj); ok {
			fn(obj, h, stamped)
		}
	}
	return nil
}

// holding reads the address, owner and stamped pool of obj. Addresses are
// taken in their canonical form: an object that bypassed the webhook with
// a second spelling of an address still holds that address.
func (r *Registry) holding(obj *unstructured.Unstructured) (ipam.Holding, string, bool) {
	addrs, err := r.opts.Target.Addresses(obj)
	if err != nil || len(addrs) == 0 {
		return ipam.Holding{}, "", false
	}
	a, err := netip.ParseAddr(addrs[0])
	if err != nil {
		return ipam.Holding{}, "", false
	}
	ann := obj.GetAnnotations()
	return ipam.Holding{Addr: ipam.Canonical(a), Owner: ipam.Owner{
			Token: ann[vmipamv1.TokenAnnotation], UID: string(obj.GetUID()), Ref: Ref(obj.GetNamespace(), obj.GetName()),
		}},
		ann[vmipamv1.PoolAnnotation], true
}

// Ref names an object in messages: namespace/name, or the name alone.
func Ref(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// Holder is a live object holding an address of a pool.
type Holder struct {
	Namespace, Name string
	UID             types.UID
	Addr            netip.Addr
}

// Holders returns the live objects holding addresses of the named pool,
// from the cache: for a pool being deleted, what it waits for.
func (r *Registry) Holders(ctx context.Context, pool string) ([]Holder, error) {
	p := r.Get(pool)
	var out []Holder
	err := r.eachLive(ctx, func(obj *unstructured.Unstructured, h ipam.Holding, stamped string) {
		if stamped == pool || stamped == "" && p != nil && p.Ranges().Contains(h.Addr) {
			out = append(out, Holder{Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: obj.GetUID(), Addr: h.Addr})
		}
	})
	return out, err
}

// Resync reconciles a pool's allocator with every live object.
func (r *Registry) Resync(ctx context.Context, p *Pool) error {
	if !p.m.Ready() {
		return nil
	}
	// Mark before listing: what changes while the list is taken is left
	// for the next resync.
	asOf := p.m.Mark()
	live, err := r.liveHoldings(ctx, p.name, p.m.Ranges())
	if err != nil {
		return err
	}
	rep := p.m.Resync(live, asOf)
	p.noteConflicts(rep.Conflicts)
	if rep.Released > 0 || rep.Adopted > 0 || rep.Settled > 0 || len(rep.Conflicts) > 0 {
		// settled: orphans, addresses the store showed in use without
		// saying on which machine, that are on none and now rest.
		logf.FromContext(ctx).Info("Resynced pool", "pool", p.name, "released", rep.Released, "adopted", rep.Adopted,
			"settled", rep.Settled, "deferred", rep.Deferred, "conflicts", len(rep.Conflicts))
	}
	for _, c := range rep.Conflicts {
		r.warn(&vmipamv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: p.name, UID: p.uid}}, "DuplicateAddress", c.Error())
	}
	return nil
}
