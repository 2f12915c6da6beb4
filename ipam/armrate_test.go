package ipam

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestArmBatchFollowsTheRate: the arm batch grows with the rate of
// allocations to about a second's worth, up to a 32nd of the pool, so a
// fast stream writes its block to arm about once a second; a slow one, or
// a configured batch, arms no more than the configured batch, which is
// what a crash may rest.
func TestArmBatchFollowsTheRate(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		cidr     string
		armBatch int
		step     time.Duration
		n        int
		// maxArmed bounds the armed addresses the store ever shows;
		// maxWrites the writes for the n allocations.
		maxArmed, maxWrites int
	}{
		{name: "200/s in a /18: a second's worth", cidr: "10.0.0.0/18", step: 5 * time.Millisecond, n: 2000,
			maxArmed: 200, maxWrites: 30},
		{name: "200/s with a configured batch", cidr: "10.0.0.0/18", armBatch: 32, step: 5 * time.Millisecond, n: 2000,
			maxArmed: 32, maxWrites: 70},
		{name: "one every 2s: the default batch", cidr: "10.0.0.0/18", step: 2 * time.Second, n: 100,
			maxArmed: 32, maxWrites: 8},
		{name: "200/s in a /24: a 32nd of the pool", cidr: "10.0.0.0/24", step: 5 * time.Millisecond, n: 200,
			maxArmed: 7, maxWrites: 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, clk, st := newTestManager(t, testPool{cidr: tt.cidr, low: 32, target: 128, high: 512, armBatch: tt.armBatch,
				cooldown: time.Hour, pendingTT: time.Hour})
			armed := 0
			before := st.Puts()
			for i := range tt.n {
				if _, err := m.Allocate(ctx, Reservation{Token: fmt.Sprint(i), Namespace: fmt.Sprint("ns", i%64)}); err != nil {
					t.Fatalf("allocation %d: %v", i, err)
				}
				clk.Step(tt.step)
				blocks, err := st.List(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, b := range blocks {
					armed = max(armed, countBits(b.Armed["h1"]))
				}
			}
			writes := st.Puts() - before
			t.Logf("%d allocations: %d writes, at most %d armed", tt.n, writes, armed)
			if armed > tt.maxArmed {
				t.Errorf("the store showed %d armed; want at most %d", armed, tt.maxArmed)
			}
			if writes > tt.maxWrites {
				t.Errorf("%d writes for %d allocations; want at most %d", writes, tt.n, tt.maxWrites)
			}
		})
	}
}

func countBits(bm *Bitmap) int {
	if bm == nil {
		return 0
	}
	n := 0
	for off := range BlockSize {
		if bm.Has(off) {
			n++
		}
	}
	return n
}

// TestArmBatchMeetsABurst: a burst out of idle (1,000 allocations a
// second, after a pause) is met at its rate within its first tenth of a
// second: the arm batch, and with it the point where Run is kicked to arm
// more, follows the burst's extrapolated rate, not the configured batch
// that the last full second (none) leaves, so the ready list is refilled
// before the burst's first allocations empty it. Before rateWindow has
// passed, a handful of allocations counts as if spread over it.
func TestArmBatchMeetsABurst(t *testing.T) {
	ctx := context.Background()
	m, clk, _ := newTestManager(t, testPool{cidr: "10.0.0.0/18", low: 32, target: 128, high: 512,
		cooldown: time.Hour, pendingTT: time.Hour})
	clk.Step(time.Minute) // idle: no rate left
	// At 100 allocations: a second's worth is 1,000, capped at a 32nd
	// of the pool (armMax, 511).
	want := map[int]int{1: 32, 5: 50, 20: 200, 100: m.armMax}
	for i := 1; i <= 100; i++ {
		if _, err := m.Allocate(ctx, Reservation{Token: fmt.Sprint("b", i), Namespace: fmt.Sprint("ns", i%64)}); err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		clk.Step(time.Millisecond)
		if w, ok := want[i]; ok {
			m.mu.Lock()
			got := m.armBatchLocked(m.clock.Now())
			m.mu.Unlock()
			if got != w {
				t.Errorf("after %d allocations in %d ms: arm batch %d; want %d", i, i, got, w)
			}
		}
	}
	// And the marks claim ahead of it: four seconds of it, up to high.
	if _, target, _ := m.targets(); target != 512 {
		t.Errorf("target free after the burst's first 100 ms: %d; want 512 (4 s at 1,000/s, capped at the high watermark)", target)
	}
}
