package main

import (
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Goals the issue sets.
const (
	goalThroughputRatio = 0.9
	goalWebhookP99      = 0.002 // seconds
	goalVsBaseline      = 50
)

// modeStats is what the creates of one mode gave, over every round.
type modeStats struct {
	created    []int           // indexes of the VirtualMachines created
	lat        []time.Duration // sorted after the rounds
	errors     int
	firstErr   error
	elapsed    time.Duration
	roundRates []float64
	cpu        cpuSample
	// attempts and conflicts of the baseline's read-modify-writes.
	attempts, conflicts int64
	// requests the API server served during the rounds, by verb and
	// resource.
	requests map[string]float64
	// caughtUp: after each round, until vmipam's controller had processed
	// every object (and bound every reservation).
	caughtUp []time.Duration
	deletion deletion
}

func (s *modeStats) rate() float64 {
	if s.elapsed == 0 || len(s.lat) == 0 {
		return math.NaN()
	}
	return float64(len(s.lat)) / s.elapsed.Seconds()
}

// pct returns the q-quantile (nearest rank) of the sorted latencies.
func pct(lat []time.Duration, q float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(lat)))) - 1
	return lat[min(max(i, 0), len(lat)-1)]
}

// deletion is what deleting the VirtualMachines of one mode gave.
type deletion struct {
	count int
	// calls: until every DELETE call returned; gone: until the namespace
	// held none (finalizers removed).
	calls, gone time.Duration
	goneAt      time.Time
	lat         []time.Duration
	cpu         cpuSample
	storeWrites float64
}

func (d deletion) rate() float64 {
	if d.gone == 0 || d.count == 0 {
		return math.NaN()
	}
	return float64(d.count) / d.gone.Seconds()
}

type report struct {
	opts               options
	started, finished  time.Time
	loadStart, loadEnd string
	goVersion          string
	cpus               int
	modes              [numModes]modeStats
	webhook            webhookResult
	freeAfter          time.Duration
	notFree            bool
	resyncs            []string
	finalCounts        map[string]float64
	poolStatus         vmipamv1.IPPoolStatus
}

func ms(d time.Duration) string { return secs(d.Seconds()) }

// secs formats seconds as milliseconds with three significant digits.
func secs(s float64) string {
	if math.IsNaN(s) {
		return "n/a"
	}
	v := s * 1000
	switch {
	case v < 1:
		return fmt.Sprintf("%.3f ms", v)
	case v < 10:
		return fmt.Sprintf("%.2f ms", v)
	case v < 100:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}

func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "n/a"
	}
	r := a / b
	if r >= 10 {
		return fmt.Sprintf("%.1f×", r)
	}
	return fmt.Sprintf("%.2f×", r)
}

// rate formats a throughput; NaN when nothing was measured.
func rate(v float64) string {
	switch {
	case math.IsNaN(v):
		return "n/a"
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// lat formats a latency quantile of the sorted latencies.
func lat(l []time.Duration, q float64) string {
	if len(l) == 0 {
		return "n/a"
	}
	return ms(pct(l, q))
}

func share(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

func met(ok bool) string {
	if ok {
		return "**yes**"
	}
	return "**no**"
}

func metOrNA(v float64, ok bool) string {
	if math.IsNaN(v) {
		return "not measured"
	}
	return met(ok)
}

func rates(r []float64) string {
	s := make([]string, len(r))
	for i, v := range r {
		s[i] = fmt.Sprintf("%.0f", v)
	}
	return strings.Join(s, ", ")
}

func (r *report) usable() int {
	p := netip.MustParsePrefix(r.opts.poolCIDR)
	return 1<<(32-p.Bits()) - 2
}

func (r *report) markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	o := r.opts
	with, without, base := &r.modes[modeWith], &r.modes[modeWithout], &r.modes[modeBaseline]
	wh := r.webhook

	w("# vmipam end-to-end benchmark")
	w("")
	w("%s, %d CPUs, %s; load average (1, 5, 15 min) %s at the start, %s at the end; %s in all.",
		r.started.UTC().Format(time.RFC3339), r.cpus, r.goVersion, r.loadStart, r.loadEnd, r.finished.Sub(r.started).Round(time.Second))
	w("")
	w("%d VirtualMachines with vmipam and %d without, %d through the read-modify-write baseline, from %d concurrent clients (%s connections), "+
		"in %d alternating rounds (with, without, baseline) after a warm-up of %d per mode. Pool %s (%d usable addresses), cooldown %s. "+
		"The figures depend on the machine; the ratios are what to compare.",
		o.n, o.n, o.baselineN, o.c, o.clients, o.rounds, o.warmup, o.poolCIDR, r.usable(), o.cooldown)
	if o.vmipamArgs != "" {
		w("")
		w("vmipam ran with the extra flags `%s`.", o.vmipamArgs)
	}
	w("")

	w("## Goals")
	w("")
	w("| goal | measured | met |")
	w("|---|---:|:---:|")
	tr := with.rate() / without.rate()
	w("| create throughput with vmipam ≥ %.1f × without | %s (%s vs %s VM/s) | %s |", goalThroughputRatio, ratio(with.rate(), without.rate()),
		rate(with.rate()), rate(without.rate()), met(tr >= goalThroughputRatio))
	le2 := wh.mutating.atMost(goalWebhookP99)
	w("| webhook server-side p99 ≤ %s | %s (%s of requests ≤ 2 ms) | %s |", secs(goalWebhookP99), secs(wh.mutating.quantile(0.99)), share(le2),
		met(le2 >= 0.99))
	vb := with.rate() / base.rate()
	w("| create throughput ≥ %d × the read-modify-write baseline | %s (%s vs %s VM/s) | %s |", goalVsBaseline, ratio(with.rate(), base.rate()),
		rate(with.rate()), rate(base.rate()), metOrNA(vb, vb >= goalVsBaseline))
	w("")

	w("## Creates")
	w("")
	w("| | with vmipam | without vmipam | baseline (read-modify-write) | with / without | vmipam / baseline |")
	w("|---|---:|---:|---:|---:|---:|")
	w("| VirtualMachines created (failed) | %d (%d) | %d (%d) | %d (%d) | | |", len(with.lat), with.errors, len(without.lat), without.errors,
		len(base.lat), base.errors)
	w("| **throughput** (VM/s) | **%s** | **%s** | **%s** | **%s** | **%s** |", rate(with.rate()), rate(without.rate()), rate(base.rate()),
		ratio(with.rate(), without.rate()), ratio(with.rate(), base.rate()))
	w("| throughput per round (VM/s) | %s | %s | %s | | |", rates(with.roundRates), rates(without.roundRates), rates(base.roundRates))
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", 0.5}, {"p90", 0.9}, {"p99", 0.99}, {"max", 1}} {
		a, bb, c := pct(with.lat, q.q), pct(without.lat, q.q), pct(base.lat, q.q)
		w("| client-side create latency %s | %s | %s | %s | %s | %s |", q.name, lat(with.lat, q.q), lat(without.lat, q.q), lat(base.lat, q.q),
			ratio(a.Seconds(), bb.Seconds()), ratio(a.Seconds(), c.Seconds()))
	}
	if base.attempts > 0 {
		w("| baseline: pool-object writes that lost on conflict | | | %d of %d (%.1f per allocation) | | |", base.conflicts, base.attempts,
			float64(base.conflicts)/float64(max(len(base.lat), 1)))
	}
	w("| webhook server-side p50 / p99 | %s / %s | (not called) | (not called) | | |", secs(wh.mutating.quantile(0.5)), secs(wh.mutating.quantile(0.99)))
	perK := func(s *modeStats, v float64) string {
		if len(s.lat) == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", 1000*v/float64(len(s.lat)))
	}
	for _, p := range cpuProcs {
		w("| CPU s per 1000 creates: %s | %s | %s | %s | %s | |", p, perK(with, with.cpu.procs[p]), perK(without, without.cpu.procs[p]),
			perK(base, base.cpu.procs[p]), ratio(with.cpu.procs[p]/float64(len(with.lat)), without.cpu.procs[p]/float64(len(without.lat))))
	}
	w("| CPU s per 1000 creates: kernel softirq (loopback networking, ...) | %s | %s | %s | | |", perK(with, with.cpu.softirq),
		perK(without, without.cpu.softirq), perK(base, base.cpu.softirq))
	w("| CPU s per 1000 creates: other processes | %s | %s | %s | | |", perK(with, with.cpu.other()), perK(without, without.cpu.other()),
		perK(base, base.cpu.other()))
	busy := func(s *modeStats) string {
		if s.cpu.total == 0 {
			return "n/a"
		}
		b := share(s.cpu.busy / s.cpu.total)
		if s.cpu.steal > 0 {
			b += fmt.Sprintf(" (+%s stolen)", share(s.cpu.steal/s.cpu.total))
		}
		return b
	}
	w("| machine CPU busy during the rounds (all cores) | %s | %s | %s | | |", busy(with), busy(without), busy(base))
	w("")

	w("API server requests per create during the rounds (`apiserver_request_total`; everything the API server served, vmipam's requests included):")
	w("")
	w("| request | with vmipam | without vmipam | baseline |")
	w("|---|---:|---:|---:|")
	keys := map[string]bool{}
	for m := range numModes {
		for k, v := range r.modes[m].requests {
			if v/float64(max(len(r.modes[m].lat), 1)) >= 0.005 {
				keys[k] = true
			}
		}
	}
	sorted := slices.Sorted(maps.Keys(keys))
	for _, k := range sorted {
		per := func(s *modeStats) string {
			return fmt.Sprintf("%.2f", s.requests[k]/float64(max(len(s.lat), 1)))
		}
		w("| %s | %s | %s | %s |", k, per(with), per(without), per(base))
	}
	w("")

	w("## vmipam's webhooks (server side, during the rounds with vmipam)")
	w("")
	w("Quantiles interpolate inside histogram buckets as Prometheus's `histogram_quantile` does; the ≤ columns are exact bucket counts.")
	w("")
	w("| histogram | requests | p50 | p99 | ≤ 2 ms | ≤ 5 ms |")
	w("|---|---:|---:|---:|---:|---:|")
	row := func(name string, h histogram) {
		w("| %s | %.0f | %s | %s | %s | %s |", name, h.total(), secs(h.quantile(0.5)), secs(h.quantile(0.99)), share(h.atMost(0.002)), share(h.atMost(0.005)))
	}
	row("mutating handler, allowed (`vmipam_admission_duration_seconds`)", wh.mutating)
	row("validating handler, allowed (`vmipam_admission_duration_seconds`)", wh.validating)
	row("mutating HTTP handler (`controller_runtime_webhook_latency_seconds`, coarse)", wh.serve)
	row("mutating call seen by the API server (`apiserver_admission_webhook_admission_duration_seconds`, coarse)", wh.apiMutating)
	row("validating call seen by the API server (same, coarse)", wh.apiValidating)
	row("allocator, per allocation (`vmipam_allocation_duration_seconds`)", wh.alloc)
	w("")
	lagsOf := func(st *modeStats) string {
		l := make([]string, len(st.caughtUp))
		for i, d := range st.caughtUp {
			l[i] = ms(d)
		}
		return strings.Join(l, ", ")
	}
	w("The allocator wrote %.0f IPBlock objects during the rounds. vmipam's address controller (one reconcile per object, also for the "+
		"objects it ignores) had processed every object, and bound every reservation, this long after the end of each round: "+
		"with vmipam %s; without %s; baseline %s.", wh.storeWrites, lagsOf(with), lagsOf(without), lagsOf(base))
	w("")

	w("## Deletes")
	w("")
	dw, dwo := with.deletion, without.deletion
	w("| | with vmipam | without vmipam | with / without |")
	w("|---|---:|---:|---:|")
	w("| VirtualMachines deleted | %d | %d | |", dw.count, dwo.count)
	w("| every DELETE call returned after | %s | %s | |", dw.calls.Round(time.Millisecond), dwo.calls.Round(time.Millisecond))
	w("| every object gone after | %s | %s | |", dw.gone.Round(time.Millisecond), dwo.gone.Round(time.Millisecond))
	w("| **deletion throughput** (VM/s, until gone) | **%s** | **%s** | **%s** |", rate(dw.rate()), rate(dwo.rate()), ratio(dw.rate(), dwo.rate()))
	sortDur(dw.lat)
	sortDur(dwo.lat)
	w("| client-side DELETE latency p50 / p99 | %s / %s | %s / %s | |", lat(dw.lat, 0.5), lat(dw.lat, 0.99), lat(dwo.lat, 0.5), lat(dwo.lat, 0.99))
	w("| IPBlock writes by vmipam | %.0f | %.0f | |", dw.storeWrites, dwo.storeWrites)
	for _, p := range cpuProcs {
		w("| CPU s per 1000 deletes: %s | %.2f | %.2f | |", p, 1000*dw.cpu.procs[p]/float64(max(dw.count, 1)), 1000*dwo.cpu.procs[p]/float64(max(dwo.count, 1)))
	}
	w("")
	if r.notFree {
		w("**Not every address of the pool was free again %s after the last VirtualMachine with vmipam was gone** "+
			"(cooldown %s + -free-timeout %s); pool gauges then: %s. IPPool status: allocated %d, pending %d, cooldown %d, free %d.",
			(o.cooldown + o.freeTimeout).Round(time.Second), o.cooldown, o.freeTimeout, fmtCounts(r.finalCounts),
			r.poolStatus.Allocated, r.poolStatus.Pending, r.poolStatus.Cooldown, r.poolStatus.Free)
	} else {
		w("Every address of the pool was free again **%s** after the last VirtualMachine with vmipam was gone "+
			"(cooldown %s, so %s beyond it); pool gauges then: %s. IPPool status: allocated %d, pending %d, cooldown %d, free %d.",
			r.freeAfter.Round(time.Millisecond), o.cooldown, (r.freeAfter - o.cooldown).Round(time.Millisecond), fmtCounts(r.finalCounts),
			r.poolStatus.Allocated, r.poolStatus.Pending, r.poolStatus.Cooldown, r.poolStatus.Free)
	}
	w("")
	if len(r.resyncs) > 0 {
		w("vmipam's periodic resyncs that changed the allocator during the run (from its log):")
		w("")
		w("```")
		for _, l := range r.resyncs {
			w("%s", l)
		}
		w("```")
		w("")
	}

	w("## Chart")
	w("")
	w("![create latency distributions](e2e-bench.png)")
	w("")
	w("`e2e-bench.png`: client-side create latency, log scale. Top: the distribution (share of creates at most that latency); " +
		"bottom: its tail, from p90 to p99.9 on a log scale of 1 − p. **Blue**: with vmipam (the webhooks in the path); " +
		"**green**: without vmipam (same API server, plain creates); **red**: the read-modify-write baseline (allocation and create).")
	w("")

	w("## Method")
	w("")
	w("- One local control plane (envtest's kube-apiserver and etcd) and the vmipam binary, all on this machine: every process competes for the same CPUs.")
	w("- With vmipam: namespace `%s`, `spec.ipPool: %s`, no address; the API server calls the mutating and validating webhooks over TLS on loopback, "+
		"the controller binds each reservation afterwards.", nsWith, poolName)
	w("- Without vmipam: namespace `%s`, excluded from both webhook configurations by their namespaceSelector (checked with dry-run creates and "+
		"vmipam's admission counters before measuring), a static address in %s, outside every pool, so vmipam's controller ignores the objects.",
		nsWithout, withoutRange)
	w("- Baseline: namespace `%s` (also excluded): per VirtualMachine, GET the ConfigMap `%s` holding every allocation as JSON, pick the first "+
		"free address of %s, UPDATE it with its resourceVersion, start again on Conflict, then create the VirtualMachine with that address. "+
		"Whereabouts also takes a leader-election lock around this; the baseline does not, which only flatters it.", nsBaseline, baselinePool, baselineRange)
	w("- Each client has %s. Throughput is successful creates over the rounds' wall time; latency is the wall time of each Create call "+
		"(for the baseline, allocation plus create). Between rounds the benchmark waits until vmipam's controller has caught up (work queue empty, no reservation pending), then %s more.",
		map[string]string{"per-worker": "its own HTTP/2 connection", "shared": "one HTTP/2 connection shared by all"}[o.clients], settle)
	w("- CPU time is read from /proc for vmipam, kube-apiserver, etcd and this program; \"other\" is the rest of the machine's busy time " +
		"(work outside the benchmark).")
	w("- vmipam's log: `e2e-bench-vmipam.log`.")
	for m := range numModes {
		if s := &r.modes[m]; s.firstErr != nil {
			w("- First error %s: `%v`", m, s.firstErr)
		}
	}
	return b.String()
}

func fmtCounts(c map[string]float64) string {
	var s []string
	for _, k := range []string{"allocated", "pending", "cooldown", "free", "claimed", "usable"} {
		if v, ok := c[k]; ok {
			s = append(s, fmt.Sprintf("%s %.0f", k, v))
		}
	}
	return strings.Join(s, ", ")
}
