package ctl

import (
	"context"
	"errors"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/pools"
)

// releasePoll is how often release reads the IPRelease's status.
const releasePoll = 250 * time.Millisecond

// maxReason is the longest reason the IPRelease CRD takes.
const maxReason = 512

// releaseFlags are release's flags.
type releaseFlags struct {
	skipCooldown bool
	reason       string
	timeout      time.Duration
}

// check refuses what the IPRelease CRD would refuse, before the request.
func (f releaseFlags) check() error {
	switch {
	case f.skipCooldown && f.reason == "":
		return errors.New(`--skip-cooldown needs --reason "...": ending a cooldown early may hand the address to a new VM while peers still cache the old one's, and the reason is recorded in the address's history`)
	case len(f.reason) > maxReason:
		return fmt.Errorf("--reason is %d bytes long; at most %d fit", len(f.reason), maxReason)
	case f.timeout <= 0:
		return fmt.Errorf("--timeout %s: give a positive duration such as 30s", f.timeout)
	}
	return nil
}

func newRelease(o *Options) *cobra.Command {
	f := releaseFlags{timeout: 30 * time.Second}
	cmd := &cobra.Command{
		Use:   "release IP",
		Short: "Ask vmipam to end an address's stuck pending reservation, or its cooldown early",
		Long: `Ask vmipam to release an address: release creates an IPRelease (cluster
scoped, named release-<random>) and waits until the vmipam replica whose
claim holds the address acts on it, then prints what it did.

vmipam refuses, naming the object, while a live object holds the address.
Otherwise it ends a pending reservation now (the address goes into its
cooldown), or, with --skip-cooldown --reason "...", frees a pending
reservation or a cooling-down address at once. The release is recorded in
the address's history with the reason and the user who asked.

release writes nothing but the IPRelease; vmipam writes its blocks. It
exits 0 when vmipam did it, 1 when vmipam refused or did not act within
--timeout (the IPRelease stays, and a replica may still act on it), 2 on an
error.`,
		Example: `  kubectl vmipam release 10.100.0.42
  kubectl vmipam release 10.100.0.42 --skip-cooldown --reason "INC-1234: VM recreated, same tenant"`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			addr, err := parseAddr(args[0])
			if err != nil {
				return err
			}
			if err := f.check(); err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			rel := &vmipamv1.IPRelease{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "release-"},
				Spec:       vmipamv1.IPReleaseSpec{Address: addr.String(), SkipCooldown: f.skipCooldown, Reason: f.reason},
			}
			return o.release(contextOf(cmd), c, rel, f.timeout)
		},
	}
	cmd.Flags().BoolVar(&f.skipCooldown, "skip-cooldown", false, "free the address at once, without (or ending) its cooldown; needs --reason")
	cmd.Flags().StringVar(&f.reason, "reason", "", "why, recorded in the address's history")
	cmd.Flags().DurationVar(&f.timeout, "timeout", f.timeout, "how long to wait for vmipam to act")
	return cmd
}

// release creates rel, signed by the user the API server knows the
// caller as, and waits up to timeout for its phase.
func (o *Options) release(ctx context.Context, c client.Client, rel *vmipamv1.IPRelease, timeout time.Duration) error {
	// An admission policy lets only the creator sign: the history records
	// who asked. A SelfSubjectReview says who that is, however the
	// kubeconfig authenticates.
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, review); err != nil {
		return fmt.Errorf("learn which user you are (a SelfSubjectReview, which the IPRelease is signed with): %w", err)
	}
	rel.Spec.RequestedBy = review.Status.UserInfo.Username
	if err := c.Create(ctx, rel); err != nil {
		return fmt.Errorf("create an IPRelease of %s: %w", rel.Spec.Address, err)
	}
	key := client.ObjectKeyFromObject(rel)
	err := wait.PollUntilContextTimeout(ctx, releasePoll, timeout, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, key, rel); err != nil {
			return false, fmt.Errorf("read IPRelease %s: %w", rel.Name, err)
		}
		return rel.Status.Phase != "", nil
	})
	done, perr := o.printStructured(rel)
	if !done && err == nil {
		perr = o.printRelease(rel)
	}
	if perr != nil {
		return perr
	}
	switch {
	case err != nil && wait.Interrupted(err):
		msg := fmt.Sprintf("no vmipam replica acted on IPRelease %s of %s within %s: check that vmipam runs (kubectl get leases -n %s -l %s=true); the IPRelease stays and may still be acted on (kubectl get iprelease %s), or delete it",
			rel.Name, rel.Spec.Address, timeout, o.VMIPAMNamespace, pools.HolderLeaseLabel, rel.Name)
		return withCode(ExitFindings, errors.New(msg))
	case err != nil:
		return err
	case rel.Status.Phase == vmipamv1.ReleaseRefused:
		return findings("IPRelease %s refused", rel.Name)
	}
	return nil
}

// printRelease says what vmipam did.
func (o *Options) printRelease(rel *vmipamv1.IPRelease) error {
	s := rel.Status
	out := &printer{w: o.Out}
	out.printf("%s: %s %s", rel.Name, s.Phase, rel.Spec.Address)
	if s.Pool != "" {
		out.printf(" (pool %s)", s.Pool)
	}
	if s.Previous != "" {
		out.printf(", was %s", s.Previous)
	}
	if s.Holder != "" {
		out.printf(", by replica %s", s.Holder)
	}
	out.printf("\n")
	if s.Message != "" {
		out.printf("%s\n", s.Message)
	}
	return out.err
}
