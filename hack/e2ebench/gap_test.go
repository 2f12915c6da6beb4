package main

import (
	"strings"
	"testing"
	"time"
)

func TestFloorGap(t *testing.T) {
	stats := func(n int, elapsed time.Duration, busy, softirq float64, procs map[string]float64) *modeStats {
		return &modeStats{lat: make([]time.Duration, n), elapsed: elapsed, cpu: cpuSample{procs: procs, busy: busy, softirq: softirq}}
	}
	// 1,000 creates each: 3.6 s of the machine with vmipam, 3.2 s through
	// the no-op webhook; the 0.4 s between them is 0.25 the API server's,
	// 0.2 vmipam's, 0.05 etcd's and -0.1 this program's.
	with := stats(1000, 1800*time.Millisecond, 3.6, 0.1, map[string]float64{"kube-apiserver": 2.25, "vmipam": 0.5, "etcd": 0.25, "e2ebench": 0.5})
	noop := stats(1000, 1600*time.Millisecond, 3.2, 0.1, map[string]float64{"kube-apiserver": 2.0, "vmipam": 0.3, "etcd": 0.2, "e2ebench": 0.6})
	// The same, with 0.05 s of the no-op's e2ebench moved to its stand-in
	// Service's process.
	noopProxied := stats(1000, 1600*time.Millisecond, 3.2, 0.1, map[string]float64{"kube-apiserver": 2.0, "vmipam": 0.3, "etcd": 0.2, "e2ebench": 0.55, "lbproxy": 0.05})
	// And 0.15 s of the rest moved to the no-op's own process.
	noopOwn := stats(1000, 1600*time.Millisecond, 3.2, 0.1, map[string]float64{"kube-apiserver": 2.0, "vmipam": 0.3, "etcd": 0.2, "e2ebench": 0.4, "lbproxy": 0.05,
		"noopwebhook": 0.15})
	tests := []struct {
		name string
		opts options
		noop *modeStats
		want []string
		not  []string
	}{
		{"without a fleet", options{}, noop, []string{
			"3.60 ms with vmipam, 3.20 ms through the no-op webhook (0.89× by that measure; 0.89× measured)",
			"at most 3.37 ms, 0.17 ms more", "it cost 0.40 ms more",
			"| kube-apiserver | 2.250 | 2.000 | +0.250 | 62% |",
			"| vmipam | 0.500 | 0.300 | +0.200 | 50% |",
			"| e2ebench | 0.500 | 0.600 | -0.100 | -25% |",
			"| kernel softirq | 0.100 | 0.100 | +0.000 | 0% |",
			"| other processes | 0.000 | 0.000 | +0.000 | 0% |",
		}, []string{"stand-in", "lbproxy"}},
		{"the scale mode names the stand-in for the Service", options{fleet: 100000, noop: true}, noop,
			[]string{"stand-in for the Service", "reached directly (-noop-service=false)"}, []string{"lbproxy"}},
		{"the no-op's stand-in Service is a row of its own", options{fleet: 100000, noop: true, noopService: true}, noopProxied, []string{
			"no-op webhook's server behind the same proxy run as a process of its own (lbproxy)",
			"| e2ebench | 0.500 | 0.550 | -0.050 | -13% |",
			"| lbproxy | 0.000 | 0.050 | -0.050 | -13% |",
			"| vmipam | 0.500 | 0.300 | +0.200 | 50% |",
		}, []string{"reached directly"}},
		{"the no-op's own process is a row of its own", options{fleet: 100000, noop: true, noopService: true, noopProcess: true}, noopOwn, []string{
			"the no-op server and finalizer remover run in a process of their own (noopwebhook)",
			"| e2ebench | 0.500 | 0.400 | +0.100 | 25% |",
			"| noopwebhook | 0.000 | 0.150 | -0.150 | -38% |",
			"| lbproxy | 0.000 | 0.050 | -0.050 | -13% |",
		}, []string{"reached directly", "less the no-op server"}},
		{"the no-op's own process, reached directly", options{fleet: 100000, noop: true, noopProcess: true}, noopOwn,
			[]string{"reached directly (-noop-service=false), in a process of its own with the finalizer remover (noopwebhook)"},
			[]string{"less the no-op server"}},
		{"no stand-in for the no-op outside the scale mode", options{noop: true, noopService: true}, noop, nil, []string{"stand-in", "lbproxy"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &report{opts: tt.opts}
			var b strings.Builder
			r.floorGap(&b, with, tt.noop)
			got := b.String()
			for _, s := range tt.want {
				if !strings.Contains(got, s) {
					t.Errorf("floorGap wrote\n%s\nwithout %q", got, s)
				}
			}
			for _, s := range tt.not {
				if strings.Contains(got, s) {
					t.Errorf("floorGap wrote %q:\n%s", s, got)
				}
			}
		})
	}
	t.Run("nothing without the machine's CPU", func(t *testing.T) {
		var b strings.Builder
		(&report{}).floorGap(&b, stats(10, time.Second, 0, 0, map[string]float64{}), noop)
		if b.Len() != 0 {
			t.Errorf("floorGap wrote %q, want nothing", b.String())
		}
	})
}

func TestFloorGapWithinMargin(t *testing.T) {
	// 3.3 ms against 3.2: 0.1 ms more, less than the 0.17 the goal allows.
	with := &modeStats{lat: make([]time.Duration, 1000), elapsed: time.Second,
		cpu: cpuSample{procs: map[string]float64{"vmipam": 0.4}, busy: 3.3}}
	noop := &modeStats{lat: make([]time.Duration, 1000), elapsed: time.Second,
		cpu: cpuSample{procs: map[string]float64{"vmipam": 0.3}, busy: 3.2}}
	var b strings.Builder
	(&report{}).floorGap(&b, with, noop)
	if got := b.String(); !strings.Contains(got, "| vmipam | 0.400 | 0.300 | +0.100 | n/a |") || !strings.Contains(got, "it cost 0.10 ms more") {
		t.Errorf("floorGap wrote\n%s\nwant shares n/a when the difference is within the goal's margin", got)
	}
}

func TestFloorGapCheaper(t *testing.T) {
	with := &modeStats{lat: make([]time.Duration, 1000), elapsed: time.Second, cpu: cpuSample{procs: map[string]float64{}, busy: 3.47}}
	noop := &modeStats{lat: make([]time.Duration, 1000), elapsed: time.Second, cpu: cpuSample{procs: map[string]float64{}, busy: 3.53}}
	var b strings.Builder
	(&report{}).floorGap(&b, with, noop)
	if got := b.String(); !strings.Contains(got, "it cost 0.06 ms less") {
		t.Errorf("floorGap wrote\n%s\nwant a create with vmipam that costs less said so", got)
	}
}

func TestFloorGapNoDifference(t *testing.T) {
	s := &modeStats{lat: make([]time.Duration, 100), elapsed: time.Second,
		cpu: cpuSample{procs: map[string]float64{"vmipam": 0.1}, busy: 0.3}}
	var b strings.Builder
	(&report{}).floorGap(&b, s, s)
	if got := b.String(); !strings.Contains(got, "| vmipam | 1.000 | 1.000 | +0.000 | n/a |") {
		t.Errorf("floorGap wrote\n%s\nwant shares n/a when the two cost the same", got)
	}
}
