package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The steady-rate phase's VirtualMachines: named paced-NNNNN in the
// namespace with vmipam, and labelled so that the phase can wait for its
// own to be gone while the saturated rounds' ones remain.
const (
	pacedPrefix = "paced"
	phaseLabel  = "e2ebench.vmipam.io/phase"
	phasePaced  = "paced"
)

// pacedStats is what the steady-rate phase gave.
type pacedStats struct {
	ran bool
	// skipped says why the phase, though enabled, did not run.
	skipped string
	// target is the schedule's rate (VM/s); auto: half the saturated
	// throughput with vmipam, which was saturated.
	target   float64
	auto     bool
	n        int
	created  int
	errors   int
	firstErr error
	// lat: each Create call (sorted); late: how long after its due time
	// each create started (sorted).
	lat, late []time.Duration
	// elapsed: from the first create's due time to the end of the last.
	elapsed time.Duration
	cpu     cpuSample
	webhook webhookResult
	// caughtUp: after the phase, until vmipam's controller had bound
	// every reservation.
	caughtUp time.Duration
	// deletion of the phase's VirtualMachines, then how long after they
	// were gone their addresses were all free again (notFree: not within
	// the cooldown plus -free-timeout).
	deletion  deletion
	freeAfter time.Duration
	notFree   bool
}

// rate is the achieved rate: successful creates over the phase's span.
func (p *pacedStats) rate() float64 {
	if p.elapsed == 0 || p.created == 0 {
		return math.NaN()
	}
	return float64(p.created) / p.elapsed.Seconds()
}

// runPaced runs n operations on the bench's clients on an open-loop
// schedule: operation i is due at t0 + i/rate. Each worker takes the next
// operation, waits until it is due and runs it; a worker that takes one
// already due starts it at once and records how late it was, skipping
// none, so that a slow operation delays only the clients, never the
// schedule. A rate of zero or less sets no schedule: every operation is
// due at once. It returns the batch (elapsed from t0 to the end of the
// last operation) and every operation's lateness.
func (b *bench) runPaced(ctx context.Context, n int, rate float64, op func(ctx context.Context, c client.Client, i int) error) (opsResult, []time.Duration) {
	var next atomic.Int64
	lat := make([]time.Duration, n)
	late := make([]time.Duration, n)
	errs := make([]error, n)
	interval := 0.0
	if rate > 0 {
		interval = float64(time.Second) / rate
	}
	var t0 time.Time
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range b.clients {
		wg.Go(func() {
			<-start
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				due := t0.Add(time.Duration(float64(i) * interval))
				if d := time.Until(due); d > 0 {
					t := time.NewTimer(d)
					select {
					case <-ctx.Done():
						t.Stop()
						errs[i] = ctx.Err()
						return
					case <-t.C:
					}
				}
				s := time.Now()
				late[i] = max(s.Sub(due), 0)
				errs[i] = op(ctx, c, i)
				lat[i] = time.Since(s)
			}
		})
	}
	t0 = time.Now()
	close(start)
	wg.Wait()
	return collect(ctx, time.Since(t0), lat, errs), late
}

// pacedCreateOp returns the create of the i-th VirtualMachine of the
// steady-rate phase: with vmipam, from its pool, as in the saturated
// rounds.
func pacedCreateOp(ctx context.Context, c client.Client, i int) error {
	vm := newVM(modeWith, fmt.Sprintf("%s-%05d", pacedPrefix, i))
	vm.Labels[phaseLabel] = phasePaced
	vm.Spec.IPPool = poolName
	return c.Create(ctx, vm)
}

// measurePaced runs the steady-rate phase after the saturated rounds:
// -paced-n creates with vmipam at -paced-rate (by default half the
// throughput with vmipam just measured), reading vmipam's and the API
// server's histograms and the CPU around them. It then waits for vmipam's
// controller, deletes the phase's VirtualMachines and waits until their
// addresses are free again, so that the deletes measured next compare the
// same numbers with and without vmipam, and no release or cooldown of the
// phase's lands in them.
func (b *bench) measurePaced(ctx context.Context, rep *report) error {
	o := b.opts
	if !o.paced() {
		return nil
	}
	ps := &rep.paced
	ps.n, ps.target = o.pacedN, o.pacedRate
	if ps.target == 0 {
		ps.target, ps.auto = rep.modes[modeWith].rate()/2, true
	}
	if math.IsNaN(ps.target) || ps.target <= 0 {
		ps.skipped = "no create with vmipam succeeded in the saturated rounds, so there was no throughput to take half of"
		logf("steady rate: skipped: %s", ps.skipped)
		return nil
	}
	counts0, err := b.poolCounts()
	if err != nil {
		return err
	}
	vBefore, aBefore, err := b.bothMetrics(ctx)
	if err != nil {
		return err
	}
	logf("steady rate: creating %d with vmipam at %.1f/s", ps.n, ps.target)
	c0 := sampleCPU()
	res, late := b.runPaced(ctx, ps.n, ps.target, pacedCreateOp)
	c1 := sampleCPU()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	vAfter, aAfter, err := b.bothMetrics(ctx)
	if err != nil {
		return err
	}
	ps.ran = true
	ps.cpu = c1.sub(c0)
	ps.webhook = webhookStats(vBefore, vAfter, aBefore, aAfter)
	ps.elapsed, ps.errors, ps.firstErr = res.elapsed, res.errors, res.firstErr
	ps.created = len(res.lat)
	ps.lat = slices.Sorted(slices.Values(res.lat))
	ps.late = slices.Sorted(slices.Values(late))
	logf("steady rate: %d created, %d failed in %s: %.1f/s (target %.1f/s), start late p99 %s, webhook p99 %s, CPU busy %s",
		ps.created, ps.errors, ps.elapsed.Round(time.Millisecond), ps.rate(), ps.target, ms(pct(ps.late, 0.99)),
		secs(ps.webhook.mutating.quantile(0.99)), share(ps.cpu.busy/ps.cpu.total))
	if res.firstErr != nil {
		logf("  first error: %v", res.firstErr)
	}

	var st modeStats
	if err := b.settle(ctx, modeWith, &st); err != nil {
		return err
	}
	ps.caughtUp = st.caughtUp[0]
	// Every name, the failed creates' too: one may still have been
	// stored (after a timeout, say); the others' deletes are not found.
	names := make([]string, ps.n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%05d", pacedPrefix, i)
	}
	d, err := b.deleteNames(ctx, modeWith, names, client.MatchingLabels{phaseLabel: phasePaced})
	if err != nil {
		return err
	}
	d.count = ps.created
	ps.deletion = d
	// The saturated rounds' VirtualMachines keep their addresses; the
	// phase's must be free again, none pending nor cooling down.
	err = poll(ctx, pollMetrics, o.cooldown+o.freeTimeout, "the steady-rate phase's addresses to be free again", func() error {
		c, err := b.poolCounts()
		if err != nil {
			return err
		}
		if c["allocated"] != counts0["allocated"] || c["pending"] != 0 || c["cooldown"] != 0 {
			return fmt.Errorf("pool counts %v, allocated %v before the phase", c, counts0["allocated"])
		}
		return nil
	})
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		// The final check over the whole pool reports it as well.
		ps.notFree = true
		logf("warning: %v", err)
	default:
		ps.freeAfter = time.Since(d.goneAt)
		logf("steady rate: %d deleted, gone after %s, their addresses free again %s later",
			d.count, d.gone.Round(time.Millisecond), ps.freeAfter.Round(time.Millisecond))
	}
	return nil
}
