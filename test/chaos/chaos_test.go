package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
)

// The pool's timing. pendingTTL is the shortest the IPPool webhook accepts;
// after a crash every claimed address on no live VM rests for both.
const (
	poolName   = "chaos"
	cooldown   = 5 * time.Second
	pendingTTL = 60 * time.Second
)

// settings are the knobs, from the environment; the defaults are the short
// run of `make test-chaos` (which CI runs after `make test`), `make chaos`
// sets the long one.
type settings struct {
	duration    time.Duration // CHAOS_DURATION: minimum length of the load
	kills       int           // CHAOS_KILLS: SIGKILLs of vmipam
	apiRestarts int           // CHAOS_APISERVER_RESTARTS
	replicas    int           // CHAOS_REPLICAS: vmipam replicas behind the stand-in Service
	rolls       int           // CHAOS_ROLLS: rolling restarts of every replica (with several)
	clients     int           // CHAOS_CLIENTS
	maxOwn      int           // CHAOS_MAX_VMS_PER_CLIENT: live VMs a client keeps at most
	think       time.Duration // CHAOS_THINK: mean pause between a client's operations
	cidr        netip.Prefix  // CHAOS_CIDR: the pool
	dual        bool          // CHAOS_DUAL=1: every VM RequireDualStack, the pool an IPv6 range as large beside CHAOS_CIDR
	seed        uint64        // CHAOS_SEED: the randomness (printed, to replay the schedule)
}

func loadSettings(t *testing.T) settings {
	t.Helper()
	s := settings{
		duration: 40 * time.Second, kills: 3, apiRestarts: 1, replicas: 3, rolls: 1, clients: 8, maxOwn: 16, think: 20 * time.Millisecond,
		cidr: netip.MustParsePrefix("10.99.0.0/23"), seed: uint64(time.Now().UnixNano()),
	}
	env := func(name string, parse func(string) error) {
		if v := os.Getenv(name); v != "" {
			if err := parse(v); err != nil {
				t.Fatalf("%s=%q: %v", name, v, err)
			}
		}
	}
	dur := func(p *time.Duration) func(string) error {
		return func(v string) (err error) { *p, err = time.ParseDuration(v); return err }
	}
	num := func(p *int) func(string) error {
		return func(v string) (err error) { *p, err = strconv.Atoi(v); return err }
	}
	env("CHAOS_DURATION", dur(&s.duration))
	env("CHAOS_KILLS", num(&s.kills))
	env("CHAOS_APISERVER_RESTARTS", num(&s.apiRestarts))
	env("CHAOS_REPLICAS", num(&s.replicas))
	env("CHAOS_ROLLS", num(&s.rolls))
	env("CHAOS_CLIENTS", num(&s.clients))
	env("CHAOS_MAX_VMS_PER_CLIENT", num(&s.maxOwn))
	env("CHAOS_THINK", dur(&s.think))
	env("CHAOS_CIDR", func(v string) (err error) { s.cidr, err = netip.ParsePrefix(v); return err })
	env("CHAOS_SEED", func(v string) (err error) { s.seed, err = strconv.ParseUint(v, 10, 64); return err })
	env("CHAOS_DUAL", func(v string) (err error) { s.dual, err = strconv.ParseBool(v); return err })
	if s.replicas < 2 {
		s.rolls = 0 // one process has nothing to roll over to
	}
	if s.clients < 1 || s.maxOwn < 1 || s.kills < 0 || s.apiRestarts < 0 || s.replicas < 1 || s.rolls < 0 || !s.cidr.Addr().Is4() || s.cidr.Bits() > 28 {
		t.Fatalf("bad settings: %+v (need clients and max VMs per client >= 1, an IPv4 CIDR of /28 or larger)", s)
	}
	return s
}

// TestChaos: many clients create and delete VirtualMachines while vmipam is
// SIGKILLed and restarted at random moments and the API server is restarted;
// then, from the API server only, no two live VMs share an address, every VM
// has one, no address was reused inside its cooldown, every address on no
// live VM is free again once the pending TTL and the cooldown have passed,
// and the IPPool's status counts match.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the reliability suite takes two minutes; -short skips it")
	}
	logf.SetLogger(logr.Discard())
	s := loadSettings(t)
	began := time.Now()
	ctx := t.Context()
	root := filepath.Join("..", "..")
	tmp := t.TempDir()
	cl, err := harness.Start(ctx, root, tmp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Stop() })

	logs := newLogs()
	ph := &phases{}
	sup := newSupervisor(cl, logs, ph, s.replicas, rand.New(rand.NewPCG(s.seed, 1<<32))) //nolint:gosec // reproducible test randomness
	sup.mu.Lock()
	err = sup.start(ctx)
	sup.mu.Unlock()
	if err != nil {
		t.Fatalf("%v\nvmipam's logs:\n%s", err, tail(logs, 100))
	}
	t.Cleanup(func() {
		sup.stop()
		if path := os.Getenv("CHAOS_LOGS"); path != "" {
			if err := os.WriteFile(path, []byte(logs.String()), 0o600); err != nil {
				t.Errorf("write vmipam's logs: %v", err)
			}
		}
		if t.Failed() {
			t.Logf("vmipam's error lines:\n%s", collapse(strings.Join(harness.Grep(logs.String(), 400, `"level":"error"`, "panic", "=== chaos"), "\n")))
			t.Logf("vmipam's logs (tail):\n%s", tail(logs, 250))
		}
	})
	c := cl.Client

	ns := fmt.Sprintf("chaos-%d", s.seed%100000)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	pool := fixture.Pool(poolName, fixture.WithRanges(s.ranges()...), fixture.WithCooldown(cooldown), fixture.WithPendingTTL(pendingTTL),
		// Small watermarks: the free list is refilled and trimmed often, so
		// claims and give-backs are in flight when vmipam or the API
		// server goes away.
		fixture.WithWatermarks(4, 8, 16))
	if err := c.Create(ctx, pool); err != nil {
		t.Fatalf("create IPPool (through vmipam's validating webhook): %v", err)
	}
	// usable counts the addresses of one family: as many VMs fill the pool.
	usable := harness.UsableOf(s.cidr)
	sp := s.space(t)
	harness.Eventually(t, 60*time.Second, "the pool to be Ready", func() error {
		p := &vmipamv1.IPPool{}
		if err := c.Get(ctx, client.ObjectKey{Name: poolName}, p); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(p.Status.Conditions, vmipamv1.ConditionReady) || p.Status.Usable != int64(usable*sp.fams) {
			return fmt.Errorf("status %+v", p.Status)
		}
		return nil
	})

	wc, err := client.NewWithWatch(cl.Config, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	obsCtx, stopObs := context.WithCancel(ctx)
	defer stopObs()
	tr := harness.NewTracker(wc, ns)
	sc := newScanner(c, ns, poolName, sp, sup.restartPeriods)
	var obs sync.WaitGroup
	obs.Go(func() { tr.Run(obsCtx) })
	obs.Go(func() { sc.run(obsCtx, time.Second) })
	supErr := make(chan error, 1)
	obs.Go(func() { supErr <- sup.watch(obsCtx) })
	t.Logf("seed %d: %d clients for at least %s, %d replica(s), %d SIGKILLs, %d rolling restarts, %d API server restarts, pool %s (%d usable per family), cooldown %s, pendingTTL %s",
		s.seed, s.clients, s.duration, s.replicas, s.kills, s.rolls, s.apiRestarts, sp, usable, cooldown, pendingTTL)

	// The load.
	led := harness.NewLedger(cooldown, sp.fams, sp.ranges)
	ref := newRefusals()
	ld := &load{c: c, ns: ns, pool: poolName, maxOwn: s.maxOwn, deleteP: 0.4, think: s.think,
		ledger: led, refused: ref, phases: ph, base: ctx, dual: s.dual}
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var clients sync.WaitGroup
	loadStart := time.Now()
	for i := range s.clients {
		rng := rand.New(rand.NewPCG(s.seed, uint64(i)+1)) //nolint:gosec // reproducible test randomness
		clients.Go(func() { ld.client(loadCtx, i, rng) })
	}

	// The chaos: kills and API server restarts at random moments between
	// 10% and 85% of the load; the load lasts until the last one is over.
	fig := &figures{}
	rng := rand.New(rand.NewPCG(s.seed, 0)) //nolint:gosec // reproducible test randomness
	events := schedule(rng, s)
	var chaosErr error
	for _, ev := range events {
		if !harness.Sleep(ctx, time.Until(loadStart.Add(ev.at))) {
			break
		}
		if ev.roll {
			if err := sup.roll(ctx); err != nil {
				chaosErr = err
				break
			}
		} else if ev.api {
			r, err := apiRestart(ctx, cl, filepath.Join(tmp, "apiserver-certs"), ph)
			if err != nil {
				chaosErr = err
				break
			}
			fig.apiRestarts++
			fig.apiRestart = append(fig.apiRestart, r)
			mark(logs, "API server restarted: stopped in %s (%v), serving again after %s", r.stopped.Round(time.Millisecond), r.stopErr, r.downtime.Round(time.Millisecond))
		} else if err := sup.kill(ctx, time.Duration(rng.Int64N(int64(1500*time.Millisecond)))); err != nil {
			chaosErr = err
			break
		}
		// Let the load run undisturbed a moment between two events.
		harness.Sleep(ctx, 2*time.Second)
	}
	harness.Sleep(ctx, time.Until(loadStart.Add(s.duration)))
	stopLoad()
	clients.Wait()
	loadEnd := time.Now()
	fig.loadDuration = loadEnd.Sub(loadStart)
	fig.creates, fig.deletes, _ = led.Counts()
	if chaosErr != nil {
		t.Fatalf("chaos: %v", chaosErr)
	}
	select {
	case err := <-supErr:
		t.Fatalf("restarting vmipam after it exited: %v", err)
	default:
	}

	// Every deletion completes: vmipam releases the address and removes its
	// finalizer.
	if err := harness.Poll(ctx, 200*time.Millisecond, 2*time.Minute, func() error {
		var l vmipamv1.VirtualMachineList
		if err := c.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return err
		}
		var stuck []string
		for _, vm := range l.Items {
			if vm.DeletionTimestamp != nil {
				stuck = append(stuck, fmt.Sprintf("%s (deleting since %s, finalizers %v)", vm.Name, vm.DeletionTimestamp.Format(time.RFC3339), vm.Finalizers))
			}
		}
		if len(stuck) > 0 {
			return fmt.Errorf("%d still deleting, e.g. %s", len(stuck), stuck[0])
		}
		return nil
	}); err != nil {
		t.Errorf("STUCK DELETIONS: 2m after the load: %v", err)
	}
	drained := time.Now()
	fig.drain = drained.Sub(loadEnd)
	// Let the watch deliver the last DELETED events before stopping it.
	harness.Sleep(ctx, time.Second)

	// Wait out the pending TTL and the cooldown: after the last admission,
	// after the last recovery (claimed addresses on no live VM rest for
	// both), and after the last release.
	// Replicas replaced under a new name are taken over once their Lease
	// lapses; what a takeover rests, it rests from then.
	tookOver, err := sup.waitTakeovers(ctx, c)
	if err != nil {
		t.Errorf("TAKEOVER: %v", err)
	}
	sup.mu.Lock()
	lastReady := latest(sup.lastReady, tookOver)
	sup.mu.Unlock()
	settle := latest(loadEnd.Add(pendingTTL+cooldown), lastReady.Add(pendingTTL+cooldown), drained.Add(cooldown)).Add(2 * time.Second)
	t.Logf("load over after %s; deletions drained in %s; waiting %s for pending TTL and cooldown to pass",
		fig.loadDuration.Round(time.Second), fig.drain.Round(time.Second), time.Until(settle).Round(time.Second))
	harness.Sleep(ctx, time.Until(settle))

	// The state at rest, from the API server: VMs, IPPool status, IPBlocks.
	var rest restState
	// What is still wrong after 45s is reported below, one error each.
	_ = harness.Poll(ctx, time.Second, 45*time.Second, func() error {
		rest = readRest(ctx, c, ns, sp, usable, sup.holders())
		if len(rest.problems) > 0 {
			return errors.New(rest.problems[0])
		}
		return nil
	})
	fig.live = len(rest.vms)
	fig.endDups = rest.dups
	fig.endNoAddr = rest.noAddr
	for _, p := range rest.problems {
		t.Errorf("at rest, %s after the load: %s", time.Since(loadEnd).Round(time.Second), p)
	}

	// Actively: every address on no live VM can be had again, and then the
	// pool is exhausted.
	fillStart := time.Now()
	cw := newCoolingWatch(c, poolName)
	cwCtx, stopCW := context.WithCancel(ctx)
	var cwDone sync.WaitGroup
	cwDone.Go(func() { cw.run(cwCtx, 250*time.Millisecond) })
	fill := harness.Fill(ctx, harness.FillOptions{Want: usable - len(rest.vms), Prefix: "fill", Create: ld.createOnce,
		Exhausted: func(err error) bool { return classify(err) == reasonExhausted }, Ledger: led})
	// A resync after the last create may still release one: give it one
	// resync interval and a flush.
	harness.Sleep(ctx, 7*time.Second)
	stopCW()
	cwDone.Wait()
	fillEnd := time.Now()
	t.Logf("filled the pool with %d VMs in %s", fill.Got, fillEnd.Add(-7*time.Second).Sub(fillStart).Round(100*time.Millisecond))
	fig.fillWant, fig.fillGot = fill.Want, fill.Got
	fig.leaked = fill.Want - fill.Got
	if fig.leaked > 0 {
		t.Errorf("LEAK: only %d of the %d addresses on no live VM could be had again; last refusal: %v", fill.Got, fill.Want, fill.LastErr)
	}
	for _, e := range fill.Errs {
		t.Errorf("filling the pool: %s", e)
	}
	if fill.ExtraErr == nil || !apierrors.IsForbidden(fill.ExtraErr) || !strings.Contains(fill.ExtraErr.Error(), "is exhausted") && !strings.Contains(fill.ExtraErr.Error(), "address left") {
		t.Errorf("a create in the full pool: %v; want a denial saying the pool is exhausted", fill.ExtraErr)
	}
	full := readRest(ctx, c, ns, sp, usable, sup.holders())
	holders := map[string]*vmipamv1.VirtualMachine{}
	for i := range full.vms {
		for _, a := range full.vms[i].Spec.Addresses {
			holders[a] = &full.vms[i]
		}
	}
	for a, cd := range cw.results() {
		who := "no VM"
		if vm := holders[a.String()]; vm != nil {
			who = "the live VM " + describeVM(vm)
		}
		fig.fillReleased = append(fig.fillReleased, fmt.Sprintf("%s cooling down (seen %s, until %s) while held by %s",
			a, cd.first.Format(stamp), cd.until.Format(stamp), who))
	}
	slices.Sort(fig.fillReleased)
	fig.fillDups = full.dups
	for _, d := range full.dups {
		t.Errorf("DUPLICATE after filling the pool: %s", d)
	}
	if len(full.dups) > 0 || len(rest.dups) > 0 {
		t.Logf("vmipam's resync reports and duplicate findings (a resync that releases addresses while nobody removed a finalizer by force released a live VM's address):\n%s",
			strings.Join(harness.Grep(logs.String(), 60, `"msg":"Resynced pool"`, `"msg":"Duplicate address"`, "=== chaos"), "\n"))
	}
	if len(full.vms) != usable {
		t.Errorf("%d VirtualMachines after filling the pool, want %d (usable)", len(full.vms), usable)
	}
	if err := harness.Poll(ctx, 200*time.Millisecond, 30*time.Second, func() error {
		p := &vmipamv1.IPPool{}
		if err := c.Get(ctx, client.ObjectKey{Name: poolName}, p); err != nil {
			return err
		}
		st := p.Status
		if st.Allocated != int64(usable*sp.fams) || st.Pending != 0 || st.Cooldown != 0 || st.Free != 0 ||
			!meta.IsStatusConditionTrue(st.Conditions, vmipamv1.ConditionExhausted) {
			return fmt.Errorf("allocated %d pending %d cooldown %d free %d, Exhausted %v; want %d allocated and Exhausted",
				st.Allocated, st.Pending, st.Cooldown, st.Free, meta.FindStatusCondition(st.Conditions, vmipamv1.ConditionExhausted), usable*sp.fams)
		}
		return nil
	}); err != nil {
		t.Errorf("the full pool's status: %v", err)
	}
	stopObs()
	obs.Wait()

	// What the run saw as it went.
	_, _, fig.reuses = led.Counts()
	fig.dupAtCreate = led.Problems(harness.Duplicate)
	fig.earlyReuse = led.Problems(harness.EarlyReuse)
	fig.badAddr = led.Problems(harness.NoAddress, harness.BadAddress)
	for _, r := range led.Records() {
		if r.ViaGet {
			fig.viaGet++
		}
	}
	fig.lateReuse, fig.lateChecked, fig.lateUnchecked = led.LateReuse(tr.ExactGoneAt)
	fig.snapshots, fig.runDups, fig.terminatingOverlap, fig.runNoAddr, fig.liveCooling = sc.results()
	fig.gone, fig.watchRestarts = tr.Stats()
	sup.mu.Lock()
	fig.kills, fig.starts, fig.selfExits = sup.kills, sup.starts, sup.selfExits
	fig.replicas, fig.rolls, fig.takeovers = s.replicas, sup.rolls, sup.takeovers
	fig.exitReasons, fig.readyAfter, fig.startFailures = sup.exitReasons, sup.readyAfter, sup.startFailures
	sup.mu.Unlock()
	fig.refused = ref
	fig.logs = analyzeLogs(logs.String())
	for _, r := range fig.logs.resyncs {
		// Log timestamps are whole seconds.
		if !r.at.Before(fillStart.Truncate(time.Second)) && !r.at.After(fillEnd) {
			fig.fillResyncReleased += r.released
		}
	}
	fig.total = time.Since(began)

	// The address history against the ledger: every deleted VM's tenure,
	// from its create to its deletion exactly, SIGKILLs and takeovers
	// notwithstanding.
	hist, err := harness.CheckHistory(ctx, c, ns, led, tr, 300)
	if err != nil {
		t.Errorf("the address history: %v", err)
	}
	t.Logf("address history: %d addresses, %d tenures of deleted VMs compared (%d with no deletionTimestamp seen), %d mismatches",
		hist.Addresses, hist.Tenures, hist.Unknown, len(hist.Mismatches))
	for _, m := range hist.Mismatches {
		t.Errorf("ADDRESS HISTORY: %s", m)
	}
	if hist.Tenures == 0 {
		t.Errorf("the address history: no tenure of a deleted VM compared")
	}

	report := fig.table(s, usable)
	t.Log("\n" + report)
	if testing.Verbose() {
		fmt.Println(report)
	}

	for _, d := range fig.dupAtCreate {
		t.Errorf("DUPLICATE at creation: %s", d)
	}
	for _, d := range fig.runDups {
		t.Errorf("DUPLICATE during the run: %s", d)
	}
	for _, d := range fig.badAddr {
		t.Errorf("VM WITHOUT A POOL ADDRESS at creation: %s", d)
	}
	for _, d := range fig.liveCooling {
		t.Errorf("LIVE VM's ADDRESS RELEASED during the run (in cooldown while a live VM holds it, away from any vmipam restart): %s", d)
	}
	for _, d := range fig.runNoAddr {
		t.Errorf("VM WITHOUT ADDRESS during the run: %s", d)
	}
	for _, d := range fig.earlyReuse {
		t.Errorf("REUSE INSIDE THE COOLDOWN (before delete issued + cooldown): %s", d)
	}
	for _, d := range fig.lateReuse {
		t.Errorf("REUSE INSIDE THE COOLDOWN (before deletion completed + cooldown - 2s): %s", d)
	}
	if n := ref.total("create", reasonInvalid); n > 0 {
		t.Errorf("%d creates were refused as invalid, which vmipam must never do to a VM asking for no particular address: %v", n, ref.samples[reasonInvalid])
	}
	if len(fig.fillReleased) > 0 || fig.fillResyncReleased > 0 {
		t.Errorf("RELEASED LIVE VMs' ADDRESSES: while the pool was being filled, with nothing deleted and no restart, vmipam put %d addresses into cooldown "+
			"(IPBlocks) and its resyncs logged %d releases; such an address goes to another VM after the cooldown unless a resync re-adopts it first "+
			"(a resync that releases VMs bound while it listed them: see TestResyncKeepsAddressBoundDuringItsList):\n%s",
			len(fig.fillReleased), fig.fillResyncReleased, strings.Join(fig.fillReleased, "\n"))
	}
	if fig.logs.maxPersistPerSec > maxPersistErrorsPerSecond {
		t.Errorf("HOT LOOP: vmipam logged %d \"Persisting pool state\" errors within the second %s (%d in all): its allocator retries a failing "+
			"store write without waiting for its next round (see TestRunWaitsAfterAFailedWrite)",
			fig.logs.maxPersistPerSec, fig.logs.maxPersistAt, fig.logs.persistErrs)
	}
	if fig.kills < s.kills || fig.apiRestarts < s.apiRestarts {
		t.Errorf("only %d of %d kills and %d of %d API server restarts happened", fig.kills, s.kills, fig.apiRestarts, s.apiRestarts)
	}
	if fig.creates < 20*s.clients {
		t.Errorf("only %d creates went through; the run proves little", fig.creates)
	}
	if fig.reuses == 0 {
		t.Errorf("no address was handed out twice: the run did not exercise reuse; use a smaller CHAOS_CIDR")
	}
}

// maxPersistErrorsPerSecond: Manager.Run retries failed background writes
// on its next round, every RunInterval (1s) or when an allocation kicks it;
// more than this in one second is a loop that does not wait.
const maxPersistErrorsPerSecond = 20

// event is one disruption, at an offset from the start of the load: an
// API server restart, a rolling restart of the replicas, or else a kill.
type event struct {
	at        time.Duration
	api, roll bool
}

// schedule spreads the disruptions over 10% to 85% of the load: one in
// each of n equal slots, at a random moment of its slot. The API server
// restarts come first, while the first vmipam has long been the leader and
// releases addresses: the kills that follow leave vmipam without the
// lease (and so without releases) for its duration, a calmer moment.
func schedule(rng *rand.Rand, s settings) []event {
	n := s.kills + s.apiRestarts + s.rolls
	evs := make([]event, n)
	slot := s.duration * 3 / 4 / time.Duration(max(n, 1))
	for i := range evs {
		evs[i] = event{at: s.duration/10 + time.Duration(i)*slot + time.Duration(rng.Int64N(int64(slot))), api: i < s.apiRestarts}
	}
	// The rolling restarts spread among the kills, after the API server
	// restarts.
	for k := range s.rolls {
		for i := s.apiRestarts + k*(n-s.apiRestarts)/s.rolls; i < n; i++ {
			if !evs[i].roll {
				evs[i].roll = true
				break
			}
		}
	}
	return evs
}

// ranges are the pool's ranges: CHAOS_CIDR and, for a dual-stack run, as
// many IPv6 addresses, fd00:99::1 on.
func (s settings) ranges() []vmipamv1.IPRange {
	out := []vmipamv1.IPRange{{CIDR: s.cidr.String()}}
	if s.dual {
		last := netip.MustParseAddr("fd00:99::").As16()
		n := harness.UsableOf(s.cidr)
		last[13], last[14], last[15] = byte(n>>16), byte(n>>8), byte(n)
		out = append(out, vmipamv1.IPRange{CIDR: "fd00:99::/104", First: "fd00:99::1", Last: netip.AddrFrom16(last).String()})
	}
	return out
}

// space is the pool's usable addresses, as vmipam reads its ranges.
type space struct {
	ranges *ipam.Ranges
	// fams is how many addresses, one per family, every VM holds.
	fams int
}

func (s settings) space(t *testing.T) space {
	t.Helper()
	r, err := ipam.ParseRanges(pools.RangeSpecs(s.ranges()))
	if err != nil {
		t.Fatalf("the pool's ranges: %v", err)
	}
	sp := space{ranges: r, fams: 1}
	if s.dual {
		sp.fams = 2
	}
	return sp
}

func (sp space) String() string { return sp.ranges.String() }

// addresses parses the addresses of vm, which must be one usable address
// of each family the run gives, or says what is wrong with them.
func (sp space) addresses(vm *vmipamv1.VirtualMachine) ([]netip.Addr, error) {
	return harness.Addresses(vm, sp.fams, sp.ranges)
}

// restState is what the API server says once everything has settled.
type restState struct {
	vms      []vmipamv1.VirtualMachine
	dups     []string
	noAddr   []string
	problems []string
}

// readRest lists the VMs, the IPPool and its IPBlocks and checks them
// against each other: distinct addresses inside the pool on every VM; the
// status counts equal to the VMs and to the blocks' claims; no pending, no
// cooldown; Ready, no DuplicateAddress; every live address claimed by
// vmipam; no cooldown deadline still ahead.
func readRest(ctx context.Context, c client.Client, ns string, sp space, usable int, holders []string) restState {
	var r restState
	var l vmipamv1.VirtualMachineList
	if err := c.List(ctx, &l, client.InNamespace(ns)); err != nil {
		r.problems = append(r.problems, fmt.Sprintf("list VirtualMachines: %v", err))
		return r
	}
	r.vms = l.Items
	live := map[netip.Addr]string{}
	byAddr := map[netip.Addr]*vmipamv1.VirtualMachine{}
	for i := range l.Items {
		vm := &l.Items[i]
		if vm.DeletionTimestamp != nil {
			r.problems = append(r.problems, fmt.Sprintf("%s is still being deleted", vm.Name))
		}
		addrs, err := sp.addresses(vm)
		if err != nil {
			r.noAddr = append(r.noAddr, fmt.Sprintf("%s has %v", vm.Name, err))
			continue
		}
		for _, a := range addrs {
			if other, dup := byAddr[a]; dup {
				r.dups = append(r.dups, fmt.Sprintf("%s on %s and %s", a, describeVM(other), describeVM(vm)))
			}
			live[a], byAddr[a] = vm.Name, vm
		}
		if vm.Annotations[vmipamv1.PoolAnnotation] != poolName || vm.Annotations[vmipamv1.TokenAnnotation] == "" || !slices.Contains(vm.Finalizers, vmipamv1.Finalizer) {
			r.problems = append(r.problems, fmt.Sprintf("%s is not fully stamped: annotations %v, finalizers %v", vm.Name, vm.Annotations, vm.Finalizers))
		}
	}
	for _, d := range r.dups {
		r.problems = append(r.problems, "DUPLICATE: "+d)
	}
	for _, d := range r.noAddr {
		r.problems = append(r.problems, "NO ADDRESS: "+d)
	}

	p := &vmipamv1.IPPool{}
	if err := c.Get(ctx, client.ObjectKey{Name: poolName}, p); err != nil {
		r.problems = append(r.problems, fmt.Sprintf("get IPPool: %v", err))
		return r
	}
	st := p.Status
	if st.ObservedGeneration != p.Generation || st.Usable != int64(usable*sp.fams) || st.Allocated != int64(len(l.Items)*sp.fams) || st.Pending != 0 || st.Cooldown != 0 {
		r.problems = append(r.problems, fmt.Sprintf(
			"IPPool status observedGeneration %d usable %d allocated %d pending %d cooldown %d free %d; want generation %d, usable %d, allocated %d (the live VMs' addresses), pending 0, cooldown 0",
			st.ObservedGeneration, st.Usable, st.Allocated, st.Pending, st.Cooldown, st.Free, p.Generation, usable*sp.fams, len(l.Items)*sp.fams))
	}
	if !meta.IsStatusConditionTrue(st.Conditions, vmipamv1.ConditionReady) || !meta.IsStatusConditionFalse(st.Conditions, vmipamv1.ConditionDuplicateAddress) {
		r.problems = append(r.problems, fmt.Sprintf("IPPool conditions %v; want Ready True and DuplicateAddress False", conds(st.Conditions)))
	}

	blocks, err := kubestore.Read(ctx, c, poolName)
	if err != nil {
		r.problems = append(r.problems, fmt.Sprintf("read IPBlocks: %v", err))
		return r
	}
	claimed := map[netip.Addr]bool{}
	now := time.Now()
	for _, dec := range blocks {
		for h, bm := range dec.Claims {
			for off := range ipam.BlockSize {
				if !bm.Has(off) {
					continue
				}
				a := harness.AddrAt(dec.Prefix, off)
				switch {
				case !slices.Contains(holders, h):
					r.problems = append(r.problems, fmt.Sprintf("block %s: %s claimed by holder %q, want only those running, %q", dec.Prefix, a, h, holders))
				case !sp.ranges.Contains(a):
					r.problems = append(r.problems, fmt.Sprintf("block %s: %s claimed but not usable in %s", dec.Prefix, a, sp))
				}
				claimed[a] = true
			}
		}
		for a, until := range dec.Cooldowns {
			if until.After(now) {
				r.problems = append(r.problems, fmt.Sprintf("block %s: %s still cools down until %s (%s from now), after the pending TTL and the cooldown have passed",
					dec.Prefix, a, until.Format(time.RFC3339), until.Sub(now).Round(time.Second)))
			}
		}
	}
	var unclaimed []string
	for a, name := range live {
		if !claimed[a] {
			unclaimed = append(unclaimed, fmt.Sprintf("%s (%s)", a, name))
		}
	}
	if len(unclaimed) > 0 {
		slices.Sort(unclaimed)
		r.problems = append(r.problems, fmt.Sprintf("%d live addresses are not claimed in the IPBlocks, e.g. %v", len(unclaimed), unclaimed[:min(5, len(unclaimed))]))
	}
	if spare := len(claimed) - len(live); int64(spare) != st.Free {
		r.problems = append(r.problems, fmt.Sprintf("the IPBlocks claim %d addresses, %d on live VMs: %d spare, but the status says %d free", len(claimed), len(live), spare, st.Free))
	}
	return r
}

func describeVM(vm *vmipamv1.VirtualMachine) string {
	return fmt.Sprintf("%s (uid %s, created %s, token %s)", vm.Name, vm.UID, vm.CreationTimestamp.Format(time.RFC3339), vm.Annotations[vmipamv1.TokenAnnotation])
}

func conds(cs []metav1.Condition) string {
	var out []string
	for _, c := range cs {
		out = append(out, fmt.Sprintf("%s=%s (%s)", c.Type, c.Status, c.Message))
	}
	return strings.Join(out, "; ")
}

func latest(ts ...time.Time) time.Time {
	m := ts[0]
	for _, t := range ts[1:] {
		if t.After(m) {
			m = t
		}
	}
	return m
}
