package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/harness"
)

// mode is one way of creating VirtualMachines.
type mode int

const (
	modeWith mode = iota
	modeWithout
	modeNoop
	modeBaseline
	numModes
)

func (m mode) String() string {
	return [...]string{"with vmipam", "without vmipam", "no-op mutating webhook", "baseline (read-modify-write)"}[m]
}

func (m mode) namespace() string { return [...]string{nsWith, nsWithout, nsNoop, nsBaseline}[m] }

func (m mode) prefix() string { return [...]string{"with", "without", "noop", "baseline"}[m] }

// settle is the pause between rounds, so that the controller's work after
// a round with vmipam (binding, events) does not land in the next round.
const settle = time.Second

type bench struct {
	opts          options
	root, results string
	cl            *harness.Cluster
	clients       []client.Client
	base          baseline
	noop          *noopServer // nil without -noop
	// vmipam is what runs vmipam now; logFile gets its output.
	vmipam  stopper
	logFile io.Writer
	// vmipamPprof is where vmipam serves pprof, with -profile.
	vmipamPprof string
}

// opsResult is what one batch of operations gave.
type opsResult struct {
	ok       []bool
	lat      []time.Duration // of the successful operations
	errors   int
	firstErr error
	elapsed  time.Duration
}

// runOps runs n operations on the bench's clients as fast as they go,
// each worker taking the next index, all starting together; it times each
// operation and the batch.
func (b *bench) runOps(ctx context.Context, n int, op func(ctx context.Context, c client.Client, i int) error) opsResult {
	r, _ := b.runPaced(ctx, n, 0, op)
	return r
}

// collect sums up a batch of operations: their latencies and errors, and
// the batch's wall time.
func collect(ctx context.Context, elapsed time.Duration, lat []time.Duration, errs []error) opsResult {
	r := opsResult{elapsed: elapsed, ok: make([]bool, len(errs))}
	for i, err := range errs {
		if err != nil || ctx.Err() != nil {
			r.errors++
			if r.firstErr == nil {
				r.firstErr = err
			}
			continue
		}
		r.ok[i] = true
		r.lat = append(r.lat, lat[i])
	}
	if r.firstErr == nil && ctx.Err() != nil {
		r.firstErr = ctx.Err()
	}
	return r
}

func newVM(m mode, name string) *vmipamv1.VirtualMachine {
	return &vmipamv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: m.namespace(), Name: name, Labels: map[string]string{"app.kubernetes.io/name": "e2ebench"}},
		Spec:       vmipamv1.VirtualMachineSpec{Image: "registry.example/bench:1", CPUs: 1, Memory: "1Gi"},
	}
}

// createOp returns the create of the i-th VirtualMachine named
// prefix-(offset+i) in mode m.
func (b *bench) createOp(m mode, prefix string, offset int) func(ctx context.Context, c client.Client, i int) error {
	return func(ctx context.Context, c client.Client, i int) error {
		vm := newVM(m, fmt.Sprintf("%s-%05d", prefix, offset+i))
		switch m {
		case modeWith:
			vm.Spec.IPPool = poolName
		case modeWithout:
			vm.Spec.Addresses = []string{nthAddr(withoutRange, offset+i).String()}
		case modeNoop:
			vm.Spec.Addresses = []string{nthAddr(noopRange, offset+i).String()}
		case modeBaseline:
			a, err := b.base.allocate(ctx, c, vm.Namespace+"/"+vm.Name)
			if err != nil {
				return err
			}
			vm.Spec.Addresses = []string{a.String()}
		}
		return c.Create(ctx, vm)
	}
}

func (b *bench) run(ctx context.Context) (*report, error) {
	o := b.opts
	rep := &report{opts: o, started: time.Now(), loadStart: loadavg(), goVersion: runtime.Version(), cpus: runtime.NumCPU()}
	b.base.prefix = baselineRange
	dir, err := os.MkdirTemp("", "e2ebench-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()

	logf("building vmipam and starting the control plane (load average %s)", rep.loadStart)
	var copts harness.ClusterOptions
	if !o.cacheCheck {
		copts.Configure = func(_ *harness.Cluster, env *envtest.Environment) error {
			env.ControlPlane.GetAPIServer().Configure().Append("feature-gates", "DetectCacheInconsistency=false")
			return nil
		}
	}
	cl, err := harness.StartWith(ctx, b.root, dir, copts)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := cl.Stop(); err != nil {
			logf("stop the control plane: %v", err)
		}
	}()
	b.cl = cl
	cl.VMIPAMEnv = strings.Fields(o.vmipamEnv)
	// Before vmipam starts, so nothing races on the configurations; vmipam
	// then only injects its CA.
	if err := excludeFromWebhooks(ctx, cl.Client, nsWithout, nsNoop, nsBaseline); err != nil {
		return nil, err
	}
	logPath := filepath.Join(b.results, "e2e-bench-vmipam.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	args := strings.Fields(o.vmipamArgs)
	if o.profile > 0 {
		if b.vmipamPprof, err = freeLocalAddr(); err != nil {
			return nil, err
		}
		args = append(args, "--pprof-bind-address="+b.vmipamPprof)
	}
	p, err := cl.StartVMIPAM(ctx, logFile, args...)
	if err != nil {
		return nil, fmt.Errorf("%w (logs in %s)", err, logPath)
	}
	b.vmipam, b.logFile = p, logFile
	defer func() {
		if b.vmipam == nil {
			return
		}
		if err := b.vmipam.Stop(30 * time.Second); err != nil {
			logf("stop vmipam: %v", err)
		}
	}()
	if err := b.setupObjects(ctx); err != nil {
		return nil, err
	}
	if o.noop {
		if o.noopProcess {
			b.noop, err = startNoopProcess(ctx, dir, filepath.Join(b.results, "e2e-bench-noopwebhook.log"), cl.Kubeconfig,
				cl.Config.QPS, cl.Config.Burst, o.noopStamp)
		} else {
			b.noop, err = startNoopServer(o.noopStamp)
		}
		if err != nil {
			return nil, err
		}
		defer b.noop.stop()
		if o.noopBehindService() {
			// A period of 0 is the proxy's default, as for the replicas'.
			px, err := startNoopProxy(ctx, b.root, dir, filepath.Join(b.results, "e2e-bench-lbproxy.log"), b.noop, o.probePeriod)
			if err != nil {
				return nil, fmt.Errorf("the no-op webhook's stand-in Service: %w", err)
			}
			defer px.stop()
		}
		if err := b.noop.install(ctx, cl.Client); err != nil {
			return nil, err
		}
		// The no-op objects carry a finalizer: something must take it
		// away, as vmipam's controller takes its own (the no-op process
		// runs its own remover).
		if !o.noopProcess {
			if err := b.startFinalizerRemover(ctx); err != nil {
				return nil, fmt.Errorf("no-op finalizer remover: %w", err)
			}
		}
	}
	if err := b.waitWebhooks(ctx); err != nil {
		return nil, err
	}
	if b.clients, err = b.newClients(); err != nil {
		return nil, err
	}
	if o.fleet > 0 {
		if err := b.startScale(ctx); err != nil {
			return nil, fmt.Errorf("scale mode: %w", err)
		}
	}
	logf("control plane, vmipam and pool %s (%s) ready; warming up with %d VirtualMachines per mode", poolName, o.poolCIDR, o.warmup)
	if err := b.warmUp(ctx, false); err != nil {
		return nil, fmt.Errorf("warm up: %w", err)
	}
	if err := b.measureScale(ctx, rep); err != nil {
		return nil, fmt.Errorf("scale mode: %w", err)
	}
	if o.fleet > 0 {
		// The rolling restart left new replicas: the rounds meet them
		// warm, as the warm-up above left the first ones for the phases
		// before.
		logf("scale: warming up again after the rolling restart, %d VirtualMachines per mode", o.warmup)
		if err := b.warmUp(ctx, true); err != nil {
			return nil, fmt.Errorf("warm up after the scale mode: %w", err)
		}
	}
	if err := b.measureCreates(ctx, rep); err != nil {
		return nil, err
	}
	if err := b.measurePaced(ctx, rep); err != nil {
		return nil, fmt.Errorf("steady-rate phase: %w", err)
	}
	if o.fleet > 0 {
		// Deleting the fleet would measure little and take long.
		rep.loadEnd = loadavg()
		rep.finished = time.Now()
		return rep, nil
	}
	if err := b.measureDeletes(ctx, rep); err != nil {
		return nil, err
	}
	if err := b.measureHistory(ctx, rep); err != nil {
		return nil, fmt.Errorf("history phase: %w", err)
	}
	if err := b.measureReplicas(ctx, rep); err != nil {
		return nil, fmt.Errorf("replicas phase: %w", err)
	}
	rep.loadEnd = loadavg()
	rep.finished = time.Now()
	return rep, nil
}

// warmUp creates and deletes a few VirtualMachines in every mode, so that
// connections, the API server's caches and vmipam's free list are warm;
// with keep it leaves them (the scale mode's, which deletes nothing: its
// fleet shares the namespace of the VMs with vmipam, so a wait for the
// deletes to end would wait for the fleet's).
func (b *bench) warmUp(ctx context.Context, keep bool) error {
	if b.opts.warmup == 0 {
		return nil
	}
	for m := range numModes {
		if !b.opts.enabled(m) {
			continue
		}
		r := b.runOps(ctx, b.opts.warmup, b.createOp(m, "warm-"+m.prefix(), 0))
		if r.errors > 0 {
			return fmt.Errorf("%d of %d creates %s failed: %w", r.errors, b.opts.warmup, m, r.firstErr)
		}
		if keep {
			continue
		}
		if _, err := b.deleteAll(ctx, m, "warm-"+m.prefix(), 0, r.ok); err != nil {
			return err
		}
	}
	if keep {
		// The baseline's pool keeps what its warm-up took.
		return nil
	}
	return b.base.reset(ctx, b.cl.Client)
}

// split divides n into k near-equal parts.
func split(n, k int) []int {
	out := make([]int, k)
	for i := range out {
		out[i] = n / k
		if i < n%k {
			out[i]++
		}
	}
	return out
}

// roundOrder is the order the modes run in round r (from 0): as declared
// in even rounds, reversed in odd ones. A fixed order put each mode after
// the same other every round, and a drift of the machine's speed within
// rounds (or what one mode leaves the next: the API server's garbage,
// vmipam's binds) fell on the same mode each time; reversed every other
// round, it falls on each mode's neighbours in turn.
func roundOrder(r int) []mode {
	out := make([]mode, 0, numModes)
	for m := range numModes {
		out = append(out, m)
	}
	if r%2 == 1 {
		slices.Reverse(out)
	}
	return out
}

// measureCreates runs the alternating rounds and reads vmipam's and the
// API server's histograms around them: only the rounds with vmipam call
// its webhook, only those of the no-op mode the no-op one.
func (b *bench) measureCreates(ctx context.Context, rep *report) error {
	o := b.opts
	noopN := 0
	if o.noop {
		noopN = o.n
	}
	perRound := [numModes][]int{split(o.n, o.rounds), split(o.n, o.rounds), split(noopN, o.rounds), split(o.baselineN, o.rounds)}
	var noopBefore int64
	if b.noop != nil {
		noopBefore = b.noop.reviews()
	}
	vBefore, aBefore, err := b.bothMetrics(ctx)
	if err != nil {
		return err
	}
	var offsets [numModes]int
	for r := range o.rounds {
		for _, m := range roundOrder(r) {
			k := perRound[m][r]
			if k == 0 {
				continue
			}
			st := &rep.modes[m]
			forced, err := b.collectAPIServer(ctx)
			if err != nil {
				return err
			}
			a0, err := b.apiserverMetrics(ctx)
			if err != nil {
				return err
			}
			// vmipam's metrics only add the round's context: if they
			// cannot be read, the round's figures of them say so.
			v0, vErr := b.vmipamMetrics()
			logf("round %d/%d %s: creating %d", r+1, o.rounds, m, k)
			wait := func() {}
			if o.profile > 0 && r == 0 {
				wait = b.profile(ctx, m.prefix(), o.profile)
			}
			c0 := sampleCPU()
			res := b.runOps(ctx, k, b.createOp(m, m.prefix(), offsets[m]))
			c1 := sampleCPU()
			wait()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			a1, err := b.apiserverMetrics(ctx)
			if err != nil {
				return err
			}
			v1, err := b.vmipamMetrics()
			if vErr == nil {
				vErr = err
			}
			rs := roundStat{mode: m, round: r + 1, created: len(res.lat), rate: float64(len(res.lat)) / res.elapsed.Seconds(), cpu: c1.sub(c0),
				roundCounters: countersOf(a1, v1).sub(countersOf(a0, v0)), forcedGC: forced, vmipamUnknown: vErr != nil}
			rep.rounds = append(rep.rounds, rs)
			st.cpu.add(rs.cpu)
			st.checks += rs.checks
			if st.requests == nil {
				st.requests = map[string]float64{}
			}
			before := requestCounts(a0)
			for k, v := range requestCounts(a1) {
				st.requests[k] += v - before[k]
			}
			st.elapsed += res.elapsed
			st.lat = append(st.lat, res.lat...)
			st.errors += res.errors
			if st.firstErr == nil {
				st.firstErr = res.firstErr
			}
			for i, ok := range res.ok {
				if ok {
					st.created = append(st.created, offsets[m]+i)
				}
			}
			st.roundRates = append(st.roundRates, rs.rate)
			offsets[m] += k
			logf("round %d/%d %s: %d created, %d failed in %s: %.0f/s", r+1, o.rounds, m, len(res.lat), res.errors,
				res.elapsed.Round(time.Millisecond), rs.rate)
			if res.firstErr != nil {
				logf("  first error: %v", res.firstErr)
			}
			if m == modeBaseline {
				st.attempts += b.base.attempts.Swap(0)
				st.conflicts += b.base.conflicts.Swap(0)
			}
			if err := b.settle(ctx, m, st); err != nil {
				return err
			}
			// From the round's start until the controller had caught up
			// and the pause after it showed nothing more to do: what the
			// creates cost vmipam in all, the webhook calls, the binds
			// and the watch events included, whenever they ran.
			st.cpuSettled.add(sampleCPU().sub(c0))
		}
	}
	if o.profile > 0 {
		rep.apiserverSplit = b.splitAPIServerProfiles(ctx)
	}
	vAfter, err := b.vmipamMetrics()
	if err != nil {
		return err
	}
	aText, err := b.apiserverMetricsText(ctx)
	if err != nil {
		return err
	}
	aAfter, err := parseMetrics(aText)
	if err != nil {
		return fmt.Errorf("the API server's metrics: %w", err)
	}
	if text, err := b.cl.Metrics(); err == nil {
		b.keep("e2e-bench-vmipam.metrics", text)
	}
	b.keep("e2e-bench-apiserver.metrics", aText)
	rep.webhook = webhookStats(vBefore, vAfter, aBefore, aAfter)
	if b.noop != nil {
		rep.noopReviews = b.noop.reviews() - noopBefore
	}
	for m := range numModes {
		sort.Slice(rep.modes[m].lat, func(i, j int) bool { return rep.modes[m].lat[i] < rep.modes[m].lat[j] })
	}
	return nil
}

// collectAPIServer runs the API server's garbage collector and returns
// the CPU it cost the API server, with -apiserver-gc; otherwise NaN.
func (b *bench) collectAPIServer(ctx context.Context) (float64, error) {
	if !b.opts.apiserverGC {
		return math.NaN(), nil
	}
	c0 := sampleCPU()
	// net/http/pprof's heap profile runs a collection first with gc=1,
	// and returns once it is over.
	if _, err := b.apiserverGet(ctx, "/debug/pprof/heap?gc=1"); err != nil {
		return 0, fmt.Errorf("run the API server's garbage collector: %w", err)
	}
	return sampleCPU().sub(c0).procs["kube-apiserver"], nil
}

// resyncLines returns what vmipam logged of its periodic resyncs: each
// one that changed the allocator.
func (b *bench) resyncLines() []string {
	raw, err := os.ReadFile(filepath.Join(b.results, "e2e-bench-vmipam.log"))
	if err != nil {
		return nil
	}
	var out []string
	for line := range strings.SplitSeq(string(raw), "\n") {
		if strings.Contains(line, `"msg":"Resynced pool"`) {
			out = append(out, line)
		}
	}
	return out
}

// keep writes a file into the results folder for later inspection.
func (b *bench) keep(name, content string) {
	if err := os.WriteFile(filepath.Join(b.results, name), []byte(content), 0o644); err != nil {
		logf("warning: %v", err)
	}
}

// requestCounts sums the API server's requests by verb and resource.
func requestCounts(m metricSet) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m {
		if s.Name != "apiserver_request_total" || s.Labels["resource"] == "" {
			continue
		}
		k := s.Labels["verb"] + " " + s.Labels["resource"]
		if sub := s.Labels["subresource"]; sub != "" {
			k += "/" + sub
		}
		out[k] += s.Value
	}
	return out
}

// cacheChecks is how many watch-cache consistency checks of
// VirtualMachines the API server has made (see -cache-check).
func cacheChecks(a metricSet) float64 {
	return a.sum("apiserver_storage_consistency_checks_total", map[string]string{"resource": "virtualmachines"})
}

// requestDelta returns the requests the API server served from a0 to
// a1, by verb and resource, as requestCounts keys them; only those that
// grew.
func requestDelta(a0, a1 metricSet) map[string]float64 {
	out := map[string]float64{}
	before := requestCounts(a0)
	for k, v := range requestCounts(a1) {
		if n := v - before[k]; n > 0 {
			out[k] = n
		}
	}
	return out
}

// settle waits after a round until vmipam's address controller has caught
// up: its work queue empty and, after a round with vmipam, every
// reservation bound. It records how long that took, then pauses, so that
// no round pays for the previous one.
func (b *bench) settle(ctx context.Context, m mode, st *modeStats) error {
	t0 := time.Now()
	drained := func() error {
		v, err := b.vmipamMetrics()
		if err != nil {
			return err
		}
		gc := map[string]string{"name": "address-gc"}
		if d := v.sum("workqueue_depth", gc); d != 0 {
			return fmt.Errorf("%v queued", d)
		}
		if u := v.sum("workqueue_unfinished_work_seconds", gc); u != 0 {
			return errors.New("reconciles in flight")
		}
		if p := v.sum("vmipam_pool_addresses", map[string]string{"pool": poolName, "state": "pending"}); p != 0 {
			return fmt.Errorf("%v pending", p)
		}
		return nil
	}
	for {
		if err := poll(ctx, pollMetrics, 2*time.Minute, "vmipam's controller to catch up", drained); err != nil {
			return err
		}
		caughtUp := time.Since(t0)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(settle):
		}
		// Late watch events may have refilled the queue meanwhile.
		if drained() == nil {
			st.caughtUp = append(st.caughtUp, caughtUp)
			return nil
		}
	}
}

// deleteAll deletes the VirtualMachines prefix-(offset+i) of mode m for
// every ok[i], and waits until the namespace holds none.
func (b *bench) deleteAll(ctx context.Context, m mode, prefix string, offset int, ok []bool) (deletion, error) {
	var names []string
	for i, o := range ok {
		if o {
			names = append(names, fmt.Sprintf("%s-%05d", prefix, offset+i))
		}
	}
	return b.deleteNames(ctx, m, names)
}

// deleteNames deletes the VirtualMachines names of mode m and waits until
// the namespace holds none (of those matching opts, when given).
func (b *bench) deleteNames(ctx context.Context, m mode, names []string, opts ...client.ListOption) (deletion, error) {
	t0 := time.Now()
	res := b.runOps(ctx, len(names), func(ctx context.Context, c client.Client, i int) error {
		return ignoreNotFound(c.Delete(ctx, newVM(m, names[i])))
	})
	if res.errors > 0 {
		return deletion{}, fmt.Errorf("%d of %d deletes %s failed: %w", res.errors, len(names), m, res.firstErr)
	}
	gone, err := b.waitGone(ctx, m.namespace(), 5*time.Minute, opts...)
	if err != nil {
		return deletion{}, err
	}
	return deletion{count: len(names), calls: res.elapsed, gone: gone.Sub(t0), goneAt: gone, lat: res.lat}, nil
}

// measureDeletes deletes the VirtualMachines without vmipam and those of
// the no-op mutating webhook (whose finalizer the no-op remover takes
// away), then those with vmipam (each through the finalizer and the
// controller's release), and times until every address of the pool is
// free again after its cooldown.
func (b *bench) measureDeletes(ctx context.Context, rep *report) error {
	for _, m := range []mode{modeWithout, modeNoop, modeWith} {
		if !b.opts.enabled(m) {
			continue
		}
		st := &rep.modes[m]
		names := make([]string, len(st.created))
		for i, idx := range st.created {
			names[i] = fmt.Sprintf("%s-%05d", m.prefix(), idx)
		}
		v0, err := b.vmipamMetrics()
		if err != nil {
			return err
		}
		a0, err := b.apiserverMetrics(ctx)
		if err != nil {
			return err
		}
		wait := func() {}
		if b.opts.profile > 0 {
			wait = b.profile(ctx, "delete-"+m.prefix(), b.opts.profile)
		}
		c0 := sampleCPU()
		d, err := b.deleteNames(ctx, m, names)
		if err != nil {
			return err
		}
		d.cpu = sampleCPU().sub(c0)
		wait()
		v1, err := b.vmipamMetrics()
		if err != nil {
			return err
		}
		a1, err := b.apiserverMetrics(ctx)
		if err != nil {
			return err
		}
		d.requests = requestDelta(a0, a1)
		d.storeWrites = v1.sum("vmipam_store_writes_total", map[string]string{"pool": poolName}) -
			v0.sum("vmipam_store_writes_total", map[string]string{"pool": poolName})
		st.deletion = d
		logf("deleted %d VirtualMachines (%s): calls done in %s, all gone after %s: %.0f/s",
			d.count, m, d.calls.Round(time.Millisecond), d.gone.Round(time.Millisecond), d.rate())
	}
	// Every address is free again once none is allocated, pending or
	// cooling down, and every claimed one is on the free list.
	goneAt := rep.modes[modeWith].deletion.goneAt
	var last map[string]float64
	err := poll(ctx, pollMetrics, b.opts.cooldown+b.opts.freeTimeout, "every address of the pool to be free", func() error {
		c, err := b.poolCounts()
		if err != nil {
			return err
		}
		last = c
		if c["allocated"] != 0 || c["pending"] != 0 || c["cooldown"] != 0 || c["claimed"] != c["free"] {
			return fmt.Errorf("pool counts %v", c)
		}
		return nil
	})
	rep.finalCounts = last
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		// Report it rather than lose the run: it is a finding.
		rep.notFree = true
		logf("warning: %v", err)
	default:
		rep.freeAfter = time.Since(goneAt)
		logf("every address free %s after the last VirtualMachine was gone (cooldown %s): %v",
			rep.freeAfter.Round(time.Millisecond), b.opts.cooldown, last)
	}
	rep.resyncs = b.resyncLines()
	// The baseline's VirtualMachines are plain objects; vmipam ignores them.
	if err := b.cl.Client.DeleteAllOf(ctx, &vmipamv1.VirtualMachine{}, client.InNamespace(nsBaseline)); err != nil {
		return fmt.Errorf("delete the baseline's VirtualMachines: %w", err)
	}
	if _, err := b.waitGone(ctx, nsBaseline, time.Minute); err != nil {
		return err
	}
	// The pool's status catches up every few seconds.
	var pool vmipamv1.IPPool
	err = poll(ctx, pollAPI, 30*time.Second, "the IPPool status to show no address in use", func() error {
		if err := b.cl.Client.Get(ctx, client.ObjectKey{Name: poolName}, &pool); err != nil {
			return err
		}
		if s := pool.Status; s.Allocated != 0 || s.Pending != 0 || s.Cooldown != 0 {
			return errors.New("not yet")
		}
		return nil
	})
	rep.poolStatus = pool.Status
	if err != nil {
		logf("warning: %v", err)
	}
	return nil
}
