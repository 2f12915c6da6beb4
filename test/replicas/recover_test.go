package replicas

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/harness"
)

// TestReplacementRecoversFromCaches replaces one of three replicas run
// with holder slots, as a rollout does, with VMs on every replica: the
// replacement takes the slot its predecessor sealed and recovers the pool
// from its caches, listing no VM, and comes to the state a list gives.
// The proof of the state: the pool is then filled to its last address,
// with no duplicate, and refuses one more. TestCrashCost checks the other
// side: after a SIGKILL, the armed batch is on no VM, and the recovery
// lists every VM.
func TestReplacementRecoversFromCaches(t *testing.T) {
	s := newSuite(t)
	s.startReplicas(3, "--holder-slots")
	const (
		pool = "fromcaches"
		live = 40
	)
	prefix, usable := s.createPool(poolSpec{name: pool, cidr: "10.60.0.0/25", cooldown: 5 * time.Second, pendingTTL: time.Minute})
	led := harness.NewLedger(5*time.Second, 1, harness.Prefixes{prefix})
	for i := range live {
		name := fmt.Sprintf("live-%03d", i)
		rec := &harness.Record{Name: name, Sent: time.Now()}
		vm, err := s.create(s.ctx, name, pool)
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		rec.Resp = time.Now()
		led.Created(rec, vm)
	}
	s.waitBound(pool, live, 30*time.Second)
	labels := s.holderLabels()

	// The replica whose slot labels the most VMs (the API server keeps
	// its connections, so one replica may have had them all).
	byLabel := map[string]int{}
	for _, l := range labels {
		byLabel[l]++
	}
	var old *harness.Replica
	ownVMs := 0
	for _, rep := range s.rs.InRotation() {
		if n := byLabel[pools.HolderLabelValue(rep.Holder)]; old == nil || n > ownVMs {
			old, ownVMs = rep, n
		}
	}
	if ownVMs == 0 {
		t.Fatalf("no VM is labelled for a replica's slot (labels %v): a recovery would prove nothing", byLabel)
	}
	s.mark("replacing %s, whose slot's label %d of %d VMs carry", old.Holder, ownVMs, live)
	began := time.Now()
	rep, err := s.rs.Replace(s.ctx, old, "", 30*time.Second)
	if err != nil {
		t.Fatalf("replace %s: %v", old.Holder, err)
	}
	t.Logf("replacement %s ready %s after the SIGTERM of %s, whose slot labels %d of the %d VMs", rep.Holder, time.Since(began).Round(100*time.Millisecond), old.Holder, ownVMs, live)
	if rep.Holder != old.Holder {
		t.Fatalf("the replacement took slot %s, want %s's", rep.Holder, old.Holder)
	}
	listed, found := recoveryListed(s.logs.get(rep.Index).String(), pool)
	if !found {
		t.Fatalf("%s logged no recovery of pool %s", rep.Holder, pool)
	}
	if listed {
		t.Errorf("%s recovered pool %s by listing every VM, want it from its caches", rep.Holder, pool)
	}

	s.checkLive("after the replacement", pool, prefix)
	fill := s.fill(pool, "fill", usable-live, led)
	t.Logf("filled the pool: %d of %d addresses in %s", fill.Got, fill.Want, fill.Took.Round(10*time.Millisecond))
	switch {
	case fill.Got < fill.Want:
		t.Errorf("only %d of the %d addresses on no VM could be had after the replacement; last refusal: %v", fill.Got, fill.Want, fill.LastErr)
	case !isExhausted(fill.ExtraErr):
		t.Errorf("a create in the full pool: %v; want a denial saying the pool is exhausted", fill.ExtraErr)
	}
	s.checkLive("after filling the pool", pool, prefix)
	for _, p := range led.Problems() {
		t.Errorf("%s", p)
	}
}

// recoveryListed reports whether the last "Recovered pool" line of pool
// in a replica's log says it listed every VM, and whether there is one.
func recoveryListed(log, pool string) (listed, found bool) {
	for line := range strings.Lines(log) {
		var l struct {
			Msg, Pool string
			Listed    bool
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "Recovered pool" || l.Pool != pool {
			continue
		}
		listed, found = l.Listed, true
	}
	return listed, found
}
