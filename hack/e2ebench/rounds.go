package main

import (
	"fmt"
	"strings"
)

// roundStat is what one round cost, and what else ran in it that could
// slow it down: the API server's garbage collections, vmipam's periodic
// resyncs and the watch-cache consistency checks. Which rounds ran slow,
// and what they shared, is what tells noise from cost.
type roundStat struct {
	mode    mode
	round   int
	created int
	rate    float64
	cpu     cpuSample
	// roundCounters are what changed in the round.
	roundCounters
	// forcedGC is the API server's CPU in the collection -apiserver-gc ran
	// before the round (NaN without).
	forcedGC float64
	// vmipamUnknown: vmipam's metrics could not be read around the round.
	vmipamUnknown bool
}

// roundCounters are what a roundStat counts from the metrics: apiGC is the
// API server's garbage collector's CPU (the Go runtime's estimate,
// go_cpu_classes_gc_total_cpu_seconds_total) and apiGCs its completed
// cycles; vmipamGC the same estimate summed over vmipam's processes;
// resyncs vmipam's resyncs, summed over its processes, and resyncSecs how
// long they took (vmipam_resync_duration_seconds); checks the watch-cache
// consistency checks; requests the requests the API server served
// (apiserver_request_total: the creates, vmipam's own, anyone's) and
// reconciles the reconciles of vmipam's address controller (all its
// processes).
type roundCounters struct {
	apiGC, apiGCs, vmipamGC, resyncs, resyncSecs, checks, requests, reconciles float64
}

// countersOf reads roundCounters from the API server's metrics a and
// vmipam's v (nil when they could not be read: vmipam's figures are then
// zero).
func countersOf(a, v metricSet) roundCounters {
	const gcCPU = "go_cpu_classes_gc_total_cpu_seconds_total"
	return roundCounters{
		apiGC:      a.sum(gcCPU, nil),
		apiGCs:     a.sum("go_gc_duration_seconds_count", nil),
		vmipamGC:   v.sum(gcCPU, nil),
		resyncs:    v.sum("vmipam_resync_duration_seconds_count", nil),
		resyncSecs: v.sum("vmipam_resync_duration_seconds_sum", nil),
		checks:     cacheChecks(a),
		requests:   a.sum("apiserver_request_total", nil),
		reconciles: v.sum("controller_runtime_reconcile_total", map[string]string{"controller": "address-gc"}),
	}
}

// sub returns what changed from o to c.
func (c roundCounters) sub(o roundCounters) roundCounters {
	return roundCounters{
		apiGC: c.apiGC - o.apiGC, apiGCs: c.apiGCs - o.apiGCs, vmipamGC: c.vmipamGC - o.vmipamGC,
		resyncs: c.resyncs - o.resyncs, resyncSecs: c.resyncSecs - o.resyncSecs, checks: c.checks - o.checks,
		requests: c.requests - o.requests, reconciles: c.reconciles - o.reconciles,
	}
}

// roundsSection writes a table of the rounds in the order they ran.
func (r *report) roundsSection(b *strings.Builder) {
	if len(r.rounds) == 0 {
		return
	}
	w := func(format string, a ...any) { fmt.Fprintf(b, format+"\n", a...) }
	w("Each round in the order it ran, with what else ran in it: the API server's garbage collector (its CPU as the Go runtime " +
		"estimates it, `go_cpu_classes_gc_total_cpu_seconds_total`, and its completed cycles), vmipam's garbage collector (the same " +
		"estimate, all its processes), vmipam's periodic resyncs that ended in the round (`vmipam_resync_duration_seconds`, all its " +
		"processes; each runs every --resync-interval whatever the load), the watch-cache consistency checks, the requests the API " +
		"server served (`apiserver_request_total`) and the reconciles of vmipam's address controller (`controller_runtime_reconcile_total`, " +
		"all its processes; a create is bound in the watch's handler and the objects outside every pool stay out of the queue, so a " +
		"round's own objects need none: what it counts is other work). CPU, " +
		"requests and reconciles are per 1,000 creates.")
	w("")
	if r.opts.apiserverGC {
		w("Before each round the API server's garbage collector ran (-apiserver-gc), so that none of its collections of the fleet in " +
			"its heap lands in a round; the last column is what that cost the API server, outside the round's figures.")
		w("")
	}
	t := table{b: b, skip: map[int]bool{11: !r.opts.apiserverGC}}
	t.header("round", "VM/s", "API server CPU", "of it GC (cycles)", "vmipam CPU", "of it GC", "vmipam resyncs (s)", "etcd CPU", "checks",
		"API requests", "vmipam reconciles", "API server CPU in the GC before it (s)")
	for _, s := range r.rounds {
		// perK formats v per 1,000 creates of the round.
		perK := func(format string, v float64) string {
			if s.created == 0 {
				return "n/a"
			}
			return fmt.Sprintf(format, 1000*v/float64(s.created))
		}
		k := func(v float64) string { return perK("%.2f", v) }
		count := func(v float64) string { return perK("%.0f", v) }
		vmipamGC, resyncs, reconciles := k(s.vmipamGC), fmt.Sprintf("%.0f (%.2f)", s.resyncs, s.resyncSecs), count(s.reconciles)
		if s.vmipamUnknown {
			vmipamGC, resyncs, reconciles = "n/a", "n/a", "n/a"
		}
		t.row(fmt.Sprintf("%d %s", s.round, s.mode), fmt.Sprintf("%.0f", s.rate), k(s.cpu.procs["kube-apiserver"]),
			fmt.Sprintf("%s (%.0f)", k(s.apiGC), s.apiGCs), k(s.cpu.procs["vmipam"]), vmipamGC, resyncs, k(s.cpu.procs["etcd"]),
			fmt.Sprintf("%.0f", s.checks), count(s.requests), reconciles, fmt.Sprintf("%.2f", s.forcedGC))
	}
	w("")
}
