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
