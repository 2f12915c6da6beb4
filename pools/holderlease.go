package pools

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/kinds"
)

// HolderLease is a holder's Lease as a tool reading the cluster sees it
// (kubectl vmipam): who holds it, when it was last renewed, and what its
// holder publishes.
type HolderLease struct {
	// Holder is the Lease's holder: its name past LeaseName's prefix,
	// which stays while another holder writes its takeover mark on it.
	Holder string
	// Identity is spec.holderIdentity: the holder itself, or
	// TakeoverPrefix and the holder taking its claims over.
	Identity string
	Renewed  time.Time
	Duration time.Duration
	// Process names the process (the pod) holding a holder slot
	// (ProcessAnnotation); empty for a holder named after its pod.
	Process string
	// Kinds are the kinds the holder serves (KindsAnnotation); nil when it
	// publishes none, and KindsErr says why they could not be read.
	Kinds    []kinds.Kind
	KindsErr error
}

// Live reports whether the holder renewed its Lease itself within its
// duration at now.
func (l HolderLease) Live(now time.Time) bool {
	return l.Identity == l.Holder && !now.After(l.Renewed.Add(l.Duration))
}

// TakenOverBy returns the holder taking l's claims over at now: its
// takeover mark, which it renews as it goes, has not lapsed.
func (l HolderLease) TakenOverBy(now time.Time) (string, bool) {
	taker, ok := strings.CutPrefix(l.Identity, TakeoverPrefix)
	return taker, ok && !now.After(l.Renewed.Add(l.Duration))
}

// ReadHolderLeases reads the holder Leases of namespace ns with r, sorted
// by holder.
func ReadHolderLeases(ctx context.Context, r client.Reader, ns string) ([]HolderLease, error) {
	var list coordinationv1.LeaseList
	if err := r.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{HolderLeaseLabel: "true"}); err != nil {
		return nil, fmt.Errorf("list the holder Leases in namespace %s: %w", ns, err)
	}
	out := make([]HolderLease, 0, len(list.Items))
	for i := range list.Items {
		obj := &list.Items[i]
		holder, ok := strings.CutPrefix(obj.Name, LeaseName(""))
		if !ok {
			continue
		}
		l := HolderLease{
			Holder: holder, Identity: ptr.Deref(obj.Spec.HolderIdentity, ""), Process: obj.Annotations[ProcessAnnotation],
			Duration: time.Duration(ptr.Deref(obj.Spec.LeaseDurationSeconds, int32(DefaultLeaseDuration/time.Second))) * time.Second,
		}
		if obj.Spec.RenewTime != nil {
			l.Renewed = obj.Spec.RenewTime.Time
		}
		if raw := obj.Annotations[KindsAnnotation]; raw != "" {
			if err := json.Unmarshal([]byte(raw), &l.Kinds); err != nil {
				l.Kinds, l.KindsErr = nil, fmt.Errorf("the kinds on the Lease of holder %s (annotation %s): %w", holder, KindsAnnotation, err)
			}
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b HolderLease) int { return cmp.Compare(a.Holder, b.Holder) })
	return out, nil
}

// KindsOf is the union, by kind, of the kinds ls publish, the most
// recently renewed Lease's description of a kind winning; kinds.Default()
// when none publishes any.
func KindsOf(ls []HolderLease) []kinds.Kind {
	byRenewal := slices.Clone(ls)
	slices.SortStableFunc(byRenewal, func(a, b HolderLease) int { return b.Renewed.Compare(a.Renewed) })
	var out []kinds.Kind
	for _, l := range byRenewal {
		for _, k := range l.Kinds {
			if !slices.ContainsFunc(out, func(o kinds.Kind) bool { return o.GVK == k.GVK }) {
				out = append(out, k)
			}
		}
	}
	return kinds.OrDefault(out)
}
