package ctl

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/pools"
)

// pageSize is how many objects one List call asks for: pages keep a
// command's memory and the API server's work per call bounded on clusters
// of many thousands of VMs.
const pageSize = 500

// Holder is what a holder Lease says of its replica.
type Holder struct {
	// Name is the holder, as its claims name it.
	Name string `json:"name"`
	// Live reports that the Lease was renewed within its duration.
	Live bool `json:"live"`
	// Renewed is the last renewal.
	Renewed time.Time `json:"renewed,omitzero"`
	// TakenOverBy names the replica taking this one's claims over, if one
	// is.
	TakenOverBy string `json:"takenOverBy,omitempty"`
	// kinds is the Lease's KindsAnnotation.
	kinds string
}

// holders reads the holder Leases in vmipam's namespace, by holder name.
func (o *Options) holders(ctx context.Context, r client.Reader) (map[string]Holder, error) {
	var list coordinationv1.LeaseList
	if err := r.List(ctx, &list, client.InNamespace(o.VMIPAMNamespace), client.MatchingLabels{pools.HolderLeaseLabel: "true"}); err != nil {
		return nil, fmt.Errorf("list the holder Leases in namespace %s: %w", o.VMIPAMNamespace, err)
	}
	out := make(map[string]Holder, len(list.Items))
	for i := range list.Items {
		h := holderOf(&list.Items[i], o.Now())
		out[h.Name] = h
	}
	return out, nil
}

// holderOf reads one holder Lease at now. The holder's name is the
// Lease's name past pools.LeaseName's prefix, which stays when a takeover
// rewrites the holder identity.
func holderOf(l *coordinationv1.Lease, now time.Time) Holder {
	h := Holder{Name: strings.TrimPrefix(l.Name, pools.LeaseName("")), kinds: l.Annotations[pools.KindsAnnotation]}
	id := ptr.Deref(l.Spec.HolderIdentity, "")
	if taker, ok := strings.CutPrefix(id, pools.TakeoverPrefix); ok {
		h.TakenOverBy = taker
	}
	if l.Spec.RenewTime != nil {
		h.Renewed = l.Spec.RenewTime.Time
		d := time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, int32(pools.DefaultLeaseDuration/time.Second))) * time.Second
		h.Live = id == h.Name && !now.After(h.Renewed.Add(d))
	}
	return h
}

// kinds returns the kinds vmipam serves: --kinds-config's when given, else
// those the holder Leases publish (the union, by kind, the most recently
// renewed Lease's description winning), else kinds.Default().
func (o *Options) kinds(ctx context.Context, r client.Reader) ([]kinds.Kind, error) {
	if o.KindsConfig != "" {
		ks, err := kinds.Load(o.KindsConfig)
		if err != nil {
			return nil, fmt.Errorf("--kinds-config: %w", err)
		}
		return ks, nil
	}
	hs, err := o.holders(ctx, r)
	if err != nil {
		return nil, err
	}
	return kindsOf(hs)
}

// kindsOf merges the kinds the holders publish.
func kindsOf(hs map[string]Holder) ([]kinds.Kind, error) {
	byRenewal := slices.SortedFunc(func(yield func(Holder) bool) {
		for _, h := range hs {
			if h.kinds != "" && !yield(h) {
				return
			}
		}
	}, func(a, b Holder) int { return cmp.Or(b.Renewed.Compare(a.Renewed), strings.Compare(a.Name, b.Name)) })
	var out []kinds.Kind
	for _, h := range byRenewal {
		var ks []kinds.Kind
		if err := json.Unmarshal([]byte(h.kinds), &ks); err != nil {
			return nil, fmt.Errorf("the kinds on the Lease of holder %s (annotation %s): %w; give --kinds-config with vmipam's kinds configuration instead", h.Name, pools.KindsAnnotation, err)
		}
		for _, k := range ks {
			if !slices.ContainsFunc(out, func(o kinds.Kind) bool { return o.GVK == k.GVK }) {
				out = append(out, k)
			}
		}
	}
	return kinds.OrDefault(out), nil
}

// Holding is a live object that carries an address.
type Holding struct {
	Kind      string    `json:"kind"`
	Namespace string    `json:"namespace,omitempty"`
	Name      string    `json:"name"`
	UID       string    `json:"uid"`
	Created   time.Time `json:"created"`
	// Deleting reports a deletion that waits for vmipam's finalizer.
	Deleting bool `json:"deleting,omitempty"`
	// Holder is the object's holder label: the replica that watches it.
	Holder string `json:"holder,omitempty"`
}

// Ref is the object as namespace/name.
func (h Holding) Ref() string {
	if h.Namespace == "" {
		return h.Name
	}
	return h.Namespace + "/" + h.Name
}

// kindName is "Kind.group" as the history records it.
func kindName(k kinds.Kind) string {
	if k.GVK.Group == "" {
		return k.GVK.Kind
	}
	return k.GVK.Kind + "." + k.GVK.Group
}

// holdersOf lists every object of ks, a page at a time, and returns those
// that carry addr. A kind the API server does not serve is skipped: its
// objects cannot exist.
func holdersOf(ctx context.Context, r client.Reader, ks []kinds.Kind, addr netip.Addr) ([]Holding, error) {
	var out []Holding
	for _, k := range ks {
		err := eachObject(ctx, r, k, func(obj *unstructured.Unstructured) {
			addrs, err := k.Addresses(obj)
			if err != nil {
				return
			}
			for _, s := range addrs {
				if a, err := netip.ParseAddr(s); err == nil && a.Unmap() == addr {
					out = append(out, Holding{
						Kind: kindName(k), Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: string(obj.GetUID()),
						Created: obj.GetCreationTimestamp().Time, Deleting: obj.GetDeletionTimestamp() != nil,
						Holder: obj.GetLabels()[vmipamv1.HolderLabel],
					})
					return
				}
			}
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// eachObject calls fn for every object of k, listing pageSize at a time.
func eachObject(ctx context.Context, r client.Reader, k kinds.Kind, fn func(*unstructured.Unstructured)) error {
	cont := ""
	for {
		list := k.NewList()
		err := r.List(ctx, list, client.Limit(pageSize), client.Continue(cont))
		switch {
		case err == nil:
		case isNotServed(err):
			return nil
		default:
			return fmt.Errorf("list %s: %w", k.Resource, err)
		}
		for i := range list.Items {
			fn(&list.Items[i])
		}
		if cont = list.GetContinue(); cont == "" {
			return nil
		}
	}
}

// isNotServed reports an error listing a kind the API server does not
// serve (its CRD is not installed).
func isNotServed(err error) bool { return meta.IsNoMatchError(err) || apierrors.IsNotFound(err) }
