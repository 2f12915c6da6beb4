package e2e_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/procfs"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/kinds/manifests"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
)

// TestNoRouteOut: the cluster's network namespace has no route out of the
// machine. From the node and from a Pod, a connection to an outside
// address is refused at once; one from a Pod to a ClusterIP that
// kube-proxy has not programmed yet ends at the node's own veth, inside
// the namespace.
func TestNoRouteOut(t *testing.T) {
	need(t)
	links, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		switch {
		case l.Name == "lo", l.Name == "e2e-node", l.Name == "e2e-node-peer", l.Name == "e2e-cni0", strings.HasPrefix(l.Name, "veth"):
		default:
			t.Errorf("interface %s in the cluster's namespace: only lo, the node's veth pair, the CNI bridge and the Pods' veths belong here", l.Name)
		}
	}
	routes, err := procFS(t).NetRoute()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if r.Destination == 0 && r.Mask == 0 {
			t.Errorf("a default route: via %s, gateway %08X", r.Iface, r.Gateway)
		}
	}
	_, err = net.DialTimeout("tcp", "192.0.2.1:80", 2*time.Second)
	if !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("dial 192.0.2.1:80 from the node: %v; want network unreachable", err)
	}

	// The same from a Pod, through the CNI bridge.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "e2e-probe"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "probe", Image: env.probe, ImagePullPolicy: corev1.PullNever,
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/healthz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1}}},
	}}
	if err := c.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), pod) })
	harness.Eventually(t, 2*time.Minute, "the probe Pod to be ready", func() error {
		if err := c.Get(t.Context(), client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		if !ready(*pod) {
			return fmt.Errorf("phase %s", pod.Status.Phase)
		}
		return nil
	})
	dial := func(addr string) string {
		resp, err := http.Get(fmt.Sprintf("http://%s:8080/dial?addr=%s", pod.Status.PodIP, addr))
		if err != nil {
			t.Fatalf("ask the probe Pod to dial %s: %v", addr, err)
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	if got := dial("192.0.2.1:80"); !strings.Contains(got, "unreachable") && !strings.Contains(got, "no route to host") {
		t.Errorf("dial 192.0.2.1:80 from a Pod: %s; want unreachable", got)
	}

	// A Service, and a connection from the Pod to its ClusterIP at once:
	// before kube-proxy's rules, the packet takes the Service range's
	// route to the node's veth and ends at its other end.
	before := rxPackets(t, "e2e-node-peer")
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "e2e-unprogrammed"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}, Selector: map[string]string{"none": "none"}},
	}
	if err := c.Create(t.Context(), svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), svc) })
	got := dial(net.JoinHostPort(svc.Spec.ClusterIP, "80"))
	if got == "connected" {
		t.Fatalf("a connection to %s, a Service with no endpoints", svc.Spec.ClusterIP)
	}
	after := rxPackets(t, "e2e-node-peer")
	t.Logf("a Pod's dial of %s right after its Service was created: %s; packets that ended at e2e-node-peer meanwhile: %d",
		svc.Spec.ClusterIP, got, after-before)

	// kube-proxy may be faster than the dial above. An address of the
	// Service range that no Service has is what any ClusterIP is until
	// kube-proxy programs it: nothing rewrites it.
	var svcs corev1.ServiceList
	if err := c.List(t.Context(), &svcs); err != nil {
		t.Fatal(err)
	}
	unassigned := "10.96.255.254"
	for _, s := range svcs.Items {
		if s.Spec.ClusterIP == unassigned {
			t.Fatalf("Service %s/%s has %s", s.Namespace, s.Name, unassigned)
		}
	}
	before = rxPackets(t, "e2e-node-peer")
	got = dial(net.JoinHostPort(unassigned, "80"))
	after = rxPackets(t, "e2e-node-peer")
	if got == "connected" || after == before {
		t.Errorf("a Pod's dial of %s, in the Service range but programmed by no one: %s, %d packets at e2e-node-peer; want it to end there",
			unassigned, got, after-before)
	}
	t.Logf("a Pod's dial of %s (unprogrammed): %s; packets that ended at e2e-node-peer: %d", unassigned, got, after-before)
}

// rxPackets is how many packets link has received, from /proc/net/dev
// (which, unlike /sys, follows the reader's network namespace).
func rxPackets(t *testing.T, link string) int64 {
	t.Helper()
	dev, err := procFS(t).NetDev()
	if err != nil {
		t.Fatal(err)
	}
	l, ok := dev[link]
	if !ok {
		t.Fatalf("no interface %s in /proc/net/dev", link)
	}
	return int64(l.RxPackets)
}

// procFS is the machine's /proc.
func procFS(t *testing.T) procfs.FS {
	t.Helper()
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// TestAddresses: VirtualMachines created through the API server get
// addresses from vmipam's Pods behind its Service; kubectl shows them; the
// pool's status and the replicas' metrics agree with them.
func TestAddresses(t *testing.T) {
	need(t)
	const ns = "e2e-addresses"
	ensureNamespace(t, ns)
	want := map[string]string{}
	for i := range 20 {
		vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("vm-%d", i)}}
		if err := c.Create(t.Context(), vm); err != nil {
			t.Fatalf("create %s: %v", vm.Name, err)
		}
		if len(vm.Spec.Addresses) != 1 || !netip.MustParsePrefix("10.100.0.0/16").Contains(netip.MustParseAddr(vm.Spec.Addresses[0])) {
			t.Fatalf("%s created with addresses %v, want one of 10.100.0.0/16", vm.Name, vm.Spec.Addresses)
		}
		want[vm.Name] = vm.Spec.Addresses[0]
	}
	out, err := kubectl("get", "vmivm", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	for name, addr := range want {
		if !strings.Contains(out, name) || !strings.Contains(out, addr) {
			t.Errorf("kubectl get vmivm does not show %s with %s:\n%s", name, addr, out)
		}
	}
	consistent(t, poolName)

	// The replicas' metrics, each Pod's own: the allocated addresses of
	// the pool add up to the status's.
	tok := token(t, readerSA)
	harness.Eventually(t, time.Minute, "the replicas' metrics to add up to the pool's status", func() error {
		var p vmipamv1.IPPool
		if err := c.Get(t.Context(), client.ObjectKey{Name: poolName}, &p); err != nil {
			return err
		}
		var sum float64
		for _, pod := range vmipamPods(t) {
			code, body, err := get(fmt.Sprintf("https://%s:8443/metrics", pod.Status.PodIP), tok)
			if err != nil {
				return fmt.Errorf("metrics of %s: %w", pod.Name, err)
			}
			if code != http.StatusOK {
				return fmt.Errorf("metrics of %s: status %d", pod.Name, code)
			}
			v, ok := harness.Metric(body, "vmipam_pool_addresses", map[string]string{"pool": poolName, "state": "allocated"})
			if !ok {
				return fmt.Errorf("%s has no vmipam_pool_addresses for %s", pod.Name, poolName)
			}
			sum += v
		}
		if int64(sum) != p.Status.Allocated {
			return fmt.Errorf("metrics: %v allocated; status: %d", sum, p.Status.Allocated)
		}
		return nil
	})
}

// TestMetricsAuth: the metrics Service serves a ServiceAccount token bound
// to the chart's reader role, and refuses no token and a token without it.
func TestMetricsAuth(t *testing.T) {
	need(t)
	url := serviceURL(t, "vmipam-metrics") + "/metrics"
	for _, tc := range []struct {
		name, token string
		want        int
	}{
		{"reader", token(t, readerSA), http.StatusOK},
		{"no token", "", http.StatusUnauthorized},
		{"a token without the role", token(t, "e2e-nobody"), http.StatusForbidden},
	} {
		code, body, err := get(url, tc.token)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if code != tc.want || (code == http.StatusOK && !strings.Contains(body, "vmipam_pool_addresses")) {
			t.Errorf("%s: %d; want %d", tc.name, code, tc.want)
		}
	}
}

// TestIdentities: a user who may edit VirtualMachines cannot set or change
// vmipam's holder label or token; vmipam's ServiceAccount can.
func TestIdentities(t *testing.T) {
	need(t)
	const ns = "e2e-identities"
	ensureNamespace(t, ns)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm-editor"}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{vmipamv1.GroupVersion.Group}, Resources: []string{"virtualmachines"}, Verbs: []string{"*"},
	}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "alice"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "alice"}}}
	for _, o := range []client.Object{role, binding} {
		if err := c.Create(t.Context(), o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	as := func(user string, groups ...string) client.Client {
		ic := rest.CopyConfig(cfg)
		ic.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
		cl, err := client.New(ic, client.Options{Scheme: c.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	alice := as("alice", "system:authenticated")
	vmipamSA := as("system:serviceaccount:"+namespace+":vmipam", "system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:authenticated")

	vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a1"}}
	if err := alice.Create(t.Context(), vm); err != nil {
		t.Fatalf("alice creates a VM: %v", err)
	}
	holder := vm.Labels[vmipamv1.HolderLabel]
	if holder == "" || vm.Annotations[vmipamv1.TokenAnnotation] == "" {
		t.Fatalf("a1 created without vmipam's holder label or token: %v %v", vm.Labels, vm.Annotations)
	}
	forged := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a2",
		Labels: map[string]string{vmipamv1.HolderLabel: "evil"}, Annotations: map[string]string{vmipamv1.TokenAnnotation: "forged"}}}
	if err := alice.Create(t.Context(), forged); err == nil {
		if forged.Labels[vmipamv1.HolderLabel] == "evil" || forged.Annotations[vmipamv1.TokenAnnotation] == "forged" {
			t.Errorf("alice created a VM with her own holder label or token: %v %v", forged.Labels, forged.Annotations)
		}
	}
	for _, patch := range []string{
		`{"metadata":{"labels":{"vmipam.io/holder":"evil"}}}`,
		`{"metadata":{"labels":{"vmipam.io/holder":null}}}`,
		`{"metadata":{"annotations":{"vmipam.io/token":"forged"}}}`,
	} {
		err := alice.Patch(t.Context(), vm.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch)))
		if err == nil {
			t.Errorf("alice's patch %s was allowed", patch)
		} else if !strings.Contains(err.Error(), "ValidatingAdmissionPolicy") {
			t.Errorf("alice's patch %s: %v; want refused by vmipam's admission policy (she may edit VMs)", patch, err)
		} else {
			t.Logf("alice's patch %s: %v", patch, err)
		}
	}
	// vmipam, as its ServiceAccount, moves the label to another live
	// replica, as a takeover does, and back (the claim stays with the
	// first: a VM labelled for a holder that does not hold its address
	// keeps its finalizer until a resync).
	var other string
	for _, h := range liveHolders(t) {
		if h != holder {
			other = h
			break
		}
	}
	if other == "" {
		t.Fatalf("no live replica but %s", holder)
	}
	for _, to := range []string{other, holder} {
		if err := vmipamSA.Patch(t.Context(), vm.DeepCopy(), client.RawPatch(types.MergePatchType,
			fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, vmipamv1.HolderLabel, to))); err != nil {
			t.Errorf("vmipam's ServiceAccount relabels a1 for %s: %v", to, err)
		}
	}
	deleteNamespace(t, ns)
}

// TestPDB: the PodDisruptionBudget lets one replica be evicted and
// refuses a second eviction while the first is replaced.
func TestPDB(t *testing.T) {
	need(t)
	settled(t, 3*time.Minute)
	pods := vmipamPods(t)
	evict := func(p corev1.Pod) error {
		return c.SubResource("eviction").Create(t.Context(), &p, &policyv1.Eviction{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}})
	}
	// The disruption controller must have counted the three.
	harness.Eventually(t, time.Minute, "the PDB to allow one disruption", func() error {
		var pdb policyv1.PodDisruptionBudget
		if err := c.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: "vmipam"}, &pdb); err != nil {
			return err
		}
		if pdb.Status.DisruptionsAllowed != 1 {
			return fmt.Errorf("status %+v", pdb.Status)
		}
		return nil
	})
	if err := evict(pods[0]); err != nil {
		t.Fatalf("evict %s: %v", pods[0].Name, err)
	}
	err := evict(pods[1])
	if !apierrors.IsTooManyRequests(err) {
		t.Errorf("a second eviction (%s) while %s is replaced: %v; want refused (429)", pods[1].Name, pods[0].Name, err)
	} else {
		t.Logf("second eviction: %v", err)
	}
	settled(t, 4*time.Minute)
}

// TestMemory: each replica set Go's soft memory limit to nine tenths of
// its container's (the Deployment's 512Mi, read from its cgroup), and the
// memory limit holds under 7 MiB request bodies sent to the webhook
// Service, a storm of 3 MiB VirtualMachines through the API server
// (admitted, then refused by its storage) and one of 1.5 MiB
// VirtualMachines (stored): no replica is OOMKilled or restarts; the peak
// memory of each is printed.
func TestMemory(t *testing.T) {
	need(t)
	settled(t, 3*time.Minute)
	restarts := restartCounts(t)
	for _, p := range vmipamPods(t) {
		out, err := kubectl("logs", "-n", namespace, p.Name, "-c", "manager")
		if err != nil {
			t.Fatal(err)
		}
		limit := int64(512 << 20)
		want := fmt.Sprintf(`"limit":%d,"containerLimit":%d`, int64(float64(limit)*0.9), limit)
		if !strings.Contains(out, `"msg":"Set the Go runtime's memory limit from the container's"`) || !strings.Contains(out, want) {
			t.Errorf("%s did not log that it set Go's memory limit (%s)", p.Name, want)
		}
	}
	url := serviceURL(t, "vmipam-webhook") + "/mutate-vmipam-io-v1alpha1-virtualmachine"
	big := bytes.Repeat([]byte("x"), 7<<20-1024)
	body := fmt.Appendf(nil, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"e2e","kind":{"group":"vmipam.io","version":"v1alpha1","kind":"VirtualMachine"},"operation":"CREATE","namespace":"default","object":{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"name":"big"},"spec":{"image":"%s"}}}}`, big)
	var wg sync.WaitGroup
	codes := map[int]int{}
	var mu sync.Mutex
	for range 48 {
		wg.Go(func() {
			resp, err := insecure.Post(url, "application/json", bytes.NewReader(body))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				codes[-1]++
				return
			}
			_ = resp.Body.Close()
			codes[resp.StatusCode]++
		})
	}
	wg.Wait()
	t.Logf("48 concurrent 7 MiB AdmissionReviews to the webhook Service: answers by status %v", codes)

	// 3 MiB VirtualMachines reach vmipam's webhook whole, but the API
	// server cannot store them: its etcd client sends at most 2 MiB. Each
	// create must fail there, after admission, and never in vmipam.
	image := strings.Repeat("i", 3<<20-8<<10)
	s := startStorm(t, "e2e-memory", 6, 2, func(vm *vmipamv1.VirtualMachine) { vm.Spec.Image = image })
	time.Sleep(20 * time.Second)
	fails := s.Stop()
	creates, _ := s.counts()
	t.Logf("3 MiB VirtualMachines for 20s: %d creates sent, %d refused", creates, len(fails))
	for _, f := range fails {
		if !strings.Contains(f.err.Error(), "larger than max") {
			t.Errorf("a 3 MiB create failed otherwise than in the API server's storage: %s: %v", f.op, f.err)
		}
	}
	// 1.5 MiB VirtualMachines are stored, and deleted.
	image = strings.Repeat("i", 3<<19)
	s = startStorm(t, "e2e-memory", 6, 2, func(vm *vmipamv1.VirtualMachine) { vm.Spec.Image = image })
	time.Sleep(30 * time.Second)
	fails = s.Stop()
	s.report(t, "1.5 MiB VirtualMachines for 30s", fails)
	if len(fails) > 0 {
		t.Errorf("%d creates or deletes of 1.5 MiB VirtualMachines failed", len(fails))
	}
	for _, p := range vmipamPods(t) {
		dir, err := podCgroup(string(p.UID))
		if err != nil {
			t.Error(err)
			continue
		}
		peak, _ := os.ReadFile(dir + "/memory.max_usage_in_bytes")
		limit, _ := os.ReadFile(dir + "/memory.limit_in_bytes")
		oom, _ := os.ReadFile(dir + "/memory.oom_control")
		n, _ := strconv.ParseInt(strings.TrimSpace(string(peak)), 10, 64)
		l, _ := strconv.ParseInt(strings.TrimSpace(string(limit)), 10, 64)
		t.Logf("%s: peak memory use (the cgroup's, page cache included) %d MiB of a %d MiB limit; %s", p.Name, n>>20, l>>20, strings.ReplaceAll(strings.TrimSpace(string(oom)), "\n", ", "))
	}
	if after := restartCounts(t); !mapsEqual(after, restarts) {
		t.Errorf("replicas restarted: %v, before %v", after, restarts)
	}
	deleteNamespace(t, "e2e-memory")
}

func restartCounts(t *testing.T) map[string]int32 {
	t.Helper()
	out := map[string]int32{}
	for _, p := range vmipamPods(t) {
		for _, st := range p.Status.ContainerStatuses {
			out[p.Name] += st.RestartCount
			if st.LastTerminationState.Terminated != nil && st.LastTerminationState.Terminated.Reason == "OOMKilled" {
				t.Errorf("%s was OOMKilled", p.Name)
			}
		}
	}
	return out
}

func mapsEqual(a, b map[string]int32) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func deleteNamespace(t *testing.T, ns string) {
	t.Helper()
	if err := c.Delete(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 3*time.Minute, "namespace "+ns+" to be deleted", func() error {
		err := c.Get(t.Context(), client.ObjectKey{Name: ns}, &corev1.Namespace{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		}
		return errors.New("still there")
	})
}

// TestKill: during a create and delete storm, one replica's process is
// SIGKILLed (its container restarts under the same Pod name) and another
// Pod is force-deleted (its replacement has a new name, so the others
// take its claims over). Creates fail for a few seconds at most; no
// address is given twice or leaked.
func TestKill(t *testing.T) {
	need(t)
	settled(t, 3*time.Minute)
	pods := vmipamPods(t)
	s := startStorm(t, "e2e-kill", 4, 10, nil)
	time.Sleep(5 * time.Second)

	pid, err := pidOf(string(pods[0].UID))
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGKILLed vmipam (pid %d) in %s", pid, pods[0].Name)
	harness.Eventually(t, 3*time.Minute, pods[0].Name+" to restart its container", func() error {
		var p corev1.Pod
		if err := c.Get(t.Context(), client.ObjectKeyFromObject(&pods[0]), &p); err != nil {
			return err
		}
		if p.Status.ContainerStatuses[0].RestartCount <= pods[0].Status.ContainerStatuses[0].RestartCount {
			return errors.New("not restarted yet")
		}
		return nil
	})
	settled(t, 3*time.Minute)
	t.Logf("three replicas ready again %s after the SIGKILL", time.Since(killed).Round(time.Millisecond))
	time.Sleep(5 * time.Second)

	forced := time.Now()
	zero := int64(0)
	if err := c.Delete(t.Context(), &pods[1], &client.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	t.Logf("force-deleted %s", pods[1].Name)
	settled(t, 3*time.Minute)
	t.Logf("three replicas ready again %s after the forced deletion", time.Since(forced).Round(time.Millisecond))
	// Its slot goes to the others (taken over, its Lease deleted) or, if
	// it lapsed before the replacement looked, to the replacement.
	harness.Eventually(t, 3*time.Minute, "the force-deleted replica's slot to be taken over or taken", func() error {
		var leases coordinationv1.LeaseList
		if err := c.List(t.Context(), &leases, client.InNamespace(namespace), client.MatchingLabels{pools.HolderLeaseLabel: "true"}); err != nil {
			return err
		}
		for _, l := range leases.Items {
			if l.Annotations[pools.ProcessAnnotation] == pods[1].Name || strings.Contains(l.Name, pods[1].Name) {
				return fmt.Errorf("Lease %s still names %s", l.Name, pods[1].Name)
			}
		}
		return nil
	})
	t.Logf("its claims taken over %s after the forced deletion", time.Since(forced).Round(time.Millisecond))
	time.Sleep(5 * time.Second)
	fails := s.Stop()
	s.report(t, "storm across a SIGKILL and a forced Pod deletion", fails)
	windows(t, fails, map[string]time.Time{"SIGKILL": killed, "force delete": forced})
	consistent(t, poolName)
	deleteNamespace(t, "e2e-kill")
}

// windows logs, for each event, how many failures came after it (and
// before the next) and how long after it the last one came, and fails
// the test when one came more than 30 s after its event.
func windows(t *testing.T, fails []failure, events map[string]time.Time) {
	t.Helper()
	for _, f := range fails {
		var name string
		var at time.Time
		for n, e := range events {
			if !f.at.Before(e) && e.After(at) {
				name, at = n, e
			}
		}
		if name == "" {
			t.Errorf("a failure before any event: %s %v", f.op, f.err)
			continue
		}
		if d := f.at.Sub(at); d > 30*time.Second {
			t.Errorf("a failure %s after the %s: %s %v", d.Round(time.Millisecond), name, f.op, f.err)
		}
	}
	for n, e := range events {
		count, last := 0, time.Duration(0)
		for _, f := range fails {
			owner := ""
			var at time.Time
			for n2, e2 := range events {
				if !f.at.Before(e2) && e2.After(at) {
					owner, at = n2, e2
				}
			}
			if owner == n {
				count++
				last = max(last, f.at.Sub(e))
			}
		}
		t.Logf("after the %s: %d failed, the last %s after it", n, count, last.Round(time.Millisecond))
	}
}

// TestRolloutRestart: kubectl rollout restart during a create and delete
// storm, with the chart's drain settings: no create and no delete fails.
func TestRolloutRestart(t *testing.T) {
	need(t)
	throughStorm(t, "e2e-rollout", "kubectl rollout restart", func(start time.Time) {
		if _, err := kubectl("rollout", "restart", "-n", namespace, "deployment/vmipam"); err != nil {
			t.Fatal(err)
		}
		if _, err := kubectl("rollout", "status", "-n", namespace, "deployment/vmipam", "--timeout", "5m"); err != nil {
			t.Fatal(err)
		}
		t.Logf("rollout status done after %s", time.Since(start).Round(time.Millisecond))
		settled(t, 5*time.Minute)
		t.Logf("old Pods gone after %s", time.Since(start).Round(time.Millisecond))
	})
}

// throughStorm runs disrupt (given when it started) during a create and
// delete storm in namespace ns, which it deletes after: no create and no
// delete may fail, no address be given twice or leak.
func throughStorm(t *testing.T, ns, what string, disrupt func(start time.Time)) {
	t.Helper()
	settled(t, 3*time.Minute)
	s := startStorm(t, ns, 4, 10, nil)
	time.Sleep(5 * time.Second)
	disrupt(time.Now())
	time.Sleep(5 * time.Second)
	fails := s.Stop()
	s.report(t, "storm across "+what, fails)
	if len(fails) > 0 {
		t.Errorf("%d creates or deletes failed across %s; want 0", len(fails), what)
	}
	consistent(t, poolName)
	deleteNamespace(t, ns)
}

// TestCertRotation: the serving certificate's Secret is deleted (what the
// README says to do when its key may have leaked) while creates run:
// vmipam makes a new CA, serves a certificate of it once the webhook
// configurations trust it, and no create fails.
func TestCertRotation(t *testing.T) {
	need(t)
	throughStorm(t, "e2e-certs", "a CA and certificate rotation", func(start time.Time) {
		var old corev1.Secret
		if err := c.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: "vmipam-webhook-tls"}, &old); err != nil {
			t.Fatal(err)
		}
		if err := c.Delete(t.Context(), &old); err != nil {
			t.Fatal(err)
		}
		harness.Eventually(t, 5*time.Minute, "every replica to serve a certificate of the new Secret", func() error {
			var cur corev1.Secret
			if err := c.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: "vmipam-webhook-tls"}, &cur); err != nil {
				return err
			}
			if bytes.Equal(cur.Data["tls.crt"], old.Data["tls.crt"]) || len(cur.Data["tls.crt"]) == 0 {
				return errors.New("no new serving certificate yet")
			}
			for _, p := range vmipamPods(t) {
				served, err := servedCert(p.Status.PodIP + ":9443")
				if err != nil {
					return err
				}
				if !pemHolds(cur.Data["tls.crt"], served) {
					return fmt.Errorf("%s serves a certificate that is not the Secret's", p.Name)
				}
			}
			return nil
		})
		t.Logf("every replica served the new certificate %s after the Secret's deletion", time.Since(start).Round(time.Millisecond))
	})
}

// servedCert returns the DER of the leaf certificate addr serves.
func servedCert(addr string) ([]byte, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only the certificate is read
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	certs := conn.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return nil, fmt.Errorf("%s served no certificate", addr)
	}
	return certs[0].Raw, nil
}

// pemHolds reports whether one of the PEM blocks of data is der.
func pemHolds(data, der []byte) bool {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return false
		}
		if bytes.Equal(block.Bytes, der) {
			return true
		}
	}
}

// TestHelmUpgrade: helm upgrade with other values (resources, an
// annotation: a new Pod template) during creates: none fails.
func TestHelmUpgrade(t *testing.T) {
	need(t)
	throughStorm(t, "e2e-upgrade", "helm upgrade", func(start time.Time) {
		if out, err := helm(installArgs("upgrade", "--set", "resources.requests.cpu=50m", "--set-string", "podAnnotations.e2e=upgraded")...); err != nil {
			t.Fatalf("helm upgrade: %v\n%s", err, out)
		}
		settled(t, 5*time.Minute)
		t.Logf("helm upgrade --wait and the old Pods gone after %s", time.Since(start).Round(time.Millisecond))
	})
}

// TestNamespaceDeletion: deleting a namespace that holds VirtualMachines
// completes (kube-controller-manager's namespace controller, vmipam's
// finalizer), and their addresses go into cooldown.
func TestNamespaceDeletion(t *testing.T) {
	need(t)
	const ns, pool = "e2e-nsdel", "e2e-nsdel"
	p := fixture.Pool(pool, fixture.WithCIDRs("10.101.0.0/24"), fixture.WithCooldown(30*time.Minute))
	if err := c.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, time.Minute, "IPPool "+pool+" ready", func() error { return poolReady(t.Context(), pool) })
	ensureNamespace(t, ns)
	held := map[string]bool{}
	for i := range 10 {
		vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("vm-%d", i)},
			Spec: vmipamv1.VirtualMachineSpec{IPPool: pool}}
		if err := retryCreate(t, vm); err != nil {
			t.Fatal(err)
		}
		held[vm.Spec.Addresses[0]] = true
	}
	start := time.Now()
	deleteNamespace(t, ns)
	t.Logf("namespace with 10 VirtualMachines deleted in %s", time.Since(start).Round(time.Millisecond))
	harness.Eventually(t, time.Minute, "the 10 addresses in cooldown", func() error {
		if err := c.Get(t.Context(), client.ObjectKey{Name: pool}, p); err != nil {
			return err
		}
		if p.Status.Cooldown != 10 || p.Status.Allocated != 0 || p.Status.Pending != 0 {
			return fmt.Errorf("status: %d cooling, %d allocated, %d pending", p.Status.Cooldown, p.Status.Allocated, p.Status.Pending)
		}
		return nil
	})
	// None of them is handed out again while it cools.
	ensureNamespace(t, ns+"-2")
	for i := range 20 {
		vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns + "-2", Name: fmt.Sprintf("vm-%d", i)},
			Spec: vmipamv1.VirtualMachineSpec{IPPool: pool}}
		if err := retryCreate(t, vm); err != nil {
			t.Fatal(err)
		}
		if held[vm.Spec.Addresses[0]] {
			t.Errorf("%s got %s, released %s ago with a 30m cooldown", vm.Name, vm.Spec.Addresses[0], time.Since(start).Round(time.Second))
		}
	}
	deleteNamespace(t, ns+"-2")
}

// retryCreate creates vm, retrying for 30 s while vmipam asks for a retry.
func retryCreate(t *testing.T, vm *vmipamv1.VirtualMachine) error {
	t.Helper()
	return harness.Poll(t.Context(), 200*time.Millisecond, 30*time.Second, func() error {
		err := c.Create(t.Context(), vm)
		if err == nil && len(vm.Spec.Addresses) == 0 {
			return fmt.Errorf("%s created without an address", vm.Name)
		}
		return err
	})
}

// TestNeonVMKind: a NeonVM-style VirtualMachine (vm.neon.tech/v1) served by
// configuration alone: the chart upgraded with a kinds configuration that
// serves vmipam's own kind and NeonVM's (deploy/kinds), and the wiring
// `vmipam manifests` renders from it. A NeonVM VM with its extra network
// enabled gets an address in status.extraNetIP; vmipam's own kind is still
// served; the address is released into cooldown when the VM goes.
func TestNeonVMKind(t *testing.T) {
	need(t)
	if _, err := kubectl("apply", "--server-side", "-f", filepath.Join(env.repo, "test", "kinds", "testdata", "neonvm-crd.yaml")); err != nil {
		t.Fatal(err)
	}
	all := kinds.Config{APIVersion: kinds.ConfigAPIVersion, Kind: kinds.ConfigKind}
	for _, f := range []string{"kinds.yaml", "examples/neonvm.yaml"} {
		raw, err := os.ReadFile(filepath.Join(env.repo, "deploy", "kinds", f))
		if err != nil {
			t.Fatal(err)
		}
		var one kinds.Config
		if err := yaml.Unmarshal(raw, &one); err != nil {
			t.Fatal(err)
		}
		all.Kinds = append(all.Kinds, one.Kinds...)
	}
	config, err := yaml.Marshal(all)
	if err != nil {
		t.Fatal(err)
	}
	kinds, err := kinds.Parse(config)
	if err != nil {
		t.Fatal(err)
	}
	wiring, err := manifests.YAML(manifests.All(kinds, manifests.Options{Namespace: namespace}), "make e2e: vmipam's kind and NeonVM's")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"kinds.yaml": config, "wiring.yaml": wiring} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	settled(t, 3*time.Minute)
	if out, err := helm(installArgs("upgrade", "--reuse-values", "--set-file", "kinds.config="+filepath.Join(dir, "kinds.yaml"),
		"--set-file", "kinds.wiring="+filepath.Join(dir, "wiring.yaml"))...); err != nil {
		t.Fatalf("helm upgrade with the NeonVM kind: %v\n%s", err, out)
	}
	settled(t, 5*time.Minute)

	const ns = "e2e-neonvm"
	ensureNamespace(t, ns)
	gvk := schema.GroupVersionKind{Group: "vm.neon.tech", Version: "v1", Kind: "VirtualMachine"}
	vm := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"guest": map[string]any{"cpus": map[string]any{"min": int64(1)}}, "extraNetwork": map[string]any{"enable": true}},
	}}
	vm.SetGroupVersionKind(gvk)
	vm.SetNamespace(ns)
	vm.SetName("neon-1")
	if err := harness.Poll(t.Context(), 200*time.Millisecond, 30*time.Second, func() error { return c.Create(t.Context(), vm) }); err != nil {
		t.Fatalf("create a NeonVM VirtualMachine: %v", err)
	}
	var addr string
	harness.Eventually(t, time.Minute, "status.extraNetIP of neon-1", func() error {
		if err := c.Get(t.Context(), client.ObjectKeyFromObject(vm), vm); err != nil {
			return err
		}
		addr, _, _ = unstructured.NestedString(vm.Object, "status", "extraNetIP")
		if addr == "" {
			return errors.New("no address yet")
		}
		return nil
	})
	if !netip.MustParsePrefix("10.100.0.0/16").Contains(netip.MustParseAddr(addr)) {
		t.Errorf("neon-1 got %s, not in the default pool", addr)
	}
	t.Logf("neon-1 got %s", addr)
	own := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "own-1"}}
	if err := retryCreate(t, own); err != nil {
		t.Fatalf("vmipam's own kind beside NeonVM's: %v", err)
	}
	if own.Spec.Addresses[0] == addr {
		t.Errorf("own-1 and neon-1 both hold %s", addr)
	}
	deleteNamespace(t, ns)
}

// liveHolders returns the holders whose Lease their process holds: the
// replicas' holder slots, or pod names without slots.
func liveHolders(t *testing.T) []string {
	t.Helper()
	var leases coordinationv1.LeaseList
	if err := c.List(t.Context(), &leases, client.InNamespace(namespace), client.MatchingLabels{pools.HolderLeaseLabel: "true"}); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range leases.Items {
		h := strings.TrimPrefix(l.Name, pools.LeaseName(""))
		if ptr.Deref(l.Spec.HolderIdentity, "") == h {
			out = append(out, h)
		}
	}
	return out
}
