package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/test/harness"
)

// newLogs is the buffer of every vmipam process's output, for the report
// and for the dump on failure, bounded in memory.
func newLogs() *harness.LogBuffer { return &harness.LogBuffer{Max: 256 << 20} }

// mark writes a line of the test's own into logs, so a reader sees where
// each process begins and ends; it returns the offset of the line.
func mark(logs *harness.LogBuffer, format string, args ...any) int {
	return logs.Mark(fmt.Sprintf("=== chaos %s: "+format, append([]any{time.Now().Format(stamp)}, args...)...))
}

// tail returns the last n lines of logs, repeated lines collapsed.
func tail(logs *harness.LogBuffer, n int) string {
	return strings.Join(harness.Tail(collapse(logs.String()), n), "\n")
}

// scanner lists the pool's IPBlocks and then the namespace from the API
// server every interval during the run and checks each snapshot:
//   - no two VirtualMachines that are not being deleted share an address,
//     and each has one (a VM being deleted that shares its address with a
//     live one is counted apart: vmipam releases before it removes the
//     finalizer, so a user may legitimately see both for a moment);
//   - no live VM holds an address whose persisted cooldown outlasts the VM
//     list by more than a second. The blocks are read first: a VM deleted
//     and released in between is seen deleting, and a deadline still ahead
//     after the VM list means no one may hold the address yet (the persisted
//     deadline is rounded up to the second). VMs created around a vmipam
//     restart are spared: an admission in flight at the crash leaves its
//     address resting until vmipam adopts it, by design.
type scanner struct {
	c        client.Client
	ns, pool string
	space    space
	// restarts returns the periods around vmipam restarts.
	restarts func() []period

	mu          sync.Mutex
	snapshots   int
	dups        map[string]string // key: address and both UIDs -> evidence
	terminating map[string]string // same, one of the two being deleted
	noAddr      map[string]string // VM name -> evidence
	liveCooling map[string]string // address and UID -> evidence
}

// period is a span of time.
type period struct{ from, to time.Time }

func newScanner(c client.Client, ns, pool string, sp space, restarts func() []period) *scanner {
	return &scanner{c: c, ns: ns, pool: pool, space: sp, restarts: restarts, dups: map[string]string{}, terminating: map[string]string{},
		noAddr: map[string]string{}, liveCooling: map[string]string{}}
}

func (s *scanner) run(ctx context.Context, every time.Duration) {
	for harness.Sleep(ctx, every) {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var l vmipamv1.VirtualMachineList
		blocks, err := kubestore.Read(lctx, s.c, s.pool)
		if err == nil {
			err = s.c.List(lctx, &l, client.InNamespace(s.ns))
		}
		cancel()
		if err != nil {
			continue
		}
		s.check(l.Items, cooldowns(blocks), time.Now())
	}
}

// cooldowns gathers the persisted cooldown deadlines of blocks.
func cooldowns(blocks []ipam.Block) map[netip.Addr]time.Time {
	out := map[netip.Addr]time.Time{}
	for _, b := range blocks {
		maps.Copy(out, b.Cooldowns)
	}
	return out
}

func (s *scanner) check(vms []vmipamv1.VirtualMachine, cooling map[netip.Addr]time.Time, at time.Time) {
	restarts := s.restarts()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snapshots++
	holders := map[string][]*vmipamv1.VirtualMachine{}
	for i := range vms {
		vm := &vms[i]
		addrs, err := s.space.addresses(vm)
		if err != nil {
			if vm.DeletionTimestamp == nil {
				s.noAddr[vm.Name] = fmt.Sprintf("snapshot at %s: VirtualMachine %s (uid %s, created %s) has %v",
					at.Format(time.RFC3339Nano), vm.Name, vm.UID, vm.CreationTimestamp.Format(time.RFC3339), err)
			}
			continue
		}
		for _, a := range addrs {
			holders[a.String()] = append(holders[a.String()], vm)
			if until, ok := cooling[a]; ok && vm.DeletionTimestamp == nil && until.After(at.Add(time.Second)) && !nearRestart(vm.CreationTimestamp.Time, restarts) {
				key := a.String() + "/" + string(vm.UID)
				if _, known := s.liveCooling[key]; !known {
					s.liveCooling[key] = fmt.Sprintf("snapshot at %s: %s cools down until %s in the IPBlock while the live VM %s (uid %s, created %s) holds it",
						at.Format(stamp), a, until.Format(stamp), vm.Name, vm.UID, vm.CreationTimestamp.Format(time.RFC3339))
				}
			}
		}
	}
	for addr, hs := range holders {
		for i := range hs {
			for j := i + 1; j < len(hs); j++ {
				a, b := hs[i], hs[j]
				key := addr + "/" + string(a.UID) + "/" + string(b.UID)
				ev := fmt.Sprintf("snapshot at %s: %s on %s (uid %s, created %s%s) and %s (uid %s, created %s%s)",
					at.Format(time.RFC3339Nano), addr, a.Name, a.UID, a.CreationTimestamp.Format(time.RFC3339), deleting(a),
					b.Name, b.UID, b.CreationTimestamp.Format(time.RFC3339), deleting(b))
				if a.DeletionTimestamp == nil && b.DeletionTimestamp == nil {
					s.dups[key] = ev
				} else if _, known := s.terminating[key]; !known {
					s.terminating[key] = ev
				}
			}
		}
	}
}

// nearRestart reports whether a VM created at created (truncated to the
// second) may have been admitted by a vmipam that then died: from 10s
// before a process ended (the webhook timeout and the request around it)
// to 10s after its successor was ready.
func nearRestart(created time.Time, restarts []period) bool {
	for _, p := range restarts {
		if !created.Before(p.from.Add(-10*time.Second)) && !created.After(p.to.Add(10*time.Second)) {
			return true
		}
	}
	return false
}

func deleting(vm *vmipamv1.VirtualMachine) string {
	if vm.DeletionTimestamp == nil {
		return ""
	}
	return fmt.Sprintf(", deleting since %s, finalizers %v", vm.DeletionTimestamp.Format(time.RFC3339), vm.Finalizers)
}

func (s *scanner) results() (snapshots int, dups, terminating, noAddr, liveCooling []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshots, sortedValues(s.dups), sortedValues(s.terminating), sortedValues(s.noAddr), sortedValues(s.liveCooling)
}

func sortedValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// logFacts is what vmipam's own logs say, for the report and for the checks
// that only the logs can support.
type logFacts struct {
	// persistErrs counts "Persisting pool state" errors, the Manager's
	// background store writes failing; maxPersistPerSec is the most in one
	// second, and maxPersistAt that second. Run retries "on the next
	// round", at most every RunInterval (1s) unless kicked.
	persistErrs, maxPersistPerSec int
	maxPersistAt                  string
	// errorLines counts every error-level line.
	errorLines int
	// Resync and recovery reports summed over the run.
	resyncReleased, resyncAdopted, resyncConflicts, recoveryConflicts int
	resyncs                                                           []resyncReport
	leaderLost                                                        int
	// recoveries counts the recoveries, by whether they listed every VM
	// (true) or read the caches (false).
	recoveries map[bool]int
}

// resyncReport is one "Resynced pool" line.
type resyncReport struct {
	at                           time.Time
	released, adopted, conflicts int
	// adoptedFirst names the first addresses adopted and their VMs.
	adoptedFirst []string
}

func (r resyncReport) String() string {
	s := fmt.Sprintf("%s released %d adopted %d conflicts %d", r.at.Format(time.RFC3339), r.released, r.adopted, r.conflicts)
	if len(r.adoptedFirst) > 0 {
		s += " (" + strings.Join(r.adoptedFirst, ", ") + ")"
	}
	return s
}

func analyzeLogs(text string) logFacts {
	var f logFacts
	perSec := map[string]int{}
	for line := range strings.SplitSeq(text, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var l struct {
			Level, TS, Msg               string
			Released, Adopted, Conflicts int
			AdoptedFirst                 []string
			Listed                       bool
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			continue
		}
		if l.Level == "error" {
			f.errorLines++
		}
		switch {
		case l.Msg == "Persisting pool state":
			f.persistErrs++
			perSec[l.TS]++
			if perSec[l.TS] > f.maxPersistPerSec {
				f.maxPersistPerSec, f.maxPersistAt = perSec[l.TS], l.TS
			}
		case l.Msg == "Resynced pool":
			f.resyncReleased += l.Released
			f.resyncAdopted += l.Adopted
			f.resyncConflicts += l.Conflicts
			at, _ := time.Parse(time.RFC3339, l.TS)
			f.resyncs = append(f.resyncs, resyncReport{at: at, released: l.Released, adopted: l.Adopted, conflicts: l.Conflicts, adoptedFirst: l.AdoptedFirst})
		case l.Msg == "Recovered pool":
			f.recoveryConflicts += l.Conflicts
			if f.recoveries == nil {
				f.recoveries = map[bool]int{}
			}
			f.recoveries[l.Listed]++
		case strings.Contains(line, "leader election lost"):
			f.leaderLost++
		}
	}
	return f
}

// collapse shortens runs of lines that differ only in their timestamp, so
// that a log flooded by one message stays readable.
func collapse(text string) string {
	var out []string
	prev, n := "", 0
	flush := func() {
		if n > 1 {
			out = append(out, fmt.Sprintf("    ... the line above %d times in all", n))
		}
	}
	for line := range strings.SplitSeq(text, "\n") {
		key := line
		if i := strings.Index(line, `"ts":"`); i >= 0 && len(line) > i+26 {
			key = line[:i] + line[i+26:]
		}
		if key == prev {
			n++
			continue
		}
		flush()
		out = append(out, line)
		prev, n = key, 1
	}
	flush()
	return strings.Join(out, "\n")
}

// coolingWatch lists the pool's IPBlocks every interval and notes every
// address with a cooldown deadline still ahead. It runs while the pool is
// filled: nothing is deleted then and no recovery is recent, so no address
// may start a cooldown; one that does was released from a live VM.
type coolingWatch struct {
	c    client.Client
	pool string

	mu   sync.Mutex
	seen map[netip.Addr]cooling
}

type cooling struct {
	first time.Time
	until time.Time
}

func newCoolingWatch(c client.Client, pool string) *coolingWatch {
	return &coolingWatch{c: c, pool: pool, seen: map[netip.Addr]cooling{}}
}

func (w *coolingWatch) run(ctx context.Context, every time.Duration) {
	for harness.Sleep(ctx, every) {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		blocks, err := kubestore.Read(lctx, w.c, w.pool)
		cancel()
		if err != nil {
			continue
		}
		now := time.Now()
		for _, dec := range blocks {
			for a, until := range dec.Cooldowns {
				if !until.After(now) {
					continue
				}
				w.mu.Lock()
				if _, ok := w.seen[a]; !ok {
					w.seen[a] = cooling{first: now, until: until}
				}
				w.mu.Unlock()
			}
		}
	}
}

func (w *coolingWatch) results() map[netip.Addr]cooling {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.seen)
}
