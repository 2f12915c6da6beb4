// Package binary runs the vmipam binary as users do, against a real
// kube-apiserver and etcd: self-managed certificates injected into webhook
// configurations that point at it, the API server calling it over TLS,
// probes, metrics and a graceful stop.
package binary

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/internal/app"
	"github.com/vmipam/vmipam/internal/localcluster"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = cond(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
}

func get(url string) (int, string, error) {
	resp, err := http.Get(url) //nolint:gosec,noctx // a local test endpoint
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func TestBinary(t *testing.T) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run the tests with 'make test'")
	}
	root := filepath.Join("..", "..")
	dir := t.TempDir()
	bin := filepath.Join(dir, "vmipam")
	build := exec.Command("go", "build", "-o", bin, "./cmd/vmipam")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build vmipam: %v\n%s", err, out)
	}

	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join(root, "deploy", "crd")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: app.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	webhookPort, metricsPort, probePort := freePort(t), freePort(t), freePort(t)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "vmipam-system"}}); err != nil {
		t.Fatal(err)
	}
	if err := localcluster.InstallWebhooks(ctx, c, filepath.Join(root, "deploy", "webhook", "manifests.yaml"),
		"https://127.0.0.1:"+strconv.Itoa(webhookPort), "vmipam-system"); err != nil {
		t.Fatal(err)
	}
	user, err := env.AddUser(envtest.User{Name: "vmipam-test", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}

	var logs bytes.Buffer
	cmd := exec.Command(bin,
		"--kubeconfig", kubeconfig, "--namespace", "vmipam-system", "--leader-elect",
		"--webhook-host", "127.0.0.1", "--webhook-port", strconv.Itoa(webhookPort), "--webhook-extra-sans", "127.0.0.1",
		"--metrics-bind-address", "127.0.0.1:"+strconv.Itoa(metricsPort), "--metrics-secure=false",
		"--health-probe-bind-address", "127.0.0.1:"+strconv.Itoa(probePort))
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("vmipam's logs:\n%s", logs.String())
		}
	})

	probe := "http://127.0.0.1:" + strconv.Itoa(probePort)
	waitFor(t, 60*time.Second, "/readyz", func() error {
		code, body, err := get(probe + "/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("%d: %s", code, body)
		}
		return nil
	})
	// Ready means the CA is in the webhook configurations and the
	// certificate persisted.
	var vwc admissionregv1.ValidatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKey{Name: "vmipam-validating"}, &vwc); err != nil || len(vwc.Webhooks[0].ClientConfig.CABundle) == 0 {
		t.Fatalf("caBundle of vmipam-validating not injected: %v", err)
	}
	var secret corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: "vmipam-system", Name: "vmipam-webhook-tls"}, &secret); err != nil {
		t.Fatalf("certificate Secret: %v", err)
	}

	// The API server calls the binary's webhooks over TLS with that CA.
	pool := &vmipamv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "bin"}, Spec: vmipamv1.IPPoolSpec{
		Default: true, Ranges: []vmipamv1.IPRange{{CIDR: "10.200.0.0/24"}},
	}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatalf("create IPPool (through the validating webhook): %v", err)
	}
	vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "vm-"}}
	waitFor(t, 30*time.Second, "a VirtualMachine with an address", func() error {
		vm.Name = ""
		if err := c.Create(ctx, vm); err != nil {
			return err // 503 while the new pool recovers
		}
		if len(vm.Spec.Addresses) != 1 || !strings.HasPrefix(vm.Spec.Addresses[0], "10.200.0.") {
			return fmt.Errorf("created without an address: %v", vm.Spec.Addresses)
		}
		return nil
	})
	metrics := "http://127.0.0.1:" + strconv.Itoa(metricsPort) + "/metrics"
	waitFor(t, 30*time.Second, "the metrics to show the allocation", func() error {
		_, body, err := get(metrics)
		if err != nil {
			return err
		}
		for _, want := range []string{
			`vmipam_pool_addresses{pool="bin",state="allocated"} 1`,
			`vmipam_admission_duration_seconds_count{outcome="allowed",webhook="virtualmachine-mutating"}`,
			`vmipam_certificate_expiry_timestamp_seconds `,
		} {
			if !strings.Contains(body, want) {
				return fmt.Errorf("no %q in /metrics", want)
			}
		}
		if strings.Contains(body, "vmipam_certificate_expiry_timestamp_seconds 0\n") {
			return errors.New("certificate expiry unknown")
		}
		return nil
	})

	// SIGTERM: a clean, prompt exit.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("vmipam exited with %v after SIGTERM", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("vmipam did not stop within 30s of SIGTERM")
	}
}
