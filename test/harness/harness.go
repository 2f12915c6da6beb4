// Package harness runs vmipam as a user does, for the end-to-end tests, the
// reliability suite and the end-to-end benchmark: a real kube-apiserver and
// etcd (envtest's binaries, built by hack/envtest-assets.sh), the vmipam
// binary with self-managed certificates, and the webhook configurations
// pointing at it on loopback. It does not depend on package testing.
package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
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

	"github.com/vmipam/vmipam/internal/app"
	"github.com/vmipam/vmipam/internal/localcluster"
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
	// WebhookPort, MetricsPort and ProbePort are vmipam's ports.
	WebhookPort, MetricsPort, ProbePort int

	dir string
}

// Start builds vmipam from the repository at root into dir, starts a
// control plane, and installs the CRDs and webhook configurations.
func Start(ctx context.Context, root, dir string) (*Cluster, error) {
	if _, err := Assets(); err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, Binary: filepath.Join(dir, "vmipam")}
	build := exec.CommandContext(ctx, "go", "build", "-o", c.Binary, "./cmd/vmipam")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build vmipam: %w\n%s", err, out)
	}
	c.Env = &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join(root, "deploy", "crd")}, ErrorIfCRDPathMissing: true}
	cfg, err := c.Env.Start()
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	cfg.QPS, cfg.Burst = 5000, 10000
	c.Config = cfg
	if c.Client, err = client.New(cfg, client.Options{Scheme: app.Scheme}); err != nil {
		return nil, c.stopWith(fmt.Errorf("client: %w", err))
	}
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return nil, c.stopWith(err)
		}
	}
	c.WebhookPort, c.MetricsPort, c.ProbePort = ports[0], ports[1], ports[2]
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil {
		return nil, c.stopWith(fmt.Errorf("create namespace: %w", err))
	}
	if err := localcluster.InstallWebhooks(ctx, c.Client, filepath.Join(root, "deploy", "webhook", "manifests.yaml"),
		"https://127.0.0.1:"+strconv.Itoa(c.WebhookPort), Namespace); err != nil {
		return nil, c.stopWith(err)
	}
	user, err := c.Env.AddUser(envtest.User{Name: "vmipam-harness", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, c.stopWith(fmt.Errorf("add user: %w", err))
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return nil, c.stopWith(err)
	}
	c.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, kc, 0o600); err != nil {
		return nil, c.stopWith(err)
	}
	return c, nil
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
}

// StartVMIPAM starts the vmipam binary with its logs going to logs and the
// extra flags appended, and waits until /readyz answers 200.
func (c *Cluster) StartVMIPAM(ctx context.Context, logs io.Writer, extra ...string) (*Process, error) {
	args := append([]string{
		"--kubeconfig", c.Kubeconfig, "--namespace", Namespace, "--leader-elect",
		"--webhook-host", "127.0.0.1", "--webhook-port", strconv.Itoa(c.WebhookPort), "--webhook-extra-sans", "127.0.0.1",
		"--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(c.MetricsPort), "--metrics-secure=false",
		"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(c.ProbePort),
	}, extra...)
	cmd := exec.Command(c.Binary, args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start vmipam: %w", err)
	}
	p := &Process{cmd: cmd, exited: make(chan error, 1)}
	go func() { p.exited <- cmd.Wait() }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		code, body, err := c.Get("http://127.0.0.1:" + strconv.Itoa(c.ProbePort) + "/readyz")
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

// TB is the part of testing.TB that Eventually needs.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Eventually polls cond until it returns nil, failing tb with cond's last
// error when timeout passes first.
func Eventually(tb TB, timeout time.Duration, what string, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}
