package ctl

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/history"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/pools"
)

// Who is who's answer.
type Who struct {
	Address string `json:"address"`
	Pool    string `json:"pool"`
	Family  string `json:"family"`
	AddressState
	// Why names the field of the pool that keeps a reserved address out.
	Why string `json:"why,omitempty"`
	// Objects are the live objects that carry the address.
	Objects []Holding `json:"objects,omitempty"`
	// ClaimHolder is what the claim's holder Lease says; nil when it has
	// none.
	ClaimHolder *Holder `json:"claimHolder,omitempty"`
	// LastHolders are the newest records of the address's history.
	LastHolders []vmipamv1.AddressRecord `json:"lastHolders,omitempty"`
}

func newWho(o *Options) *cobra.Command {
	last := 5
	cmd := &cobra.Command{
		Use:   "who IP",
		Short: "Show an address's pool, state, the object holding it, the replica whose claim it is, and its last holders",
		Long:  "Show an address's pool and family, its state, the live object holding it (kind, namespace/name, UID), the vmipam replica whose claim it is and whether that replica is live, and the address's last holders from its history.\n\n" + stateHelp,
		Example: `  kubectl vmipam who 10.100.0.42
  kubectl vmipam who fd00::1:5 -o yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, err := parseAddr(args[0])
			if err != nil {
				return err
			}
			w, err := o.who(contextOf(cmd), addr, last)
			if err != nil {
				return err
			}
			return o.printWho(w)
		},
	}
	cmd.Flags().IntVar(&last, "last", last, "how many of the address's last holders to show")
	return cmd
}

// parseAddr reads an address argument.
func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address: give one such as 10.100.0.42 or fd00::42", s)
	}
	return a.Unmap(), nil
}

// findPool returns the pool whose ranges' CIDRs hold addr, and where.
func findPool(ctx context.Context, c client.Reader, addr netip.Addr) (*vmipamv1.IPPool, Place, error) {
	var list vmipamv1.IPPoolList
	if err := c.List(ctx, &list); err != nil {
		return nil, Place{}, fmt.Errorf("list IPPools: %w", err)
	}
	var all []string
	for i := range list.Items {
		p := &list.Items[i]
		ranges, _ := ipam.ParseRanges(pools.RangeSpecs(p.Spec.Ranges))
		if pl, ok := placeOf(addr, p.Spec.Ranges, ranges); ok {
			return p, pl, nil
		}
		for _, r := range p.Spec.Ranges {
			all = append(all, fmt.Sprintf("%s (%s)", r.CIDR, p.Name))
		}
	}
	if len(all) == 0 {
		return nil, Place{}, fmt.Errorf("%s is in no pool: the cluster has no IPPool (kubectl get ippools.vmipam.io)", addr)
	}
	slices.Sort(all)
	return nil, Place{}, fmt.Errorf("%s is in no pool's ranges; the pools' ranges are: %s", addr, strings.Join(all, ", "))
}

// familyOf names addr's family as IPPools do.
func familyOf(addr netip.Addr) string {
	if addr.Is4() {
		return string(vmipamv1.IPv4)
	}
	return string(vmipamv1.IPv6)
}

// who gathers and derives who's answer.
func (o *Options) who(ctx context.Context, addr netip.Addr, last int) (*Who, error) {
	c, err := o.client()
	if err != nil {
		return nil, err
	}
	pool, place, err := findPool(ctx, c, addr)
	if err != nil {
		return nil, err
	}
	w := &Who{Address: addr.String(), Pool: pool.Name, Family: familyOf(addr), Why: place.Why}
	hs, err := o.holders(ctx, c)
	if err != nil {
		return nil, err
	}
	ks, err := o.kinds(ctx, c)
	if err != nil {
		return nil, err
	}
	if w.Objects, err = holdersOf(ctx, c, ks, addr); err != nil {
		return nil, err
	}
	if place.State != "" {
		w.State = place.State
	} else {
		blocks, err := kubestore.Read(ctx, c, pool.Name)
		if err != nil {
			return nil, fmt.Errorf("read the blocks of pool %s: %w", pool.Name, err)
		}
		w.AddressState = stateOf(addr, blocks, len(w.Objects), o.Now())
		if h, ok := hs[w.Claim]; ok {
			w.ClaimHolder = &h
		}
	}
	recs, err := history.Read(ctx, c, addr)
	if err != nil {
		return nil, err
	}
	w.LastHolders = recs[:min(len(recs), max(last, 0))]
	return w, nil
}

func (o *Options) printWho(w *Who) error {
	if done, err := o.printStructured(w); done {
		return err
	}
	out := &printer{w: o.Out}
	out.printf("Address:  %s\n", w.Address)
	out.printf("Pool:     %s (%s)\n", w.Pool, w.Family)
	state := w.State
	switch {
	case w.State == StateCooldown:
		state += " until " + stamp(w.Until) + " (" + human(w.Until.Sub(o.Now())) + " left)"
	case w.Why != "":
		state += " (" + w.Why + ")"
	case w.State == StateAllocated && len(w.Objects) > 1:
		state += fmt.Sprintf(" to %d live objects: a duplicate; run kubectl vmipam check", len(w.Objects))
	}
	out.printf("State:    %s\n", state)
	for _, h := range w.Objects {
		del := ""
		if h.Deleting {
			del = " (being deleted)"
		}
		out.printf("Object:   %s %s uid=%s created=%s%s\n", h.Kind, h.Ref(), h.UID, stamp(h.Created), del)
	}
	if w.Why == "" {
		out.printf("Claim:    %s\n", claimLine(w))
	}
	if len(w.LastHolders) == 0 {
		out.printf("History:  none recorded\n")
		return out.err
	}
	out.printf("Last holders:\n")
	if out.err != nil {
		return out.err
	}
	return table(o.Out, historyHeader(w.LastHolders), historyRows(w.LastHolders))
}

// claimLine says whose claim the address is and whether that replica is
// live.
func claimLine(w *Who) string {
	switch {
	case w.Claim == "":
		return "none (no replica claims it)"
	case w.ClaimHolder == nil:
		return w.Claim + " (no holder Lease: the replica is gone; another replica takes its claims over)"
	case w.ClaimHolder.TakenOverBy != "":
		return w.Claim + " (not live: being taken over by " + w.ClaimHolder.TakenOverBy + ")"
	case w.ClaimHolder.Live && w.ClaimHolder.Process != "":
		return w.Claim + " (live, pod " + w.ClaimHolder.Process + ", renewed " + stamp(w.ClaimHolder.Renewed) + ")"
	case w.ClaimHolder.Live:
		return w.Claim + " (live, renewed " + stamp(w.ClaimHolder.Renewed) + ")"
	}
	return w.Claim + " (not live: Lease last renewed " + stamp(w.ClaimHolder.Renewed) + ")"
}
