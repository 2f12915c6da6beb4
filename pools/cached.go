package pools

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/ipam"
)

// Cached is what a replica's informer caches hold of one kind: the
// objects labelled for it and the unlabelled ones (an object labelled for
// another replica is in neither).
type Cached interface {
	// EachCached calls fn with what a resync reads of every object of the
	// kind the caches hold (ObjectOf, or the same read from its metadata),
	// and reports false, having called fn or not, when the caches cannot
	// stand for that: they are not there yet, or too many of their objects
	// would have to be read from the API server. fn must not change o or
	// keep it.
	EachCached(ctx context.Context, fn func(o *Object)) (bool, error)
}

// SetCached gives the registry the caches of kind gvk, which its resyncs
// read between the lists of every object (see Options.FullResyncInterval).
func (r *Registry) SetCached(gvk schema.GroupVersionKind, c Cached) {
	r.servedMu.Lock()
	defer r.servedMu.Unlock()
	if r.cached == nil {
		r.cached = map[schema.GroupVersionKind]Cached{}
	}
	r.cached[gvk] = c
}

func (r *Registry) cachedOf(gvk schema.GroupVersionKind) Cached {
	r.servedMu.Lock()
	defer r.servedMu.Unlock()
	return r.cached[gvk]
}

// maxConfirms bounds the objects a resync from the caches reads from the
// API server, one Get each; with more, it lists every object instead.
const maxConfirms = maxWholeReads

// liveCached is liveIn for the pools ps (those with marks in asOf) without
// listing every object: it reads what this replica's caches hold, and
// then, from the API server, each object that an allocator holds an
// address allocated to, as of its mark, and that the caches lack. That is
// what a resync acts on: an allocated address whose object is in neither
// is released, and an object labelled for another replica, or for none,
// whose address is allocated to it here gets its label back. In the usual
// resync nothing is lacking, and no object is read. An object that holds
// an address that this replica does not hold allocated to it is only seen
// when it is in the caches (unlabelled, or labelled for this replica); one
// labelled for another replica waits for a full list.
//
// A resync adopts an address into what the list shows, so each object
// whose address it would adopt is read again from the API server too, in
// place of what the caches hold of it. Unlike a list, the caches may be
// older than the mark: after an outage of the API server they were seen
// to lag it by seconds, long enough for an object to be deleted, its
// address released, and its cooldown over, while the caches still showed
// it holding the address. Adopted from them, the address went to an object
// that was gone.
//
// It reports false when only a full list will do: a kind's caches are not
// there yet or cannot stand for one, an allocator has orphans (addresses
// that may be on any object: see ipam.Manager.Unseen), more than
// maxConfirms objects are to be read, or an owner's name is not known.
func (r *Registry) liveCached(ctx context.Context, ps []*Pool, ranges map[string]*ipam.Ranges, asOf map[string][]uint64) (map[string]live, bool, error) {
	c, ok, err := r.cachedIn(ctx, ranges)
	if err != nil || !ok {
		return nil, false, err
	}
	add := func(obj *unstructured.Unstructured) { r.eachHolding(obj, c.add) }
	// The objects to read from the API server, by UID: those the caches
	// lack that hold an address allocated here, and those whose address
	// a resync would adopt (the caches may be older than the mark).
	again := map[string]string{}
	for _, p := range ps {
		marks, ok := asOf[p.name]
		if !ok {
			continue
		}
		hs := c.out[p.name].holdings
		miss, orphans := p.unseen(hs, marks)
		if orphans {
			return nil, false, nil
		}
		// An object's own name, where a cache shows it, is preferred to
		// the one its allocator recorded.
		for _, h := range p.adopting(hs, marks) {
			again[h.Owner.UID] = h.Owner.Ref
		}
		for _, tn := range miss {
			if _, ok := again[tn.Owner.UID]; !ok {
				again[tn.Owner.UID] = tn.Owner.Ref
			}
		}
		if len(again) > maxConfirms {
			return nil, false, nil
		}
	}
	if len(again) == 0 {
		return c.done(), true, nil
	}
	c.drop(again)
	for uid, ref := range again {
		ns, name := splitRef(ref)
		if name == "" {
			return nil, false, nil
		}
		if err := r.readOwner(ctx, ns, name, uid, add); err != nil {
			return nil, false, err
		}
	}
	return c.done(), true, nil
}

// cachedIn collects the holdings of the pools named in ranges from what
// this replica's caches hold, and reports false when a kind's caches cannot
// stand for a list (see Cached). A kind not served yet as far as this
// process knows has no caches, and is listed: its CRD is not installed
// (the list finds no kind, at the cost of a request), or was just now.
func (r *Registry) cachedIn(ctx context.Context, ranges map[string]*ipam.Ranges) (*collector, bool, error) {
	c := r.newCollector(ranges)
	add := func(o *Object) { eachHeld(o, c.add) }
	for _, t := range r.opts.Kinds {
		if !r.served(t.GVK) {
			if err := r.eachOf(ctx, t, "", add); err != nil {
				return nil, false, err
			}
			continue
		}
		src := r.cachedOf(t.GVK)
		if src == nil {
			return nil, false, nil
		}
		ok, err := src.EachCached(ctx, add)
		if err != nil || !ok {
			return nil, false, err
		}
	}
	return c, true, nil
}

// readOwner calls fn with the object of a configured kind named ns/name
// whose UID is uid, read from the API server, if there is one. The pools
// do not record an owner's kind, so each kind is read.
func (r *Registry) readOwner(ctx context.Context, ns, name, uid string, fn func(obj *unstructured.Unstructured)) error {
	for _, t := range r.opts.Kinds {
		if t.ClusterScoped != (ns == "") {
			continue
		}
		obj := t.New()
		if err := r.opts.APIReader.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, obj); err != nil {
			if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) && !r.served(t.GVK) {
				continue // see eachPage
			}
			return fmt.Errorf("get %s %s: %w", t.GVR().GroupResource(), Ref(ns, name), err)
		}
		if string(obj.GetUID()) == uid {
			fn(obj)
		}
	}
	return nil
}
