package main

import (
	"fmt"
	"math"
	"strings"
)

// floorGap writes what separates the creates with vmipam from the no-op
// floor: the rounds keep every core busy, so throughput is about the cores
// over what one create costs the whole machine, and the difference in
// that cost, process by process, is where the gap to the floor is.
func (r *report) floorGap(b *strings.Builder, with, noop *modeStats) {
	w := func(format string, a ...any) { fmt.Fprintf(b, format+"\n", a...) }
	type part struct {
		name      string
		with, off float64 // CPU seconds per create
	}
	per := func(s *modeStats, v float64) float64 { return v / float64(len(s.lat)) }
	var parts []part
	for _, p := range r.opts.cpuProcs() {
		parts = append(parts, part{p, per(with, with.cpu.procs[p]), per(noop, noop.cpu.procs[p])})
	}
	parts = append(parts,
		part{"kernel softirq", per(with, with.cpu.softirq), per(noop, noop.cpu.softirq)},
		part{"other processes", per(with, with.cpu.other()), per(noop, noop.cpu.other())})
	mw, mn := per(with, with.cpu.busy), per(noop, noop.cpu.busy)
	if mw <= 0 || mn <= 0 {
		return
	}
	// allowed is how much more a create with vmipam may cost for the goal.
	allowed := mn/goalCreateVsNoop - mn
	cost := fmt.Sprintf("%.2f ms more", 1000*(mw-mn))
	if mw < mn {
		cost = fmt.Sprintf("%.2f ms less", 1000*(mn-mw))
	}
	w("What separates the creates with vmipam from the no-op floor. The rounds keep the machine's cores busy, so throughput is "+
		"about the cores over what one create costs the whole machine: %.2f ms with vmipam, %.2f ms through the no-op webhook "+
		"(%.2f× by that measure; %.2f× measured). For %.2f× the floor a create with vmipam may cost at most %.2f ms, %.2f ms more "+
		"than through the no-op webhook; it cost %s, of which (shares of the difference only where it is more than the goal allows):",
		1000*mw, 1000*mn, mn/mw, with.rate()/noop.rate(), goalCreateVsNoop, 1000*(mn+allowed), 1000*allowed, cost)
	w("")
	t := table{b: b}
	t.header("CPU ms per create", "with vmipam", "no-op mutating webhook", "difference", "share of the difference")
	for _, p := range parts {
		d := noNegZero(1000 * (p.with - p.off))
		// Shares explain a miss: within the goal's margin the difference
		// is small enough for the runs' spread to make them read as
		// hundreds of percent either way.
		share := "n/a"
		if mw-mn > allowed {
			share = fmt.Sprintf("%.0f%%", 100*d/(1000*(mw-mn)))
		}
		t.row(p.name, fmt.Sprintf("%.3f", 1000*p.with), fmt.Sprintf("%.3f", 1000*p.off), fmt.Sprintf("%+.3f", d), share)
	}
	w("")
	switch {
	case r.opts.noopBehindService() && r.opts.noopProcess:
		w("In this mode vmipam's replicas sit behind this program's stand-in for their Service, a user-space proxy that kube-proxy " +
			"replaces with the kernel's forwarding in a cluster, and the no-op webhook's server behind the same proxy run as a process " +
			"of its own (lbproxy); the no-op server and finalizer remover run in a process of their own (" + noopProcessComm + "): this " +
			"program's difference is its stand-in and its clients' larger responses, and lbproxy's is the no-op's stand-in.")
		w("")
	case r.opts.noopBehindService():
		w("In this mode vmipam's replicas sit behind this program's stand-in for their Service, a user-space proxy that kube-proxy " +
			"replaces with the kernel's forwarding in a cluster, and the no-op webhook's server behind the same proxy run as a process " +
			"of its own (lbproxy): this program's difference is its stand-in and its clients' larger responses less the no-op server and " +
			"finalizer remover, which run in it during the no-op rounds only, and lbproxy's is the no-op's stand-in " +
			"(-profile writes this program's own profiles, e2e-bench-e2ebench-<mode>.pprof).")
		w("")
	case r.opts.fleet > 0 && r.opts.noopProcess:
		w("In this mode vmipam's replicas sit behind this program's stand-in for the Service, a user-space proxy that kube-proxy " +
			"replaces with the kernel's forwarding in a cluster, while the no-op webhook's server is reached directly (-noop-service=false), " +
			"in a process of its own with the finalizer remover (" + noopProcessComm + "): this program's difference is that proxy and its " +
			"clients' larger responses.")
		w("")
	case r.opts.fleet > 0:
		w("In this mode vmipam's replicas sit behind this program's stand-in for the Service, a user-space proxy that kube-proxy " +
			"replaces with the kernel's forwarding in a cluster, while the no-op webhook's server is reached directly (-noop-service=false): " +
			"this program's difference is that proxy and its clients' larger responses less the no-op server and finalizer remover, which " +
			"run in it during the no-op rounds only (-profile writes its own profiles, e2e-bench-e2ebench-<mode>.pprof).")
		w("")
	}
}

// noNegZero is the difference d (ms, printed to three decimals), or 0 where
// it rounds to nothing, so that no table prints "-0.000".
func noNegZero(d float64) float64 {
	if math.Abs(d) < 0.0005 {
		return 0
	}
	return d
}
