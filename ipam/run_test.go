package ipam

// A regression test for a hot loop the chaos suite (test/chaos) found,
// fixed in db0cbbd: the chaos run hits it only when the timing is right,
// this test forces it every time.

import (
	"context"
	"errors"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunWaitsAfterAFailedWrite: Manager.Run retries failed background
// writes on its next round, every interval. With the free list above the
// high watermark while the store is unreachable (the API server away), it
// must not retry without pause. It used to: advance() kicks Run on each
// pass while the list is too long and the failed give-back puts the
// addresses back, so Run looped at once, writing and logging as fast as it
// could (over a hundred failed writes a second in the chaos run).
func TestRunWaitsAfterAFailedWrite(t *testing.T) {
	const cooldown = 5 * time.Second
	ctx := t.Context()
	m, clk, st := newTestManager(t, testPool{cidr: "10.96.0.0/24", low: 1, target: 2, high: 4, cooldown: cooldown, pendingTT: time.Minute})
	// Ten VMs come and go: ten addresses cool down, then all are free at
	// once, well above the high watermark, just as the store goes away.
	var addrs []netip.Addr
	for i := range 10 {
		tok, uid := "t"+strconv.Itoa(i), "u"+strconv.Itoa(i)
		a, err := m.Allocate(ctx, Reservation{Token: tok})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Bind(Owner{Token: tok, UID: uid}); err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, a)
	}
	for i, a := range addrs {
		if err := m.Release(a, Owner{UID: "u" + strconv.Itoa(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	st.fail = errors.New("connection refused")
	st.mu.Unlock()
	clk.Step(cooldown + time.Second)
	before := st.Puts()
	var failures atomic.Int64
	runCtx, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	m.Run(runCtx, time.Second, func(error) { failures.Add(1) })
	writes := st.Puts() - before
	// Two rounds in two seconds, a kick or two, a few retries each.
	if writes > 50 {
		t.Errorf("HOT LOOP: with the store failing and %d free addresses above the high watermark of 4, Run attempted %d writes and reported %d failures in 2s "+
			"(interval 1s): it retries at once instead of on its next round", m.Snapshot().Free, writes, failures.Load())
	}
}
