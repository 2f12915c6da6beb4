package main

import (
	"bytes"
	"image/png"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWriteChart draws recorded-like latencies: every mode, one mode, and
// none.
func TestWriteChart(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	latencies := func(n int, median time.Duration) []time.Duration {
		lat := make([]time.Duration, n)
		for i := range lat {
			lat[i] = time.Duration(float64(median) * rng.ExpFloat64())
		}
		sortDur(lat)
		return lat
	}
	tests := map[string]struct {
		lat     map[mode][]time.Duration
		wantErr bool
	}{
		"every mode": {lat: map[mode][]time.Duration{
			modeWith:     latencies(5000, 4*time.Millisecond),
			modeWithout:  latencies(5000, 2*time.Millisecond),
			modeNoop:     latencies(5000, 3*time.Millisecond),
			modeBaseline: latencies(500, 80*time.Millisecond),
		}},
		"one mode, one latency": {lat: map[mode][]time.Duration{modeWith: {3 * time.Millisecond}}},
		"no latencies":          {wantErr: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			r := &report{opts: options{n: 5000, c: 16}}
			for m, lat := range tt.lat {
				r.modes[m].lat = lat
			}
			path := filepath.Join(t.TempDir(), "e2e-bench.png")
			err := writeChart(path, r)
			if tt.wantErr {
				if err == nil {
					t.Fatal("writeChart drew a chart of nothing")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := png.DecodeConfig(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Width != 1100 || cfg.Height != 1000 {
				t.Errorf("chart is %dx%d, want 1100x1000", cfg.Width, cfg.Height)
			}
			if out := os.Getenv("E2EBENCH_CHART_OUT"); out != "" && name == "every mode" {
				// A look at the chart: E2EBENCH_CHART_OUT=/tmp/chart.png.
				if err := os.WriteFile(out, raw, 0o644); err != nil {
					t.Error(err)
				}
			}
		})
	}
}
