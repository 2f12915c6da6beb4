package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/vmipam/vmipam/test/harness"
)

// stopper is what runs vmipam: one process, or several replicas behind
// the stand-in Service.
type stopper interface {
	Stop(timeout time.Duration) error
}

// replicaStats is one layout's share of the replicas phase.
type replicaStats struct {
	replicas int
	elapsed  time.Duration
	lat      []time.Duration
	errors   int
	firstErr error
	cpu      cpuSample
	rates    []float64
	// ready is how long each start took until every replica was ready.
	ready []time.Duration
	// api is what the rounds cost the API server besides the creates.
	api apiCost
}

// apiCost sums, over a layout's rounds, the IPBlock and IPBlockShare writes the API server
// served (updates, creates and deletes) and how many of them lost a
// compare-and-swap (409), and the watch events it sent and their bytes,
// by resource: what several replicas cost the API server beyond one.
type apiCost struct {
	blockWrites, blockConflicts float64
	watchEvents, watchBytes     map[string]float64
}

// add adds the difference of the API server's metrics from a0 to a1.
func (c *apiCost) add(a0, a1 metricSet) {
	if c.watchEvents == nil {
		c.watchEvents, c.watchBytes = map[string]float64{}, map[string]float64{}
	}
	for _, res := range []string{"ipblocks", "ipblockshares"} {
		for _, verb := range []string{"UPDATE", "PUT", "POST", "DELETE", "PATCH"} {
			want := map[string]string{"resource": res, "verb": verb}
			c.blockWrites += a1.sum("apiserver_request_total", want) - a0.sum("apiserver_request_total", want)
			want["code"] = "409"
			c.blockConflicts += a1.sum("apiserver_request_total", want) - a0.sum("apiserver_request_total", want)
		}
	}
	byResource := func(m metricSet, name string) map[string]float64 {
		out := map[string]float64{}
		for _, s := range m {
			if s.Name != name {
				continue
			}
			r := s.Labels["resource"]
			if r == "" {
				r = strings.ToLower(s.Labels["kind"])
			}
			out[r] += s.Value
		}
		return out
	}
	for name, into := range map[string]map[string]float64{
		"apiserver_watch_events_total": c.watchEvents, "apiserver_watch_events_sizes_sum": c.watchBytes,
	} {
		before := byResource(a0, name)
		for r, v := range byResource(a1, name) {
			into[r] += v - before[r]
		}
	}
}

func (s *replicaStats) rate() float64 { return float64(len(s.lat)) / s.elapsed.Seconds() }

// replicasPhase compares one vmipam replica with -replicas of them in the
// same run: alternating rounds of -replicas-n creates (split across
// -rounds), vmipam restarted between layouts.
type replicasPhase struct {
	ran    bool
	n      int
	layout [2]replicaStats
}

// measureReplicas runs the replicas phase after the deletes, so that it
// disturbs none of the figures above. Each round stops what runs (SIGTERM:
// a drain, the seal, the Lease released) and starts the other layout, then
// creates its share with vmipam. The replicas run behind the stand-in for
// the Service (test/lbproxy) on the webhook port, so the API server's
// connections spread over them as over a Service's endpoints.
func (b *bench) measureReplicas(ctx context.Context, rep *report) error {
	o := b.opts
	if o.replicas < 2 || o.replicasN < 1 {
		return nil
	}
	ph := &rep.replicas
	ph.ran, ph.n = true, o.replicasN
	ph.layout[0].replicas, ph.layout[1].replicas = 1, o.replicas
	per := split(o.replicasN, o.rounds)
	extra := append(strings.Fields(o.vmipamArgs), "--shutdown-drain=1s")
	offset := 0
	for r := range o.rounds {
		for i := range ph.layout {
			st := &ph.layout[i]
			if err := b.relayout(ctx, st, extra); err != nil {
				return err
			}
			// Unmeasured: connections, caches, the new allocators' free
			// lists.
			if res := b.runOps(ctx, min(o.warmup, 64), b.createOp(modeWith, fmt.Sprintf("rep%dwarm", st.replicas), offset)); res.errors > 0 {
				logf("replicas round %d/%d, %d replica(s): %d warm-up creates failed: %v", r+1, o.rounds, st.replicas, res.errors, res.firstErr)
			}
			offset += min(o.warmup, 64)
			k := per[r]
			logf("replicas round %d/%d, %d replica(s): creating %d", r+1, o.rounds, st.replicas, k)
			var res opsResult
			cpu, a0, a1, err := b.around(ctx, func() error {
				res = b.runOps(ctx, k, b.createOp(modeWith, fmt.Sprintf("rep%d", st.replicas), offset))
				return ctx.Err()
			})
			if err != nil {
				return err
			}
			st.api.add(a0, a1)
			offset += k
			st.cpu.add(cpu)
			st.elapsed += res.elapsed
			st.lat = append(st.lat, res.lat...)
			st.errors += res.errors
			if st.firstErr == nil {
				st.firstErr = res.firstErr
			}
			rate := float64(len(res.lat)) / res.elapsed.Seconds()
			st.rates = append(st.rates, rate)
			logf("replicas round %d/%d, %d replica(s): %d created, %d failed in %s: %.0f/s", r+1, o.rounds, st.replicas,
				len(res.lat), res.errors, res.elapsed.Round(time.Millisecond), rate)
		}
	}
	return nil
}

// relayout stops what runs vmipam and starts st's layout, then waits
// until the webhooks answer through it.
func (b *bench) relayout(ctx context.Context, st *replicaStats, extra []string) error {
	ready, err := b.restartVMIPAM(ctx, st.replicas, extra)
	if err != nil {
		return err
	}
	st.ready = append(st.ready, ready)
	return nil
}

// restartVMIPAM stops what runs vmipam and starts it again: one process
// when replicas is 1, else that many behind the stand-in Service, with
// the extra flags; it returns how long the start took until the webhooks
// answered.
func (b *bench) restartVMIPAM(ctx context.Context, replicas int, extra []string) (time.Duration, error) {
	if b.vmipam != nil {
		if err := b.vmipam.Stop(30 * time.Second); err != nil {
			return 0, fmt.Errorf("stop vmipam: %w", err)
		}
		b.vmipam = nil
	}
	start := time.Now()
	logs := b.logFile
	if logs == nil {
		logs = io.Discard
	}
	if replicas == 1 {
		p, err := b.cl.StartVMIPAM(ctx, logs, extra...)
		if err != nil {
			return 0, fmt.Errorf("start one vmipam: %w", err)
		}
		b.vmipam = p
	} else {
		rs, err := b.cl.StartReplicas(ctx, replicas, func(int) io.Writer { return logs }, extra...)
		if err != nil {
			return 0, fmt.Errorf("start %d replicas: %w", replicas, err)
		}
		b.vmipam = rs
	}
	if err := b.waitStamped(ctx); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// replicasSection writes the replicas phase's table.
func (r *report) replicasSection(b *strings.Builder) {
	ph := &r.replicas
	if !ph.ran {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format+"\n", args...) }
	one, many := &ph.layout[0], &ph.layout[1]
	sortDur(one.lat)
	sortDur(many.lat)
	w("## One replica against %d", many.replicas)
	w("")
	w("After the deletes, %d more VirtualMachines per layout with vmipam (pool `%s`) from the same %d clients, in %d rounds alternating one vmipam "+
		"process and %d replicas behind the stand-in for the Service (`test/lbproxy`, round robin over ready replicas). "+
		"Between rounds vmipam is stopped (SIGTERM: drain, seal, Lease released) and the other layout started and warmed up with "+
		"unmeasured creates; the replicas share the same %d CPUs, so no gain is expected: the point is no loss. vmipam's CPU is summed over its processes.",
		ph.n, poolName, r.opts.c, r.opts.rounds, many.replicas, r.cpus)
	w("")
	t := table{b: b}
	t.header("", "1 replica", fmt.Sprintf("%d replicas", many.replicas), fmt.Sprintf("%d / 1", many.replicas))
	t.row("VirtualMachines created (failed)", fmt.Sprintf("%d (%d)", len(one.lat), one.errors), fmt.Sprintf("%d (%d)", len(many.lat), many.errors), "")
	t.row("**creates/s**", bold(rate(one.rate())), bold(rate(many.rate())), bold(ratio(many.rate(), one.rate())))
	t.row("creates/s per round", rates(one.rates), rates(many.rates), "")
	t.row("client-side create latency p50 / p99", lat(one.lat, 0.5)+" / "+lat(one.lat, 0.99), lat(many.lat, 0.5)+" / "+lat(many.lat, 0.99), "")
	per := func(s *replicaStats, v float64) float64 {
		if len(s.lat) == 0 {
			return 0
		}
		return v / float64(len(s.lat)) * 1000
	}
	// Every process's share, not only vmipam's: on a saturated machine
	// what the replicas cost the others shows here.
	for _, p := range cpuProcs {
		t.row(p+" CPU per 1,000 creates", secs(per(one, one.cpu.procs[p])), secs(per(many, many.cpu.procs[p])),
			ratio(per(many, many.cpu.procs[p]), per(one, one.cpu.procs[p])))
	}
	t.row("all CPU per 1,000 creates (every process, the kernel)", secs(per(one, one.cpu.busy)), secs(per(many, many.cpu.busy)),
		ratio(per(many, many.cpu.busy), per(one, one.cpu.busy)))
	t.row("machine CPU busy during the rounds (all cores)", busyShare(one.cpu), busyShare(many.cpu), "")
	perCreate := func(s *replicaStats, v float64) float64 {
		if len(s.lat) == 0 {
			return 0
		}
		return v / float64(len(s.lat))
	}
	t.row("IPBlock and IPBlockShare writes per 1,000 creates (lost a compare-and-swap)",
		fmt.Sprintf("%.0f (%.0f)", 1000*perCreate(one, one.api.blockWrites), 1000*perCreate(one, one.api.blockConflicts)),
		fmt.Sprintf("%.0f (%.0f)", 1000*perCreate(many, many.api.blockWrites), 1000*perCreate(many, many.api.blockConflicts)), "")
	resources := map[string]bool{}
	for _, s := range []*replicaStats{one, many} {
		for r, v := range s.api.watchEvents {
			if v > 0 {
				resources[r] = true
			}
		}
	}
	for _, res := range slices.Sorted(maps.Keys(resources)) {
		t.row(fmt.Sprintf("watch events (KiB) sent per create: %s", res),
			fmt.Sprintf("%.2f (%.1f)", perCreate(one, one.api.watchEvents[res]), perCreate(one, one.api.watchBytes[res])/1024),
			fmt.Sprintf("%.2f (%.1f)", perCreate(many, many.api.watchEvents[res]), perCreate(many, many.api.watchBytes[res])/1024),
			ratio(perCreate(many, many.api.watchBytes[res]), perCreate(one, one.api.watchBytes[res])))
	}
	t.row("start until the webhooks answer (each start)", durs(one.ready), durs(many.ready), "")
	w("")
	for _, s := range []*replicaStats{one, many} {
		if s.firstErr != nil {
			w("First failure with %d replica(s): `%v`", s.replicas, s.firstErr)
			w("")
		}
	}
}

// durs formats durations to the millisecond, comma-separated.
func durs(d []time.Duration) string {
	out := make([]string, len(d))
	for i, v := range d {
		out[i] = v.Round(time.Millisecond).String()
	}
	return strings.Join(out, ", ")
}

var _ stopper = (*harness.Process)(nil)
var _ stopper = (*harness.Replicas)(nil)
