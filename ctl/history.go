package ctl

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/spf13/cobra"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/history"
)

// EndedLive is the Ended of a live object's tenure, which has not ended.
const EndedLive = "Live"

// History is history's answer: the address's tenures and releases, newest
// first, a live object's tenure first of all.
type History struct {
	Address string `json:"address"`
	// Since and At are the flags' times, when given.
	Since   time.Time                `json:"since,omitzero"`
	At      time.Time                `json:"at,omitzero"`
	Records []vmipamv1.AddressRecord `json:"records"`
}

func newHistory(o *Options) *cobra.Command {
	var since, at string
	cmd := &cobra.Command{
		Use:   "history IP",
		Short: "Show who held an address when, newest first",
		Long: `Show who held an address when, newest first: each tenure (from when its
object was stored with the address to when its deletion released it) with
the object's kind, namespace/name and UID, and each release an operator
asked for (kubectl vmipam release) with who asked and why. A live object's
tenure, from its creation to now, comes first, with ENDED "Live".

--since keeps what ended at or after a time; --at keeps only the tenure
that covered a time (the question of an abuse report: which VM had this
address at 14:00?). A tenure without FROM is one whose start vmipam did
not see (its object went without vmipam's finalizer); --at takes it to
start when the tenure before it ended. Both take an RFC 3339 time (2026-03-01T14:00:00Z, or
with an offset) or a duration back from now (90m, 2h, 3d).

The history is what vmipam recorded: the newest records of each address,
as many as its retention keeps.`,
		Example: `  kubectl vmipam history 10.100.0.42
  kubectl vmipam history 10.100.0.42 --since 7d
  kubectl vmipam history 10.100.0.42 --at 2026-03-01T14:00:00+01:00`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, err := parseAddr(args[0])
			if err != nil {
				return err
			}
			h := &History{Address: addr.String()}
			now := o.Now()
			if cmd.Flags().Changed("since") {
				if h.Since, err = parseWhen("since", since, now); err != nil {
					return err
				}
			}
			if cmd.Flags().Changed("at") {
				if h.At, err = parseWhen("at", at, now); err != nil {
					return err
				}
			}
			if err := o.history(contextOf(cmd), addr, h); err != nil {
				return err
			}
			return o.printHistory(h)
		},
	}
	cmd.Flags().StringVar(&since, "since", "", "show only what ended at or after this time (RFC 3339, or a duration back from now such as 2h)")
	cmd.Flags().StringVar(&at, "at", "", "show only the tenure that covered this time (RFC 3339, or a duration back from now)")
	return cmd
}

// history gathers the records of addr into h.
func (o *Options) history(ctx context.Context, addr netip.Addr, h *History) error {
	c, err := o.client()
	if err != nil {
		return err
	}
	recs, err := history.Read(ctx, c, addr)
	if err != nil {
		return err
	}
	ks, err := o.kinds(ctx, c)
	if err != nil {
		return err
	}
	live, err := holdersOf(ctx, c, ks, addr)
	if err != nil {
		return err
	}
	h.Records = selectRecords(addr, recs, live, h.Since, h.At, o.Now())
	return nil
}

// selectRecords puts the live objects' tenures before recs (newest
// first), then keeps those that ended at or after since, and, when at is
// set, only those that covered at. A zero since or at selects all.
func selectRecords(addr netip.Addr, recs []vmipamv1.AddressRecord, live []Holding, since, at, now time.Time) []vmipamv1.AddressRecord {
	var out []vmipamv1.AddressRecord
	slices.SortFunc(live, func(a, b Holding) int { return b.Created.Compare(a.Created) })
	for _, h := range live {
		from := metav1Time(h.Created)
		rec := vmipamv1.AddressRecord{Address: addr.String(), Kind: h.Kind, Namespace: h.Namespace, Name: h.Name, UID: h.UID,
			From: &from, To: metav1Time(now), Ended: EndedLive, Holder: h.Holder}
		if !at.IsZero() && (at.Before(h.Created) || at.After(now)) {
			continue
		}
		out = append(out, rec)
	}
	for i, r := range recs {
		if !since.IsZero() && r.To.Time.Before(since) {
			continue
		}
		if !at.IsZero() && !heldAt(r, recs[i+1:], at) {
			continue
		}
		out = append(out, r)
	}
	return out
}

// heldAt reports whether rec covers t. A tenure whose start vmipam did not
// see (its object went before vmipam noticed) started no earlier than the
// end of the tenure before it, older (newest first): no two objects hold
// an address at once.
func heldAt(rec vmipamv1.AddressRecord, older []vmipamv1.AddressRecord, t time.Time) bool {
	if !history.HeldAt(rec, t) {
		return false
	}
	if rec.From != nil {
		return true
	}
	for _, o := range older {
		if o.Ended == vmipamv1.EndedAllocated || o.Ended == vmipamv1.EndedVanished {
			return !t.Before(o.To.Time)
		}
	}
	return true
}

func (o *Options) printHistory(h *History) error {
	if done, err := o.printStructured(h); done {
		return err
	}
	if len(h.Records) == 0 {
		switch {
		case !h.At.IsZero():
			_, err := fmt.Fprintf(o.Out, "No recorded holder of %s at %s.\n", h.Address, stamp(h.At))
			return err
		case !h.Since.IsZero():
			_, err := fmt.Fprintf(o.Out, "No recorded holder of %s since %s.\n", h.Address, stamp(h.Since))
			return err
		}
		_, err := fmt.Fprintf(o.Out, "No recorded holder of %s.\n", h.Address)
		return err
	}
	return table(o.Out, historyHeader(h.Records), historyRows(h.Records))
}

// historyHeader is the header of a table of recs: RELEASED-BY and REASON
// only when a record has them.
func historyHeader(recs []vmipamv1.AddressRecord) []string {
	hd := []string{"FROM", "TO", "ENDED", "KIND", "NAMESPACE/NAME", "UID"}
	if releases(recs) {
		hd = append(hd, "RELEASED-BY", "REASON")
	}
	return hd
}

func releases(recs []vmipamv1.AddressRecord) bool {
	return slices.ContainsFunc(recs, func(r vmipamv1.AddressRecord) bool { return r.ReleasedBy != "" || r.Reason != "" })
}

func historyRows(recs []vmipamv1.AddressRecord) [][]string {
	rel := releases(recs)
	rows := make([][]string, 0, len(recs))
	for _, r := range recs {
		from := "-"
		if r.From != nil {
			from = stamp(r.From.Time)
		}
		to := stamp(r.To.Time)
		if r.Ended == EndedLive {
			to = "now"
		}
		ref := r.Name
		if r.Namespace != "" {
			ref = r.Namespace + "/" + r.Name
		}
		row := []string{from, to, r.Ended, orDash(r.Kind), orDash(ref), orDash(r.UID)}
		if rel {
			row = append(row, orDash(r.ReleasedBy), orDash(r.Reason))
		}
		rows = append(rows, row)
	}
	return rows
}
