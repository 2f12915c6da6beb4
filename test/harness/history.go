package harness

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/history"
)

// HistoryCheck is what CheckHistory found.
type HistoryCheck struct {
	// Addresses and Tenures count what was compared: the sampled
	// addresses, and the deleted VMs on them.
	Addresses, Tenures int
	// Unknown counts the deleted VMs whose deletionTimestamp the tracker
	// never saw (the watch was down across their whole deletion): their
	// record is looked for, its end not compared.
	Unknown int
	// Mismatches says, for each tenure, what the history got wrong:
	// missing, or another start, end, name or UID; and records of VMs
	// the ledger does not show deleted.
	Mismatches []string
}

// CheckHistory compares, for up to sample addresses that VMs of the
// ledger held and gave back, the address history vmipam recorded with
// what the ledger and the tracker saw: every deleted VM's tenure is there
// once, from its creationTimestamp to its deletionTimestamp exactly, with
// its name, namespace and UID; and no record names a VM the ledger does
// not show deleted.
func CheckHistory(ctx context.Context, c client.Reader, ns string, led *Ledger, tr *Tracker, sample int) (HistoryCheck, error) {
	var out HistoryCheck
	by := map[netip.Addr][]Record{}
	for _, r := range led.Records() {
		for _, a := range r.Addrs {
			by[a] = append(by[a], r)
		}
	}
	addrs := make([]netip.Addr, 0, len(by))
	for a, recs := range by {
		if slices.ContainsFunc(recs, func(r Record) bool { return !r.DeleteIssued.IsZero() }) {
			addrs = append(addrs, a)
		}
	}
	sort.Slice(addrs, func(i, j int) bool { return addrs[i].Less(addrs[j]) })
	if len(addrs) > sample {
		// Evenly spread over the range.
		picked := make([]netip.Addr, 0, sample)
		for i := range sample {
			picked = append(picked, addrs[i*len(addrs)/sample])
		}
		addrs = picked
	}
	for _, a := range addrs {
		got, err := history.Read(ctx, c, a)
		if err != nil {
			return out, fmt.Errorf("read the history of %s: %w", a, err)
		}
		out.Addresses++
		byUID := map[string]vmipamv1.AddressRecord{}
		for _, h := range got {
			if h.Ended == vmipamv1.EndedAllocated || h.Ended == vmipamv1.EndedVanished {
				if _, twice := byUID[h.UID]; twice {
					out.Mismatches = append(out.Mismatches, fmt.Sprintf("%s: two tenures of uid %s", a, h.UID))
				}
				byUID[h.UID] = h
			}
		}
		deleted := map[string]bool{}
		for _, r := range by[a] {
			if r.DeleteIssued.IsZero() {
				continue
			}
			g, gone := tr.GoneAt(r.Name)
			if !gone {
				// Deleted, not gone yet: its finalizer is on.
				continue
			}
			deleted[string(r.UID)] = true
			out.Tenures++
			h, ok := byUID[string(r.UID)]
			if !ok {
				out.Mismatches = append(out.Mismatches, fmt.Sprintf("%s: no record of %s (uid %s), created %s, deleted", a, r.Name, r.UID, r.Created.Format(time.RFC3339)))
				continue
			}
			var bad []string
			if h.Name != r.Name || h.Namespace != ns || h.Kind != "VirtualMachine.vmipam.io" || h.Ended != vmipamv1.EndedAllocated {
				bad = append(bad, fmt.Sprintf("names %s %s/%s ended %s", h.Kind, h.Namespace, h.Name, h.Ended))
			}
			if h.From == nil || !h.From.Time.Equal(r.Created) {
				bad = append(bad, fmt.Sprintf("from %v, created %s", h.From, r.Created.Format(time.RFC3339)))
			}
			if g.Deleted.IsZero() {
				out.Unknown++
			} else if !h.To.Time.Equal(g.Deleted) {
				bad = append(bad, fmt.Sprintf("to %s, deletionTimestamp %s", h.To.Format(time.RFC3339), g.Deleted.Format(time.RFC3339)))
			}
			if len(bad) > 0 {
				out.Mismatches = append(out.Mismatches, fmt.Sprintf("%s: %s (uid %s): %v", a, r.Name, r.UID, bad))
			}
		}
		for uid, h := range byUID {
			if !deleted[uid] && h.Namespace == ns && !slices.ContainsFunc(by[a], func(r Record) bool { return string(r.UID) == uid && !r.DeleteIssued.IsZero() }) {
				out.Mismatches = append(out.Mismatches, fmt.Sprintf("%s: a tenure of %s (uid %s) ended %s, but the ledger shows it not deleted", a, h.Name, uid, h.To.Format(time.RFC3339)))
			}
		}
	}
	return out, nil
}
