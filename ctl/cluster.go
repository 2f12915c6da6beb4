package ctl

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	// Process is the pod holding a holder slot (--holder-slots).
	Process string `json:"process,omitempty"`
}

// holders reads the holder Leases in vmipam's namespace, by holder name.
func (o *Options) holders(ctx context.Context, r client.Reader) (map[string]Holder, error) {
	ls, err := pools.ReadHolderLeases(ctx, r, o.VMIPAMNamespace)
	if err != nil {
		return nil, err
	}
	now := o.Now()
	out := make(map[string]Holder, len(ls))
	for _, l := range ls {
		h := Holder{Name: l.Holder, Live: l.Live(now), Renewed: l.Renewed, Process: l.Process}
		// A takeover mark names its taker whether or not it lapsed: the
		// holder is not live either way.
		h.TakenOverBy, _ = strings.CutPrefix(l.Identity, pools.TakeoverPrefix)
		if h.TakenOverBy == l.Identity {
			h.TakenOverBy = ""
		}
		out[h.Name] = h
	}
	return out, nil
}

// kinds returns the kinds vmipam serves: --kinds-config's when given, else
// those the holder Leases publish (pools.KindsOf), else kinds.Default().
func (o *Options) kinds(ctx context.Context, r client.Reader) ([]kinds.Kind, error) {
	if o.KindsConfig != "" {
		ks, err := kinds.Load(o.KindsConfig)
		if err != nil {
			return nil, fmt.Errorf("--kinds-config: %w", err)
		}
		return ks, nil
	}
	ls, err := pools.ReadHolderLeases(ctx, r, o.VMIPAMNamespace)
	if err != nil {
		return nil, err
	}
	for _, l := range ls {
		if l.KindsErr != nil {
			return nil, fmt.Errorf("%w; give --kinds-config with vmipam's kinds configuration instead", l.KindsErr)
		}
	}
	return pools.KindsOf(ls), nil
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
