package replicas

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/api/scheme"
	"github.com/vmipam/vmipam/test/harness"
)

// TestChurnOneSmallPool runs clients that create and delete VMs through
// three replicas on one /26 (62 usable addresses), for REPLICAS_CHURN
// seconds (20) each row, and checks that the replicas behave as one pool:
//
//   - below the pool (4 clients keeping at most 8 VMs each, cooldown 2s):
//     no create is refused at all;
//   - above it (6 clients keeping at most 12, cooldown 8s, 72 wanted):
//     every refusal as exhausted is checked against the test's own
//     ledger: at the moment of the refusal, the VMs that may have held an
//     address (created or being created, and not gone for a cooldown
//     since) must account for every usable address.
//
// Refusals are printed by cause. "Below" bounds the rate as well as the
// VMs: every delete keeps its address cooling for the cooldown, so a
// client that deletes as fast as the API server answers wants far more
// than its VMs.
func TestChurnOneSmallPool(t *testing.T) {
	s := newSuite(t)
	s.startReplicas(3)
	d := time.Duration(envInt(t, "REPLICAS_CHURN", 20, 1)) * time.Second
	wc, err := client.NewWithWatch(s.cl.Config, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range []struct {
		name            string
		cidr, cidr6     string
		clients, maxOwn int
		cooldown        time.Duration
		// think is the mean pause between a client's requests: below the
		// pool, what the clients hold and what cools down must stay
		// under 62 (4 clients at about 3 requests a second, 40% of them
		// deletes: 32 live at most and about 10 cooling).
		think           time.Duration
		refusalsAllowed bool
	}{
		{name: "below", cidr: "10.60.0.0/26", clients: 4, maxOwn: 8, cooldown: 2 * time.Second, think: 300 * time.Millisecond},
		{name: "above", cidr: "10.60.1.0/26", clients: 6, maxOwn: 12, cooldown: 8 * time.Second, think: 50 * time.Millisecond, refusalsAllowed: true},
		// Dual-stack, below the pool in both families: each create takes
		// an address of each from the replica it reaches.
		{name: "below-dual", cidr: "10.60.2.0/26", cidr6: "fd00:60::/122", clients: 4, maxOwn: 8, cooldown: 2 * time.Second, think: 300 * time.Millisecond},
	} {
		pool := "churn-" + row.name
		prefix, usable := s.createPool(poolSpec{name: pool, cidr: row.cidr, cidr6: row.cidr6, cooldown: row.cooldown, pendingTTL: time.Minute})
		prefixes := []netip.Prefix{prefix}
		if row.cidr6 != "" {
			prefixes = append(prefixes, netip.MustParsePrefix(row.cidr6))
		}
		led := harness.NewLedger(row.cooldown, len(prefixes), harness.Prefixes(prefixes))
		tr := harness.NewTracker(wc, s.ns)
		tctx, stopTracker := context.WithCancel(s.ctx)
		var trDone sync.WaitGroup
		trDone.Go(func() { tr.Run(tctx) })
		st := &storm{s: s, pool: pool, prefix: pool, led: led, maxOwn: row.maxOwn, deleteP: 0.4, think: row.think, dual: row.cidr6 != ""}
		began := time.Now()
		stop := st.start(row.clients)
		time.Sleep(d)
		stop()
		creates, deletes, _ := led.Counts()
		fails := led.Failures("create")
		causes := map[string]int{}
		first := map[string]string{}
		var wrong []string
		judged := 0
		for _, f := range fails {
			c := refusalCause(f.Err)
			if causes[c]++; causes[c] == 1 {
				first[c] = fmt.Sprintf("%s at %+.3fs", f.Err, f.At.Sub(began).Seconds())
			}
			if !isExhausted(f.Err) {
				continue
			}
			judged++
			if busy := maybeBusy(led, f.Sent, f.At, tr.ExactGoneAt, time.Second); busy < usable {
				wrong = append(wrong, fmt.Sprintf("%s at %+.3fs: at most %d of %d usable addresses could have been held: %v",
					f.Name, f.At.Sub(began).Seconds(), busy, usable, f.Err))
			}
		}
		// How long the refused admissions took: an exhausted refusal may
		// wait for other replicas to answer, within the API server's
		// deadline.
		var waits []time.Duration
		for _, f := range fails {
			if isExhausted(f.Err) {
				waits = append(waits, f.At.Sub(f.Sent))
			}
		}
		var lines []string
		for c, n := range causes {
			lines = append(lines, fmt.Sprintf("| %s | %d | %s |", c, n, first[c]))
		}
		sort.Strings(lines)
		t.Logf("row %s: %d clients keeping at most %d VMs on %s (%d usable), cooldown %s, for %s: %d creates, %d deletes, %d creates refused, %d deletes failed; exhausted refusals checked against the ledger: %d, wrong: %d; their answers took p50 %v, p99 %v, max %v\n| refused because | creates | first |\n|---|---|---|\n%s",
			row.name, row.clients, row.maxOwn, row.cidr, usable, row.cooldown, d, creates, deletes, len(fails), len(led.Failures("delete")), judged, len(wrong),
			quantile(waits, 50), quantile(waits, 99), quantile(waits, 100), strings.Join(lines, "\n"))
		if p := led.Problems(); len(p) > 0 {
			t.Errorf("row %s: %d violations:\n%s", row.name, len(p), summarize(p, 10))
		}
		if !row.refusalsAllowed && len(fails) > 0 {
			t.Errorf("row %s: %d creates refused while the clients want fewer addresses than the pool has:\n%s",
				row.name, len(fails), strings.Join(failureLines(fails, began, 10), "\n"))
		}
		if len(wrong) > 0 {
			t.Errorf("row %s: %d refusals as exhausted while the pool had addresses left:\n%s", row.name, len(wrong), summarize(wrong, 10))
		}
		if fs := led.Failures("delete"); len(fs) > 0 {
			t.Errorf("row %s: %d deletes failed:\n%s", row.name, len(fs), strings.Join(failureLines(fs, began, 10), "\n"))
		}
		// The row's VMs go before the next row starts.
		s.deleteAll(led, 60*time.Second)
		stopTracker()
		trDone.Wait()
	}
}

// maybeBusy counts the VMs of the ledger that may have held an address at
// some moment in [from, to]: sent before to, and not seen gone, plus the
// cooldown and slack, before from. A VM whose create failed held none
// once the answer came (its reservation is cancelled), so only the
// successful ones count, with those still in flight at the end counted by
// the caller's choice of to.
func maybeBusy(l *harness.Ledger, from, to time.Time, goneAt func(name string) (time.Time, bool), slack time.Duration) int {
	held := map[netip.Addr]bool{}
	busy := 0
	for _, rec := range l.Records() {
		if rec.Sent.After(to) {
			continue
		}
		if !rec.DeleteIssued.IsZero() && rec.DeleteIssued.Before(from) {
			if at, ok := goneAt(rec.Name); ok && at.Add(l.Cooldown()+slack).Before(from) {
				continue
			}
		}
		// One address per VM: the first family's.
		if len(rec.Addrs) > 0 && !held[rec.Addrs[0]] {
			held[rec.Addrs[0]] = true
			busy++
		}
	}
	// Creates answered with an error after from may have held a
	// reservation meanwhile; they are not in byName. Count those failing
	// for another reason than exhaustion generously as one each.
	for _, f := range l.Failures("create") {
		if !f.Sent.After(to) && !f.At.Before(from) && !isExhausted(f.Err) {
			busy++
		}
	}
	return busy
}

// refusalCause names why a create failed, for the table.
func refusalCause(err error) string {
	msg := err.Error()
	switch {
	case isExhausted(err):
		return "exhausted"
	case strings.Contains(msg, "did not hand it over in time"), strings.Contains(msg, "not running"):
		return "holder did not answer"
	case strings.Contains(msg, "still recovering"), strings.Contains(msg, "is recovering"):
		return "not ready"
	case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return "timeout"
	}
	if len(msg) > 80 {
		msg = msg[:80]
	}
	return "other: " + msg
}

// quantile returns the p-th percentile of ds (which it sorts), rounded.
func quantile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, len(ds)*p/100)].Round(100 * time.Microsecond)
}
