package main

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs"

	"github.com/vmipam/vmipam/test/harness"
	"github.com/vmipam/vmipam/test/lbproxy"
)

// The scale mode (-fleet N, make bench-scale): vmipam runs as three
// replicas, a fleet of N VirtualMachines is built through them, and the
// costs that grow with the fleet are measured before the usual rounds run
// at that size: memory per VM, one resync interval, a replica's restart,
// a rollout. The rounds then compare creates with vmipam against the
// no-op floor with the fleet present.

// scaleReplicas is how many replicas the scale mode runs.
const scaleReplicas = 3

// scalePhase is what the scale mode measured.
type scalePhase struct {
	ran   bool
	fleet int
	slots bool
	// build: the fleet's creates, in two halves.
	build [2]opsResult
	// rss: each replica's resident memory after each half, in bytes.
	rss [2][]float64
	// live: each replica's Go heap in use after a garbage collection
	// (runtime.MemStats.HeapAlloc), after each half, in bytes.
	live [2][]float64
	// probePeriod: the stand-in's readiness probes from the idle
	// interval on (-probe-period).
	probePeriod time.Duration
	// resync: one resync interval, idle.
	resyncInterval time.Duration
	resyncCPU      cpuSample
	resyncLists    float64 // LISTs of virtualmachines
	resyncBytes    float64 // bytes of the API server's LIST responses of virtualmachines
	resyncRequests map[string]float64
	resyncChecks   float64 // the API server's watch-cache consistency checks of virtualmachines
	// resyncs: vmipam's resyncs in the interval, all replicas, by source
	// (caches, list): how many, and their seconds in all (nil when its
	// metrics could not be read).
	resyncs map[string][2]float64
	// restart: a replica stopped (SIGTERM) and its replacement ready.
	restart time.Duration
	// rollout: every replica replaced, one after the other.
	rollout         time.Duration
	rolloutRequests map[string]float64
	rolloutCPU      cpuSample
	// heapTop is what one replica's heap holds with the whole fleet, as
	// go tool pprof -top prints it (empty if it could not be taken).
	heapTop string
}

// heapFile is the heap profile of one replica with the whole fleet, in the
// results folder.
const heapFile = "e2e-bench-vmipam-heap.pprof"

// heapProfile takes rep's heap profile (after a garbage collection), writes
// it to the results folder as heapFile, and returns what go tool pprof -top
// makes of its memory in use.
func (b *bench) heapProfile(ctx context.Context, rep *harness.Replica) (string, error) {
	buf, err := heapOf(ctx, rep, "")
	if err != nil {
		return "", err
	}
	path := filepath.Join(b.results, heapFile)
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-sample_index=inuse_space", "-nodecount=25", path).Output()
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// scaleArgs are the flags the scale mode adds to vmipam's.
func (o *options) scaleArgs() []string {
	args := []string{"--shutdown-drain=1s", "--resync-interval=" + o.scaleResync.String(), "--full-resync-interval=1h"}
	if o.slots {
		args = append(args, "--holder-slots")
	}
	return args
}

// startScale starts the replicas of the scale mode in place of the one
// vmipam process.
func (b *bench) startScale(ctx context.Context) error {
	extra := append(strings.Fields(b.opts.vmipamArgs), b.opts.scaleArgs()...)
	ready, err := b.restartVMIPAM(ctx, scaleReplicas, extra)
	if err != nil {
		return err
	}
	logf("scale: %d replicas ready in %s", scaleReplicas, ready.Round(time.Millisecond))
	return nil
}

// replicas returns the running replicas, nil unless the scale mode runs.
func (b *bench) replicas() *harness.Replicas {
	rs, _ := b.vmipam.(*harness.Replicas)
	return rs
}

// measureScale builds the fleet and measures what it costs.
func (b *bench) measureScale(ctx context.Context, rep *report) error {
	o := b.opts
	if o.fleet == 0 {
		return nil
	}
	rs := b.replicas()
	if rs == nil {
		return fmt.Errorf("the scale mode runs %d replicas; none run", scaleReplicas)
	}
	ph := &rep.scale
	ph.ran, ph.fleet, ph.slots, ph.resyncInterval, ph.probePeriod = true, o.fleet, o.slots, o.scaleResync, o.probePeriod
	half := split(o.fleet, 2)
	offset := 0
	for i, k := range half {
		logf("scale: building the fleet, %d of %d", offset+k, o.fleet)
		res := b.runOps(ctx, k, b.createOp(modeWith, "fleet", offset))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if res.errors > 0 {
			logf("scale: %d creates of the fleet failed: %v", res.errors, res.firstErr)
		}
		offset += k
		ph.build[i] = res
		logf("scale: %d created in %s: %.0f/s", len(res.lat), res.elapsed.Round(time.Millisecond), float64(len(res.lat))/res.elapsed.Seconds())
		if err := b.settle(ctx, modeWith, &modeStats{}); err != nil {
			return err
		}
		// The caches and the allocators settle after the burst.
		if !sleepFor(ctx, 5*time.Second) {
			return ctx.Err()
		}
		ph.rss[i] = replicaRSS(rs)
		ph.live[i] = liveHeap(ctx, rs)
		logf("scale: replicas' RSS %s, live heap %s", mibs(ph.rss[i]), mibs(ph.live[i]))
	}
	if live := rs.Live(); len(live) > 0 {
		top, err := b.heapProfile(ctx, live[0])
		if err != nil {
			logf("scale: heap profile: %v", err)
		}
		ph.heapTop = top
	}

	// From here on the stand-in Service probes readiness every
	// -probe-period, as a kubelet would, but around the replacement and
	// the rollout. Ten probes a second, each a fresh connection, held
	// about half of an idle replica's CPU samples.
	rs.Proxy.SetProbeInterval(o.probePeriod)

	// One resync interval, idle: every replica resyncs once, from its
	// caches (--full-resync-interval=1h, its default, set here all the same).
	logf("scale: one resync interval (%s), idle", o.scaleResync)
	v0, vErr := b.vmipamMetrics()
	cpu, a0, a1, err := b.around(ctx, func() error {
		wait := func() {}
		if o.profile > 0 {
			// The whole interval, whatever -profile says.
			wait = b.profile(ctx, "idle", o.scaleResync)
		}
		defer wait()
		if !sleepFor(ctx, o.scaleResync) {
			return ctx.Err()
		}
		return nil
	})
	if err != nil {
		return err
	}
	ph.resyncCPU, ph.resyncRequests, ph.resyncChecks = cpu, requestDelta(a0, a1), cacheChecks(a1)-cacheChecks(a0)
	if v1, err := b.vmipamMetrics(); err == nil && vErr == nil {
		ph.resyncs = map[string][2]float64{}
		for _, source := range []string{"caches", "list"} {
			want := map[string]string{"source": source}
			n := v1.sum("vmipam_resync_duration_seconds_count", want) - v0.sum("vmipam_resync_duration_seconds_count", want)
			d := v1.sum("vmipam_resync_duration_seconds_sum", want) - v0.sum("vmipam_resync_duration_seconds_sum", want)
			ph.resyncs[source] = [2]float64{n, d}
		}
	}
	list := map[string]string{"verb": "LIST", "resource": "virtualmachines"}
	ph.resyncLists = a1.sum("apiserver_request_total", list) - a0.sum("apiserver_request_total", list)
	ph.resyncBytes = a1.sum("apiserver_response_sizes_sum", list) - a0.sum("apiserver_response_sizes_sum", list)

	// A replica replaced: stopped (it drains, seals, releases its slot)
	// and its replacement started at once, until it is ready.
	live := rs.InRotation()
	if len(live) == 0 {
		return fmt.Errorf("no replica in rotation")
	}
	logf("scale: replacing one replica")
	rs.Proxy.SetProbeInterval(lbproxy.DefaultProbeInterval)
	defer rs.Proxy.SetProbeInterval(o.probePeriod)
	t0 := time.Now()
	if _, err := rs.Replace(ctx, live[0], "", 30*time.Second); err != nil {
		return fmt.Errorf("replace a replica: %w", err)
	}
	ph.restart = time.Since(t0)
	logf("scale: replacement ready after %s", ph.restart.Round(time.Millisecond))

	// A rollout: every replica replaced, one after the other.
	logf("scale: rolling restart")
	t0 = time.Now()
	cpu, a0, a1, err = b.around(ctx, func() error {
		_, err := rs.RollingRestart(ctx, false, 30*time.Second)
		return err
	})
	if err != nil {
		return fmt.Errorf("rolling restart: %w", err)
	}
	// Whatever the rollout started (relabels, takeovers) finishes after
	// it: count it too.
	if !sleepFor(ctx, 2*scaleSettle) {
		return ctx.Err()
	}
	a2, err := b.apiserverMetrics(ctx)
	if err != nil {
		return err
	}
	ph.rollout, ph.rolloutCPU, ph.rolloutRequests = time.Since(t0)-2*scaleSettle, cpu, requestDelta(a0, a2)
	_ = a1
	logf("scale: rolling restart over in %s; writes %v", ph.rollout.Round(time.Millisecond), writesOf(ph.rolloutRequests))
	return b.waitStamped(ctx)
}

// deployedProbePeriod is the readinessProbe's periodSeconds in
// deploy/base/deployment.yaml (TestDeployedProbePeriod checks it).
const deployedProbePeriod = 2 * time.Second

// scaleSettle is how long after a rollout its consequences are counted.
const scaleSettle = 15 * time.Second

// replicaRSS returns the resident memory of each live replica, in bytes.
func replicaRSS(rs *harness.Replicas) []float64 {
	var out []float64
	for _, r := range rs.Live() {
		p, err := procfs.NewProc(r.Pid())
		if err != nil {
			continue
		}
		st, err := p.Stat()
		if err != nil {
			continue
		}
		out = append(out, float64(st.ResidentMemory()))
	}
	return out
}

// heapOf reads rep's heap profile, taken right after a garbage
// collection; query adds to the request's query ("&debug=1": as text,
// with runtime.MemStats).
func heapOf(ctx context.Context, rep *harness.Replica, query string) ([]byte, error) {
	return replicaPprof(ctx, rep, "/debug/pprof/heap?gc=1"+query)
}

// replicaPprof reads path (with its query) from rep's pprof server.
func replicaPprof(ctx context.Context, rep *harness.Replica, path string) ([]byte, error) {
	return get(ctx, http.DefaultClient, "http://127.0.0.1:"+strconv.Itoa(rep.PprofPort)+path)
}

// liveHeap returns the Go heap each live replica holds right after a
// garbage collection (the HeapAlloc its heap profile reports), in bytes.
func liveHeap(ctx context.Context, rs *harness.Replicas) []float64 {
	var out []float64
	for _, r := range rs.Live() {
		buf, err := heapOf(ctx, r, "&debug=1")
		if err != nil {
			logf("scale: live heap: %v", err)
			continue
		}
		for line := range strings.Lines(string(buf)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "# HeapAlloc = "); ok {
				if n, err := strconv.ParseFloat(v, 64); err == nil {
					out = append(out, n)
				}
				break
			}
		}
	}
	return out
}

// writesOf keeps the writes of requests by verb and resource.
func writesOf(req map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range req {
		verb, _, _ := strings.Cut(k, " ")
		switch verb {
		case "POST", "PUT", "PATCH", "DELETE", "UPDATE", "CREATE", "APPLY":
			out[k] = v
		}
	}
	return out
}

func mibs(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.0f MiB", x/(1<<20))
	}
	return strings.Join(s, ", ")
}

// sleepFor waits d; false if ctx ended first.
func sleepFor(ctx context.Context, d time.Duration) bool {
	sleepCtx(ctx, d)
	return ctx.Err() == nil
}

func avg(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t / float64(len(v))
}

// probesWere says how often the stand-in Service probed the replicas.
func probesWere(period time.Duration) string {
	if period == 0 {
		period = lbproxy.DefaultProbeInterval
	}
	return fmt.Sprintf("The stand-in probed each replica's readiness every %s from the idle interval on (a fresh connection each, as a kubelet's "+
		"probe; the Deployment's readinessProbe runs every %s), but every %s around the replacement and the rolling restart.",
		period, deployedProbePeriod, lbproxy.DefaultProbeInterval)
}

// scaleSection writes the scale mode's table.
func (r *report) scaleSection(b *strings.Builder) {
	ph := &r.scale
	if !ph.ran {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	holders := "pod-named holders (no `--holder-slots`)"
	if ph.slots {
		holders = "holder slots (`--holder-slots`)"
	}
	w("## At scale: a fleet of %d VirtualMachines", ph.fleet)
	w("")
	w("vmipam ran as %d replicas behind the stand-in for the Service, with %s and `--resync-interval=%s` (and `--full-resync-interval` "+
		"at an hour, its default: the idle interval's resyncs read the replicas' caches, and list every VM only if the caches cannot stand for a list). The fleet was created "+
		"through them (pool `%s`) before anything else was measured, in two halves; the rounds above ran with it present. %s",
		scaleReplicas, holders, ph.resyncInterval, poolName, probesWere(ph.probePeriod))
	w("")
	t := table{b: b}
	t.header("", "measured")
	for i, res := range ph.build {
		t.row(fmt.Sprintf("fleet creates, half %d: VM/s (failed)", i+1),
			fmt.Sprintf("%.0f (%d)", float64(len(res.lat))/res.elapsed.Seconds(), res.errors))
	}
	per := float64(ph.fleet-ph.fleet/2) / float64(scaleReplicas)
	t.row("replicas' RSS at half the fleet", mibs(ph.rss[0]))
	t.row("replicas' RSS with the whole fleet", mibs(ph.rss[1]))
	if len(ph.rss[0]) > 0 && len(ph.rss[1]) > 0 {
		t.row("memory per VM per replica (RSS slope over the second half, each replica keeping a third)",
			fmt.Sprintf("%.0f bytes", (avg(ph.rss[1])-avg(ph.rss[0]))/per))
	}
	t.row("replicas' live Go heap (after a GC) at half the fleet", mibs(ph.live[0]))
	t.row("replicas' live Go heap (after a GC) with the whole fleet", mibs(ph.live[1]))
	if len(ph.live[0]) > 0 && len(ph.live[1]) > 0 {
		t.row("live heap per VM per replica (slope over the second half): what vmipam keeps, without the Go runtime's slack",
			fmt.Sprintf("%.0f bytes", (avg(ph.live[1])-avg(ph.live[0]))/per))
	}
	lists := max(ph.resyncLists, 1)
	t.row(fmt.Sprintf("one resync interval, idle (%s): LISTs of virtualmachines", ph.resyncInterval), fmt.Sprintf("%.0f", ph.resyncLists))
	t.row("… bytes listed per LIST", fmt.Sprintf("%.1f MiB", ph.resyncBytes/lists/(1<<20)))
	t.row("… GETs of virtualmachines", fmt.Sprintf("%.0f", ph.resyncRequests["GET virtualmachines"]))
	if ph.resyncs != nil {
		for _, s := range []struct{ source, from string }{{"caches", "their caches"}, {"list", "a list of every VM"}} {
			n, d := ph.resyncs[s.source][0], ph.resyncs[s.source][1]
			v := "none"
			if n > 0 {
				v = fmt.Sprintf("%.0f, %s each on average", n, secs(d/n))
			}
			t.row("… vmipam's resyncs from "+s.from+" (all replicas; `vmipam_resync_duration_seconds`)", v)
		}
	}
	t.row("… vmipam CPU (all replicas) in the interval", secs(ph.resyncCPU.procs["vmipam"]))
	t.row("… kube-apiserver CPU in the interval", secs(ph.resyncCPU.procs["kube-apiserver"]))
	t.row("… etcd CPU in the interval", secs(ph.resyncCPU.procs["etcd"]))
	t.row("… the API server's watch-cache consistency checks of virtualmachines in the interval (each lists them from etcd; see above)", fmt.Sprintf("%.0f", ph.resyncChecks))
	t.row("a replica replaced (SIGTERM, drain, seal) until its replacement is ready", ph.restart.Round(time.Millisecond).String())
	t.row("a rolling restart of the 3 replicas", ph.rollout.Round(time.Millisecond).String())
	writes := writesOf(ph.rolloutRequests)
	total := 0.0
	for _, v := range writes {
		total += v
	}
	t.row(fmt.Sprintf("… API writes it caused (and in the %s after it)", 2*scaleSettle), fmt.Sprintf("%.0f", total))
	for _, k := range slices.Sorted(maps.Keys(writes)) {
		t.row("… "+k, fmt.Sprintf("%.0f", writes[k]))
	}
	// The replaced processes exited during it: their share is in reaped.
	t.row("… vmipam CPU during it (the replaced processes' last seconds too)", secs(ph.rolloutCPU.procs["vmipam"]+ph.rolloutCPU.reaped))
	t.row("… kube-apiserver CPU during it", secs(ph.rolloutCPU.procs["kube-apiserver"]))
	w("")
	if ph.heapTop != "" {
		w("What one replica's Go heap holds with the whole fleet, after a garbage collection (`go tool pprof -top -sample_index=inuse_space %s`; "+
			"flat is what each function allocated and still holds):", heapFile)
		w("")
		w("```")
		w("%s", ph.heapTop)
		w("```")
		w("")
	}
}
