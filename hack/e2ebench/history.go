package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// historyStats is one setting's share of the history phase: its creates,
// counted until vmipam's controller has bound them all, and its deletes,
// counted until every finalizer is off.
type historyStats struct {
	off             bool
	created, failed int
	createTime      time.Duration
	rates           []float64
	firstErr        error
	createCPU       cpuSample
	createWrites    map[string]float64
	deleted         int
	deleteTime      time.Duration
	deleteCPU       cpuSample
	deleteWrites    map[string]float64
	ready           []time.Duration
}

// historyPhase compares vmipam with its address history (the default)
// and without it (--no-history) in the same run: alternating rounds of
// -history-n creates and their deletes, split across -rounds, one vmipam
// process restarted between settings.
type historyPhase struct {
	ran     bool
	n       int
	setting [2]historyStats
}

// writeVerbs are the verbs of apiserver_request_total that write.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "APPLY": true, "DELETE": true, "DELETECOLLECTION": true}

// writesByResource keeps the writes of a requestDelta, by resource (and
// subresource).
func writesByResource(reqs map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range reqs {
		verb, res, _ := strings.Cut(k, " ")
		if writeVerbs[verb] {
			out[res] += v
		}
	}
	return out
}

// addTo adds every value of from to into, which it makes when nil.
func addTo(into *map[string]float64, from map[string]float64) {
	if *into == nil {
		*into = map[string]float64{}
	}
	for k, v := range from {
		(*into)[k] += v
	}
}

// measureHistory runs the history phase after the deletes, so that it
// disturbs none of the figures above. Each round restarts vmipam with
// the history on or off, warms it up with creates and deletes it does
// not count, then creates its share and waits for the controller to bind
// them all (the CPU and the API server's requests counted over both),
// and deletes them, waiting until every finalizer is off: with the
// history on, each release's tenure is written before its finalizer
// comes off.
func (b *bench) measureHistory(ctx context.Context, rep *report) error {
	o := b.opts
	if o.historyN < 1 {
		return nil
	}
	ph := &rep.history
	ph.ran, ph.n = true, o.historyN
	ph.setting[1].off = true
	per := split(o.historyN, o.rounds)
	base := append(strings.Fields(o.vmipamArgs), "--shutdown-drain=1s")
	offset := 0
	for r := range o.rounds {
		for i := range ph.setting {
			st := &ph.setting[i]
			name, extra := "on", base
			if st.off {
				name, extra = "off", append(slices.Clone(base), "--no-history")
			}
			ready, err := b.restartVMIPAM(ctx, 1, extra)
			if err != nil {
				return err
			}
			st.ready = append(st.ready, ready)
			prefix := "hist-" + name
			w := min(o.warmup, 64)
			warm := b.runOps(ctx, w, b.createOp(modeWith, prefix+"warm", offset))
			if _, err := b.deleteAll(ctx, modeWith, prefix+"warm", offset, warm.ok); err != nil {
				return fmt.Errorf("history %s: warm-up deletes: %w", name, err)
			}
			offset += w

			k := per[r]
			logf("history round %d/%d, history %s: creating %d", r+1, o.rounds, name, k)
			var res opsResult
			cpu, a0, a1, err := b.around(ctx, func() error {
				res = b.runOps(ctx, k, b.createOp(modeWith, prefix, offset))
				return b.settle(ctx, modeWith, &modeStats{})
			})
			if err != nil {
				return fmt.Errorf("history %s: %w", name, err)
			}
			st.createCPU.add(cpu)
			addTo(&st.createWrites, writesByResource(requestDelta(a0, a1)))
			st.created += len(res.lat)
			st.failed += res.errors
			st.createTime += res.elapsed
			if st.firstErr == nil {
				st.firstErr = res.firstErr
			}
			rate := float64(len(res.lat)) / res.elapsed.Seconds()
			st.rates = append(st.rates, rate)

			var d deletion
			cpu, a0, a1, err = b.around(ctx, func() (err error) {
				d, err = b.deleteAll(ctx, modeWith, prefix, offset, res.ok)
				return err
			})
			if err != nil {
				return fmt.Errorf("history %s: %w", name, err)
			}
			st.deleteCPU.add(cpu)
			addTo(&st.deleteWrites, writesByResource(requestDelta(a0, a1)))
			st.deleted += d.count
			st.deleteTime += d.gone
			offset += k
			logf("history round %d/%d, history %s: %d created, %d failed: %.0f/s; deleted in %s: %.0f/s", r+1, o.rounds, name,
				len(res.lat), res.errors, rate, d.gone.Round(time.Millisecond), d.rate())
		}
	}
	return nil
}

// around runs fn and returns the CPU it took, from /proc, and the API
// server's metrics from before and after it.
func (b *bench) around(ctx context.Context, fn func() error) (cpu cpuSample, a0, a1 metricSet, err error) {
	if a0, err = b.apiserverMetrics(ctx); err != nil {
		return cpu, nil, nil, err
	}
	c0 := sampleCPU()
	if err := fn(); err != nil {
		return cpu, nil, nil, err
	}
	cpu = sampleCPU().sub(c0)
	if a1, err = b.apiserverMetrics(ctx); err != nil {
		return cpu, nil, nil, err
	}
	return cpu, a0, a1, nil
}

// historySection writes the history phase's table.
func (r *report) historySection(b *strings.Builder) {
	ph := &r.history
	if !ph.ran {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	on, off := &ph.setting[0], &ph.setting[1]
	w("## The address history on and off")
	w("")
	w("After the deletes, %d more VirtualMachines per setting with vmipam (pool `%s`) from the same %d clients, in %d rounds alternating "+
		"one vmipam process with its address history (the default) and one with `--no-history`, each started afresh and warmed up with creates "+
		"and deletes that are not counted. A round's creates count until vmipam's controller has bound every one; its deletes count until "+
		"every finalizer is off (with the history on, the tenure is written before the finalizer comes off, in batches per chunk of addresses). "+
		"Writes are what the API server served in that time (POST, PUT, PATCH, DELETE), every client's, the VirtualMachines' own included.",
		ph.n, poolName, r.opts.c, r.opts.rounds)
	w("")
	per := func(n int, v float64) float64 {
		if n == 0 {
			return 0
		}
		return 1000 * v / float64(n)
	}
	perSec := func(n int, d time.Duration) float64 {
		if d == 0 {
			return 0
		}
		return float64(n) / d.Seconds()
	}
	t := table{b: b}
	t.header("", "history on", "history off", "on / off")
	t.row("VirtualMachines created (failed)", fmt.Sprintf("%d (%d)", on.created, on.failed), fmt.Sprintf("%d (%d)", off.created, off.failed), "")
	cOn, cOff := perSec(on.created, on.createTime), perSec(off.created, off.createTime)
	t.row("**creates/s**", bold(rate(cOn)), bold(rate(cOff)), bold(ratio(cOn, cOff)))
	t.row("creates/s per round", rates(on.rates), rates(off.rates), "")
	for _, p := range []string{"vmipam", "kube-apiserver"} {
		t.row(p+" CPU per 1,000 creates", secs(per(on.created, on.createCPU.procs[p])), secs(per(off.created, off.createCPU.procs[p])),
			ratio(per(on.created, on.createCPU.procs[p]), per(off.created, off.createCPU.procs[p])))
	}
	writeRows := func(what string, nOn, nOff int, wOn, wOff map[string]float64) {
		sum := func(m map[string]float64) float64 {
			s := 0.0
			for _, v := range m {
				s += v
			}
			return s
		}
		t.row("**API writes per 1,000 "+what+"**", bold(fmt.Sprintf("%.0f", per(nOn, sum(wOn)))), bold(fmt.Sprintf("%.0f", per(nOff, sum(wOff)))),
			bold(ratio(per(nOn, sum(wOn)), per(nOff, sum(wOff)))))
		resources := map[string]bool{}
		for _, m := range []map[string]float64{wOn, wOff} {
			for res, v := range m {
				if v > 0 {
					resources[res] = true
				}
			}
		}
		for _, res := range slices.Sorted(maps.Keys(resources)) {
			t.row(fmt.Sprintf("  of which %s", res), fmt.Sprintf("%.0f", per(nOn, wOn[res])), fmt.Sprintf("%.0f", per(nOff, wOff[res])), "")
		}
	}
	writeRows("creates", on.created, off.created, on.createWrites, off.createWrites)
	t.row("VirtualMachines deleted", fmt.Sprint(on.deleted), fmt.Sprint(off.deleted), "")
	dOn, dOff := perSec(on.deleted, on.deleteTime), perSec(off.deleted, off.deleteTime)
	t.row("**deletes/s** (until every finalizer was off)", bold(rate(dOn)), bold(rate(dOff)), bold(ratio(dOn, dOff)))
	for _, p := range []string{"vmipam", "kube-apiserver"} {
		t.row(p+" CPU per 1,000 deletes", secs(per(on.deleted, on.deleteCPU.procs[p])), secs(per(off.deleted, off.deleteCPU.procs[p])),
			ratio(per(on.deleted, on.deleteCPU.procs[p]), per(off.deleted, off.deleteCPU.procs[p])))
	}
	writeRows("deletes", on.deleted, off.deleted, on.deleteWrites, off.deleteWrites)
	t.row("start until the webhooks answer (each start)", durs(on.ready), durs(off.ready), "")
	w("")
	for _, s := range []*historyStats{on, off} {
		if s.firstErr != nil {
			w("First failure with the history %s: `%v`", map[bool]string{false: "on", true: "off"}[s.off], s.firstErr)
			w("")
		}
	}
}
