package harness_test

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
)

// TestReplicas runs three vmipam replicas behind the proxy: VirtualMachines
// created through the API server get addresses, the API server's
// connections reach more than one replica, and creates go on while a
// replica is killed and the others are replaced one by one.
func TestReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a kube-apiserver and etcd; -short runs without them")
	}
	harness.SetTestLogger(testing.Verbose())
	ctx := t.Context()
	cl, err := harness.Start(ctx, filepath.Join("..", ".."), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Stop() })

	var mu sync.Mutex
	logs := map[int]*harness.LogBuffer{}
	logsFor := func(i int) *harness.LogBuffer {
		mu.Lock()
		defer mu.Unlock()
		if logs[i] == nil {
			logs[i] = &harness.LogBuffer{}
		}
		return logs[i]
	}
	rs, err := cl.StartReplicas(ctx, 3, func(i int) io.Writer { return logsFor(i) })
	t.Cleanup(func() {
		if t.Failed() {
			mu.Lock()
			for i, l := range logs {
				t.Logf("replica %d's logs:\n%s", i, l.String())
			}
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rs.Stop(30 * time.Second); err != nil {
			t.Errorf("stop the replicas: %v", err)
		}
	})
	if got := len(rs.InRotation()); got != 3 {
		t.Fatalf("%d replicas in rotation, want 3", got)
	}
	for i, rep := range rs.All() {
		if want := fmt.Sprintf("vmipam-%d", i); rep.Holder != want || rep.Index != i {
			t.Errorf("replica %d: index %d, holder %q; want %q", i, rep.Index, rep.Holder, want)
		}
	}

	c := cl.Client
	// Large enough for every holder's claims: each replica claims
	// addresses of its own up to its high watermark, and the claims of
	// replicas gone under other names are not taken over (yet).
	cidr := netip.MustParsePrefix("10.210.0.0/16")
	pool := fixture.Pool("replicas", fixture.WithDefault(), fixture.WithCIDRs(cidr.String()))
	if err := c.Create(ctx, pool); err != nil {
		t.Fatalf("create IPPool (through the validating webhook, behind the proxy): %v", err)
	}

	// Every replica recovers the new pool before the first create: one
	// still recovering answers 503, so the creates it is sent would be
	// retried until a recovered replica admitted them all, and the spread
	// checked below would be down to which replica recovered first.
	for _, rep := range rs.InRotation() {
		harness.Eventually(t, 30*time.Second, rep.Holder+" to recover the pool", func() error {
			if !strings.Contains(logsFor(rep.Index).String(), `"msg":"Recovered pool"`) {
				return fmt.Errorf("%s has not logged \"Recovered pool\"", rep.Holder)
			}
			return nil
		})
	}

	owner := map[string]string{} // address → VM
	var ownerMu sync.Mutex
	// createVMs creates n VirtualMachines, 8 at a time, each retried for
	// 30s (a replica answers 503 until it has recovered the new pool).
	createVMs := func(phase string, n int) {
		t.Helper()
		var wg sync.WaitGroup
		sem := make(chan struct{}, 8)
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				errs <- retry(ctx, 30*time.Second, func() error {
					vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("%s-%d", phase, i)}}
					err := c.Create(ctx, vm)
					if apierrors.IsAlreadyExists(err) {
						// An earlier try was stored, but its answer lost.
						err = c.Get(ctx, client.ObjectKeyFromObject(vm), vm)
					}
					if err != nil {
						return fmt.Errorf("create %s: %w", vm.Name, err)
					}
					if len(vm.Spec.Addresses) != 1 {
						return fmt.Errorf("%s created with addresses %v", vm.Name, vm.Spec.Addresses)
					}
					a, err := netip.ParseAddr(vm.Spec.Addresses[0])
					if err != nil || !cidr.Contains(a) {
						return fmt.Errorf("%s created with address %q, not in %s", vm.Name, vm.Spec.Addresses[0], cidr)
					}
					ownerMu.Lock()
					defer ownerMu.Unlock()
					if o, dup := owner[a.String()]; dup {
						t.Errorf("%s and %s were both given %s", o, vm.Name, a)
					}
					owner[a.String()] = vm.Name
					return nil
				})
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("%s: %v", phase, err)
			}
		}
	}

	createVMs("three", 24)
	reached := 0
	for _, rep := range rs.InRotation() {
		if rep.Connections() > 0 {
			reached++
		}
	}
	if reached < 2 {
		t.Errorf("the API server's connections reached %d replica(s), want at least 2: %+v", reached, rs.Proxy.Status())
	}
	served := 0
	for _, rep := range rs.InRotation() {
		m, err := rep.Metrics()
		if err != nil {
			t.Fatalf("metrics of %s: %v", rep.Holder, err)
		}
		if strings.Contains(m, `vmipam_admission_duration_seconds_count{outcome="allowed",webhook="virtualmachine-mutating"}`) {
			served++
		}
	}
	if served < 2 {
		t.Errorf("%d replica(s) admitted VirtualMachines, want at least 2", served)
	}

	// A replica crashes: the proxy stops sending it connections once its
	// probe fails, and creates go on through the others.
	dead := rs.InRotation()[0]
	dead.Kill()
	harness.Eventually(t, 5*time.Second, "the proxy to see "+dead.Holder+" unready", func() error {
		for _, b := range rs.Proxy.Status().Backends {
			if b.Addr == dead.Addr() && b.Ready {
				return fmt.Errorf("%s still ready", b.Name)
			}
		}
		return nil
	})
	before := dead.Connections()
	createVMs("two", 8)
	if got := dead.Connections(); got != before {
		t.Errorf("%d connections went to the killed replica", got-before)
	}

	// Its replacement keeps its name (a StatefulSet's way); then a
	// rollout with fresh names (a Deployment's way).
	if _, err := rs.Replace(ctx, dead, dead.Holder, 30*time.Second); err != nil {
		t.Fatalf("replace %s: %v", dead.Holder, err)
	}
	fresh, err := rs.RollingRestart(ctx, false, 30*time.Second)
	if err != nil {
		t.Fatalf("rolling restart: %v", err)
	}
	if len(fresh) != 3 || len(rs.Live()) != 3 || len(rs.InRotation()) != 3 {
		t.Fatalf("after the rolling restart: %d replacements, %d live, %d in rotation; want 3 of each",
			len(fresh), len(rs.Live()), len(rs.InRotation()))
	}
	for _, rep := range fresh {
		if rep.Holder != fmt.Sprintf("vmipam-%d", rep.Index) || rep.Index < 4 {
			t.Errorf("replacement %d has holder %q, want a fresh vmipam-<index>", rep.Index, rep.Holder)
		}
	}
	createVMs("rolled", 8)

	var vms vmipamv1.VirtualMachineList
	if err := c.List(context.Background(), &vms, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	if len(vms.Items) != 40 {
		t.Errorf("%d VirtualMachines, want 40", len(vms.Items))
	}
}

// retry calls f every 100ms until it succeeds or timeout passes, and
// returns its last error.
func retry(ctx context.Context, timeout time.Duration, f func() error) error {
	var last error
	if wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		last = f()
		return last == nil, nil
	}) == nil {
		return nil
	}
	return last
}
