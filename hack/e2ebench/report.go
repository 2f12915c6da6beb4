package main

import (
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Goals the issue sets.
const (
	// goalCreateVsNoop: create throughput with vmipam against the floor
	// of one no-op mutating webhook, measured in the same run.
	goalCreateVsNoop = 0.95
	// goalCPUPerK: vmipam's CPU seconds per 1,000 creates, its webhook,
	// its controller's binds and its watches all counted.
	goalCPUPerK = 0.45
	// goalCPUVsNoop: vmipam's CPU per create against what the no-op
	// webhook's server and finalizer remover cost per create.
	goalCPUVsNoop = 1.0
	// goalDeleteVsNoop: deletion throughput with vmipam against the
	// floor of a delete through the no-op finalizer.
	goalDeleteVsNoop = 0.9
	goalWebhookP99   = 0.002 // seconds
	goalVsBaseline   = 50
)

// modeStats is what the creates of one mode gave, over every round.
type modeStats struct {
	created    []int           // indexes of the VirtualMachines created
	lat        []time.Duration // sorted after the rounds
	errors     int
	firstErr   error
	elapsed    time.Duration
	roundRates []float64
	// cpu: over the rounds alone.
	cpu cpuSample
	// cpuSettled: over each round and the wait after it until vmipam's
	// controller had caught up (settle, its pause included), so that
	// vmipam's binds and watch events that come after a round count.
	cpuSettled cpuSample
	// attempts and conflicts of the baseline's read-modify-writes.
	attempts, conflicts int64
	// requests the API server served during the rounds, by verb and
	// resource.
	requests map[string]float64
	// checks: the API server's watch-cache consistency checks of
	// VirtualMachines during the rounds (see -cache-check).
	checks float64
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
	// requests counts what the API server served meanwhile, by verb and
	// resource (apiserver_request_total).
	requests map[string]float64
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
	// noopReviews: the reviews the no-op mutating webhook answered during
	// the rounds.
	noopReviews int64
	paced       pacedStats
	replicas    replicasPhase
	history     historyPhase
	scale       scalePhase
	// rounds: each round of the creates, in the order they ran.
	rounds []roundStat
	// apiserverSplit: the API server's profiles of the rounds by part,
	// with -profile.
	apiserverSplit apiserverSplit
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

// pairedRatios returns, for each round in which both modes a and b
// created something, a's rate over b's, in round order.
func pairedRatios(rounds []roundStat, a, b mode) []float64 {
	rates := map[int][numModes]float64{}
	var order []int
	for _, s := range rounds {
		if s.created == 0 || s.rate <= 0 {
			continue
		}
		v, seen := rates[s.round]
		if !seen {
			order = append(order, s.round)
		}
		v[s.mode] = s.rate
		rates[s.round] = v
	}
	var out []float64
	for _, r := range order {
		if v := rates[r]; v[a] > 0 && v[b] > 0 {
			out = append(out, v[a]/v[b])
		}
	}
	return out
}

// geomean returns the geometric mean of positive vs; NaN for none.
func geomean(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	sum := 0.0
	for _, v := range vs {
		sum += math.Log(v)
	}
	return math.Exp(sum / float64(len(vs)))
}

// ratioOf formats a ratio already taken.
func ratioOf(r float64) string { return ratio(r, 1) }

// ratios formats each of rs as ratioOf does, comma-separated.
func ratios(rs []float64) string {
	if len(rs) == 0 {
		return "none"
	}
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = ratioOf(r)
	}
	return strings.Join(out, ", ")
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

// createGoal is the goal of create throughput against the no-op floor.
const createGoal = "create throughput with vmipam ≥ %.2f × the floor of one no-op mutating webhook, measured in the same run"

// createGoalRow is the goals table's row of create throughput with vmipam
// (withRate) against the no-op floor (noopRate). With -noop-stamp (stamped)
// the floor writes as much as vmipam's stamp: a higher floor than the
// goal's, which leaves out what the stamp costs the API server, so the row
// says so and does not call the goal met or not.
func createGoalRow(withRate, noopRate float64, stamped bool) string {
	goal := fmt.Sprintf(createGoal, goalCreateVsNoop)
	measured := fmt.Sprintf("%s (%s vs %s VM/s)", ratio(withRate, noopRate), rate(withRate), rate(noopRate))
	cr := withRate / noopRate
	verdict := metOrNA(cr, cr >= goalCreateVsNoop)
	if stamped {
		measured += " against a no-op webhook that writes a stamp as large as vmipam's (-noop-stamp)"
		verdict = "– (not the goal's floor)"
	}
	return "| " + goal + " | " + measured + " | " + verdict + " |"
}

// cpuPerK returns the CPU seconds process p spent in c per 1,000 of the
// creates s counted; NaN without any.
func cpuPerK(s *modeStats, c cpuSample, p string) float64 {
	if len(s.lat) == 0 {
		return math.NaN()
	}
	return 1000 * c.procs[p] / float64(len(s.lat))
}

// cpuSecs formats CPU seconds.
func cpuSecs(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.3f s", v)
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

// table writes the rows of a markdown table, leaving out the columns in
// skip (those of a mode the run did not measure).
type table struct {
	b    *strings.Builder
	skip map[int]bool
}

func (t table) row(cells ...string) {
	for i, c := range cells {
		if t.skip[i] {
			continue
		}
		if c == "" {
			t.b.WriteString("| ")
		} else {
			t.b.WriteString("| " + c + " ")
		}
	}
	t.b.WriteString("|\n")
}

// header writes the header row and the alignment row: the first column
// left-aligned, the others right-aligned.
func (t table) header(cells ...string) {
	t.row(cells...)
	for i := range cells {
		switch {
		case t.skip[i]:
		case i == 0:
			t.b.WriteString("|---")
		default:
			t.b.WriteString("|---:")
		}
	}
	t.b.WriteString("|\n")
}

func bold(s string) string { return "**" + s + "**" }

// mapKeys returns m's keys, sorted, each in backquotes, comma-separated.
func mapKeys(m map[string]string) string {
	var ks []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		ks = append(ks, "`"+k+"`")
	}
	return strings.Join(ks, ", ")
}

// namedHist is a row of a histogram table.
type namedHist struct {
	name string
	h    histogram
}

// writeHistTable writes histograms as a markdown table: observations, p50
// and p99 (interpolated inside the buckets as Prometheus's
// histogram_quantile does), and the exact shares at most 2 and 5 ms.
func writeHistTable(b *strings.Builder, rows []namedHist) {
	b.WriteString("| histogram | requests | p50 | p99 | ≤ 2 ms | ≤ 5 ms |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		h := r.h
		fmt.Fprintf(b, "| %s | %.0f | %s | %s | %s | %s |\n", r.name, h.total(), secs(h.quantile(0.5)), secs(h.quantile(0.99)),
			share(h.atMost(0.002)), share(h.atMost(0.005)))
	}
}

// busyShare formats the machine's busy share of a CPU sample, with the
// time stolen by the hypervisor when there was any.
func busyShare(c cpuSample) string {
	if c.total == 0 {
		return "n/a"
	}
	b := share(c.busy / c.total)
	if c.steal > 0 {
		b += fmt.Sprintf(" (+%s stolen)", share(c.steal/c.total))
	}
	return b
}

// pacedBusyWarn is the machine's busy share above which the steady-rate
// phase's load is called out as close to saturation.
const pacedBusyWarn = 0.9

// held reports whether the steady-rate phase kept to its schedule: its
// achieved rate within 5% of the target.
func (p *pacedStats) held() bool { return p.rate() >= 0.95*p.target }

func (r *report) markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	o := r.opts
	with, without, noop, base := &r.modes[modeWith], &r.modes[modeWithout], &r.modes[modeNoop], &r.modes[modeBaseline]
	wh := r.webhook
	skipNoop := r.skipNoop

	w("# vmipam end-to-end benchmark")
	w("")
	w("%s, %d CPUs, %s; load average (1, 5, 15 min) %s at the start, %s at the end; %s in all.",
		r.started.UTC().Format(time.RFC3339), r.cpus, r.goVersion, r.loadStart, r.loadEnd, r.finished.Sub(r.started).Round(time.Second))
	w("")
	if o.noop {
		w("%d VirtualMachines with vmipam, %d without, %d through one no-op mutating webhook and %d through the read-modify-write baseline, "+
			"from %d concurrent clients (%s connections), in %d alternating rounds (with, without, no-op, baseline, then reversed, and so on) after a warm-up of %d per mode%s. "+
			"Pool %s (%d usable addresses), cooldown %s. The figures depend on the machine; the ratios are what to compare.",
			o.n, o.n, o.n, o.baselineN, o.c, o.clients, o.rounds, o.warmup, warmAgain(o), o.poolCIDR, r.usable(), o.cooldown)
	} else {
		w("%d VirtualMachines with vmipam and %d without, %d through the read-modify-write baseline, from %d concurrent clients (%s connections), "+
			"in %d alternating rounds (with, without, baseline, then reversed, and so on) after a warm-up of %d per mode%s. Pool %s (%d usable addresses), cooldown %s. "+
			"The figures depend on the machine; the ratios are what to compare.",
			o.n, o.n, o.baselineN, o.c, o.clients, o.rounds, o.warmup, warmAgain(o), o.poolCIDR, r.usable(), o.cooldown)
	}
	if ps := &r.paced; ps.ran {
		w("")
		w("Then %d more with vmipam at a steady %s VM/s (%s) from the same clients, to measure the webhooks' latency at a fixed load "+
			"rather than a saturating one.", ps.n, rate(ps.target), pacedWhy(ps))
	}
	if o.vmipamArgs != "" {
		w("")
		w("vmipam ran with the extra flags `%s`.", o.vmipamArgs)
	}
	if o.vmipamEnv != "" {
		w("")
		w("vmipam ran with the extra environment `%s`.", o.vmipamEnv)
	}
	w("")

	w("## Goals")
	w("")
	w("| goal | measured | met |")
	w("|---|---:|:---:|")
	if o.noop {
		w("%s", createGoalRow(with.rate(), noop.rate(), o.noopStamp))
	} else {
		w("| "+createGoal+" | not measured (-noop=false) | – |", goalCreateVsNoop)
	}
	if o.noop && o.rounds > 1 {
		pr := pairedRatios(r.rounds, modeWith, modeNoop)
		w("| ↳ *context, not a goal:* with / no-op within each round (each round's two rates, a few seconds apart, so that a change in the "+
			"machine's speed between rounds cancels out): geometric mean, and each round's | %s (%s) | – |", ratioOf(geomean(pr)), ratios(pr))
	}
	if o.noop {
		w("| ↳ *context, not a goal:* the floor one no-op mutating webhook sets (no-op / without), and vmipam against plain creates "+
			"(with / without) | floor %s (%s vs %s VM/s); with / without %s (%s vs %s VM/s) | – |",
			ratio(noop.rate(), without.rate()), rate(noop.rate()), rate(without.rate()),
			ratio(with.rate(), without.rate()), rate(with.rate()), rate(without.rate()))
	} else {
		w("| ↳ *context, not a goal:* vmipam against plain creates (with / without) | %s (%s vs %s VM/s) | – |",
			ratio(with.rate(), without.rate()), rate(with.rate()), rate(without.rate()))
	}
	cpuK, cpuRounds := cpuPerK(with, with.cpuSettled, "vmipam"), cpuPerK(with, with.cpu, "vmipam")
	w("| vmipam CPU per 1,000 creates ≤ %.2f s, its webhook, its controller's binds and its watches all counted (vmipam's CPU from the start "+
		"of each round with vmipam until its controller had caught up) | %s (%s during the rounds alone) | %s |", goalCPUPerK,
		cpuSecs(cpuK), cpuSecs(cpuRounds), metOrNA(cpuK, cpuK <= goalCPUPerK))
	if o.noop {
		// The no-op server and finalizer remover run in this program: its
		// CPU in the no-op rounds, less its CPU in the rounds without
		// vmipam (the clients alone), is theirs; or in a process of their
		// own, whose CPU in the no-op rounds is.
		floorK := cpuPerK(noop, noop.cpuSettled, "e2ebench") - cpuPerK(without, without.cpuSettled, "e2ebench")
		how := "e2ebench's CPU in the no-op rounds less its CPU in the rounds without vmipam, each until the controllers had caught up"
		if o.noopProcess {
			floorK = cpuPerK(noop, noop.cpuSettled, noopProcessComm)
			how = "their process's CPU in the no-op rounds, until the controllers had caught up (-noop-process)"
		}
		w("| vmipam CPU per 1,000 creates ≤ %.1f × the no-op mutating webhook's server and finalizer remover's (%s) | %s (%s vs %s) | %s |",
			goalCPUVsNoop, how, ratio(cpuK, floorK), cpuSecs(cpuK), cpuSecs(floorK), metOrNA(cpuK/floorK, floorK > 0 && cpuK <= goalCPUVsNoop*floorK))
	}
	const deleteGoal = "deletion throughput with vmipam ≥ %.1f × the floor of a delete through a finalizer (the no-op mutating webhook's " +
		"objects, whose no-op finalizer a controller in e2ebench removes)"
	switch {
	case o.fleet > 0:
		w("| "+deleteGoal+" | not measured (the scale mode deletes nothing) | – |", goalDeleteVsNoop)
	case o.noop:
		dr := with.deletion.rate() / noop.deletion.rate()
		w("| "+deleteGoal+" | %s (%s vs %s VM/s) | %s |", goalDeleteVsNoop, ratio(with.deletion.rate(), noop.deletion.rate()),
			rate(with.deletion.rate()), rate(noop.deletion.rate()), metOrNA(dr, dr >= goalDeleteVsNoop))
	default:
		w("| "+deleteGoal+" | not measured (-noop=false) | – |", goalDeleteVsNoop)
	}
	le2 := wh.mutating.atMost(goalWebhookP99)
	w("| webhook server-side p99 ≤ %s, saturated (%d clients creating as fast as they can, %s CPU busy): the primary figure | "+
		"%s (%s of requests ≤ 2 ms) | %s |", secs(goalWebhookP99), o.c, busyShare(with.cpu), secs(wh.mutating.quantile(0.99)), share(le2),
		met(le2 >= 0.99))
	switch ps := &r.paced; {
	case !o.paced():
		w("| ↳ webhook server-side p99 ≤ %s at a steady rate | not measured (-paced-rate < 0) | – |", secs(goalWebhookP99))
	case !ps.ran:
		w("| ↳ webhook server-side p99 ≤ %s at a steady rate | not measured: %s | – |", secs(goalWebhookP99), ps.skipped)
	default:
		le2p := ps.webhook.mutating.atMost(goalWebhookP99)
		note := ""
		if !ps.held() {
			note = fmt.Sprintf("; the schedule was not held: %s of %s VM/s", rate(ps.rate()), rate(ps.target))
		}
		w("| ↳ webhook server-side p99 ≤ %s at a steady %s VM/s (%s CPU busy) | %s (%s of requests ≤ 2 ms%s) | %s |", secs(goalWebhookP99),
			rate(ps.rate()), busyShare(ps.cpu), secs(ps.webhook.mutating.quantile(0.99)), share(le2p), note, metOrNA(le2p, le2p >= 0.99))
	}
	vb := with.rate() / base.rate()
	w("| create throughput ≥ %d × the read-modify-write baseline | %s (%s vs %s VM/s) | %s |", goalVsBaseline, ratio(with.rate(), base.rate()),
		rate(with.rate()), rate(base.rate()), metOrNA(vb, vb >= goalVsBaseline))
	w("")

	w("## Creates")
	w("")
	// Columns: label, with, without, no-op, baseline, with / without,
	// no-op / without, with / no-op, vmipam / baseline.
	ct := table{b: &b, skip: skipNoop(3, 6, 7)}
	ct.header("", "with vmipam", "without vmipam", "no-op mutating webhook", "baseline (read-modify-write)", "with / without", "no-op / without",
		"with / no-op", "vmipam / baseline")
	created := func(s *modeStats) string { return fmt.Sprintf("%d (%d)", len(s.lat), s.errors) }
	ct.row("VirtualMachines created (failed)", created(with), created(without), created(noop), created(base), "", "", "", "")
	ct.row("**throughput** (VM/s)", bold(rate(with.rate())), bold(rate(without.rate())), bold(rate(noop.rate())), bold(rate(base.rate())),
		bold(ratio(with.rate(), without.rate())), bold(ratio(noop.rate(), without.rate())), bold(ratio(with.rate(), noop.rate())),
		bold(ratio(with.rate(), base.rate())))
	ct.row("throughput per round (VM/s)", rates(with.roundRates), rates(without.roundRates), rates(noop.roundRates), rates(base.roundRates),
		"", "", "", "")
	for _, q := range []struct {
		name string
		q    float64
	}{{"p50", 0.5}, {"p90", 0.9}, {"p99", 0.99}, {"max", 1}} {
		a, bb, n, c := pct(with.lat, q.q), pct(without.lat, q.q), pct(noop.lat, q.q), pct(base.lat, q.q)
		ct.row("client-side create latency "+q.name, lat(with.lat, q.q), lat(without.lat, q.q), lat(noop.lat, q.q), lat(base.lat, q.q),
			ratio(a.Seconds(), bb.Seconds()), ratio(n.Seconds(), bb.Seconds()), ratio(a.Seconds(), n.Seconds()), ratio(a.Seconds(), c.Seconds()))
	}
	if base.attempts > 0 {
		ct.row("baseline: pool-object writes that lost on conflict", "", "", "",
			fmt.Sprintf("%d of %d (%.1f per allocation)", base.conflicts, base.attempts, float64(base.conflicts)/float64(max(len(base.lat), 1))),
			"", "", "", "")
	}
	ct.row("webhook server-side p50 / p99", secs(wh.mutating.quantile(0.5))+" / "+secs(wh.mutating.quantile(0.99)), "(not called)",
		"(not measured)", "(not called)", "", "", "", "")
	perK := func(s *modeStats, v float64) string {
		if len(s.lat) == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", 1000*v/float64(len(s.lat)))
	}
	perCreate := func(s *modeStats, p string) float64 { return s.cpu.procs[p] / float64(len(s.lat)) }
	for _, p := range r.opts.cpuProcs() {
		label := "CPU s per 1000 creates: " + p
		switch {
		case p == "e2ebench" && o.noop && !o.noopProcess && o.fleet > 0:
			label += " (with the no-op webhook server and finalizer remover, and the stand-in for vmipam's Service)"
		case p == "e2ebench" && o.noop && !o.noopProcess:
			label += " (with the no-op webhook server and finalizer remover)"
		case p == "e2ebench" && o.fleet > 0:
			label += " (with the stand-in for vmipam's Service)"
		case p == noopProcessComm:
			label += " (the no-op webhook server and finalizer remover, in a process of their own)"
		case p == noopProxyComm:
			label += " (the stand-in for the no-op webhook's Service)"
		}
		ct.row(label, perK(with, with.cpu.procs[p]), perK(without, without.cpu.procs[p]), perK(noop, noop.cpu.procs[p]),
			perK(base, base.cpu.procs[p]), ratio(perCreate(with, p), perCreate(without, p)), ratio(perCreate(noop, p), perCreate(without, p)),
			ratio(perCreate(with, p), perCreate(noop, p)), "")
	}
	settled := func(s *modeStats) string { return perK(s, s.cpuSettled.procs["vmipam"]) }
	ct.row("CPU s per 1000 creates: vmipam, each round and until its controller had caught up (webhook, binds, watch events; the goal's figure)",
		bold(settled(with)), settled(without), settled(noop), settled(base), "", "", "", "")
	ct.row("CPU s per 1000 creates: kernel softirq (loopback networking, ...)", perK(with, with.cpu.softirq), perK(without, without.cpu.softirq),
		perK(noop, noop.cpu.softirq), perK(base, base.cpu.softirq), "", "", "", "")
	ct.row("CPU s per 1000 creates: other processes", perK(with, with.cpu.other()), perK(without, without.cpu.other()),
		perK(noop, noop.cpu.other()), perK(base, base.cpu.other()), "", "", "", "")
	machine := func(s *modeStats) float64 { return s.cpu.busy / float64(max(len(s.lat), 1)) }
	ct.row("CPU s per 1000 creates: the whole machine (its busy time, all processes and the kernel)", perK(with, with.cpu.busy),
		perK(without, without.cpu.busy), perK(noop, noop.cpu.busy), perK(base, base.cpu.busy), ratio(machine(with), machine(without)),
		ratio(machine(noop), machine(without)), ratio(machine(with), machine(noop)), "")
	busy := func(s *modeStats) string { return busyShare(s.cpu) }
	ct.row("machine CPU busy during the rounds (all cores)", busy(with), busy(without), busy(noop), busy(base), "", "", "", "")
	w("")
	if o.noop && len(with.lat) > 0 && len(noop.lat) > 0 {
		r.floorGap(&b, with, noop)
		r.apiserverPartsSection(&b)
	}

	w("API server requests per create during the rounds (`apiserver_request_total`; everything the API server served, vmipam's requests included):")
	w("")
	rt := table{b: &b, skip: skipNoop(3)}
	rt.header("request", "with vmipam", "without vmipam", "no-op mutating webhook", "baseline")
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
		rt.row(k, per(with), per(without), per(noop), per(base))
	}
	w("")
	// What the check is, then whether it ran.
	check := "The API server's watch-cache consistency check (`DetectCacheInconsistency`) lists every VirtualMachine from etcd every 5 to " +
		"7.5 minutes and compares the list with its cache, whatever webhook is in the path: at a large fleet, seconds of the API server's " +
		"CPU in whichever round it lands. "
	if o.cacheCheck {
		w(check+"It was on, as in a cluster (-cache-check=false turns it off). Its checks during the rounds: %.0f with vmipam, %.0f without, "+
			"%.0f through the no-op webhook, %.0f through the baseline.", with.checks, without.checks, noop.checks, base.checks)
	} else {
		w(check+"It was off (`--feature-gates=DetectCacheInconsistency=false`, -cache-check=false), since it only adds noise to the "+
			"comparison of the modes. Checks during the rounds: %.0f.", with.checks+without.checks+noop.checks+base.checks)
	}
	w("")
	r.roundsSection(&b)

	w("## vmipam's webhooks (server side, during the rounds with vmipam)")
	w("")
	w("Quantiles interpolate inside histogram buckets as Prometheus's `histogram_quantile` does; the ≤ columns are exact bucket counts.")
	w("")
	rows := vmipamHists(wh)
	if o.noop {
		// Before the allocator's row, as it always was.
		rows = slices.Insert(rows, len(rows)-1,
			namedHist{"for comparison, during the no-op rounds: no-op mutating call seen by the API server (same, coarse)", wh.noopMutating})
	}
	writeHistTable(&b, rows)
	w("")
	if o.noop {
		w("The no-op mutating webhook answered %d reviews during the rounds, for %d creates through it (one call per create: no "+
			"validating webhook, and it is never reinvoked).", r.noopReviews, len(noop.lat)+noop.errors)
		w("")
	}
	lagsOf := func(st *modeStats) string {
		if len(st.caughtUp) == 0 {
			return "(no rounds)"
		}
		l := make([]string, len(st.caughtUp))
		for i, d := range st.caughtUp {
			l[i] = ms(d)
		}
		return strings.Join(l, ", ")
	}
	noopLags := ""
	if o.noop {
		noopLags = "; no-op mutating webhook " + lagsOf(noop)
	}
	w("The allocator wrote %.0f IPBlock objects during the rounds; %.0f of its %.0f allocations found no armed address and waited for the store "+
		"(`vmipam_allocation_store_waits_total`). vmipam's address controller (which sees every object's watch event, also of the "+
		"objects it ignores) had processed every object, and bound every reservation, this long after the end of each round: "+
		"with vmipam %s; without %s%s; baseline %s.", wh.storeWrites, wh.storeWaits, wh.allocations, lagsOf(with), lagsOf(without), noopLags, lagsOf(base))
	w("")

	r.pacedSection(&b)
	r.scaleSection(&b)
	r.replicasSection(&b)
	r.historySection(&b)
	r.deletesSection(&b)

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

	r.chartAndMethod(&b)
	return b.String()
}

// skipNoop leaves the columns of the no-op mutating webhook, at the
// given indexes, out of a table when it was not measured.
func (r *report) skipNoop(i ...int) map[int]bool {
	if r.opts.noop {
		return nil
	}
	s := map[int]bool{}
	for _, v := range i {
		s[v] = true
	}
	return s
}

// deletesSection writes the deletes' table and the pool's return to free.
func (r *report) deletesSection(b *strings.Builder) {
	o := r.opts
	if o.fleet > 0 {
		return // the scale mode deletes nothing
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	with, without, noop := &r.modes[modeWith], &r.modes[modeWithout], &r.modes[modeNoop]
	w("## Deletes")
	w("")
	dw, dwo, dn := with.deletion, without.deletion, noop.deletion
	// Columns: label, with, without, no-op, with / without.
	dt := table{b: b, skip: r.skipNoop(3, 5)}
	dt.header("", "with vmipam", "without vmipam", "no-op mutating webhook and finalizer", "with / without", "with / no-op")
	dt.row("VirtualMachines deleted", strconv.Itoa(dw.count), strconv.Itoa(dwo.count), strconv.Itoa(dn.count), "", "")
	dt.row("every DELETE call returned after", dw.calls.Round(time.Millisecond).String(), dwo.calls.Round(time.Millisecond).String(),
		dn.calls.Round(time.Millisecond).String(), "", "")
	dt.row("every object gone after", dw.gone.Round(time.Millisecond).String(), dwo.gone.Round(time.Millisecond).String(),
		dn.gone.Round(time.Millisecond).String(), "", "")
	dt.row("**deletion throughput** (VM/s, until gone)", bold(rate(dw.rate())), bold(rate(dwo.rate())), bold(rate(dn.rate())),
		bold(ratio(dw.rate(), dwo.rate())), bold(ratio(dw.rate(), dn.rate())))
	sortDur(dw.lat)
	sortDur(dwo.lat)
	sortDur(dn.lat)
	p50p99 := func(l []time.Duration) string { return lat(l, 0.5) + " / " + lat(l, 0.99) }
	dt.row("client-side DELETE latency p50 / p99", p50p99(dw.lat), p50p99(dwo.lat), p50p99(dn.lat), "", "")
	dt.row("IPBlock writes by vmipam", fmt.Sprintf("%.0f", dw.storeWrites), fmt.Sprintf("%.0f", dwo.storeWrites), fmt.Sprintf("%.0f", dn.storeWrites), "", "")
	perDel := func(d deletion, p string) string {
		return fmt.Sprintf("%.2f", 1000*d.cpu.procs[p]/float64(max(d.count, 1)))
	}
	for _, p := range r.opts.cpuProcs() {
		dt.row("CPU s per 1000 deletes: "+p, perDel(dw, p), perDel(dwo, p), perDel(dn, p), "", "")
	}
	delKeys := map[string]bool{}
	for _, d := range []deletion{dw, dwo, dn} {
		for k, v := range d.requests {
			if v/float64(max(d.count, 1)) >= 0.005 {
				delKeys[k] = true
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(delKeys)) {
		per := func(d deletion) string { return fmt.Sprintf("%.2f", d.requests[k]/float64(max(d.count, 1))) }
		dt.row("API server requests per delete: "+k, per(dw), per(dwo), per(dn), "", "")
	}
	w("")
	if r.notFree {
		w("**Not every address of the pool was free again %s after the last VirtualMachine with vmipam was gone** "+
			"(cooldown %s + -free-timeout %s); pool gauges then: %s. IPPool status: allocated %d, pending %d, cooldown %d, free %d.",
			(o.cooldown + o.freeTimeout).Round(time.Second), o.cooldown, o.freeTimeout, fmtCounts(r.finalCounts),
			r.poolStatus.Allocated, r.poolStatus.Pending, r.poolStatus.Cooldown, r.poolStatus.Free)
	} else {
		// Releases happen before the object goes (the finalizer waits for
		// them), so the pool can be free sooner than a cooldown after.
		cooldown := fmt.Sprintf("cooldown %s, so %s beyond it", o.cooldown, (r.freeAfter - o.cooldown).Round(time.Millisecond))
		if r.freeAfter < o.cooldown {
			cooldown = fmt.Sprintf("cooldown %s; the last release came before the object was gone", o.cooldown)
		}
		w("Every address of the pool was free again **%s** after the last VirtualMachine with vmipam was gone "+
			"(%s); pool gauges then: %s. IPPool status: allocated %d, pending %d, cooldown %d, free %d.",
			r.freeAfter.Round(time.Millisecond), cooldown, fmtCounts(r.finalCounts),
			r.poolStatus.Allocated, r.poolStatus.Pending, r.poolStatus.Cooldown, r.poolStatus.Free)
	}
	w("")
}

// chartAndMethod writes the chart's and the method's sections.
func (r *report) chartAndMethod(b *strings.Builder) {
	o := r.opts
	w := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	w("## Chart")
	w("")
	w("![create latency distributions](e2e-bench.png)")
	w("")
	noopColour := ""
	if o.noop {
		noopColour = "**orange**: through the no-op mutating webhook (plain creates, one webhook that only allows); "
	}
	w("`e2e-bench.png`: client-side create latency, log scale. Top: the distribution (share of creates at most that latency); "+
		"bottom: its tail, from p90 to p99.9 on a log scale of 1 − p. **Blue**: with vmipam (its mutating webhook in the path); "+
		"**green**: without vmipam (same API server, plain creates); %s**red**: the read-modify-write baseline (allocation and create).", noopColour)
	w("")

	w("## Method")
	w("")
	w("- One local control plane (envtest's kube-apiserver and etcd) and the vmipam binary, all on this machine: every process competes for the same CPUs.")
	w("- With vmipam: namespace `%s`, `spec.ipPool: %s`, no address; the API server calls vmipam's mutating webhook over TLS on loopback "+
		"(vmipam's one webhook call per create: it validates VirtualMachines inside the API server, with the CRD's validation rules and a "+
		"ValidatingAdmissionPolicy, which the API server evaluates for the other modes' creates too where they match), "+
		"the controller binds each reservation afterwards.", nsWith, poolName)
	w("- Without vmipam: namespace `%s`, excluded from vmipam's webhook configurations by their namespaceSelector (checked with dry-run creates and "+
		"vmipam's admission counters before measuring), a static address in %s, outside every pool, so vmipam's controller ignores the objects.",
		nsWithout, withoutRange)
	if o.noop {
		w("- No-op mutating webhook: namespace `%s`, excluded from vmipam's webhooks like `%s`, a static address in %s (also outside every pool). "+
			"The benchmark creates one MutatingWebhookConfiguration `%s`, and no ValidatingWebhookConfiguration, for CREATE of virtualmachines "+
			"in that namespace only (namespaceSelector on `%s`), configured like vmipam's (url clientConfig, failurePolicy Fail, timeoutSeconds 5, "+
			"admissionReviewVersions v1, reinvocationPolicy Never; sideEffects None). It calls an HTTPS server that this "+
			"program runs on 127.0.0.1 with its own CA (ECDSA P-256, as vmipam's) and HTTP/1.1 only, as vmipam serves. The handler decodes "+
			"the AdmissionReview and allows with a fixed JSONPatch adding the annotation `%s` and the finalizer `%s` (the API server applies it, "+
			"as vmipam's patch). A dry-run create is checked to carry the annotation before measuring. "+
			"This is the floor one mutating webhook call per create costs the API server (encoding the review, TLS, applying a patch), "+
			"as vmipam's one call per create does: with / no-op is vmipam's own share. The webhook matches creates only; on a delete, a "+
			"controller in this program (a watch of the namespace, a queue, %d workers, an optimistically locked patch, as vmipam's controller "+
			"removes its finalizer) takes the finalizer away: the floor of a delete through a finalizer.",
			nsNoop, nsWithout, noopRange, noopConfig, namespaceNameLabel, noopAnnotation, noopFinalizer, finalizerWorkers)
		if o.noopStamp {
			w("  With -noop-stamp, the patch also adds the annotations %s and the label %s: as many, and about as long, as vmipam's stamp "+
				"writes (its token and address annotations and its holder label; the no-op's own annotation stands in for vmipam's pool annotation), so that the stored objects are as large as vmipam's "+
				"and with / no-op leaves out what the stamp's size costs the API server and etcd. The no-op objects still do not go through "+
				"vmipam's admission policy of creates.", mapKeys(noopStamp.annotations), mapKeys(noopStamp.labels))
		}
		if o.noopBehindService() {
			w("  In this mode the API server reaches the no-op server through a stand-in for its Service, as it reaches vmipam's replicas " +
				"(-noop-service): hack/lbproxy, the same user-space proxy as theirs (test/lbproxy), run as a process of its own with the no-op " +
				"server as its one backend, probed like them. Both modes pay the same hop, which kube-proxy does in the kernel in a cluster; " +
				"the proxy's CPU is its own row (lbproxy), not part of the no-op server and finalizer remover's figure.")
		}
	}
	w("- Baseline: namespace `%s` (also excluded): per VirtualMachine, GET the ConfigMap `%s` holding every allocation as JSON, pick the first "+
		"free address of %s, UPDATE it with its resourceVersion, start again on Conflict, then create the VirtualMachine with that address. "+
		"Whereabouts also takes a leader-election lock around this; the baseline does not, which only flatters it.", nsBaseline, baselinePool, baselineRange)
	w("- Each client has %s. Throughput is successful creates over the rounds' wall time; latency is the wall time of each Create call "+
		"(for the baseline, allocation plus create). Between rounds the benchmark waits until vmipam's controller has caught up (work queue empty, no reservation pending), then %s more.",
		map[string]string{"per-worker": "its own HTTP/2 connection", "shared": "one HTTP/2 connection shared by all"}[o.clients], settle)
	w("- These rounds are closed-loop: each client starts its next create when the last returns, so together they create as fast as the machine " +
		"allows and keep it saturated. Throughput is a saturated figure by nature; latency measured there includes waiting for a CPU.")
	if o.paced() {
		w("- Steady rate: after the saturated rounds, %d VirtualMachines with vmipam (namespace `%s`, `spec.ipPool: %s`, labelled `%s=%s`) "+
			"at a fixed rate (-paced-rate; by default half the throughput with vmipam just measured), open-loop from the same %d clients: "+
			"create i is due at t0 + i/rate, each client takes the next create, sleeps until it is due and runs it; one already due (the client "+
			"fell behind) starts at once and its lateness is recorded, none is skipped, so a slow create delays only its client, not the schedule. "+
			"The achieved rate is successful creates over the time from t0 to the end of the last; vmipam's and the API server's metrics are read just before and "+
			"after, the CPU over the same span. vmipam's controller binds the reservations during the phase, as it does during the rounds. "+
			"Then the benchmark waits for the controller, deletes the phase's VirtualMachines and waits until their addresses are free again "+
			"(none allocated beyond the rounds', none pending or cooling down), so that the deletes below compare the same numbers with and "+
			"without vmipam and none of the phase's releases lands in them; the final check that every address of the pool is free covers the phase's addresses too.",
			o.pacedN, nsWith, poolName, phaseLabel, phasePaced, o.c)
	}
	w("- CPU time is read from /proc for vmipam, kube-apiserver, etcd and this program (and lbproxy, the no-op webhook's stand-in Service, " +
		"with -noop-service in the scale mode, and " + noopProcessComm + ", the no-op webhook's process, with -noop-process); \"other\" is the rest of the machine's busy time (work outside the benchmark). The per-process rows cover the rounds alone. The goal's vmipam figure also covers the wait after " +
		"each round until vmipam's controller had caught up and the pause after it, so that binds and watch events that come after the " +
		"last create count; it includes vmipam's own idle work and the metric reads of that wait (and, with -profile, the rest of the " +
		"profile's span), so it errs high.")
	switch {
	case o.noop && o.noopProcess:
		w("- The no-op mutating webhook's server and the no-op finalizer remover run in a process of their own (-noop-process: this program " +
			"started under the name " + noopProcessComm + ", as a webhook in a Pod of its own runs, paying its own runtime's scheduler and collector): " +
			"their CPU is its row, and the no-op figure of the goals is its CPU in the no-op rounds until the controllers had caught up. " +
			"Its log: `e2e-bench-" + noopProcessComm + ".log`.")
	case o.noop:
		w("- The no-op mutating webhook's server and the no-op finalizer remover run inside this program: their CPU is in the e2ebench row (in the no-op " +
			"rounds only; they are idle otherwise), not in the vmipam row.")
	}
	w("- vmipam's log: `e2e-bench-vmipam.log`.")
	for m := range numModes {
		if s := &r.modes[m]; s.firstErr != nil {
			w("- First error %s: `%v`", m, s.firstErr)
		}
	}
	if r.paced.firstErr != nil {
		w("- First error at the steady rate: `%v`", r.paced.firstErr)
	}
}

// vmipamHists lists the histograms of vmipam's webhooks, as vmipam and the
// API server see them, and of its allocator. The validating webhook's
// rows are left out when it was not called: vmipam validates
// VirtualMachines inside the API server, so its configurations need not
// hold a validating webhook for them.
func vmipamHists(wh webhookResult) []namedHist {
	validated := wh.validating.total() > 0 || wh.apiValidating.total() > 0
	rows := []namedHist{{"mutating handler, allowed (`vmipam_admission_duration_seconds`)", wh.mutating}}
	if validated {
		rows = append(rows, namedHist{"validating handler, allowed (`vmipam_admission_duration_seconds`)", wh.validating})
	}
	rows = append(rows,
		namedHist{"mutating HTTP handler, review read and answer written (`vmipam_webhook_http_duration_seconds`)", wh.serve},
		namedHist{"mutating call seen by the API server (`apiserver_admission_webhook_admission_duration_seconds`, coarse)", wh.apiMutating})
	if validated {
		rows = append(rows, namedHist{"validating call seen by the API server (same, coarse)", wh.apiValidating})
	}
	return append(rows, namedHist{"allocator, per allocation (`vmipam_allocation_duration_seconds`)", wh.alloc})
}

// pacedWhy says where the steady-rate phase's target rate came from.
func pacedWhy(ps *pacedStats) string {
	if ps.auto {
		return "half the saturated throughput with vmipam"
	}
	return "set by -paced-rate"
}

// pacedSection writes the section on the steady-rate phase.
func (r *report) pacedSection(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	o, ps, with := r.opts, &r.paced, &r.modes[modeWith]
	if !o.paced() {
		return
	}
	w("## Webhook latency at a steady rate")
	w("")
	if !ps.ran {
		w("Not measured: %s.", ps.skipped)
		w("")
		return
	}
	w("The rounds above are saturated: %d clients create as fast as they can and keep the machine's %d CPUs %s busy, so a handler that needs "+
		"a fraction of a millisecond of CPU now and then waits for the scheduler or a garbage collection, and the webhook's p99 there varies "+
		"from run to run. A latency objective is normally judged at a load the system sustains: after the saturated rounds, %d more "+
		"VirtualMachines were created with vmipam (namespace `%s`, pool `%s`, as above) at a fixed %s VM/s (%s), from the same %d clients "+
		"on an open-loop schedule: create i was due at t0 + i/rate, and a client that fell behind started late, recording by how much, "+
		"and skipped nothing.", o.c, r.cpus, busyShare(with.cpu), ps.n, nsWith, poolName, rate(ps.target), pacedWhy(ps), o.c)
	w("")
	if !ps.held() {
		w("**The schedule was not held**: %s VM/s achieved of %s scheduled; the clients fell behind, so this load was not steady.",
			rate(ps.rate()), rate(ps.target))
		w("")
	}
	t := table{b: b}
	t.header("", "saturated rounds with vmipam", "steady rate")
	t.row("VirtualMachines created (failed)", fmt.Sprintf("%d (%d)", len(with.lat), with.errors), fmt.Sprintf("%d (%d)", ps.created, ps.errors))
	t.row("**rate** (VM/s)", bold(rate(with.rate()))+" (as fast as they can)", bold(rate(ps.rate()))+fmt.Sprintf(" achieved (%s scheduled)", rate(ps.target)))
	t.row("**machine CPU busy** (all cores)", bold(busyShare(with.cpu)), bold(busyShare(ps.cpu)))
	mut := func(h histogram) string {
		return fmt.Sprintf("%s / %s (%s ≤ 2 ms)", secs(h.quantile(0.5)), secs(h.quantile(0.99)), share(h.atMost(0.002)))
	}
	t.row("**webhook server-side p50 / p99** (mutating handler, allowed)", mut(r.webhook.mutating), bold(mut(ps.webhook.mutating)))
	t.row("client-side create latency p50 / p99", lat(with.lat, 0.5)+" / "+lat(with.lat, 0.99), lat(ps.lat, 0.5)+" / "+lat(ps.lat, 0.99))
	t.row("create started after its due time p50 / p99 / max", "–", lat(ps.late, 0.5)+" / "+lat(ps.late, 0.99)+" / "+lat(ps.late, 1))
	for _, p := range r.opts.cpuProcs() {
		per := func(c cpuSample, n int) string {
			if n == 0 {
				return "n/a"
			}
			return fmt.Sprintf("%.2f", 1000*c.procs[p]/float64(n))
		}
		t.row("CPU s per 1000 creates: "+p, per(with.cpu, len(with.lat)), per(ps.cpu, ps.created))
	}
	perK := func(v float64, n int) string {
		if n == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.2f", 1000*v/float64(n))
	}
	t.row("CPU s per 1000 creates: kernel softirq", perK(with.cpu.softirq, len(with.lat)), perK(ps.cpu.softirq, ps.created))
	t.row("CPU s per 1000 creates: other processes", perK(with.cpu.other(), len(with.lat)), perK(ps.cpu.other(), ps.created))
	w("")
	if c := ps.cpu; c.total > 0 && c.busy/c.total >= pacedBusyWarn {
		w("**At this rate the machine was still %s busy** (%s in processes outside the benchmark): the load hardly left the CPUs idle, "+
			"so this is not the unsaturated figure it is meant to be; a lower -paced-rate would give one.", busyShare(c), share(c.other()/c.total))
		w("")
	}
	w("vmipam's webhooks during the phase (its and the API server's histograms read just before and after it; the same interpolation as above):")
	w("")
	writeHistTable(b, vmipamHists(ps.webhook))
	w("")
	free := fmt.Sprintf("their addresses were free again %s after they were gone (cooldown %s)", ps.freeAfter.Round(time.Millisecond), o.cooldown)
	if ps.notFree {
		free = fmt.Sprintf("**their addresses were not all free again %s after they were gone** (cooldown %s + -free-timeout %s)",
			(o.cooldown + o.freeTimeout).Round(time.Second), o.cooldown, o.freeTimeout)
	}
	w("vmipam's controller had bound every reservation %s after the phase. Its %d VirtualMachines were then deleted (all gone after %s) and %s, "+
		"before the deletes below.", ms(ps.caughtUp), ps.deletion.count, ps.deletion.gone.Round(time.Millisecond), free)
	w("")
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

// warmAgain says, in the scale mode, that the warm-up ran again after the
// rolling restart, right before the rounds.
func warmAgain(o options) string {
	if o.fleet > 0 && o.warmup > 0 {
		return " (in the scale mode before the fleet's creation, and again after the rolling restart, whose new replicas the rounds meet, its VMs left in place)"
	}
	return ""
}
