package ctl

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmipam/vmipam/audit"
	"github.com/vmipam/vmipam/kinds"
)

func newCheck(o *Options) *cobra.Command {
	grace := 30 * time.Second
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Report inconsistencies read from the API server: duplicates, leaks, dead holders' claims and more, each with its fix",
		Long: `Read the pools, their blocks, the holder Leases and the objects of every
kind vmipam serves, and report what is inconsistent: duplicate addresses,
objects without an address, addresses held by no object past the pool's
pending TTL plus --grace (leaks), claims of dead holders, holder labels that
do not match the claim, objects of kinds no longer configured, and blocks
the pools do not know. Each finding comes with its fix. check only reads.

Exit status: 0 when it finds nothing, 1 when it finds something, 2 when it
could not read the cluster.`,
		Example: `  kubectl vmipam check
  kubectl vmipam check -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if grace < 0 {
				return fmt.Errorf("--grace %s is negative: give a duration such as 30s", grace)
			}
			var ks []kinds.Kind
			if o.KindsConfig != "" {
				var err error
				if ks, err = kinds.Load(o.KindsConfig); err != nil {
					return fmt.Errorf("--kinds-config: %w", err)
				}
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			d, m, err := o.discoveryAndMetadata()
			if err != nil {
				return err
			}
			rep, err := audit.Run(contextOf(cmd), audit.Sources{Reader: c, Discovery: d, Metadata: m},
				audit.Options{Kinds: ks, Namespace: o.VMIPAMNamespace, Grace: grace})
			if err != nil {
				return fmt.Errorf("check: %w", err)
			}
			if err := o.printCheck(rep); err != nil {
				return err
			}
			if n := len(rep.Findings); n > 0 {
				return findings("%d findings", n)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&grace, "grace", grace, "added to a pool's pending TTL before an address no object holds counts as leaked")
	return cmd
}

func (o *Options) printCheck(rep audit.Report) error {
	if done, err := o.printStructured(rep); done {
		return err
	}
	if len(rep.Findings) > 0 {
		rows := make([][]string, 0, len(rep.Findings))
		for _, f := range rep.Findings {
			rows = append(rows, []string{f.Type, orDash(f.Pool), orDash(f.Address), orDash(f.Object), f.Message, orDash(f.Fix)})
		}
		if err := table(o.Out, []string{"TYPE", "POOL", "ADDRESS", "OBJECT", "MESSAGE", "FIX"}, rows); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(o.Out, "%d findings in %d objects, %d blocks, %d addresses.\n", len(rep.Findings), rep.Objects, rep.Blocks, rep.Addresses)
	return err
}
