package main

import (
	"math"
	"strings"
	"testing"
)

func TestCreateGoalRow(t *testing.T) {
	for _, tc := range []struct {
		name          string
		with, noop    float64
		stamped       bool
		measured, met string
	}{
		{name: "met", with: 393, noop: 361, measured: "1.09× (393 vs 361 VM/s)", met: "**yes**"},
		{name: "at the goal", with: 95, noop: 100, measured: "0.95× (95.0 vs 100 VM/s)", met: "**yes**"},
		{name: "not met", with: 354, noop: 387, measured: "0.91× (354 vs 387 VM/s)", met: "**no**"},
		{name: "no no-op creates", with: 354, noop: math.NaN(), measured: "n/a (354 vs n/a VM/s)", met: "not measured"},
		// A stamped floor is not the goal's: the row says what it was
		// measured against and gives no verdict either way.
		{name: "stamped floor above", with: 393, noop: 361, stamped: true,
			measured: "1.09× (393 vs 361 VM/s) against a no-op webhook that writes a stamp as large as vmipam's (-noop-stamp)", met: "– (not the goal's floor)"},
		{name: "stamped floor below", with: 300, noop: 361, stamped: true,
			measured: "0.83× (300 vs 361 VM/s) against a no-op webhook that writes a stamp as large as vmipam's (-noop-stamp)", met: "– (not the goal's floor)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cells := strings.Split(strings.Trim(createGoalRow(tc.with, tc.noop, tc.stamped), "| "), " | ")
			if len(cells) != 3 {
				t.Fatalf("row has %d cells, want 3: %q", len(cells), cells)
			}
			if !strings.HasPrefix(cells[0], "create throughput with vmipam ≥ 0.95 × the floor") {
				t.Errorf("goal = %q", cells[0])
			}
			if cells[1] != tc.measured {
				t.Errorf("measured = %q, want %q", cells[1], tc.measured)
			}
			if cells[2] != tc.met {
				t.Errorf("met = %q, want %q", cells[2], tc.met)
			}
		})
	}
}
