package e2e_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamscheme "github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
)

// namespace is where the chart installs vmipam.
const namespace = "vmipam-system"

// poolName is the default pool every test but the namespace one uses.
const poolName = "e2e"

var (
	env struct {
		helm, chart, image, kubectl, repo, probe string
	}
	cfg *rest.Config
	c   client.Client
	cs  *kubernetes.Clientset
)

func TestMain(m *testing.M) {
	env.helm, env.chart, env.image = os.Getenv("E2E_HELM"), os.Getenv("E2E_CHART"), os.Getenv("E2E_IMAGE")
	env.kubectl, env.repo, env.probe = os.Getenv("E2E_KUBECTL"), os.Getenv("E2E_REPO"), os.Getenv("E2E_PROBE_IMAGE")
	if env.helm == "" {
		// Not under make e2e: every test skips.
		os.Exit(m.Run())
	}
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		dumpState()
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		dumpState()
	}
	os.Exit(code)
}

// need skips t outside make e2e.
func need(t *testing.T) {
	t.Helper()
	if c == nil {
		t.Skip("runs under make e2e, against a real cluster (hack/e2e/run.sh)")
	}
}

func setup() error {
	var err error
	cfg, err = clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	if c, err = client.New(cfg, client.Options{Scheme: vmipamscheme.Scheme}); err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	start := time.Now()
	if out, err := helm(installArgs("install")...); err != nil {
		return fmt.Errorf("helm install: %w\n%s", err, out)
	}
	fmt.Printf("helm install --wait: %s\n", time.Since(start).Round(time.Millisecond))
	installed := time.Now()
	ctx := context.Background()
	// The IPPool goes through vmipam's validating webhook, which fails
	// closed: helm's --wait sees the Pods ready, and the Service's
	// endpoints and kube-proxy's rules for them follow a moment later.
	// Until they do, the API server cannot reach the webhook; a create
	// refused for that is tried again, and anything else fails the setup.
	for tries, deadline := 1, installed.Add(30*time.Second); ; tries++ {
		pool := fixture.Pool(poolName, fixture.WithDefault(), fixture.WithCIDRs("10.100.0.0/16"), fixture.WithCooldown(20*time.Second))
		err := c.Create(ctx, pool)
		if err == nil || apierrors.IsAlreadyExists(err) {
			if tries > 1 {
				fmt.Printf("IPPool %s created in %d tries, %s after helm install --wait returned: the webhook was unreachable until then\n",
					poolName, tries, time.Since(installed).Round(time.Millisecond))
			}
			break
		}
		if !webhookUnreachable(err) || time.Now().After(deadline) {
			return fmt.Errorf("create IPPool %s (try %d, %s after helm install --wait returned): %w", poolName, tries, time.Since(installed).Round(time.Millisecond), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return harness.Poll(ctx, 200*time.Millisecond, 60*time.Second, func() error {
		return poolReady(ctx, poolName)
	})
}

// webhookUnreachable reports whether err is the API server's failure to
// call a webhook at all (no endpoints yet, connection refused or reset),
// as opposed to a webhook's answer.
func webhookUnreachable(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "failed calling webhook") &&
		(strings.Contains(msg, "no endpoints available") || strings.Contains(msg, "connection refused") ||
			strings.Contains(msg, "connection reset") || strings.Contains(msg, "EOF") || strings.Contains(msg, "i/o timeout") ||
			strings.Contains(msg, "context deadline exceeded"))
}

// installArgs are the chart's values as make e2e installs them: the
// image just built, never pulled, and the metrics reader role bound to the
// suite's ServiceAccount. Everything else is as shipped.
func installArgs(verb string, extra ...string) []string {
	i := strings.LastIndex(env.image, ":")
	repo, tag := env.image[:max(i, 0)], env.image[i+1:]
	args := []string{verb, "vmipam", env.chart, "--namespace", namespace, "--wait", "--timeout", "5m",
		"--set", "image.repository=" + repo, "--set", "image.tag=" + tag, "--set", "image.pullPolicy=Never",
		"--set", "monitoring.metricsReader.enabled=true",
		"--set", "monitoring.metricsReader.subjects[0].kind=ServiceAccount",
		"--set", "monitoring.metricsReader.subjects[0].name=" + readerSA,
		"--set", "monitoring.metricsReader.subjects[0].namespace=default",
	}
	if verb == "install" {
		args = append(args, "--create-namespace")
	}
	return append(args, extra...)
}

func helm(args ...string) (string, error) {
	cmd := exec.Command(env.helm, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func kubectl(args ...string) (string, error) {
	cmd := exec.Command(env.kubectl, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// dumpState prints what a failed run needs: the Pods, events and the
// replicas' last logs.
func dumpState() {
	if env.kubectl == "" {
		return
	}
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "events", "-n", namespace, "--sort-by", ".lastTimestamp"},
		{"logs", "-n", namespace, "-l", "app.kubernetes.io/name=vmipam", "--tail", "40", "--prefix", "--max-log-requests", "10"},
	} {
		out, err := kubectl(args...)
		fmt.Printf("--- kubectl %s\n%s%v\n", strings.Join(args, " "), out, err)
	}
}

func poolReady(ctx context.Context, name string) error {
	var p vmipamv1.IPPool
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &p); err != nil {
		return err
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == "Ready" && cond.Status == metav1.ConditionTrue {
			return nil
		}
	}
	return fmt.Errorf("IPPool %s not ready: %+v", name, p.Status.Conditions)
}

// ensureNamespace creates ns if it is not there.
func ensureNamespace(t *testing.T, ns string) {
	t.Helper()
	err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// vmipamPods returns vmipam's Pods that are not terminating.
func vmipamPods(t *testing.T) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := c.List(t.Context(), &pods, client.InNamespace(namespace), client.MatchingLabels{"app.kubernetes.io/name": "vmipam"}); err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func ready(p corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// settled waits until the Deployment has three ready Pods of its current
// template and no other Pod of vmipam is left, terminating or not.
func settled(t *testing.T, timeout time.Duration) {
	t.Helper()
	harness.Eventually(t, timeout, "three ready replicas and no other", func() error {
		var d appsv1.Deployment
		if err := c.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: "vmipam"}, &d); err != nil {
			return err
		}
		if d.Status.ObservedGeneration != d.Generation || d.Status.UpdatedReplicas != 3 || d.Status.ReadyReplicas != 3 {
			return fmt.Errorf("deployment status %+v", d.Status)
		}
		var pods corev1.PodList
		if err := c.List(t.Context(), &pods, client.InNamespace(namespace), client.MatchingLabels{"app.kubernetes.io/name": "vmipam"}); err != nil {
			return err
		}
		n := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || !ready(p) {
				return fmt.Errorf("pod %s terminating or not ready", p.Name)
			}
			n++
		}
		if n != 3 {
			return fmt.Errorf("%d pods", n)
		}
		return nil
	})
}

// consistent checks the invariants over every VirtualMachine of the
// cluster once the pools have settled: no address on two VMs, and each
// pool's allocated count equal to the VMs holding its addresses, with
// nothing pending (no leak).
func consistent(t *testing.T, pools ...string) {
	t.Helper()
	harness.Eventually(t, 3*time.Minute, "the pools to agree with the VirtualMachines", func() error {
		var vms vmipamv1.VirtualMachineList
		if err := c.List(t.Context(), &vms); err != nil {
			return err
		}
		owner := map[netip.Addr]string{}
		count := map[string]int64{}
		for _, vm := range vms.Items {
			for _, s := range vm.Spec.Addresses {
				a, err := netip.ParseAddr(s)
				if err != nil {
					return fmt.Errorf("%s/%s has address %q", vm.Namespace, vm.Name, s)
				}
				if o, dup := owner[a]; dup {
					t.Fatalf("duplicate: %s and %s/%s both hold %s", o, vm.Namespace, vm.Name, a)
				}
				owner[a] = vm.Namespace + "/" + vm.Name
			}
			if len(vm.Spec.Addresses) > 0 && vm.DeletionTimestamp == nil {
				// The pool that gave the address, as vmipam records it.
				count[vm.Annotations[vmipamv1.PoolAnnotation]]++
			}
		}
		for _, name := range pools {
			var p vmipamv1.IPPool
			if err := c.Get(t.Context(), client.ObjectKey{Name: name}, &p); err != nil {
				return err
			}
			if p.Status.Allocated != count[name] || p.Status.Pending != 0 {
				return fmt.Errorf("IPPool %s: %d allocated, %d pending; %d live VirtualMachines hold its addresses",
					name, p.Status.Allocated, p.Status.Pending, count[name])
			}
		}
		return nil
	})
}

// failure is an operation of a storm that failed.
type failure struct {
	at  time.Time
	op  string
	err error
}

// storm creates VirtualMachines in ns from workers goroutines and deletes
// each worker's oldest once it keeps more than keep, until Stop. Every
// failed create and delete is recorded with its time.
type storm struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	stopOnce sync.Once
	mu       sync.Mutex
	creates  int
	deletes  int
	failures []failure
}

func startStorm(t *testing.T, ns string, workers, keep int, mutate func(*vmipamv1.VirtualMachine)) *storm {
	t.Helper()
	ensureNamespace(t, ns)
	s := &storm{stop: make(chan struct{})}
	// A test that fails before its Stop must not leave the storm to the
	// tests after it.
	t.Cleanup(func() { s.Stop() })
	ctx := context.Background()
	for w := range workers {
		s.wg.Go(func() {
			var mine []string
			for i := 0; ; i++ {
				select {
				case <-s.stop:
					return
				default:
				}
				vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("w%d-%d", w, i)}}
				if mutate != nil {
					mutate(vm)
				}
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := c.Create(cctx, vm)
				cancel()
				if err == nil && len(vm.Spec.Addresses) == 0 {
					err = errors.New("created without an address")
				}
				s.note("create "+vm.Name, err, true)
				if err == nil {
					mine = append(mine, vm.Name)
				}
				if len(mine) > keep {
					victim := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mine[0]}}
					mine = mine[1:]
					dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					err := client.IgnoreNotFound(c.Delete(dctx, victim))
					cancel()
					s.note("delete "+victim.Name, err, false)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	return s
}

func (s *storm) note(op string, err error, create bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if create {
		s.creates++
	} else {
		s.deletes++
	}
	if err != nil {
		s.failures = append(s.failures, failure{at: time.Now(), op: op, err: err})
	}
}

// Stop ends the storm (once) and returns its failures.
func (s *storm) Stop() []failure {
	s.stopOnce.Do(func() { close(s.stop) })
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.failures)
}

func (s *storm) counts() (creates, deletes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.creates, s.deletes
}

// report logs a storm's figures and its failures.
func (s *storm) report(t *testing.T, what string, fails []failure) {
	t.Helper()
	creates, deletes := s.counts()
	t.Logf("%s: %d creates, %d deletes, %d failed", what, creates, deletes, len(fails))
	for i, f := range fails {
		if i == 20 {
			t.Logf("  ... and %d more", len(fails)-20)
			break
		}
		t.Logf("  %s %s: %v", f.at.Format("15:04:05.000"), f.op, f.err)
	}
}

// readerSA is the ServiceAccount the chart's metrics reader role is bound to.
const readerSA = "e2e-metrics-reader"

// token returns a token of ServiceAccount default/name, creating it.
func token(t *testing.T, name string) string {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	if err := c.Create(t.Context(), sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(t.Context(), name, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// insecure is an HTTPS client that does not verify the server: the suite
// talks to Pods and ClusterIPs by address.
var insecure = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // addresses inside the test cluster
}}

// get fetches url with bearer (if any) and returns the status and body.
func get(url, bearer string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := insecure.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// serviceURL is https://<ClusterIP>:<port> of Service name.
func serviceURL(t *testing.T, name string) string {
	t.Helper()
	var svc corev1.Service
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, &svc); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("https://%s:%d", svc.Spec.ClusterIP, svc.Spec.Ports[0].Port)
}

// podCgroup returns the memory cgroup folder of Pod uid. It stays a glob
// of /sys: procfs reads /proc, and has no reader for cgroup v1's memory
// files.
func podCgroup(uid string) (string, error) {
	for _, qos := range []string{"burstable/", "besteffort/", ""} {
		dirs, _ := filepath.Glob("/sys/fs/cgroup/memory/*/kubepods/" + qos + "pod" + uid)
		if len(dirs) == 1 {
			return dirs[0], nil
		}
	}
	return "", fmt.Errorf("no memory cgroup for pod %s", uid)
}

// pidOf returns the PID of the vmipam process in Pod uid.
func pidOf(uid string) (int, error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, err
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		// A process may exit between the listing and the read.
		cgs, err := p.Cgroups()
		if err != nil || !slices.ContainsFunc(cgs, func(cg procfs.Cgroup) bool { return strings.Contains(cg.Path, "pod"+uid) }) {
			continue
		}
		if comm, err := p.Comm(); err == nil && comm == "vmipam" {
			return p.PID, nil
		}
	}
	return 0, fmt.Errorf("no vmipam process in pod %s", uid)
}
