// Package harness runs vmipam as a user does, for the end-to-end tests, the
// reliability suite and the end-to-end benchmark: a real kube-apiserver and
// etcd (envtest's binaries, built by hack/envtest-assets.sh), the vmipam
// binary with self-managed certificates, and the webhook configurations
// pointing at it on loopback. It is also the one way the test suites start
// a control plane (StartEnv, Main, NeedControlPlane), wait for a condition
// (Eventually, Poll) and read a metric (Metric), and the load suites'
// (test/chaos, test/replicas) one toolkit: a Ledger of what their clients
// created and deleted, a Tracker of deletions seen, Fill, a capped
// LogBuffer.
package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/test/localcluster"
)

// Namespace is vmipam's own namespace in the harness.
const Namespace = "vmipam-system"

// Cluster is a running control plane with vmipam's CRDs and webhook
// configurations, and the vmipam binary built for it.
type Cluster struct {
	// Env is the envtest environment (its ControlPlane.APIServer can be
	// stopped and started again).
	Env *envtest.Environment
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client is a client for Config.
	Client client.Client
	// Kubeconfig is the path of an administrator kubeconfig.
	Kubeconfig string
	// Binary is the built vmipam binary.
	Binary string
	// WebhookPort, MetricsPort and ProbePort are vmipam's ports. With
	// StartReplicas, WebhookPort is the proxy's and each Replica has ports
	// of its own; MetricsPort and ProbePort are then unused.
	WebhookPort, MetricsPort, ProbePort int

	// VMIPAMEnv is added to the environment of every vmipam process
	// started from now on (e.g. GOGC=400), and to no other process.
	VMIPAMEnv []string

	dir string
	// kindsConfig is the kinds configuration vmipam is started with.
	kindsConfig string
}

// Start builds vmipam from the repository at root into dir, starts a
// control plane, and installs the CRDs and webhook configurations.
func Start(ctx context.Context, root, dir string) (*Cluster, error) {
	return StartWith(ctx, root, dir, ClusterOptions{})
}

// ClusterOptions change what StartWith sets up; the zero value is Start's.
type ClusterOptions struct {
	// Configure runs once the ports are chosen, before the control plane
	// starts: e.g. to write an admission configuration that names the
	// webhook port, and give it to the API server.
	Configure func(c *Cluster, env *envtest.Environment) error
	// Install replaces the default install: vmipam's namespace and the
	// generated webhook configurations calling
	// https://127.0.0.1:<WebhookPort>.
	Install func(ctx context.Context, c *Cluster) error
	// KindsConfig, if set, is the kinds configuration file: vmipam runs
	// with it (--kinds-config) and the default install wires its kinds.
	KindsConfig string
	// CRDs are more folders or files of CRDs to install beside vmipam's.
	CRDs []string
	// NoCRDs leaves vmipam's CRDs to Install (a Helm chart installs them).
	NoCRDs bool
}

// StartWith is Start, changed by o.
func StartWith(ctx context.Context, root, dir string, o ClusterOptions) (*Cluster, error) {
	if _, err := Assets(); err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, Binary: filepath.Join(dir, "vmipam"), kindsConfig: o.KindsConfig}
	build := exec.CommandContext(ctx, "go", "build", "-o", c.Binary, "./cmd/vmipam")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build vmipam: %w\n%s", err, out)
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	c.WebhookPort, c.MetricsPort, c.ProbePort = ports[0], ports[1], ports[2]
	crds := o.CRDs
	if !o.NoCRDs {
		crds = append([]string{filepath.Join(root, "deploy", "crd")}, crds...)
	}
	env, err := StartEnv(EnvOptions{
		CRDs: crds,
		// The end-to-end benchmark creates as fast as it can.
		QPS: 5000, Burst: 10000,
		Configure: func(e *envtest.Environment) error {
			if o.Configure == nil {
				return nil
			}
			return o.Configure(c, e)
		},
	})
	if err != nil {
		return nil, err
	}
	c.Env, c.Config, c.Client = env.Environment, env.Config, env.Client
	// The kubeconfig first: an Install may run tools that read it.
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := env.WriteKubeconfig(c.Kubeconfig, "vmipam-harness"); err != nil {
		return nil, c.stopWith(err)
	}
	install := o.Install
	if install == nil {
		install = func(ctx context.Context, c *Cluster) error { return c.installWebhooks(ctx, root) }
	}
	if err := install(ctx, c); err != nil {
		return nil, c.stopWith(err)
	}
	return c, nil
}

// installWebhooks creates vmipam's namespace and the generated webhook
// configurations, calling vmipam on loopback.
func (c *Cluster) installWebhooks(ctx context.Context, root string) error {
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	kinds, err := kinds.LoadOrDefault(c.kindsConfig)
	if err != nil {
		return err
	}
	return localcluster.InstallWebhooks(ctx, c.Client, filepath.Join(root, "deploy", "webhook", "manifests.yaml"),
		"https://127.0.0.1:"+strconv.Itoa(c.WebhookPort), Namespace, kinds)
}

func (c *Cluster) stopWith(err error) error {
	return errors.Join(err, c.Stop())
}

// Stop stops the control plane.
func (c *Cluster) Stop() error {
	if c.Env == nil {
		return nil
	}
	return c.Env.Stop()
}

// Process is a running vmipam binary.
type Process struct {
	cmd    *exec.Cmd
	exited chan error
	done   chan struct{}
}

// StartVMIPAM starts the vmipam binary with its logs going to logs and the
// extra flags appended, and waits until /readyz answers 200.
func (c *Cluster) StartVMIPAM(ctx context.Context, logs io.Writer, extra ...string) (*Process, error) {
	return c.startVMIPAM(ctx, ports{webhook: c.WebhookPort, metrics: c.MetricsPort, probe: c.ProbePort}, "", logs, extra)
}

// ports are one vmipam process's listening ports on 127.0.0.1; pprof 0
// serves no pprof.
type ports struct{ webhook, metrics, probe, pprof int }

// vmipamArgs is the one place the harness builds vmipam's command line;
// holder "" is "vmipam", the same across restarts.
func (c *Cluster) vmipamArgs(pt ports, holder string) []string {
	if holder == "" {
		holder = "vmipam"
	}
	args := []string{"--kubeconfig", c.Kubeconfig, "--namespace", Namespace, "--holder", holder}
	args = append(args,
		"--webhook-host", "127.0.0.1", "--webhook-port", strconv.Itoa(pt.webhook), "--webhook-extra-sans", "127.0.0.1",
		"--metrics-bind-address", "127.0.0.1:"+strconv.Itoa(pt.metrics), "--metrics-secure=false",
		"--health-probe-bind-address", "127.0.0.1:"+strconv.Itoa(pt.probe),
		// Waiting for the API server to close its idle connections (it
		// does after 90s) would make every stop as long; the tests and the
		// bench keep the race with an admission sent at the close instead
		// (docs/design.md, "What is left for later"). extra may override it.
		"--shutdown-connection-wait=0s",
	)
	if pt.pprof != 0 {
		args = append(args, "--pprof-bind-address", "127.0.0.1:"+strconv.Itoa(pt.pprof))
	}
	if c.kindsConfig != "" {
		args = append(args, "--kinds-config", c.kindsConfig)
	}
	return args
}

func (c *Cluster) startVMIPAM(ctx context.Context, pt ports, holder string, logs io.Writer, extra []string) (*Process, error) {
	args := append(c.vmipamArgs(pt, holder), extra...)
	cmd := exec.Command(c.Binary, args...)
	if len(c.VMIPAMEnv) > 0 {
		cmd.Env = append(os.Environ(), c.VMIPAMEnv...)
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start vmipam: %w", err)
	}
	p := &Process{cmd: cmd, exited: make(chan error, 1), done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		// Done first: who has seen the exit status sees Done closed.
		close(p.done)
		p.exited <- err
	}()
	deadline := time.Now().Add(90 * time.Second)
	for {
		code, body, err := c.Get("http://127.0.0.1:" + strconv.Itoa(pt.probe) + "/readyz")
		if err == nil && code == http.StatusOK {
			return p, nil
		}
		select {
		case err := <-p.exited:
			return nil, fmt.Errorf("vmipam exited before it was ready: %w", err)
		case <-ctx.Done():
			p.Kill()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Kill()
			return nil, fmt.Errorf("vmipam not ready after 90s: %d %s %w", code, body, err)
		}
	}
}

// Done is closed once the process has exited, for whatever reason.
func (p *Process) Done() <-chan struct{} { return p.done }

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Kill sends SIGKILL and waits for the process to be gone, as a crash or
// an OOM kill would end it.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	err := <-p.exited
	// Leave the exit status for a later Kill or Stop.
	p.exited <- err
}

// Stop sends SIGTERM and waits up to timeout for a clean exit.
func (p *Process) Stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		p.exited <- err
		return err
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("vmipam did not stop within %s of SIGTERM", timeout)
	}
}

// Get fetches a local URL and returns its status and body.
func (c *Cluster) Get(url string) (int, string, error) {
	resp, err := http.Get(url) //nolint:gosec,noctx // a local test endpoint
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Metrics returns vmipam's /metrics text.
func (c *Cluster) Metrics() (string, error) {
	_, body, err := c.Get("http://127.0.0.1:" + strconv.Itoa(c.MetricsPort) + "/metrics")
	return body, err
}

// freePorts returns n distinct free ports: each listener stays open until
// all are chosen, so that the kernel cannot hand one out twice (a webhook
// server and a probe server of one vmipam were given the same port).
func freePorts(n int) ([]int, error) {
	out := make([]int, 0, n)
	for range n {
		l, err := listenFree()
		if err != nil {
			return nil, err
		}
		defer func() { _ = l.Close() }()
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// FreePort returns a port of 127.0.0.1 free now, for a process started
// later to listen on (see listenFree).
func FreePort() (int, error) {
	l, err := listenFree()
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// listenFree listens on a free port of 127.0.0.1 below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range). A port of that range,
// which is what listening on port 0 picks, may be taken between its choice
// and vmipam's bind as the local end of a connection the API server, etcd
// or another package's test opens (seen: vmipam's webhook server failing
// with "address already in use"); below it, only a process that listens
// can take it. Other packages' tests pick at random from the same ports,
// and a port one of them listens on already is passed over.
func listenFree() (net.Listener, error) {
	lo, hi := portRange()
	for range 200 {
		port := lo + rand.IntN(hi-lo) //nolint:gosec // a port, not a secret
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			return l, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("find a free port: %w", err)
	}
	return l, nil
}

// portRange is where listenFree picks: the 8,000 ports below the kernel's
// ephemeral range (32768 to 60999 by default), or 24768 to 32767 when
// that range cannot be read.
func portRange() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		var first, last int
		if _, err := fmt.Sscan(string(b), &first, &last); err == nil && first > 2048 {
			hi = first
		}
	}
	return max(1024, hi-8000), hi
}
