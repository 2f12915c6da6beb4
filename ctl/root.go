package ctl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/api/scheme"
)

// The exit codes of kubectl-vmipam.
const (
	// ExitOK: the command did what was asked and found nothing wrong.
	ExitOK = 0
	// ExitFindings: check found something, or release was refused or not
	// acted on in time.
	ExitFindings = 1
	// ExitError: the command could not do its job (bad input, the API
	// server could not be read).
	ExitError = 2
)

// DefaultVMIPAMNamespace is where vmipam's holder Leases live unless
// --vmipam-namespace says otherwise.
const DefaultVMIPAMNamespace = "vmipam-system"

// ExitError is an error that asks for an exit code other than ExitError.
// Silent ones have been reported on the output already.
type exitError struct {
	code   int
	err    error
	silent bool
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// withCode wraps err so that ExitCode returns code for it.
func withCode(code int, err error) error { return &exitError{code: code, err: err} }

// findings is the error of a command that printed what it found and must
// exit with ExitFindings; it prints nothing more.
func findings(format string, args ...any) error {
	return &exitError{code: ExitFindings, err: fmt.Errorf(format, args...), silent: true}
}

// ExitCode returns the exit code for the error a command returned: ExitOK
// for nil, the code it carries, else ExitError.
func ExitCode(err error) int {
	if err == nil {
		return ExitOK
	}
	if e, ok := errors.AsType[*exitError](err); ok {
		return e.code
	}
	return ExitError
}

// Silent reports whether err was reported on the output already.
func Silent(err error) bool {
	e, ok := errors.AsType[*exitError](err)
	return ok && e.silent
}

// Options are what every command shares: the kubeconfig flags, vmipam's
// namespace, the kinds, the output format and the clock.
type Options struct {
	genericiooptions.IOStreams
	// ConfigFlags are kubectl's: --kubeconfig, --context, --namespace,
	// --server, --token and the rest.
	ConfigFlags *genericclioptions.ConfigFlags
	// VMIPAMNamespace holds vmipam's holder Leases.
	VMIPAMNamespace string
	// KindsConfig, if set, is a kinds configuration file that overrides
	// the kinds the holder Leases publish.
	KindsConfig string
	// Output is "", "json", "yaml" or "wide".
	Output string
	// Now is the clock; time.Now unless a test sets it.
	Now func() time.Time

	// config, once built, and the clients made from it.
	config *rest.Config
	reader client.Client
}

// NewRoot returns the kubectl-vmipam command with its subcommands, writing
// to streams.
func NewRoot(streams genericiooptions.IOStreams) *cobra.Command {
	o := &Options{
		IOStreams:       streams,
		ConfigFlags:     genericclioptions.NewConfigFlags(true),
		VMIPAMNamespace: DefaultVMIPAMNamespace,
		Now:             time.Now,
	}
	root := &cobra.Command{
		Use:   "kubectl-vmipam",
		Short: "Ask vmipam who holds an address, who held it when, what the pools have left, and release a stuck one",
		Long: `kubectl vmipam answers an operator's questions about vmipam's addresses from
the API server alone: who holds an address now, who held it when, what
each pool has left and when it runs out, and whether anything is
inconsistent; and it asks vmipam to release a stuck address.

Exit status: 0 when the command did what was asked and found nothing wrong;
1 when check found something, or release was refused or not acted on in
time; 2 on an error (bad input, an API server that cannot be read).`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl vmipam"},
	}
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	o.ConfigFlags.AddFlags(root.PersistentFlags())
	pf := root.PersistentFlags()
	pf.StringVar(&o.VMIPAMNamespace, "vmipam-namespace", o.VMIPAMNamespace, "the namespace of vmipam's holder Leases")
	pf.StringVar(&o.KindsConfig, "kinds-config", "", "a kinds configuration file (as vmipam's --kinds-config) to use instead of the kinds vmipam's holder Leases publish")
	pf.StringVarP(&o.Output, "output", "o", "", "output format: json, yaml, or a table when empty")
	root.PersistentPreRunE = func(*cobra.Command, []string) error { return o.validate() }
	root.AddCommand(newWho(o), newHistory(o), newPools(o), newRelease(o), newCheck(o))
	return root
}

// validate checks the shared flags.
func (o *Options) validate() error {
	switch o.Output {
	case "", "json", "yaml":
	default:
		return fmt.Errorf("--output %q: want json or yaml, or leave it out for a table", o.Output)
	}
	if o.VMIPAMNamespace == "" {
		return errors.New("--vmipam-namespace is empty: name the namespace vmipam runs in (default " + DefaultVMIPAMNamespace + ")")
	}
	return nil
}

// restConfig returns the REST config the kubeconfig flags describe.
func (o *Options) restConfig() (*rest.Config, error) {
	if o.config != nil {
		return o.config, nil
	}
	cfg, err := o.ConfigFlags.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	o.config = cfg
	return cfg, nil
}

// client returns a client reading the API server directly (no cache): a
// command reads once.
func (o *Options) client() (client.Client, error) {
	if o.reader != nil {
		return o.reader, nil
	}
	cfg, err := o.restConfig()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", cfg.Host, err)
	}
	o.reader = c
	return c, nil
}

// discovery and metadata clients, for check.
func (o *Options) discoveryAndMetadata() (discovery.DiscoveryInterface, metadata.Interface, error) {
	cfg, err := o.restConfig()
	if err != nil {
		return nil, nil, err
	}
	d, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("discovery client: %w", err)
	}
	m, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("metadata client: %w", err)
	}
	return d, m, nil
}

// contextOf is the command's context, never nil.
func contextOf(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}
