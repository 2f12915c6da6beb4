package chaos

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/harness"
)

// TestResyncKeepsLiveAddresses isolates what the chaos run catches only now
// and then: a periodic resync must never release the address of a live VM.
// Nothing is deleted and nothing restarts, so no address may ever enter a
// cooldown. VMs are created at a brisk, steady pace while vmipam resyncs
// every second: the more VMs a resync lists and the faster they come, the
// more are created and bound while it lists.
func TestResyncKeepsLiveAddresses(t *testing.T) {
	logf.SetLogger(logr.Discard())
	duration := 15 * time.Second
	if v := os.Getenv("CHAOS_RESYNC_PROBE"); v != "" {
		var err error
		if duration, err = time.ParseDuration(v); err != nil {
			t.Fatalf("CHAOS_RESYNC_PROBE=%q: %v", v, err)
		}
	}
	ctx := t.Context()
	cl, err := harness.Start(ctx, filepath.Join("..", ".."), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Stop() })
	logs := &logBuffer{}
	p, err := cl.StartVMIPAM(ctx, logs, "--resync-interval=1s")
	if err != nil {
		t.Fatalf("%v\nlogs:\n%s", err, logs.tail(100))
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("vmipam's resync reports:\n%s", strings.Join(grep(logs.since(0), 40, `"msg":"Resynced pool"`, `"msg":"Duplicate address"`), "\n"))
		}
	})
	c := cl.Client
	const pool = "resync"
	prefix := netip.MustParsePrefix("10.98.0.0/21")
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pool}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &vmipamv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: pool}, Spec: vmipamv1.IPPoolSpec{
		Ranges:   []vmipamv1.IPRange{{CIDR: prefix.String()}},
		Cooldown: metav1.Duration{Duration: cooldown}, PendingTTL: metav1.Duration{Duration: pendingTTL},
	}}); err != nil {
		t.Fatalf("create IPPool: %v", err)
	}
	harness.Eventually(t, 60*time.Second, "the pool to be Ready", func() error {
		ip := &vmipamv1.IPPool{}
		if err := c.Get(ctx, client.ObjectKey{Name: pool}, ip); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(ip.Status.Conditions, vmipamv1.ConditionReady) {
			return fmt.Errorf("status %+v", ip.Status)
		}
		return nil
	})

	cw := newCoolingWatch(c, pool)
	cwCtx, stopCW := context.WithCancel(ctx)
	var cwDone sync.WaitGroup
	cwDone.Go(func() { cw.run(cwCtx, 200*time.Millisecond) })
	loadCtx, stop := context.WithTimeout(ctx, duration)
	defer stop()
	// Real VMs carry specs of tens of KiB (cloud-init user data): each
	// resync then takes a while to list them, the window in which a VM can
	// be created and bound unseen.
	payload := strings.Repeat("cloud-init ", 32<<10/11)
	var mu sync.Mutex
	created, failed := 0, []string{}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := 0; loadCtx.Err() == nil; i++ {
				vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: pool, Name: fmt.Sprintf("r-%d-%04d", w, i)},
					Spec: vmipamv1.VirtualMachineSpec{IPPool: pool, Image: payload}}
				rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				err := c.Create(rctx, vm)
				cancel()
				mu.Lock()
				if err == nil {
					created++
				} else if len(failed) < 5 {
					failed = append(failed, err.Error())
				}
				mu.Unlock()
				// Paced, so that the controller keeps up and binds each VM
				// within milliseconds: a VM still pending when a resync
				// runs is left alone, only bound ones are at risk.
				sleep(loadCtx, 40*time.Millisecond)
			}
		})
	}
	wg.Wait()
	// The last resyncs, and the flush of what they did.
	sleep(ctx, 3*time.Second)
	stopCW()
	cwDone.Wait()

	var l vmipamv1.VirtualMachineList
	if err := c.List(ctx, &l, client.InNamespace(pool)); err != nil {
		t.Fatal(err)
	}
	holders := map[string][]string{}
	for _, vm := range l.Items {
		if len(vm.Spec.Addresses) == 1 {
			holders[vm.Spec.Addresses[0]] = append(holders[vm.Spec.Addresses[0]], vm.Name)
		}
	}
	var released []string
	for a, cd := range cw.results() {
		released = append(released, fmt.Sprintf("%s cooling down (seen %s, until %s), held by %v", a, cd.first.Format(stamp), cd.until.Format(stamp), holders[a.String()]))
	}
	slices.Sort(released)
	facts := analyzeLogs(logs.since(0))
	t.Logf("%d VMs created in %s, %d create errors %v; %d addresses seen cooling down; resyncs released %d and adopted %d",
		created, duration, len(failed), failed, len(released), facts.resyncReleased, facts.resyncAdopted)
	for a, names := range holders {
		if len(names) > 1 {
			t.Errorf("DUPLICATE: %s on %v", a, names)
		}
	}
	if len(released) > 0 || facts.resyncReleased > 0 {
		t.Errorf("RELEASED LIVE VMs' ADDRESSES: nothing was deleted, yet %d addresses went into cooldown and vmipam's resyncs logged %d releases. "+
			"pools.Registry.Resync lists the VMs, then Manager.Resync releases every allocated address whose UID the list lacks, including VMs "+
			"the controller bound after the list was taken; after the cooldown such an address is handed to another VM unless a resync re-adopts it first:\n%s",
			len(released), facts.resyncReleased, strings.Join(released, "\n"))
	}
	if created < 100 {
		t.Errorf("only %d VMs created; the probe proves little", created)
	}
}
