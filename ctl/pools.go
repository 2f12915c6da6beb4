package ctl

import (
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// PoolRow is one pool, or one family of a pool of both, as pools shows it.
type PoolRow struct {
	Pool      string `json:"pool"`
	Family    string `json:"family"`
	Ready     bool   `json:"ready"`
	Paused    bool   `json:"paused"`
	Usable    int64  `json:"usable"`
	Allocated int64  `json:"allocated"`
	Pending   int64  `json:"pending"`
	Cooldown  int64  `json:"cooldown"`
	Free      int64  `json:"free"`
	// Window and Change are the status's trend; Window is zero without
	// one.
	Window time.Duration `json:"window,omitempty"`
	Change int64         `json:"change"`
	// Exhaustion is the time to exhaustion at the trend's rate, nil when
	// the pool is not filling.
	Exhaustion *time.Duration `json:"exhaustion,omitempty"`
}

func newPools(o *Options) *cobra.Command {
	return &cobra.Command{
		Use:   "pools",
		Short: "Show each pool's usable, allocated, pending, cooling and free addresses, and its time to exhaustion",
		Long: `Show each pool, and each family of a pool of both, with its usable,
allocated, pending, cooling-down and free addresses (from the IPPool's
status), whether it is Ready and Paused, and its time to exhaustion at the
rate of the last hour.

The time to exhaustion comes from the status's trend (the change of
allocated plus pending over a window of up to an hour, shown as CHANGE/
WINDOW): available = usable - allocated - pending; rate = change / window;
exhaustion = available / rate while the rate is above zero, "-" otherwise
(not filling). A window shorter than an hour means the replica writing the
status has watched the pool for less.`,
		Example: `  kubectl vmipam pools
  kubectl vmipam pools -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			var list vmipamv1.IPPoolList
			if err := c.List(contextOf(cmd), &list); err != nil {
				return fmt.Errorf("list IPPools: %w", err)
			}
			var rows []PoolRow
			for i := range list.Items {
				rows = append(rows, poolRows(&list.Items[i])...)
			}
			if done, err := o.printStructured(rows); done {
				return err
			}
			if len(rows) == 0 {
				_, err := fmt.Fprintln(o.Out, "No IPPools.")
				return err
			}
			return table(o.Out, []string{"POOL", "FAMILY", "READY", "PAUSED", "USABLE", "ALLOCATED", "PENDING", "COOLING", "FREE", "CHANGE/WINDOW", "EXHAUSTION"}, poolTable(rows))
		},
	}
}

// poolRows turns a pool's status into rows: one per family for a pool
// whose status has families, else one.
func poolRows(p *vmipamv1.IPPool) []PoolRow {
	base := PoolRow{Pool: p.Name, Paused: p.Spec.Paused, Ready: meta.IsStatusConditionTrue(p.Status.Conditions, vmipamv1.ConditionReady)}
	if len(p.Status.Families) == 0 {
		r := base
		r.Family = poolFamily(p)
		s := p.Status
		r.Usable, r.Allocated, r.Pending, r.Cooldown, r.Free = s.Usable, s.Allocated, s.Pending, s.Cooldown, s.Free
		r.setTrend(s.Trend)
		return []PoolRow{r}
	}
	rows := make([]PoolRow, 0, len(p.Status.Families))
	for _, f := range p.Status.Families {
		r := base
		r.Family = string(f.Family)
		r.Usable, r.Allocated, r.Pending, r.Cooldown, r.Free = f.Usable, f.Allocated, f.Pending, f.Cooldown, f.Free
		r.setTrend(f.Trend)
		rows = append(rows, r)
	}
	return rows
}

func (r *PoolRow) setTrend(t *vmipamv1.Trend) {
	if t == nil {
		return
	}
	r.Window, r.Change = t.Window.Duration, t.Change
	r.Exhaustion = exhaustion(r.Usable, r.Allocated, r.Pending, t)
}

// poolFamily is the family of a pool's first range, "-" without one.
func poolFamily(p *vmipamv1.IPPool) string {
	for _, r := range p.Spec.Ranges {
		if pr, err := netip.ParsePrefix(r.CIDR); err == nil {
			return familyOf(pr.Addr())
		}
	}
	return "-"
}

// exhaustion is the time until usable - allocated - pending addresses are
// gone at the rate trend shows, nil when the pool is not filling (no
// trend, an empty window, a change of zero or less). A pool with nothing
// available is exhausted now: zero.
func exhaustion(usable, allocated, pending int64, trend *vmipamv1.Trend) *time.Duration {
	if trend == nil || trend.Window.Duration <= 0 || trend.Change <= 0 {
		return nil
	}
	available := usable - allocated - pending
	if available <= 0 {
		d := time.Duration(0)
		return &d
	}
	// available / (change / window), in float: a /8 over an hour's window
	// overflows int64 nanoseconds when multiplied first.
	secs := float64(available) * trend.Window.Seconds() / float64(trend.Change)
	d := time.Duration(min(secs, float64(maxDuration/time.Second))) * time.Second
	return &d
}

const maxDuration = time.Duration(1<<63 - 1)

func poolTable(rows []PoolRow) [][]string {
	out := make([][]string, 0, len(rows))
	for _, r := range rows {
		trend, exh := "-", "-"
		if r.Window > 0 {
			trend = fmt.Sprintf("%+d/%s", r.Change, human(r.Window))
		}
		if r.Exhaustion != nil {
			exh = human(*r.Exhaustion)
			if *r.Exhaustion == 0 {
				exh = "exhausted"
			}
		}
		out = append(out, []string{r.Pool, r.Family, strconv.FormatBool(r.Ready), strconv.FormatBool(r.Paused),
			strconv.FormatInt(r.Usable, 10), strconv.FormatInt(r.Allocated, 10), strconv.FormatInt(r.Pending, 10),
			strconv.FormatInt(r.Cooldown, 10), strconv.FormatInt(r.Free, 10), trend, exh})
	}
	return out
}
