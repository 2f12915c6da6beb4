package replicas

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vmipam/vmipam/test/harness"
)

// TestKillDuringStorm SIGKILLs one of three replicas while 16 clients
// create VirtualMachines without retrying. Creates may fail only around
// the kill (the requests the killed process had in flight, and those sent
// on its connections before the API server noticed them gone): none before
// it, none later than 5s after it. The dead holder's Lease must be taken
// over and deleted within the lease duration plus the clock-skew slack
// plus a margin, after which no IPBlock names it in its claims; the
// survivors must keep renewing their own Leases meanwhile; and no two live
// VMs may share an address. The first row has the storm's pool only; in
// the second, REPLICAS_KILL_POOLS (4) more pools of 20 VMs each make the
// takeover span several pools, as in a cluster with more than one
// (REPLICAS_KILL_POOLS=0 skips the row).
func TestKillDuringStorm(t *testing.T) {
	// Each row's storm pool has a range of its own: the VMs of a row stay
	// when its pools are retired, and in the next row's pool of the same
	// range they would hold half of it (a fast storm then exhausted it).
	for _, tc := range []struct {
		name   string
		cidr   string
		others int
	}{
		{name: "one pool", cidr: "10.60.0.0/19"},
		{name: "more pools", cidr: "10.60.32.0/19", others: envInt(t, "REPLICAS_KILL_POOLS", 4, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name != "one pool" && tc.others == 0 {
				t.Skip("REPLICAS_KILL_POOLS=0")
			}
			killDuringStorm(t, tc.cidr, tc.others)
		})
	}
}

// killDuringStorm is a row of TestKillDuringStorm: a storm on a pool of
// cidr, with n more pools.
func killDuringStorm(t *testing.T, cidr string, n int) {
	s := newSuite(t)
	s.startReplicas(3)
	const (
		pool    = "kill"
		clients = 16
		// failWindow bounds the failures after the kill; takeoverMargin is
		// allowed beyond the lease duration and the slack for the takeover
		// to complete (the survivors look once a retry period, then move
		// the claims and delete the Lease).
		failWindow     = 5 * time.Second
		takeoverMargin = 8 * time.Second
	)
	pad := envDuration(t, "REPLICAS_STORM", 2*time.Second)
	prefix, usable := s.createPool(poolSpec{name: pool, cidr: cidr, cooldown: 30 * time.Second, pendingTTL: time.Minute})
	others := make([]string, n)
	for i := range others {
		others[i] = fmt.Sprintf("kill-%c", 'a'+i)
		s.createPool(poolSpec{name: others[i], cidr: fmt.Sprintf("10.61.%d.0/24", i), cooldown: 30 * time.Second, pendingTTL: time.Minute})
		for j := range 20 {
			name := fmt.Sprintf("%s-%02d", others[i], j)
			err := harness.Poll(s.ctx, 500*time.Millisecond, 15*time.Second, func() error {
				_, err := s.create(s.ctx, name, others[i])
				if isExhausted(err) {
					t.Errorf("EXHAUSTED WHILE FREE: a create in the new pool %s, with %d of its 254 addresses on VMs, was refused: %v", others[i], j, err)
				}
				return err
			})
			if err != nil {
				t.Fatalf("fill the other pools: %v", err)
			}
		}
	}

	led := harness.NewLedger(30*time.Second, 1, harness.Prefixes{prefix})
	st := &storm{s: s, pool: pool, prefix: "kill", led: led, think: 20 * time.Millisecond}
	stopStorm := st.start(clients)
	harness.Sleep(s.ctx, pad)

	all := s.rs.Live()
	victim := all[1]
	s.mark("SIGKILL %s", victim.Holder)
	killed := time.Now()
	victim.Kill()
	seen := s.waitLeaseGone(victim.Holder, leaseDuration+clockSkew+takeoverMargin)
	gone, ok := seen.gone, seen.ok
	s.mark("lease of %s gone: %v", victim.Holder, ok)
	harness.Sleep(s.ctx, pad)
	stopStorm()
	stormEnd := time.Now()

	creates, _, _ := led.Counts()
	failed := led.Failures("create")
	var first, last time.Duration
	var before, late []harness.Failure
	for i, f := range failed {
		d := f.At.Sub(killed)
		if i == 0 {
			first = d
		}
		last = d
		switch {
		case f.At.Before(killed):
			before = append(before, f)
		case d > failWindow:
			late = append(late, f)
		}
	}
	takeover := "not within " + (leaseDuration + clockSkew + takeoverMargin).String()
	if ok {
		takeover = gone.Sub(killed).Round(10 * time.Millisecond).String()
	}
	window := "none"
	if len(failed) > 0 {
		window = fmt.Sprintf("%+.2fs to %+.2fs after the kill", first.Seconds(), last.Seconds())
	}
	t.Logf("%s figures (times relative to the SIGKILL of %s):\n"+
		"  storm              %d clients, creates only, %s; pool %s (%d usable), and %d more pools of 20 VMs\n"+
		"  creates            %d ok, %d failed\n"+
		"  failures           %s\n"+
		"  lease gone after   %s (lease duration %s + slack %s + margin %s allowed)\n"+
		"  the takeover       %s",
		t.Name(), victim.Holder, clients, stormEnd.Sub(killed.Add(-pad)).Round(100*time.Millisecond), prefix, usable, len(others),
		creates, len(failed), window, takeover, leaseDuration, clockSkew, takeoverMargin, seen.describe(killed))
	seen.checkNotEarly(t, victim.Holder)
	if len(failed) > 0 {
		t.Logf("the failed creates:\n%s", strings.Join(failureLines(failed, killed, 10), "\n"))
	}
	if len(before) > 0 {
		t.Errorf("FAILED CREATES BEFORE THE KILL: %d:\n%s", len(before), strings.Join(failureLines(before, killed, 10), "\n"))
	}
	if len(late) > 0 {
		t.Errorf("FAILED CREATES LATER THAN %s AFTER THE KILL: %d:\n%s", failWindow, len(late), strings.Join(failureLines(late, killed, 10), "\n"))
	}
	for _, p := range led.Problems() {
		t.Errorf("%s", p)
	}
	s.checkRenewals("while the killed holder was taken over", all[0], all[2])
	if !ok {
		t.Errorf("SLOW TAKEOVER: the Lease of the killed holder %s is still there %s after the kill: nobody completed the takeover of its claims",
			victim.Holder, time.Since(killed).Round(time.Second))
	} else if d := gone.Sub(killed); d > leaseDuration+clockSkew+takeoverMargin {
		t.Errorf("SLOW TAKEOVER: the Lease of %s was gone only %s after the kill; want at most %s (lease duration + slack + margin)",
			victim.Holder, d.Round(10*time.Millisecond), leaseDuration+clockSkew+takeoverMargin)
	}

	for _, name := range append([]string{pool}, others...) {
		bs, err := s.blocks(s.ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if where := bs.names(victim.Holder); len(where) > 0 {
			if bs.claims[victim.Holder] > 0 {
				t.Errorf("the IPBlocks of %s still claim addresses for the killed holder %s at the end of the row: %s", name, victim.Holder, strings.Join(where, ", "))
			} else {
				t.Logf("the IPBlocks of %s claim nothing for %s, but still name it in %s", name, victim.Holder, strings.Join(where, ", "))
			}
		}
	}
	bs, err := s.blocks(s.ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("claims by holder after the takeover: %v", bs.claims)
	live := s.checkLive("after the takeover", pool, prefix)
	s.checkLabels("after the takeover", pool, prefix)
	var unclaimed []string
	for a, name := range live.byAddr {
		if h, ok := bs.claimedBy[a]; !ok || h == victim.Holder {
			unclaimed = append(unclaimed, fmt.Sprintf("%s (%s, claimed by %q)", a, name, h))
		}
	}
	if len(unclaimed) > 0 {
		t.Errorf("%d live VMs' addresses are claimed by no live holder after the takeover:\n%s", len(unclaimed), summarize(unclaimed, 10))
	}
	s.checkAlive("by the end of the test", all[0], all[2])
}
