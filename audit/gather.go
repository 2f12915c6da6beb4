package audit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/pools"
)

// pageSize is the page of every list.
const pageSize = 500

// gather reads the cluster into a snapshot. The order matters to the
// rules (see decide.go): the objects of the configured kinds first, then
// the IPPools, the IPBlocks before the IPBlockShares (as kubestore reads
// them: a holder writes its share before the IPBlock), then the Leases,
// then the objects of other kinds. The kinds come from the Leases when
// the options name none, so the Leases are read once before the objects
// for them, and again after the blocks.
func gather(ctx context.Context, src Sources, opts Options) (*snapshot, error) {
	s := &snapshot{grace: opts.Grace, namespace: opts.Namespace, pools: map[string]pool{}}
	ks := opts.Kinds
	if ks == nil {
		leases, err := pools.ReadHolderLeases(ctx, src.Reader, opts.Namespace)
		if err != nil {
			return nil, err
		}
		ks = pools.KindsOf(leases)
	}
	s.listed = time.Now() //nolint:forbidigo // compared with the API server's times, across processes
	for _, t := range ks {
		if err := eachPage(ctx, src.Reader, t.NewList, nil, func(u *unstructured.Unstructured) {
			s.objects = append(s.objects, objectOf(t, u))
		}); err != nil {
			return nil, fmt.Errorf("list %s: %w", t.Resource, err)
		}
	}
	if err := readPools(ctx, src.Reader, s); err != nil {
		return nil, err
	}
	if err := readBlocks(ctx, src.Reader, s); err != nil {
		return nil, err
	}
	leases, err := pools.ReadHolderLeases(ctx, src.Reader, opts.Namespace)
	if err != nil {
		return nil, err
	}
	s.now = time.Now() //nolint:forbidigo // leases are real time, compared across processes
	s.leases = map[string]pools.HolderLease{}
	for _, l := range leases {
		s.leases[l.Holder] = l
	}
	if src.Discovery != nil && src.Metadata != nil {
		if err := readMarked(ctx, src, ks, s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// objectOf reads what the rules need of u, an object of kind t.
func objectOf(t kinds.Kind, u *unstructured.Unstructured) object {
	o := object{
		kind: kindName(t.GVK), resource: resourceName(t.GVK.Group, t.Resource),
		namespace: u.GetNamespace(), name: u.GetName(), uid: string(u.GetUID()),
		created: u.GetCreationTimestamp().Time, deleting: u.GetDeletionTimestamp() != nil,
		inScope:   t.InScope(u),
		finalizer: slices.Contains(u.GetFinalizers(), vmipamv1.Finalizer),
	}
	o.label, o.labelled = u.GetLabels()[vmipamv1.HolderLabel]
	// An address that does not read is not one vmipam gave (its webhook
	// and admission policy refuse it): it is left out.
	addrs, _ := t.Addresses(u)
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(strings.TrimSpace(a)); err == nil {
			o.addrs = append(o.addrs, ipam.Canonical(ip))
		}
	}
	return o
}

// kindName spells gvk as "Kind.group".
func kindName(gvk schema.GroupVersionKind) string {
	if gvk.Group == "" {
		return gvk.Kind
	}
	return gvk.Kind + "." + gvk.Group
}

// resourceName spells a resource as kubectl takes it, "resource.group".
func resourceName(group, resource string) string {
	if group == "" {
		return resource
	}
	return resource + "." + group
}

// eachPage lists newList's objects a page at a time, calling fn for each.
func eachPage(ctx context.Context, r client.Reader, newList func() *unstructured.UnstructuredList, opts []client.ListOption, fn func(*unstructured.Unstructured)) error {
	for cont := ""; ; {
		l := newList()
		if err := r.List(ctx, l, append(slices.Clone(opts), client.Limit(pageSize), client.Continue(cont))...); err != nil {
			return err
		}
		for i := range l.Items {
			fn(&l.Items[i])
		}
		if cont = l.GetContinue(); cont == "" {
			return nil
		}
	}
}

// lastWrite is the time of the latest write that changed obj through its
// main resource (its status writes left out), rounded up to the second:
// managedFields times are truncated to seconds. Without managed fields
// (a server that keeps none), the creation time, also rounded up: the
// rules that use it then count from the object's creation, which may be
// too early, so they are skipped instead (zero means unknown; see
// unknownWrite).
func lastWrite(m metav1.Object) time.Time {
	var t time.Time
	for _, f := range m.GetManagedFields() {
		if f.Subresource != "" || f.Time == nil {
			continue
		}
		if f.Time.After(t) {
			t = f.Time.Time
		}
	}
	if t.IsZero() {
		return unknownWrite
	}
	return t.Add(time.Second)
}

// unknownWrite is the last write of an object without managed fields:
// far in the future, so that no rule counts time from it.
var unknownWrite = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// readPools reads the IPPools.
func readPools(ctx context.Context, r client.Reader, s *snapshot) error {
	var l vmipamv1.IPPoolList
	if err := r.List(ctx, &l); err != nil {
		return fmt.Errorf("list IPPools: %w", err)
	}
	for i := range l.Items {
		p := &l.Items[i]
		ttl := ipam.DefaultPendingTTL
		if p.Spec.PendingTTL != nil {
			ttl = p.Spec.PendingTTL.Duration
		}
		rs, err := ipam.ParseRanges(pools.RangeSpecs(p.Spec.Ranges))
		if err != nil {
			rs = nil
		}
		s.pools[p.Name] = pool{name: p.Name, ranges: rs, pendingTTL: ttl, specWritten: lastWrite(p)}
	}
	return nil
}

// readBlocks reads the IPBlocks, then the IPBlockShares, and merges them
// as vmipam does (kubestore.Read, over what was read).
func readBlocks(ctx context.Context, r client.Reader, s *snapshot) error {
	var blocks []vmipamv1.IPBlock
	for cont := ""; ; {
		var l vmipamv1.IPBlockList
		if err := r.List(ctx, &l, client.Limit(pageSize), client.Continue(cont)); err != nil {
			return fmt.Errorf("list IPBlocks: %w", err)
		}
		blocks = append(blocks, l.Items...)
		if cont = l.Continue; cont == "" {
			break
		}
	}
	var shares []vmipamv1.IPBlockShare
	for cont := ""; ; {
		var l vmipamv1.IPBlockShareList
		if err := r.List(ctx, &l, client.Limit(pageSize), client.Continue(cont)); err != nil {
			return fmt.Errorf("list IPBlockShares: %w", err)
		}
		shares = append(shares, l.Items...)
		if cont = l.Continue; cont == "" {
			break
		}
	}
	s.ipblocks = len(blocks)
	type key struct{ pool, prefix, holder string }
	shareOf := map[key]*vmipamv1.IPBlockShare{}
	hasBlock := map[[2]string]bool{}
	byPool := map[string]bool{}
	for i := range blocks {
		hasBlock[[2]string{blocks[i].Spec.Pool, blocks[i].Spec.Prefix}] = true
		byPool[blocks[i].Spec.Pool] = true
	}
	for i := range shares {
		sh := &shares[i]
		shareOf[key{sh.Spec.Pool, sh.Spec.Prefix, sh.Spec.Holder}] = sh
		if !hasBlock[[2]string{sh.Spec.Pool, sh.Spec.Prefix}] {
			s.orphans = append(s.orphans, share{pool: sh.Spec.Pool, name: sh.Name, prefix: sh.Spec.Prefix, holder: sh.Spec.Holder, written: lastWrite(sh)})
		}
	}
	// The merge is kubestore's, over the lists already read: the same
	// rules as vmipam's own reads, on the same objects.
	seen := &listed{blocks: blocks, shares: shares}
	raw := map[[2]string]*vmipamv1.IPBlock{}
	for i := range blocks {
		raw[[2]string{blocks[i].Spec.Pool, blocks[i].Spec.Prefix}] = &blocks[i]
	}
	for name := range byPool {
		merged, err := kubestore.Read(ctx, seen, name)
		if err != nil {
			return fmt.Errorf("read the blocks of pool %s: %w", name, err)
		}
		for _, b := range merged {
			obj := raw[[2]string{name, b.Prefix.String()}]
			if obj == nil {
				// Its spec.prefix is spelt otherwise; find it by name.
				for i := range blocks {
					if blocks[i].Name == kubestore.BlockName(name, b.Prefix) {
						obj = &blocks[i]
					}
				}
			}
			if obj == nil {
				continue
			}
			bl := block{pool: name, name: obj.Name, b: b, written: lastWrite(obj), holders: map[string]part{}}
			for h := range b.Claims {
				pt := part{written: bl.written, exact: b.Exact}
				if slices.Contains(obj.Spec.Shares, h) {
					sh := shareOf[key{name, obj.Spec.Prefix, h}]
					pt.exact = sh != nil
					if sh != nil {
						pt.written = lastWrite(sh)
					}
				}
				bl.holders[h] = pt
			}
			s.blocks = append(s.blocks, bl)
		}
	}
	slices.SortFunc(s.blocks, func(a, b block) int { return strings.Compare(a.name, b.name) })
	return nil
}

// listed serves lists already read to kubestore.Read, as a client.Reader
// of IPBlocks and IPBlockShares filtered by their label selector.
type listed struct {
	blocks []vmipamv1.IPBlock
	shares []vmipamv1.IPBlockShare
}

var _ client.Reader = (*listed)(nil)

func (l *listed) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("get: only lists are served")
}

func (l *listed) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	match := func(m metav1.Object) bool {
		return o.LabelSelector == nil || o.LabelSelector.Matches(labels.Set(m.GetLabels()))
	}
	switch list := list.(type) {
	case *vmipamv1.IPBlockList:
		list.Items = nil
		for i := range l.blocks {
			if match(&l.blocks[i]) {
				list.Items = append(list.Items, *l.blocks[i].DeepCopy())
			}
		}
	case *vmipamv1.IPBlockShareList:
		list.Items = nil
		for i := range l.shares {
			if match(&l.shares[i]) {
				list.Items = append(list.Items, *l.shares[i].DeepCopy())
			}
		}
	default:
		return fmt.Errorf("list %T: only IPBlocks and IPBlockShares are served", list)
	}
	return nil
}

// readMarked finds the objects of kinds other than ks that carry vmipam's
// holder label, through discovery (every listable resource) and metadata
// lists. vmipam's own kinds but VirtualMachine are skipped, and so are the
// holder Leases (whose label has the same key). An object carrying only
// vmipam's finalizer is not found: no selector finds it short of listing
// every object of every kind.
func readMarked(ctx context.Context, src Sources, ks []kinds.Kind, s *snapshot) error {
	served := map[schema.GroupKind]bool{}
	for _, t := range ks {
		served[t.GVK.GroupKind()] = true
	}
	lists, err := src.Discovery.ServerPreferredResources()
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return fmt.Errorf("discover the resources: %w", err)
	}
	req, err := labels.NewRequirement(vmipamv1.HolderLabel, selection.Exists, nil)
	if err != nil {
		return fmt.Errorf("select %s: %w", vmipamv1.HolderLabel, err)
	}
	sel := labels.NewSelector().Add(*req).String()
	for _, rl := range lists {
		gv, err := schema.ParseGroupVersion(rl.GroupVersion)
		if err != nil {
			continue
		}
		for _, res := range rl.APIResources {
			gk := schema.GroupKind{Group: gv.Group, Kind: res.Kind}
			switch {
			case strings.Contains(res.Name, "/"), !slices.Contains(res.Verbs, "list"), served[gk]:
				continue
			case gv.Group == vmipamv1.GroupVersion.Group && res.Kind != "VirtualMachine":
				continue
			case gv.Group == coordinationv1.GroupName && res.Kind == "Lease":
				continue
			}
			gvr := gv.WithResource(res.Name)
			for cont := ""; ; {
				l, err := src.Metadata.Resource(gvr).List(ctx, metav1.ListOptions{LabelSelector: sel, Limit: pageSize, Continue: cont})
				if err != nil {
					return fmt.Errorf("list %s labelled %s: %w", resourceName(gv.Group, res.Name), vmipamv1.HolderLabel, err)
				}
				for i := range l.Items {
					m := &l.Items[i]
					o := object{
						kind: kindName(gv.WithKind(res.Kind)), resource: resourceName(gv.Group, res.Name),
						namespace: m.Namespace, name: m.Name, uid: string(m.UID), created: m.CreationTimestamp.Time,
						deleting: m.DeletionTimestamp != nil, finalizer: slices.Contains(m.Finalizers, vmipamv1.Finalizer),
						finalizers: slices.Clone(m.Finalizers),
					}
					o.label, o.labelled = m.Labels[vmipamv1.HolderLabel]
					s.marked = append(s.marked, o)
				}
				if cont = l.Continue; cont == "" {
					break
				}
			}
		}
	}
	return nil
}
