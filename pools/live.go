package pools

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
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
	c := r.newCollector(pools)
	if err := r.eachLive(ctx, c.add); err != nil {
		return nil, err
	}
	return c.done(), nil
}

// collector sorts the holdings of live objects into the pools they belong
// to: those stamped with a pool, and unstamped ones inside its ranges.
type collector struct {
	pools map[string]*ipam.Ranges
	mine  string
	out   map[string]live
	// held is the Registry's record of the last collections' sizes.
	held *sync.Map
}

// newCollector returns a collector for pools, each pool's holdings sized
// for as many as the last collection found there.
func (r *Registry) newCollector(pools map[string]*ipam.Ranges) *collector {
	c := &collector{pools: pools, mine: r.holderLabel, out: make(map[string]live, len(pools)), held: &r.held}
	for name := range pools {
		if n, ok := r.held.Load(name); ok {
			c.out[name] = live{holdings: make([]ipam.Holding, 0, n.(int))}
		}
	}
	return c
}

// done records how many holdings each pool has, for the next collection,
// and returns them.
func (c *collector) done() map[string]live {
	for name := range c.pools {
		c.held.Store(name, len(c.out[name].holdings))
	}
	return c.out
}

// add records holding h of o, which is stamped with pool o.Pool (or
// none).
func (c *collector) add(o *Object, h ipam.Holding) {
	for name, ranges := range c.pools {
		if o.Pool != name && (o.Pool != "" || !ranges.Contains(h.Addr)) {
			continue
		}
		l := c.out[name]
		l.holdings = append(l.holdings, h)
		if o.Holder != c.mine {
			l.elsewhere = append(l.elsewhere, labelled{gvk: o.GVK, key: client.ObjectKey{Namespace: o.Namespace, Name: o.Name}, uid: o.UID, addr: h.Addr})
		}
		c.out[name] = l
	}
}

// drop forgets the holdings of the objects whose UIDs are keys of uids:
// they are read again.
func (c *collector) drop(uids map[string]string) {
	for name, l := range c.out {
		l.holdings = slices.DeleteFunc(l.holdings, func(h ipam.Holding) bool { _, ok := uids[h.Owner.UID]; return ok })
		l.elsewhere = slices.DeleteFunc(l.elsewhere, func(o labelled) bool { _, ok := uids[string(o.uid)]; return ok })
		c.out[name] = l
	}
}

// eachLive calls fn with every live object of a configured kind that carries
// an address, as far as a resync reads it, and each of its holdings.
func (r *Registry) eachLive(ctx context.Context, fn func(o *Object, h ipam.Holding)) error {
	return r.eachObject(ctx, "", func(o *Object) { eachHeld(o, fn) })
}

// eachHolding calls fn with obj, as far as a resync reads it, and each of
// its holdings, if obj is of a configured kind and live (see eachHeld).
func (r *Registry) eachHolding(obj *unstructured.Unstructured, fn func(o *Object, h ipam.Holding)) {
	t, ok := r.KindOf(obj.GroupVersionKind())
	if !ok {
		return
	}
	o := ObjectOf(t, obj)
	eachHeld(&o, fn)
}

// eachHeld calls fn with o and each of its holdings, if o is live: an
// object being deleted still holds its address until the controller
// releases it, which it does before it removes vmipam's finalizer.
func eachHeld(o *Object, fn func(o *Object, h ipam.Holding)) {
	if o.Deleting && !o.Finalized {
		return
	}
	for _, h := range o.holdings() {
		fn(o, h)
	}
}

// Object is what a resync reads of one object of a configured kind: who
// it is, which replica its holder label names, and what it holds. A
// replica's caches give it straight from an object's metadata where that
// suffices (see Cached), the others from the whole object (ObjectOf).
type Object struct {
	GVK             schema.GroupVersionKind
	Namespace, Name string
	UID             types.UID
	// Holder is the value of its holder label (vmipamv1.HolderLabel), if
	// any.
	Holder string
	// Addresses are those at its kind's location, as kinds.Kind.Addresses
	// reads them: none when they cannot be read.
	Addresses []string
	// Token and Pool are vmipam's token and pool annotations.
	Token, Pool string
	// Deleting: its deletion began. Finalized: it carries vmipam's
	// finalizer.
	Deleting, Finalized bool
}

// MetadataObject reads what a resync reads of the object of kind t that m
// is the metadata of, as ObjectOf reads what kinds.Kind.FromMetadata
// rebuilds of it, without rebuilding it; false where that reports false
// (no stamp: read the whole object). When holder is not empty and m has no
// labels, it reads holder as the holder label (see kinds.Kind.TrimOwn and
// OwnFromMetadata).
func MetadataObject(t kinds.Kind, m *metav1.PartialObjectMetadata, holder string) (Object, bool) {
	addrs, ok := t.MetadataAddresses(m)
	if !ok {
		return Object{}, false
	}
	label := m.Labels[vmipamv1.HolderLabel]
	if m.Labels == nil {
		label = holder
	}
	return Object{
		GVK: t.GVK, Namespace: m.Namespace, Name: m.Name, UID: m.UID, Holder: label, Addresses: addrs,
		Token: m.Annotations[vmipamv1.TokenAnnotation], Pool: m.Annotations[vmipamv1.PoolAnnotation],
		Deleting: m.DeletionTimestamp != nil, Finalized: slices.Contains(m.Finalizers, vmipamv1.Finalizer),
	}, true
}

// ObjectOf reads what a resync reads of obj, of kind t: its GVK is t's,
// whether or not obj carries one (an object of a cache's list may not).
func ObjectOf(t kinds.Kind, obj *unstructured.Unstructured) Object {
	addrs, err := t.Addresses(obj)
	if err != nil {
		addrs = nil
	}
	md, _ := obj.Object["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	lbl, _ := md["labels"].(map[string]any)
	str := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }
	return Object{
		GVK: t.GVK, Namespace: str(md, "namespace"), Name: str(md, "name"), UID: types.UID(str(md, "uid")),
		Holder: str(lbl, vmipamv1.HolderLabel), Addresses: addrs,
		Token: str(ann, vmipamv1.TokenAnnotation), Pool: str(ann, vmipamv1.PoolAnnotation),
		Deleting: obj.GetDeletionTimestamp() != nil, Finalized: controllerutil.ContainsFinalizer(obj, vmipamv1.Finalizer),
	}
}

// holdings reads o's addresses (one per family at most) in their
// canonical form: an object that bypassed the webhook with a second
// spelling of an address still holds that address.
func (o *Object) holdings() []ipam.Holding {
	if len(o.Addresses) == 0 {
		return nil
	}
	owner := ipam.Owner{Token: o.Token, UID: string(o.UID), Ref: Ref(o.Namespace, o.Name)}
	out := make([]ipam.Holding, 0, min(len(o.Addresses), 2))
	for _, s := range o.Addresses[:min(len(o.Addresses), 2)] {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, ipam.Holding{Addr: ipam.Canonical(a), Owner: owner, Going: o.Deleting})
		}
	}
	return out
}

// eachObject calls fn with every object of the configured kinds in namespace
// ns (every namespace when empty), read from the API server a page at a
// time. A kind whose CRD is not installed has none.
func (r *Registry) eachObject(ctx context.Context, ns string, fn func(o *Object)) error {
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

// eachOf calls fn with every object of kind t in namespace ns (every
// namespace when empty), each once, read from the API server.
//
// A kind whose stamped objects can be read from their metadata
// (kinds.Kind.MetadataSuffices) is listed in two passes that see every
// object, as one list of whole objects would, at a fraction of the cost:
// first the whole objects without a holder label (those that bypassed the
// webhook or that vmipam does not manage: their address, if any, is only
// at its location), then every object as metadata, which the API server
// encodes as protobuf even for a custom resource (a whole one comes as
// JSON, and decoding it is most of a list's cost on both sides). An
// object in the second pass that carries vmipam's address annotation is
// read from its metadata (MetadataObject); one without it that
// the first pass did not see (labelled meanwhile, or adopted after it
// bypassed the webhook) is read whole again, by a Get each, or by one
// more list when there are more than maxWholeReads of them. An object
// live through both passes is seen in one of them, whatever happened to
// its label meanwhile.
func (r *Registry) eachOf(ctx context.Context, t kinds.Kind, ns string, fn func(o *Object)) error {
	if !t.MetadataSuffices() {
		return r.eachWhole(ctx, t, ns, nil, func(obj *unstructured.Unstructured) {
			o := ObjectOf(t, obj)
			fn(&o)
		})
	}
	seen := map[types.UID]bool{}
	once := func(o *Object) {
		if !seen[o.UID] {
			seen[o.UID] = true
			fn(o)
		}
	}
	wholeOnce := func(obj *unstructured.Unstructured) {
		o := ObjectOf(t, obj)
		once(&o)
	}
	unlabelled, err := Unlabelled()
	if err != nil {
		return err
	}
	if err := r.eachWhole(ctx, t, ns, unlabelled, wholeOnce); err != nil {
		return err
	}
	var whole []client.ObjectKey
	err = r.eachPage(ctx, t, ns, func() client.ObjectList {
		l := &metav1.PartialObjectMetadataList{}
		l.SetGroupVersionKind(t.GVK.GroupVersion().WithKind(t.GVK.Kind + "List"))
		return l
	}, func(list client.ObjectList) {
		for i := range list.(*metav1.PartialObjectMetadataList).Items {
			m := &list.(*metav1.PartialObjectMetadataList).Items[i]
			if seen[m.UID] {
				continue
			}
			if o, ok := MetadataObject(t, m, ""); ok {
				once(&o)
			} else {
				whole = append(whole, client.ObjectKey{Namespace: m.Namespace, Name: m.Name})
			}
		}
	})
	if err != nil || len(whole) == 0 {
		return err
	}
	if len(whole) > maxWholeReads {
		return r.eachWhole(ctx, t, ns, nil, wholeOnce)
	}
	return t.ReadUnstamped(ctx, r.opts.APIReader, whole, wholeOnce)
}

// maxWholeReads bounds the objects eachOf reads whole one at a time after
// its passes; more are read in one list of whole objects instead.
const maxWholeReads = 100

// eachWhole calls fn with every whole object of kind t in namespace ns
// (every namespace when empty) that sel selects (every one when nil).
func (r *Registry) eachWhole(ctx context.Context, t kinds.Kind, ns string, sel labels.Selector, fn func(obj *unstructured.Unstructured)) error {
	var opts []client.ListOption
	if sel != nil {
		opts = append(opts, client.MatchingLabelsSelector{Selector: sel})
	}
	return r.eachPage(ctx, t, ns, func() client.ObjectList { return t.NewList() }, func(list client.ObjectList) {
		for i := range list.(*unstructured.UnstructuredList).Items {
			fn(&list.(*unstructured.UnstructuredList).Items[i])
		}
	}, opts...)
}

// eachPage lists kind t in namespace ns from the API server a page at a
// time, into lists that newList makes, and calls fn with each page. A kind
// whose CRD is not installed has none.
func (r *Registry) eachPage(ctx context.Context, t kinds.Kind, ns string, newList func() client.ObjectList, fn func(client.ObjectList), opts ...client.ListOption) error {
	opts = append(opts, client.Limit(listPage))
	if ns != "" {
		opts = append(opts, client.InNamespace(ns))
	}
	for cont := ""; ; {
		list := newList()
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
		fn(list)
		if cont = list.GetContinue(); cont == "" {
			return nil
		}
	}
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
	err := r.eachLive(ctx, func(o *Object, h ipam.Holding) {
		if o.Pool == pool || o.Pool == "" && p != nil && p.Ranges().Contains(h.Addr) {
			out = append(out, Occupant{Namespace: o.Namespace, Name: o.Name, UID: o.UID, Addr: h.Addr})
		}
	})
	return out, err
}
