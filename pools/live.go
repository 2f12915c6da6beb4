package pools

import (
	"context"
	"fmt"
	"net/netip"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
)

// listPage bounds one page of a list of a configured kind from the API
// server.
const listPage = 500

// live is what a list of the live objects tells of a pool.
type live struct {
	// holdings are the addresses of the pool on live objects.
	holdings []ipam.Holding
	// elsewhere are those of them not labelled for this replica: if its
	// allocator holds their address for them, relabel moves the label.
	elsewhere []labelled
}

// labelled is an object whose holder label may have to move.
type labelled struct {
	gvk  schema.GroupVersionKind
	key  client.ObjectKey
	uid  types.UID
	addr netip.Addr
}

// liveHoldings returns the addresses of the pool on live objects, read from
// the API server (the informer cache holds only this replica's objects):
// those stamped with the pool, and unstamped ones inside its ranges.
// Objects being deleted still hold their address until the controller
// releases it.
func (r *Registry) liveHoldings(ctx context.Context, pool string, ranges *ipam.Ranges) (live, error) {
	by, err := r.liveIn(ctx, map[string]*ipam.Ranges{pool: ranges})
	return by[pool], err
}

// liveIn is liveHoldings for several pools, named with their ranges, from
// one list of the objects.
func (r *Registry) liveIn(ctx context.Context, pools map[string]*ipam.Ranges) (map[string]live, error) {
	out := make(map[string]live, len(pools))
	mine := r.holderLabel
	err := r.eachLive(ctx, func(obj *unstructured.Unstructured, h ipam.Holding, stamped string) {
		for name, ranges := range pools {
			if stamped != name && (stamped != "" || !ranges.Contains(h.Addr)) {
				continue
			}
			l := out[name]
			l.holdings = append(l.holdings, h)
			if obj.GetLabels()[vmipamv1.HolderLabel] != mine {
				l.elsewhere = append(l.elsewhere, labelled{gvk: obj.GroupVersionKind(), key: client.ObjectKeyFromObject(obj), uid: obj.GetUID(), addr: h.Addr})
			}
			out[name] = l
		}
	})
	return out, err
}

// eachLive calls fn with every live object of a configured kind that carries
// an address, its holding and the pool stamped on it.
func (r *Registry) eachLive(ctx context.Context, fn func(obj *unstructured.Unstructured, h ipam.Holding, stamped string)) error {
	return r.eachObject(ctx, "", func(obj *unstructured.Unstructured) {
		if obj.GetDeletionTimestamp() != nil && !controllerutil.ContainsFinalizer(obj, vmipamv1.Finalizer) {
			return
		}
		hs, stamped := r.holdings(obj)
		for _, h := range hs {
			fn(obj, h, stamped)
		}
	})
}

// eachObject calls fn with every object of the configured kinds in namespace
// ns (every namespace when empty), read from the API server a page at a
// time. A kind whose CRD is not installed has none.
func (r *Registry) eachObject(ctx context.Context, ns string, fn func(obj *unstructured.Unstructured)) error {
	for _, t := range r.opts.Kinds {
		if t.ClusterScoped && ns != "" {
			continue
		}
		if err := r.eachOf(ctx, t, ns, fn); err != nil {
			return err
		}
	}
	return nil
}

func (r *Registry) eachOf(ctx context.Context, t kinds.Kind, ns string, fn func(obj *unstructured.Unstructured)) error {
	opts := []client.ListOption{client.Limit(listPage)}
	if ns != "" {
		opts = append(opts, client.InNamespace(ns))
	}
	for cont := ""; ; {
		list := t.NewList()
		if err := r.opts.APIReader.List(ctx, list, append(opts, client.Continue(cont))...); err != nil {
			if meta.IsNoMatchError(err) && !r.served(t.GVK) {
				// Its CRD is not installed, and never was while this
				// process ran: no object of it exists. A kind served
				// before and gone now is an error: its objects may still
				// hold addresses, which a listing without them would free.
				return nil
			}
			return fmt.Errorf("list %s: %w", t.GVR().GroupResource(), err)
		}
		for i := range list.Items {
			fn(&list.Items[i])
		}
		if cont = list.GetContinue(); cont == "" {
			return nil
		}
	}
}

// holdings reads the addresses (one per family at most), owner and
// stamped pool of obj. Addresses are taken in their canonical form: an
// object that bypassed the webhook with a second spelling of an address
// still holds that address.
func (r *Registry) holdings(obj *unstructured.Unstructured) ([]ipam.Holding, string) {
	t, ok := r.KindOf(obj.GroupVersionKind())
	if !ok {
		return nil, ""
	}
	addrs, err := t.Addresses(obj)
	if err != nil || len(addrs) == 0 {
		return nil, ""
	}
	ann := obj.GetAnnotations()
	owner := ipam.Owner{Token: ann[vmipamv1.TokenAnnotation], UID: string(obj.GetUID()), Ref: Ref(obj.GetNamespace(), obj.GetName())}
	var out []ipam.Holding
	for _, s := range addrs[:min(len(addrs), 2)] {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, ipam.Holding{Addr: ipam.Canonical(a), Owner: owner, Going: obj.GetDeletionTimestamp() != nil})
		}
	}
	return out, ann[vmipamv1.PoolAnnotation]
}

// Ref names an object in messages: namespace/name, or the name alone.
func Ref(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// Occupant is a live object holding an address of a pool (not a holder:
// that is a replica holding claims).
type Occupant struct {
	Namespace, Name string
	UID             types.UID
	Addr            netip.Addr
}

// Occupants returns the live objects holding addresses of the named pool,
// listed from the API server: for a pool being deleted, what it waits for.
func (r *Registry) Occupants(ctx context.Context, pool string) ([]Occupant, error) {
	p := r.Get(pool)
	var out []Occupant
	err := r.eachLive(ctx, func(obj *unstructured.Unstructured, h ipam.Holding, stamped string) {
		if stamped == pool || stamped == "" && p != nil && p.Ranges().Contains(h.Addr) {
			out = append(out, Occupant{Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: obj.GetUID(), Addr: h.Addr})
		}
	})
	return out, err
}
