package pools

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/test/fixture"
)

// trendStepAt is one status write of a trend test: at (from the start),
// used (allocated plus pending), and whether the sums were complete.
type trendStepAt struct {
	at     time.Duration
	used   int64
	sample bool
}

// TestTrendSeries: the trend is used now minus the oldest sample of the
// last hour, over the time since; samples are kept at most one a minute,
// and none older than an hour, so a series never holds more than 61.
func TestTrendSeries(t *testing.T) {
	tests := map[string]struct {
		steps   []trendStepAt
		window  time.Duration
		change  int64
		samples int
	}{
		"first write":                 {steps: []trendStepAt{{0, 5, true}}, window: 0, change: 0, samples: 1},
		"seconds later, one sample":   {steps: []trendStepAt{{0, 5, true}, {5 * time.Second, 9, true}, {10 * time.Second, 12, true}}, window: 10 * time.Second, change: 7, samples: 1},
		"a sample a minute":           {steps: []trendStepAt{{0, 5, true}, {time.Minute, 9, true}, {2*time.Minute + 30*time.Second, 4, true}}, window: 2*time.Minute + 30*time.Second, change: -1, samples: 3},
		"incomplete sums not sampled": {steps: []trendStepAt{{0, 1, false}, {time.Minute, 3, true}, {3 * time.Minute, 10, false}}, window: 2 * time.Minute, change: 7, samples: 1},
		"nothing sampled yet":         {steps: []trendStepAt{{0, 1, false}, {time.Minute, 3, false}}, window: 0, change: 0, samples: 0},
		"the hour's oldest": {steps: []trendStepAt{{0, 100, true}, {30 * time.Minute, 130, true}, {61 * time.Minute, 200, true}},
			window: 31 * time.Minute, change: 70, samples: 2},
		"the clock went back": {steps: []trendStepAt{{10 * time.Minute, 7, true}, {5 * time.Minute, 9, true}}, window: 0, change: 0, samples: 1},
	}
	// Every 5s for three hours: bounded, and an hour back.
	var long []trendStepAt
	for at := time.Duration(0); at <= 3*time.Hour; at += 5 * time.Second {
		long = append(long, trendStepAt{at: at, used: int64(at / time.Minute), sample: true})
	}
	tests["three hours of writes every 5s"] = struct {
		steps   []trendStepAt
		window  time.Duration
		change  int64
		samples int
	}{steps: long, window: time.Hour, change: 60, samples: trendSamples}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var s trendSeries
			var got vmipamv1.Trend
			for _, st := range tc.steps {
				got = s.note(start.Add(st.at), st.used, st.sample)
				if len(s) > trendSamples {
					t.Fatalf("at %v: %d samples, more than %d", st.at, len(s), trendSamples)
				}
			}
			if got.Window.Duration != tc.window || got.Change != tc.change {
				t.Errorf("trend = %v %+d, want %v %+d", got.Window.Duration, got.Change, tc.window, tc.change)
			}
			if len(s) != tc.samples {
				t.Errorf("%d samples kept, want %d", len(s), tc.samples)
			}
		})
	}
}

// TestTrendClose: a stored trend needs no write for a window that only
// grew by less than a minute; any other change does.
func TestTrendClose(t *testing.T) {
	tr := func(w time.Duration, c int64) *vmipamv1.Trend {
		return &vmipamv1.Trend{Window: metav1.Duration{Duration: w}, Change: c}
	}
	tests := map[string]struct {
		a, b *vmipamv1.Trend
		want bool
	}{
		"both unset":          {nil, nil, true},
		"one unset":           {nil, tr(0, 0), false},
		"same":                {tr(time.Minute, 3), tr(time.Minute, 3), true},
		"window grew 55s":     {tr(time.Minute, 3), tr(time.Minute+55*time.Second, 3), true},
		"window grew 1m":      {tr(time.Minute, 3), tr(2*time.Minute, 3), false},
		"window shrank 1m":    {tr(time.Hour, 3), tr(59*time.Minute, 3), false},
		"change changed":      {tr(time.Minute, 3), tr(time.Minute, 4), false},
		"change and window 0": {tr(0, 0), tr(5*time.Second, 0), true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := trendClose(tc.a, tc.b); got != tc.want {
				t.Errorf("trendClose(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
			}
		})
	}
}

// TestStatusPausedAndTrend: the status writer sets Paused=True with the
// counts while spec.paused is set and Paused=False once it is not, and
// publishes the trend of the pool and of each family; a trend whose window
// only grew is written at most once a minute, while a change of the counts
// is written at the next interval.
func TestStatusPausedAndTrend(t *testing.T) {
	ctx := t.Context()
	clk := clocktesting.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	pool := fixture.Pool("p", fixture.Stored("uid-p"), fixture.WithCIDRs("10.0.0.0/28", "fd00::/124"), fixture.WithDefault())
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithStatusSubresource(&vmipamv1.IPPool{}).
		WithObjects(pool.DeepCopy(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}).Build()
	reg := NewRegistry(Options{Client: c, APIReader: c, Kinds: kinds.Default(), Holder: "vmipam", Clock: clk,
		RunInterval: time.Hour, ResyncInterval: time.Hour, StatusInterval: time.Hour})
	runCtx, stop := context.WithCancel(context.Background())
	var done sync.WaitGroup
	done.Go(func() { _ = reg.Start(runCtx) })
	t.Cleanup(func() { stop(); done.Wait() })
	if err := reg.Ensure(ctx, pool); err != nil {
		t.Fatal(err)
	}
	stored := func() *vmipamv1.IPPool {
		t.Helper()
		got := &vmipamv1.IPPool{}
		if err := c.Get(ctx, client.ObjectKey{Name: "p"}, got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	write := func() *vmipamv1.IPPool {
		t.Helper()
		if err := reg.writeStatus(ctx, reg.Get("p")); err != nil {
			t.Fatal(err)
		}
		return stored()
	}
	admit := func(n int) {
		t.Helper()
		for i := range n {
			if _, err := reg.Admit(ctx, Create{Kind: kinds.VirtualMachine, Namespace: "ns", Ref: fmt.Sprint("ns/vm-", i),
				Ask: Ask{Policy: string(vmipamv1.PreferDualStack)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	trendOf := func(p *vmipamv1.IPPool) []string {
		out := []string{fmt.Sprintf("%v %d", p.Status.Trend.Window.Duration, p.Status.Trend.Change)}
		for _, f := range p.Status.Families {
			out = append(out, fmt.Sprintf("%s %v %d", f.Family, f.Trend.Window.Duration, f.Trend.Change))
		}
		return out
	}

	admit(2)
	first := write()
	if got := fmt.Sprint(trendOf(first)); got != "[0s 0 IPv4 0s 0 IPv6 0s 0]" {
		t.Errorf("trend at the first write: %s, want none yet", got)
	}
	if cond := meta.FindStatusCondition(first.Status.Conditions, vmipamv1.ConditionPaused); cond == nil || cond.Status != metav1.ConditionFalse {
		t.Errorf("Paused condition of a pool not paused: %+v", cond)
	}

	// 30s on, nothing changed but the window: no write.
	clk.Step(30 * time.Second)
	if got := write(); got.ResourceVersion != first.ResourceVersion {
		t.Errorf("a status write for a trend whose window grew 30s: %v", trendOf(got))
	}
	// A create: written at once, with the trend to now.
	admit(1)
	second := write()
	if second.ResourceVersion == first.ResourceVersion {
		t.Fatal("no status write after a create")
	}
	if got := fmt.Sprint(trendOf(second)); got != "[30s 2 IPv4 30s 1 IPv6 30s 1]" {
		t.Errorf("trend 30s after the first write, one dual-stack create since: %s", got)
	}
	// 70s on, the window grew 40s since it was written: no write.
	clk.Step(40 * time.Second)
	if got := write(); got.ResourceVersion != second.ResourceVersion {
		t.Errorf("a status write for a trend whose window grew 40s: %v", trendOf(got))
	}
	// 90s on, a minute since: written.
	clk.Step(20 * time.Second)
	if got := fmt.Sprint(trendOf(write())); got != "[1m30s 2 IPv4 1m30s 1 IPv6 1m30s 1]" {
		t.Errorf("trend 90s after the first write: %s", got)
	}

	// Paused: the condition says so, with the counts.
	paused := pool.DeepCopy()
	paused.Spec.Paused, paused.Generation = true, 2
	if err := reg.Ensure(ctx, paused); err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(write().Status.Conditions, vmipamv1.ConditionPaused)
	want := "spec.paused is set: the pool hands out no new addresses, static requests included; the 0 allocated and 6 pending stay with their objects"
	if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != "Paused" || cond.Message != want || cond.ObservedGeneration != 2 {
		t.Errorf("Paused condition of a paused pool: %+v, want True, Paused, %q, generation 2", cond, want)
	}
}
