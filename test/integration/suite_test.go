// Package integration runs vmipam against a real kube-apiserver and etcd
// (controller-runtime envtest) with the generated CRDs and webhook
// manifests, the API server calling the webhook over TLS.
package integration

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/internal/app"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/kinds/manifests"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
	"github.com/vmipam/vmipam/webhook/transport"
)

var (
	testEnv   *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client
)

// TestMain starts the control plane with the generated CRDs and webhook
// manifests. Every test needs it: under -short none runs.
func TestMain(m *testing.M) {
	os.Exit(harness.MainControlPlaneOnly(m, func() (func(bool) error, error) {
		// Shutdowns in the restart tests log expected errors.
		harness.SetTestLogger(testing.Verbose())
		root := filepath.Join("..", "..")
		env, err := harness.StartEnv(harness.EnvOptions{
			CRDs:     []string{filepath.Join(root, "deploy", "crd")},
			Webhooks: []string{filepath.Join(root, "deploy", "webhook"), filepath.Join(root, "deploy", "kinds")},
		})
		if err != nil {
			return nil, err
		}
		testEnv, cfg, k8sClient = env.Environment, env.Config, env.Client
		// vmipam's own namespace, for its holder Lease.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: harness.Namespace}}
		if err := k8sClient.Create(context.Background(), ns); err != nil {
			return nil, errors.Join(fmt.Errorf("create namespace %s: %w", harness.Namespace, err), env.Stop())
		}
		// The checks the API server runs with no call to vmipam.
		for _, o := range append(manifests.Policies(kinds.Default(), manifests.Options{Namespace: harness.Namespace}), manifests.ReleasePolicy()...) {
			if err := k8sClient.Create(context.Background(), o.(client.Object)); err != nil {
				return nil, errors.Join(fmt.Errorf("create admission policy: %w", err), env.Stop())
			}
		}
		return func(bool) error { return env.Stop() }, nil
	}))
}

// vmipam is one running instance of vmipam's manager.
type vmipam struct {
	reg    *pools.Registry
	cancel context.CancelFunc
	done   chan error
}

// startVMIPAM starts vmipam's manager on the envtest webhook port and waits
// until its webhook serves. Stop it with stop (also registered as cleanup).
// Each of with changes the options first.
func startVMIPAM(t *testing.T, clk *clocktesting.FakeClock, with ...func(*app.Options)) *vmipam {
	t.Helper()
	wo := &testEnv.WebhookInstallOptions
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir,
		}),
		// Each test starts a new manager in this process, with the same
		// controller names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		Cache:      app.CacheOptions(harness.Namespace),
	})
	if err != nil {
		t.Fatalf("new manager: %v", err)
	}
	opts := app.Options{
		Holder: "test", Namespace: harness.Namespace, Clock: clk,
		RunInterval: 50 * time.Millisecond, ResyncInterval: time.Second, StatusInterval: 200 * time.Millisecond, ProveInterval: 200 * time.Millisecond,
		Limits:                  transport.Limits{ReadTimeout: 2 * time.Second},
		MaxConcurrentReconciles: 8,
	}
	for _, f := range with {
		f(&opts)
	}
	reg, err := app.Setup(mgr, opts)
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	v := &vmipam{reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { v.done <- mgr.Start(ctx) }()
	t.Cleanup(v.stop)
	addr := net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort))
	harness.Eventually(t, 30*time.Second, "the webhook to serve", func() error {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a readiness probe
		if err != nil {
			return err
		}
		return conn.Close()
	})
	// As readyz would: every existing pool recovered.
	harness.Eventually(t, 60*time.Second, "every pool to be recovered", func() error { return reg.Ready(context.Background()) })
	return v
}

// stop stops the manager and waits for it, as SIGTERM would: the webhook
// goes away mid-admission, in-memory reservations are lost.
func (v *vmipam) stop() {
	if v.cancel == nil {
		return
	}
	v.cancel()
	if err := <-v.done; err != nil {
		fmt.Fprintf(os.Stderr, "vmipam manager stopped with: %v\n", err)
	}
	v.cancel = nil
}

// newPool creates an IPPool and waits until vmipam serves it.
func newPool(t *testing.T, v *vmipam, name string, ranges []vmipamv1.IPRange, mutate ...func(*vmipamv1.IPPool)) *vmipamv1.IPPool {
	t.Helper()
	pool := fixture.Pool(name, fixture.WithRanges(ranges...), fixture.WithCooldown(time.Minute), fixture.WithPendingTTL(time.Minute),
		fixture.WithWatermarks(4, 16, 64))
	for _, f := range mutate {
		f(pool)
	}
	if err := k8sClient.Create(context.Background(), pool); err != nil {
		t.Fatalf("create IPPool %s: %v", name, err)
	}
	harness.Eventually(t, 30*time.Second, "pool "+name+" to be served", func() error {
		if p := v.reg.Get(name); p == nil || !p.Ready() {
			return errors.New("not ready")
		}
		return nil
	})
	return pool
}

// vm builds a VirtualMachine drawing from pool.
func vm(ns, name, pool string, addrs ...string) *vmipamv1.VirtualMachine {
	return &vmipamv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       vmipamv1.VirtualMachineSpec{IPPool: pool, Addresses: addrs, Image: "debian-13", CPUs: 1, Memory: "512Mi"},
	}
}

// createWithRetry creates obj, retrying while the webhook is unreachable
// (vmipam restarting) or recovering.
func createWithRetry(ctx context.Context, obj client.Object) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		last = k8sClient.Create(ctx, obj)
		if last == nil || !retriable(last) {
			return true, last
		}
		return false, nil
	})
	if err != nil && last == nil {
		return err
	}
	return last
}

func retriable(err error) bool {
	if apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsTimeout(err) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) {
		return true
	}
	// The API server could not reach the webhook: vmipam is restarting.
	var st apierrors.APIStatus
	return errors.As(err, &st) && strings.Contains(st.Status().Message, "failed calling webhook")
}

// namespace creates a fresh namespace for a test.
func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-"}}
	if err := k8sClient.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

func poolCondition(t *testing.T, name, typ string) *metav1.Condition {
	t.Helper()
	p := &vmipamv1.IPPool{}
	if err := k8sClient.Get(context.Background(), client.ObjectKey{Name: name}, p); err != nil {
		t.Fatalf("get IPPool %s: %v", name, err)
	}
	return meta.FindStatusCondition(p.Status.Conditions, typ)
}
