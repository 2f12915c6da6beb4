package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// figures are what the run did and found, for the report.
type figures struct {
	loadDuration, drain, total time.Duration

	creates, deletes, gone, viaGet, reuses int
	kills, starts, selfExits, apiRestarts  int
	replicas, rolls, takeovers             int
	readyAfter                             []time.Duration
	apiRestart                             []apiRestartResult
	exitReasons, startFailures             []string
	watchRestarts, snapshots               int

	live, fillWant, fillGot, leaked int

	endDups, endNoAddr, fillDups             []string
	dupAtCreate, runDups, terminatingOverlap []string
	badAddr, runNoAddr, liveCooling          []string
	earlyReuse, lateReuse                    []string
	lateChecked, lateUnchecked               int
	refused                                  *refusals
	logs                                     logFacts
	fillReleased                             []string
	fillResyncReleased                       int
}

// table renders the figures as markdown.
func (f *figures) table(s settings, usable int) string {
	var b strings.Builder
	row := func(k string, v any) { fmt.Fprintf(&b, "| %s | %v |\n", k, v) }
	dups := len(f.endDups) + len(f.fillDups) + len(f.dupAtCreate) + len(f.runDups)
	noAddr := len(f.endNoAddr) + len(f.badAddr) + len(f.runNoAddr)
	b.WriteString("### vmipam chaos run\n\n| figure | value |\n|---|---|\n")
	row("seed", s.seed)
	pool := fmt.Sprintf("%s, %d usable", s.cidr, usable)
	if s.dual {
		pool = fmt.Sprintf("dual-stack, every VM RequireDualStack: %s and %s, %d usable of each family", s.cidr, s.ranges()[1].First+"-"+s.ranges()[1].Last, usable)
	}
	row("pool", fmt.Sprintf("%s, cooldown %s, pendingTTL %s", pool, cooldown, pendingTTL))
	row("clients (max live VMs each)", fmt.Sprintf("%d (%d)", s.clients, s.maxOwn))
	row("load duration", f.loadDuration.Round(time.Second))
	row("operations (creates + deletes accepted)", f.creates+f.deletes)
	row("creates ok (of which found by Get after a lost response)", fmt.Sprintf("%d (%d)", f.creates, f.viaGet))
	row("deletes ok", f.deletes)
	row("deletions seen completed (watch)", f.gone)
	row("addresses handed out again (reuse, load and fill)", f.reuses)
	row("create attempts refused", f.refused.total("create", ""))
	row("vmipam replicas (behind the stand-in Service when more than one)", f.replicas)
	row("vmipam SIGKILLs (of which replaced under a new holder, taken over)", fmt.Sprintf("%d (%d)", f.kills, f.takeovers))
	row("rolling restarts of every replica (SIGTERM, drain, seal)", f.rolls)
	row("vmipam starts (first + after kills, rolls and self-exits)", f.starts)
	row("vmipam self-exits", f.selfExits)
	row("vmipam down to ready again (min / max)", minMax(f.readyAfter))
	row("API server restarts", f.apiRestarts)
	for i, r := range f.apiRestart {
		how := "SIGTERM"
		if r.stopErr != nil {
			how = "SIGTERM, then SIGKILL after 20s: " + r.stopErr.Error()
		}
		row(fmt.Sprintf("&nbsp;&nbsp;#%d stopped in / serving again after", i+1),
			fmt.Sprintf("%s (%s) / %s", r.stopped.Round(100*time.Millisecond), how, r.downtime.Round(100*time.Millisecond)))
	}
	row("deletions drained after the load in", f.drain.Round(time.Second))
	row("**duplicates** (must be 0)", dups)
	row("&nbsp;&nbsp;at creation / in run snapshots / at rest / after filling", fmt.Sprintf("%d / %d / %d / %d", len(f.dupAtCreate), len(f.runDups), len(f.endDups), len(f.fillDups)))
	row("**VMs without address** (must be 0)", noAddr)
	row("**addresses leaked** (must be 0)", fmt.Sprintf("%d (live at rest %d, refilled %d of %d)", f.leaked, f.live, f.fillGot, f.fillWant))
	row("**reuse before delete issued + cooldown** (must be 0)", len(f.earlyReuse))
	row("**reuse before deletion seen + cooldown - 2s** (must be 0)", fmt.Sprintf("%d (%d pairs checked, %d without an exact deletion time)", len(f.lateReuse), f.lateChecked, f.lateUnchecked))
	row("**live VMs' addresses found cooling down during the run** (must be 0)", len(f.liveCooling))
	row("address shared with a VM still being deleted (snapshots)", len(f.terminatingOverlap))
	row("consistent snapshots checked during the run", f.snapshots)
	row("watch restarts", f.watchRestarts)
	row("vmipam error log lines", f.logs.errorLines)
	row("&nbsp;&nbsp;\"Persisting pool state\" errors (max in one second)", fmt.Sprintf("%d (%d at %s)", f.logs.persistErrs, f.logs.maxPersistPerSec, f.logs.maxPersistAt))
	row("resyncs: addresses released / adopted / conflicts", fmt.Sprintf("%d / %d / %d", f.logs.resyncReleased, f.logs.resyncAdopted, f.logs.resyncConflicts))
	row("recoveries: from the caches / listing every VM / conflicts", fmt.Sprintf("%d / %d / %d", f.logs.recoveries[false], f.logs.recoveries[true], f.logs.recoveryConflicts))
	row("**live VMs' addresses released while filling the pool** (must be 0)", fmt.Sprintf("%d in the IPBlocks, %d by resyncs in the log", len(f.fillReleased), f.fillResyncReleased))
	row("total duration", f.total.Round(time.Second))

	b.WriteString("\n#### Refused requests, by reason and by what was happening\n\n")
	b.WriteString("| request | reason | " + phaseSteady + " | " + phaseVMIPAM + " | " + phaseAPIDown + " | total |\n|---|---|---|---|---|---|\n")
	f.refused.mu.Lock()
	type key struct{ op, reason string }
	seen := map[key]bool{}
	var keys []key
	for k := range f.refused.counts {
		if kk := (key{k[0], k[1]}); !seen[kk] {
			seen[kk] = true
			keys = append(keys, kk)
		}
	}
	slices.SortFunc(keys, func(a, b key) int { return strings.Compare(a.op+a.reason, b.op+b.reason) })
	for _, k := range keys {
		n := func(ph string) int { return f.refused.counts[[3]string{k.op, k.reason, ph}] }
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d |\n", k.op, k.reason, n(phaseSteady), n(phaseVMIPAM), n(phaseAPIDown),
			n(phaseSteady)+n(phaseVMIPAM)+n(phaseAPIDown))
	}
	if len(keys) == 0 {
		b.WriteString("| - | none | 0 | 0 | 0 | 0 |\n")
	}
	reasons := make([]string, 0, len(f.refused.samples))
	for r := range f.refused.samples {
		reasons = append(reasons, r)
	}
	slices.Sort(reasons)
	if len(reasons) > 0 {
		b.WriteString("\nSample messages:\n")
		for _, r := range reasons {
			for _, m := range f.refused.samples[r] {
				fmt.Fprintf(&b, "- %s: `%s`\n", r, strings.ReplaceAll(m, "`", "'"))
			}
		}
	}
	f.refused.mu.Unlock()
	if len(f.exitReasons) > 0 {
		b.WriteString("\nvmipam exits nobody asked for:\n")
		for _, r := range f.exitReasons {
			fmt.Fprintf(&b, "- %s\n", strings.ReplaceAll(r, "\n", "\n    "))
		}
	}
	if len(f.logs.resyncs) > 0 {
		b.WriteString("\nResyncs that changed something (vmipam's log):\n")
		for _, r := range f.logs.resyncs {
			fmt.Fprintf(&b, "- %s\n", r)
		}
	}
	if len(f.startFailures) > 0 {
		b.WriteString("\nvmipam starts that failed (retried):\n")
		for _, r := range f.startFailures {
			fmt.Fprintf(&b, "- %s\n", r)
		}
	}
	if len(f.terminatingOverlap) > 0 {
		b.WriteString("\nAddresses seen on a live VM and on a VM still being deleted:\n")
		for _, r := range f.terminatingOverlap[:min(10, len(f.terminatingOverlap))] {
			fmt.Fprintf(&b, "- %s\n", r)
		}
	}
	return b.String()
}

func minMax(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	return fmt.Sprintf("%s / %s", slices.Min(ds).Round(100*time.Millisecond), slices.Max(ds).Round(100*time.Millisecond))
}
