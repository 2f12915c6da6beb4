package harness

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/vmipam/vmipam/api/scheme"
)

// Assets returns the folder of the control-plane binaries the tests run
// (KUBEBUILDER_ASSETS), or an error that says how to get them.
func Assets() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return "", errors.New("KUBEBUILDER_ASSETS is not set: run the tests with 'make test', or with KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh), which builds kube-apiserver, etcd and kubectl once; " +
			"'make test-unit' (go test -short) runs the tests that need neither")
	}
	return dir, nil
}

// SetTestLogger sends controller-runtime's log to stderr when verbose and
// discards it, and klog's, otherwise: tests that stop managers on purpose
// would fill the output with expected errors.
func SetTestLogger(verbose bool) {
	if verbose {
		logf.SetLogger(zap.New(zap.UseDevMode(true)))
		return
	}
	logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	klog.SetLogger(logr.Discard())
}

// EnvOptions say what StartEnv installs; the zero value is a bare
// kube-apiserver and etcd.
type EnvOptions struct {
	// CRDs are folders or files of CustomResourceDefinitions to install,
	// e.g. the repository's deploy/crd seen from the test package.
	CRDs []string
	// Webhooks are folders of webhook configurations that envtest points
	// at a local serving address and certificate of its own
	// (Environment.WebhookInstallOptions), for a webhook server in the
	// test process.
	Webhooks []string
	// QPS and Burst of Config; 1000 and 2000 when zero: suites run many
	// clients at once, client-go's default limit would throttle them.
	QPS   float32
	Burst int
	// Configure, if set, changes the Environment before it starts, e.g.
	// to set kube-apiserver flags.
	Configure func(*envtest.Environment) error
}

// Env is a control plane started by StartEnv.
type Env struct {
	// Environment is envtest's (its ControlPlane.APIServer can be stopped
	// and started again; WebhookInstallOptions has the serving address).
	Environment *envtest.Environment
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a client for Config that knows the built-in kinds and
	// vmipam's, reading from the API server (no cache).
	Client client.Client
}

// StartEnv starts a kube-apiserver and etcd with what o asks for: the one
// way the suites start a control plane. It fails at once, saying how to
// get them, when KUBEBUILDER_ASSETS is unset.
func StartEnv(o EnvOptions) (*Env, error) {
	if _, err := Assets(); err != nil {
		return nil, err
	}
	e := &Env{Environment: &envtest.Environment{CRDDirectoryPaths: o.CRDs, ErrorIfCRDPathMissing: len(o.CRDs) > 0}}
	e.Environment.WebhookInstallOptions.Paths = o.Webhooks
	if o.Configure != nil {
		if err := o.Configure(e.Environment); err != nil {
			return nil, err
		}
	}
	cfg, err := e.Environment.Start()
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	cfg.QPS, cfg.Burst = cmp.Or(o.QPS, 1000), cmp.Or(o.Burst, 2000)
	e.Config = cfg
	if e.Client, err = client.New(cfg, client.Options{Scheme: scheme.Scheme}); err != nil {
		return nil, errors.Join(fmt.Errorf("client: %w", err), e.Stop())
	}
	return e, nil
}

// Stop stops the control plane.
func (e *Env) Stop() error {
	if err := e.Environment.Stop(); err != nil {
		return fmt.Errorf("stop control plane: %w", err)
	}
	return nil
}

// WriteKubeconfig writes to path a kubeconfig of a new administrator
// (group system:masters) named user, for kubectl or the vmipam binary.
func (e *Env) WriteKubeconfig(path, user string) error {
	u, err := e.Environment.AddUser(envtest.User{Name: user, Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("add user %s: %w", user, err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig of %s: %w", user, err)
	}
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}
