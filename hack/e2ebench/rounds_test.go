package main

import (
	"math"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func TestRoundOrder(t *testing.T) {
	declared := []mode{modeWith, modeWithout, modeNoop, modeBaseline}
	reversed := []mode{modeBaseline, modeNoop, modeWithout, modeWith}
	for r, want := range [][]mode{declared, reversed, declared, reversed} {
		if got := roundOrder(r); !slices.Equal(got, want) {
			t.Errorf("roundOrder(%d) = %v, want %v", r, got, want)
		}
	}
}

func TestPairedRatios(t *testing.T) {
	st := func(m mode, round int, rate float64) roundStat {
		return roundStat{mode: m, round: round, created: 100, rate: rate}
	}
	tests := []struct {
		name   string
		rounds []roundStat
		want   []float64
	}{
		{"none", nil, nil},
		{"each round paired, whatever the order within it", []roundStat{
			st(modeWith, 1, 300), st(modeWithout, 1, 500), st(modeNoop, 1, 400),
			st(modeNoop, 2, 200), st(modeWithout, 2, 250), st(modeWith, 2, 220),
		}, []float64{0.75, 1.1}},
		{"a round missing a mode is left out", []roundStat{
			st(modeWith, 1, 300), st(modeWith, 2, 300), st(modeNoop, 2, 600),
		}, []float64{0.5}},
		{"a round that created nothing is left out", []roundStat{
			{mode: modeWith, round: 1}, st(modeNoop, 1, 400), st(modeWith, 2, 100), st(modeNoop, 2, 100),
		}, []float64{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pairedRatios(tt.rounds, modeWith, modeNoop)
			if !slices.EqualFunc(got, tt.want, func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }) {
				t.Errorf("pairedRatios = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestGeomean(t *testing.T) {
	tests := []struct {
		in   []float64
		want float64
	}{
		{[]float64{2}, 2},
		{[]float64{0.5, 2}, 1},
		{[]float64{1, 4, 16}, 4},
	}
	for _, tt := range tests {
		if got := geomean(tt.in); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("geomean(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
	if got := geomean(nil); !math.IsNaN(got) {
		t.Errorf("geomean(nil) = %v, want NaN", got)
	}
	if got := ratios([]float64{0.9, 1.02}); got != "0.90×, 1.02×" {
		t.Errorf("ratios = %q", got)
	}
}

// TestDeployedProbePeriod keeps the scale mode's default probe period
// the Deployment's readinessProbe period.
func TestDeployedProbePeriod(t *testing.T) {
	data, err := os.ReadFile("../../deploy/base/deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, probe, ok := strings.Cut(string(data), "readinessProbe:")
	if !ok {
		t.Fatal("deploy/base/deployment.yaml has no readinessProbe")
	}
	m := regexp.MustCompile(`periodSeconds: (\d+)`).FindStringSubmatch(probe)
	if m == nil {
		t.Fatal("the readinessProbe sets no periodSeconds")
	}
	if want := m[1] + "s"; deployedProbePeriod.String() != want {
		t.Errorf("deployedProbePeriod = %s, the Deployment's readinessProbe period %s", deployedProbePeriod, want)
	}
}
