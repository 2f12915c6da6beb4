package replicas

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/harness"
)

// TestRollingRestart replaces the three replicas, run with holder slots
// as the manifests run them, one at a time, as a Deployment's rollout with
// maxSurge 0 does (the old pod SIGTERMed: it turns not ready, drains for
// --shutdown-drain, seals its blocks and releases its slot; its
// replacement, started at once, waits for the slot and takes it), while
// 16 clients create and delete VirtualMachines without retrying. Each slot
// goes to its replacement: no claim is taken over and no VM relabelled.
// No create and no delete may fail; no two live VMs may share an address;
// no address may be handed out again before its previous holder's delete
// plus the cooldown; and once everything is deleted and the cooldown has
// passed (and the rest of a pending reservation, whose VM may yet appear:
// max(pending TTL, cooldown) after the restart), nothing is leaked: the
// replicas hold nothing but free addresses, and the pool can be filled to
// its last address. (Holders named after pods, which a rollout takes over,
// roll in test/chaos.)
func TestRollingRestart(t *testing.T) {
	s := newSuite(t)
	s.startReplicas(3, "--holder-slots")
	const (
		pool     = "rolling"
		cooldown = 5 * time.Second
		// The shortest the IPPool allows; a reservation taken over from a
		// replaced replica rests as long (see below).
		pendingTTL = time.Minute
		clients    = 16
	)
	pad := envDuration(t, "REPLICAS_STORM", 2*time.Second)
	prefix, usable := s.createPool(poolSpec{name: pool, cidr: "10.50.0.0/22", cooldown: cooldown, pendingTTL: pendingTTL})
	old := s.rs.Live()

	wc, err := client.NewWithWatch(s.cl.Config, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	tr := harness.NewTracker(wc, s.ns)
	var trDone sync.WaitGroup
	trDone.Go(func() { tr.Run(s.ctx) })
	t.Cleanup(trDone.Wait) // the test's context ends it

	led := harness.NewLedger(cooldown, 1, harness.Prefixes{prefix})
	// VMs that live through the restart, whose holder labels must not
	// change (the storm's live a few hundred milliseconds).
	const kept = 60
	for i := range kept {
		name := fmt.Sprintf("kept-%d", i)
		rec := &harness.Record{Name: name, Sent: time.Now()}
		vm, err := s.create(s.ctx, name, pool)
		if err != nil {
			t.Fatal(err)
		}
		rec.Resp = time.Now()
		led.Created(rec, vm)
	}
	st := &storm{s: s, pool: pool, prefix: "roll", led: led, maxOwn: 8, deleteP: 0.4, think: 10 * time.Millisecond}
	stormStart := time.Now()
	stopStorm := st.start(clients)
	harness.Sleep(s.ctx, pad)
	labelsBefore := s.holderLabels()
	rollStart := time.Now()
	s.mark("rolling restart begins")
	fresh, err := s.rs.RollingRestart(s.ctx, false, 30*time.Second)
	rollEnd := time.Now()
	s.mark("rolling restart over")
	harness.Sleep(s.ctx, pad)
	stopStorm()
	stormEnd := time.Now()
	if err != nil {
		t.Fatalf("rolling restart: %v", err)
	}
	if len(fresh) != 3 || len(s.rs.Live()) != 3 {
		// Go on with the survivors: what follows still holds for them.
		t.Errorf("after the rolling restart: %d replacements, %d live; want 3 of each", len(fresh), len(s.rs.Live()))
	}

	creates, deletes, reuses := led.Counts()
	failedCreates, failedDeletes := led.Failures("create"), led.Failures("delete")
	holders := make([]string, 0, len(fresh))
	for _, rep := range fresh {
		holders = append(holders, rep.Holder)
	}
	t.Logf("TestRollingRestart figures (times relative to the start of the rolling restart):\n"+
		"  storm             %d clients, %s (%s before and after the restart)\n"+
		"  rolling restart   %s, replacements %v\n"+
		"  creates           %d ok, %d failed\n"+
		"  deletes           %d ok, %d failed\n"+
		"  addresses reused  %d",
		clients, stormEnd.Sub(stormStart).Round(100*time.Millisecond), pad, rollEnd.Sub(rollStart).Round(100*time.Millisecond), holders,
		creates, len(failedCreates), deletes, len(failedDeletes), reuses)
	if len(failedCreates) > 0 {
		t.Errorf("FAILED CREATES during the rolling restart: %d of %d:\n%s", len(failedCreates), creates+len(failedCreates),
			strings.Join(failureLines(failedCreates, rollStart, 15), "\n"))
	}
	if len(failedDeletes) > 0 {
		t.Errorf("FAILED DELETES during the rolling restart: %d of %d:\n%s", len(failedDeletes), deletes+len(failedDeletes),
			strings.Join(failureLines(failedDeletes, rollStart, 15), "\n"))
	}
	problems := led.Problems()
	for _, p := range problems {
		t.Errorf("%s", p)
	}
	if creates < 10*clients {
		t.Errorf("only %d creates went through; the storm proves little", creates)
	}
	s.checkLive("after the rolling restart", pool, prefix)
	s.checkLabels("after the rolling restart", pool, prefix)
	// Every slot went to a replacement; no VM that lived through the
	// restart has another holder label.
	oldSlots, newSlots := make([]string, 0, len(old)), make([]string, 0, len(fresh))
	for _, rep := range old {
		oldSlots = append(oldSlots, rep.Holder)
	}
	for _, rep := range fresh {
		newSlots = append(newSlots, rep.Holder)
	}
	slices.Sort(oldSlots)
	slices.Sort(newSlots)
	if !slices.Equal(oldSlots, newSlots) {
		t.Errorf("slots before the rolling restart %v, after %v: want each handed to a replacement", oldSlots, newSlots)
	}
	labelsAfter := s.holderLabels()
	lived, relabelled := 0, []string{}
	for uid, before := range labelsBefore {
		after, ok := labelsAfter[uid]
		if !ok {
			continue
		}
		lived++
		if after != before {
			relabelled = append(relabelled, fmt.Sprintf("%s: %s -> %s", uid, before, after))
		}
	}
	t.Logf("VMs that lived through the rolling restart: %d, relabelled: %d", lived, len(relabelled))
	if len(relabelled) > 0 {
		t.Errorf("RELABELLED by the rolling restart: %d of %d VMs:\n%s", len(relabelled), lived, summarize(relabelled, 10))
	}
	if lived < kept {
		t.Errorf("only %d VMs lived through the rolling restart, %d kept: the relabel check proves little", lived, kept)
	}

	// Everything goes; then the cooldown passes.
	s.deleteAll(led, 60*time.Second)
	drained := time.Now()
	harness.Sleep(s.ctx, time.Second) // the watch's last DELETED events
	late, checked, unchecked := led.LateReuse(tr.ExactGoneAt)
	t.Logf("reuses checked against the observed end of the previous holder's deletion: %d (%d without an observed end)", checked, unchecked)
	for _, v := range late {
		t.Errorf("REUSE INSIDE THE COOLDOWN: %s", v)
	}

	for _, rep := range old {
		if got, err := s.cl.SlotOf(s.ctx, rep.Name); err == nil {
			t.Errorf("the Lease of slot %s still names the replaced process %s", got, rep.Name)
		}
	}
	// A reservation still pending when its replica sealed, whose VM its
	// slot's next process did not find (stored a moment later, or deleted
	// before it was recovered), rests for max(pending TTL, cooldown) from
	// the recovery: the last one ended the rolling restart.
	harness.Sleep(s.ctx, time.Until(drained.Add(cooldown+2*time.Second)))
	harness.Sleep(s.ctx, time.Until(rollEnd.Add(max(cooldown, pendingTTL)+2*time.Second)))
	s.checkNoLeak(pool, usable, fresh)

	// Actively: every address can be had again, and then no more.
	fill := s.fill(pool, "fill", usable, led)
	t.Logf("filled the pool: %d of %d addresses in %s", fill.Got, fill.Want, fill.Took.Round(10*time.Millisecond))
	if fill.Got < fill.Want {
		t.Errorf("LEAK: only %d of the %d usable addresses could be had once everything was deleted and the cooldown had passed "+
			"(see above for a replica that crashed, lost its pool or still rests addresses); last refusal: %v; other refusals:\n%s",
			fill.Got, fill.Want, fill.LastErr, summarize(fill.Errs, 5))
	} else if len(fill.Errs) > 0 {
		t.Logf("refusals while filling (retried): %d, e.g. %s", len(fill.Errs), fill.Errs[0])
	}
	if fill.Got == fill.Want && !isExhausted(fill.ExtraErr) {
		t.Errorf("a create in the full pool: %v; want a denial saying the pool is exhausted", fill.ExtraErr)
	}
	for _, p := range led.Problems()[len(problems):] {
		t.Errorf("while filling: %s", p)
	}
	s.checkLive("after filling the pool", pool, prefix)
	s.checkAlive("by the end of the test", fresh...)
	s.checkRenewals("during the test", append(old, fresh...)...)
}

// deleteAll deletes every VirtualMachine of the namespace, noting it in
// led, and waits until their deletions completed (vmipam released every
// address and removed its finalizer).
func (s *suite) deleteAll(led *harness.Ledger, timeout time.Duration) {
	s.t.Helper()
	var l vmipamv1.VirtualMachineList
	if err := s.c.List(s.ctx, &l, client.InNamespace(s.ns)); err != nil {
		s.t.Fatal(err)
	}
	work := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for range 16 {
		wg.Go(func() {
			for name := range work {
				led.DeleteIssuedFor(name)
				err := s.c.Delete(s.ctx, &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: name}})
				if err != nil && !apierrors.IsNotFound(err) {
					mu.Lock()
					errs = append(errs, err.Error())
					mu.Unlock()
				}
			}
		})
	}
	for _, vm := range l.Items {
		work <- vm.Name
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		s.t.Errorf("deleting every VM: %d deletes failed:\n%s", len(errs), summarize(errs, 5))
	}
	harness.Eventually(s.t, timeout, "every deletion to complete", func() error {
		var l vmipamv1.VirtualMachineList
		if err := s.c.List(s.ctx, &l, client.InNamespace(s.ns)); err != nil {
			return err
		}
		if len(l.Items) > 0 {
			vm := l.Items[0]
			return fmt.Errorf("%d VMs left, e.g. %s (deleting since %v, finalizers %v)", len(l.Items), vm.Name, vm.DeletionTimestamp, vm.Finalizers)
		}
		return nil
	})
}

// checkNoLeak checks, with nothing on the pool any more and the cooldown
// passed, that the IPBlocks are claimed by live holders only with no
// cooldown ahead, and that the live replicas hold nothing but free
// addresses, as many as the blocks say they claim.
func (s *suite) checkNoLeak(pool string, usable int, live []*harness.Replica) {
	s.t.Helper()
	isLive := map[string]bool{}
	for _, rep := range live {
		isLive[rep.Holder] = true
	}
	var g map[string]float64
	var bs blockState
	err := harness.Poll(s.ctx, 500*time.Millisecond, 20*time.Second, func() error {
		var err error
		if bs, err = s.blocks(s.ctx, pool); err != nil {
			return err
		}
		if g, err = s.sumGauges(pool); err != nil {
			return err
		}
		var problems []string
		for h, n := range bs.claims {
			if !isLive[h] {
				problems = append(problems, fmt.Sprintf("holder %s, not a live replica, still claims %d addresses", h, n))
			}
		}
		if fc := bs.futureCooldowns(time.Now()); len(fc) > 0 {
			problems = append(problems, fmt.Sprintf("%d cooldowns still ahead, e.g. %s", len(fc), fc[0]))
		}
		if g["allocated"] != 0 || g["pending"] != 0 || g["cooldown"] != 0 {
			problems = append(problems, fmt.Sprintf("the replicas still count %v allocated, %v pending, %v cooling down", g["allocated"], g["pending"], g["cooldown"]))
		}
		if int(g["claimed"]) != len(bs.claimedBy) {
			problems = append(problems, fmt.Sprintf("the replicas claim %v addresses, the IPBlocks %d", g["claimed"], len(bs.claimedBy)))
		}
		if len(problems) > 0 {
			return errors.New(strings.Join(problems, "; "))
		}
		return nil
	})
	s.t.Logf("at rest: the IPBlocks claim %d of %d addresses (%v by holder), the live replicas count %v free; %d unclaimed",
		len(bs.claimedBy), usable, bs.claims, g["free"], usable-len(bs.claimedBy))
	if err != nil {
		s.t.Errorf("LEAK at rest, with every VM deleted and the cooldown passed: %v", err)
	}
	var p vmipamv1.IPPool
	if err := s.c.Get(s.ctx, client.ObjectKey{Name: pool}, &p); err == nil {
		s.t.Logf("IPPool status at rest: usable %d allocated %d pending %d free %d cooldown %d",
			p.Status.Usable, p.Status.Allocated, p.Status.Pending, p.Status.Free, p.Status.Cooldown)
	}
}

// holderLabels returns the holder label of every VirtualMachine of the
// suite's namespace, by UID.
func (s *suite) holderLabels() map[string]string {
	s.t.Helper()
	var l vmipamv1.VirtualMachineList
	if err := s.c.List(s.ctx, &l, client.InNamespace(s.ns)); err != nil {
		s.t.Fatalf("list VirtualMachines: %v", err)
	}
	out := make(map[string]string, len(l.Items))
	for _, vm := range l.Items {
		if vm.DeletionTimestamp == nil {
			out[string(vm.UID)] = vm.Labels[vmipamv1.HolderLabel]
		}
	}
	return out
}
