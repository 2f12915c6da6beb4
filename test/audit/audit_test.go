// Package audit is the envtest suite of `kubectl vmipam check`'s logic
// (package audit) against three vmipam replicas (test/harness's
// Replicas) on a real kube-apiserver and etcd:
//
//   - TestCheck, in one run of replicas and one pool:
//     a storm of creates and deletes while replicas are SIGKILLed and
//     restarted (under their holder name, or a new one), with audit.Run
//     called over and over during it and after it: no finding, ever.
//     Then the faults, each found with its fix: a holder label changed on
//     a live VM (found at once); then every replica killed, and in that
//     window a VM deleted with its finalizer removed (a leak, found past the
//     pool's pending TTL of 60s plus the grace), a duplicate and a VM
//     without an address created while the mutating webhook is bypassed,
//     beside an object of a kind the replicas do not serve (KubeVirt's
//     VirtualMachine) carrying vmipam's label and finalizer, and the
//     claims of the dead replicas.
//
// AUDIT_STORM sets the storm's length (default 36s). Under -short the
// suite skips.
package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	vmipamaudit "github.com/vmipam/vmipam/audit"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
)

// The replicas' lease timing, short as in test/replicas, so that a killed
// replica is taken over within seconds.
const (
	audLeaseDuration = 10 * time.Second
	audGrace         = 5 * time.Second
	audPendingTTL    = time.Minute // the smallest the IPPool CRD allows
)

var audFlags = []string{
	"--lease-duration=" + audLeaseDuration.String(),
	"--lease-renew-deadline=7s",
	"--lease-retry-period=2s",
	"--shutdown-drain=2s",
}

// audCluster is the control plane, with vmipam built and KubeVirt's
// VirtualMachine CRD installed (a kind the replicas do not serve).
var audCluster *harness.Cluster

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, func() (func(bool) error, error) {
		harness.SetTestLogger(false)
		dir, err := os.MkdirTemp("", "vmipam-audit-")
		if err != nil {
			return nil, fmt.Errorf("temporary directory: %w", err)
		}
		root := filepath.Join("..", "..")
		audCluster, err = harness.StartWith(context.Background(), root, dir, harness.ClusterOptions{
			CRDs: []string{filepath.Join(root, "test", "kinds", "testdata", "kubevirt-crd.yaml")},
		})
		if err != nil {
			return nil, errors.Join(err, os.RemoveAll(dir))
		}
		return func(bool) error { return errors.Join(audCluster.Stop(), os.RemoveAll(dir)) }, nil
	}))
}

// audSuite is the test's view of the control plane.
type audSuite struct {
	t    *testing.T
	ctx  context.Context
	c    client.Client
	src  vmipamaudit.Sources
	rs   *harness.Replicas
	logs sync.Map // replica index → *harness.LogBuffer
	ns   string
}

func audNewSuite(t *testing.T) *audSuite {
	harness.NeedControlPlane(t)
	if audCluster == nil {
		t.Fatal("no control plane: TestMain did not start one")
	}
	s := &audSuite{t: t, ctx: t.Context(), c: audCluster.Client, ns: "audit"}
	dc, err := discovery.NewDiscoveryClientForConfig(audCluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	mc, err := metadata.NewForConfig(audCluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	s.src = vmipamaudit.Sources{Reader: audCluster.Client, Discovery: dc, Metadata: mc}
	if err := s.c.Create(s.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}); err != nil {
		t.Fatal(err)
	}
	rs, err := audCluster.StartReplicas(s.ctx, 3, func(i int) io.Writer {
		b := &harness.LogBuffer{Max: 64 << 20}
		s.logs.Store(i, b)
		return b
	}, audFlags...)
	if err != nil {
		t.Fatal(err)
	}
	s.rs = rs
	t.Cleanup(func() {
		if t.Failed() {
			s.logs.Range(func(k, v any) bool {
				for _, l := range harness.Grep(v.(*harness.LogBuffer).String(), 30, `"level":"error"`, "DuplicateAddress") {
					t.Logf("replica %d: %s", k, l)
				}
				return true
			})
		}
		if err := rs.Stop(30 * time.Second); err != nil {
			t.Errorf("stop the replicas: %v", err)
		}
	})
	return s
}

// check runs audit.Run as the plugin does.
func (s *audSuite) check() (vmipamaudit.Report, time.Duration, error) {
	began := time.Now()
	rep, err := vmipamaudit.Run(s.ctx, s.src, vmipamaudit.Options{Namespace: harness.Namespace, Grace: audGrace})
	return rep, time.Since(began), err
}

// create creates a VM of pool, without retrying.
func (s *audSuite) create(name, pool string, mutate ...func(*vmipamv1.VirtualMachine)) (*vmipamv1.VirtualMachine, error) {
	vm := &vmipamv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: name},
		Spec:       vmipamv1.VirtualMachineSpec{IPPool: pool, Image: "audit", CPUs: 1},
	}
	for _, f := range mutate {
		f(vm)
	}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	return vm, s.c.Create(ctx, vm)
}

func TestCheck(t *testing.T) {
	s := audNewSuite(t)
	const pool = "audit"
	if err := s.c.Create(s.ctx, fixture.Pool(pool, fixture.WithCIDRs("10.120.0.0/22"),
		fixture.WithCooldown(10*time.Second), fixture.WithPendingTTL(audPendingTTL))); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 60*time.Second, "a VM of the pool to be created", func() error {
		vm, err := s.create("probe", pool)
		if err != nil {
			return err
		}
		return s.c.Delete(s.ctx, vm)
	})

	storm := 36 * time.Second
	if v := os.Getenv("AUDIT_STORM"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("AUDIT_STORM: %v", err)
		}
		storm = d
	}
	t.Run("storm", func(t *testing.T) { s.stormPhase(t, pool, storm) })
	if t.Failed() {
		return
	}
	t.Run("faults", func(t *testing.T) { s.faultsPhase(t, pool) })
}

// stormPhase creates and deletes VMs from 6 clients for d, SIGKILLs a
// replica every 10s and starts one again (under the same holder or a new
// one, in turn), and runs audit.Run back to back all along and for 10s
// after: every run must find nothing.
func (s *audSuite) stormPhase(t *testing.T, pool string, d time.Duration) {
	ctx, stop := context.WithCancel(s.ctx)
	var wg sync.WaitGroup
	var created, deleted, failed atomic.Int64
	for w := range 6 {
		wg.Go(func() {
			var mine []*vmipamv1.VirtualMachine
			for i := 0; ctx.Err() == nil; i++ {
				vm, err := s.create(fmt.Sprintf("storm-%d-%d", w, i), pool)
				if err != nil {
					failed.Add(1)
					harness.Sleep(ctx, 100*time.Millisecond)
					continue
				}
				created.Add(1)
				mine = append(mine, vm)
				if len(mine) > 15 {
					k := rand.IntN(len(mine))
					if err := s.c.Delete(s.ctx, mine[k]); err == nil {
						deleted.Add(1)
					}
					mine = slices.Delete(mine, k, k+1)
				}
			}
		})
	}
	var kills []string
	wg.Go(func() {
		for n := 0; ; n++ {
			harness.Sleep(ctx, 10*time.Second)
			if ctx.Err() != nil {
				return
			}
			live := s.rs.Live()
			victim := live[rand.IntN(len(live))]
			victim.Kill()
			_, _ = s.rs.Remove(victim)
			holder := ""
			if n%2 == 1 {
				holder = victim.Holder
			}
			rep, err := s.rs.Start(s.ctx, holder)
			if err != nil {
				t.Errorf("start a replica after killing %s: %v", victim.Holder, err)
				return
			}
			kills = append(kills, victim.Holder+"→"+rep.Holder)
		}
	})
	runs, longest := 0, time.Duration(0)
	audit := func(when string) {
		rep, took, err := s.check()
		switch {
		case err != nil:
			t.Errorf("%s: check: %v", when, err)
		case len(rep.Findings) > 0:
			for _, f := range rep.Findings {
				t.Errorf("%s: FALSE POSITIVE %s: %s (fix: %s)", when, f.Type, f.Message, f.Fix)
			}
		}
		runs++
		longest = max(longest, took)
	}
	end := time.Now().Add(d)
	for time.Now().Before(end) && !t.Failed() {
		audit("during the storm")
	}
	stop()
	wg.Wait()
	quiet := time.Now().Add(10 * time.Second)
	for time.Now().Before(quiet) && !t.Failed() {
		audit("after the storm")
	}
	rep, _, _ := s.check()
	t.Logf("storm of %s: %d VMs created, %d deleted, %d creates failed; kills (killed→started): %v", d, created.Load(), deleted.Load(), failed.Load(), kills)
	t.Logf("%d checks, none finding anything, the longest %s; the last looked at %d objects, %d blocks, %d addresses",
		runs, longest.Round(time.Millisecond), rep.Objects, rep.Blocks, rep.Addresses)
	if created.Load() < 200 {
		t.Errorf("only %d VMs created: not a storm", created.Load())
	}
}

// faultsPhase injects the faults and checks that each is found, with its
// fix, and nothing else.
func (s *audSuite) faultsPhase(t *testing.T, pool string) {
	var vms []*vmipamv1.VirtualMachine
	for i := range 4 {
		vm, err := s.create(fmt.Sprintf("fault-%d", i), pool)
		if err != nil {
			t.Fatal(err)
		}
		vms = append(vms, vm)
	}
	addr := func(vm *vmipamv1.VirtualMachine) string { return netip.MustParseAddr(vm.Spec.Addresses[0]).String() }
	// An address handed out at admission is armed, and may stay only
	// armed in its holder's state until the holder writes the block for
	// another reason; armed addresses are not leaks (most are free). The
	// storm's VMs go, so that every holder writes its state, and the
	// address of the VM to leak then shows in use.
	var left vmipamv1.VirtualMachineList
	if err := s.c.List(s.ctx, &left, client.InNamespace(s.ns)); err != nil {
		t.Fatal(err)
	}
	for i := range left.Items {
		if strings.HasPrefix(left.Items[i].Name, "storm-") {
			if err := s.c.Delete(s.ctx, &left.Items[i]); client.IgnoreNotFound(err) != nil {
				t.Fatal(err)
			}
		}
	}
	harness.Eventually(t, 20*time.Second, "the address of "+vms[1].Name+" to show in use in its holder's state", func() error {
		blocks, err := kubestore.Read(s.ctx, s.c, pool)
		if err != nil {
			return err
		}
		a := netip.MustParseAddr(addr(vms[1]))
		for _, b := range blocks {
			h, ok := b.ClaimedBy(a)
			if ok && b.InUse[h] != nil && b.InUse[h].Has(audOffset(b.Prefix, a)) {
				return nil
			}
		}
		return fmt.Errorf("%s not in use in any holder's state yet", a)
	})
	// Older than the grace, so that the label rule looks at them.
	harness.Sleep(s.ctx, audGrace+time.Second)

	// A holder label changed on a live VM, to another live replica's:
	// found at once (no resync for 5 minutes puts it back).
	var mislabelled vmipamv1.VirtualMachine
	if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(vms[0]), &mislabelled); err != nil {
		t.Fatal(err)
	}
	other := ""
	for _, rep := range s.rs.Live() {
		if v := pools.HolderLabelValue(rep.Holder); v != mislabelled.Labels[vmipamv1.HolderLabel] {
			other = v
		}
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, vmipamv1.HolderLabel, other)
	if err := s.c.Patch(s.ctx, &mislabelled, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	s.want(t, "a holder label changed", []audWant{{typ: vmipamaudit.TypeHolderLabelMismatch, object: s.ns + "/" + vms[0].Name, fix: "kubectl label --overwrite virtualmachines.vmipam.io " + vms[0].Name}}, nil)

	// An object of a kind the replicas do not serve (their kinds
	// configuration lacks KubeVirt's VirtualMachine) carrying vmipam's
	// marks, as one left from when they served it.
	kv := &unstructured.Unstructured{}
	kv.SetAPIVersion("kubevirt.io/v1")
	kv.SetKind("VirtualMachine")
	kv.SetNamespace(s.ns)
	kv.SetName("kubevirt-vm")
	kv.SetLabels(map[string]string{vmipamv1.HolderLabel: "vmipam-0"})
	kv.SetFinalizers([]string{vmipamv1.Finalizer})
	if err := unstructured.SetNestedField(kv.Object, map[string]any{}, "spec", "template", "metadata"); err != nil {
		t.Fatal(err)
	}
	if err := s.c.Create(s.ctx, kv); err != nil {
		t.Fatalf("create a KubeVirt VirtualMachine: %v", err)
	}
	t.Cleanup(func() {
		patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
		_ = s.c.Patch(context.Background(), kv, patch)
	})

	// Every replica killed; in that window, a VM deleted without its
	// release, and a duplicate and a VM without an address created past
	// the mutating webhook.
	var holders []string
	for _, rep := range s.rs.Live() {
		holders = append(holders, rep.Holder)
		rep.Kill()
		_, _ = s.rs.Remove(rep)
	}
	killed := time.Now()
	var gone vmipamv1.VirtualMachine
	if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(vms[1]), &gone); err != nil {
		t.Fatal(err)
	}
	gone.Finalizers = nil
	if err := s.c.Update(s.ctx, &gone); err != nil {
		t.Fatalf("remove the finalizer by force: %v", err)
	}
	if err := s.c.Delete(s.ctx, &gone); err != nil {
		t.Fatal(err)
	}
	s.bypassWebhook(t, func() {
		if _, err := s.create("duplicate", pool, func(vm *vmipamv1.VirtualMachine) { vm.Spec.Addresses = []string{addr(vms[2])} }); err != nil {
			t.Fatalf("create a duplicate past the webhook: %v", err)
		}
		if _, err := s.create("no-address", pool); err != nil {
			t.Fatalf("create a VM without an address past the webhook: %v", err)
		}
	})

	want := []audWant{
		{typ: vmipamaudit.TypeLeak, address: addr(vms[1]), fix: "kubectl vmipam release " + addr(vms[1])},
		{typ: vmipamaudit.TypeDuplicateAddress, address: addr(vms[2]), object: s.ns + "/duplicate", fix: "kubectl delete virtualmachines.vmipam.io duplicate"},
		{typ: vmipamaudit.TypeNoAddress, object: s.ns + "/no-address", fix: "kubectl describe virtualmachines.vmipam.io no-address"},
		{typ: vmipamaudit.TypeUnconfiguredKind, object: "VirtualMachine.kubevirt.io audit/kubevirt-vm", fix: "kubectl patch virtualmachines.kubevirt.io kubevirt-vm"},
	}
	// The claims of the dead replicas (at least one had some), and no
	// other holder's.
	want = append(want, audWant{typ: vmipamaudit.TypeDeadHolderClaims, fix: "start a vmipam replica"})
	allowed := func(f vmipamaudit.Finding) bool {
		switch f.Type {
		case vmipamaudit.TypeDeadHolderClaims:
			return slices.Contains(holders, f.Holder)
		case vmipamaudit.TypeLeak:
			// A create of the storm admitted and then failed leaves a
			// pending address its dead holder never wrote expired: a
			// leak too, by the rule.
			return true
		}
		return false
	}
	// The leak shows once its holder's share is older than the pending
	// TTL plus the grace, the dead holders' claims three lease durations
	// plus the grace after their Leases lapsed. It is the deleted VM's
	// that is waited for: a storm's leak in another holder's share, older,
	// can show first.
	harness.Eventually(t, audPendingTTL+audGrace+45*time.Second, "the leak to be found", func() error {
		rep, _, err := s.check()
		if err != nil {
			return err
		}
		for _, f := range rep.Findings {
			if f.Type == vmipamaudit.TypeLeak && f.Address == addr(vms[1]) {
				return nil
			}
		}
		return fmt.Errorf("%d findings, no leak of %s yet", len(rep.Findings), addr(vms[1]))
	})
	t.Logf("leak found %s after the replicas were killed", time.Since(killed).Round(time.Second))
	s.want(t, "faults injected while every replica was down", want, allowed)
}

// audOffset is a's offset in block p.
func audOffset(p netip.Prefix, a netip.Addr) int {
	x, y := p.Addr().As16(), a.As16()
	return (int(y[14])-int(x[14]))<<8 | int(y[15]) - int(x[15])
}

// audWant is a finding a check must show: its type, and what its
// address, object (a suffix of Finding.Object) and holder are, when set;
// fix is a part of its Fix.
type audWant struct {
	typ, address, object, holder, fix string
}

func (w audWant) matches(f vmipamaudit.Finding) bool {
	return f.Type == w.typ && (w.address == "" || f.Address == w.address) &&
		(w.object == "" || strings.HasSuffix(f.Object, w.object)) && (w.holder == "" || f.Holder == w.holder) &&
		strings.Contains(f.Fix, w.fix)
}

// want runs a check and fails the test unless it shows each of want;
// with allowed, unless every other finding is allowed.
func (s *audSuite) want(t *testing.T, when string, want []audWant, allowed func(vmipamaudit.Finding) bool) {
	t.Helper()
	rep, took, err := s.check()
	if err != nil {
		t.Fatalf("%s: check: %v", when, err)
	}
	t.Logf("%s: %d findings in %s", when, len(rep.Findings), took.Round(time.Millisecond))
	used := make([]bool, len(rep.Findings))
	for _, w := range want {
		found := false
		for i, f := range rep.Findings {
			if w.matches(f) {
				found, used[i] = true, true
			}
		}
		if !found {
			t.Errorf("%s: no %s finding for %+v", when, w.typ, w)
		}
	}
	for i, f := range rep.Findings {
		t.Logf("  %s: %s\n      fix: %s", f.Type, f.Message, f.Fix)
		if allowed != nil && !used[i] && !allowed(f) {
			t.Errorf("%s: unexpected finding %s: %s", when, f.Type, f.Message)
		}
	}
}

// bypassWebhook runs fn with vmipam's mutating webhooks and admission
// policy bindings removed, as when an administrator removed them, then
// puts them back.
func (s *audSuite) bypassWebhook(t *testing.T, fn func()) {
	t.Helper()
	var hooks admissionregv1.MutatingWebhookConfigurationList
	if err := s.c.List(s.ctx, &hooks); err != nil {
		t.Fatal(err)
	}
	var bindings admissionregv1.ValidatingAdmissionPolicyBindingList
	if err := s.c.List(s.ctx, &bindings); err != nil {
		t.Fatal(err)
	}
	for i := range hooks.Items {
		if err := s.c.Delete(s.ctx, &hooks.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range bindings.Items {
		if err := s.c.Delete(s.ctx, &bindings.Items[i]); err != nil {
			t.Fatal(err)
		}
	}
	// The API server drops them asynchronously: a dry run passes once
	// no webhook is called.
	harness.Eventually(t, 30*time.Second, "the mutating webhook to be gone", func() error {
		_, err := s.create("probe", "audit", func(vm *vmipamv1.VirtualMachine) { vm.Spec.Addresses = []string{"192.0.2.1"} })
		if err != nil {
			return err
		}
		return s.c.Delete(s.ctx, &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "probe"}})
	})
	fn()
	for i := range bindings.Items {
		b := bindings.Items[i]
		b.ResourceVersion = ""
		if err := s.c.Create(s.ctx, &b); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Errorf("restore admission policy binding %s: %v", b.Name, err)
		}
	}
	for i := range hooks.Items {
		h := hooks.Items[i]
		h.ResourceVersion = ""
		if err := s.c.Create(s.ctx, &h); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Errorf("restore mutating webhook %s: %v", h.Name, err)
		}
	}
}
