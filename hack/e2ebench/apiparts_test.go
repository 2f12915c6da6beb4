package main

import (
	"math"
	"regexp"
	"strings"
	"testing"
	"time"
)

// traces is a profile as `go tool pprof -traces` prints it: a header,
// then each trace from its leaf to its root.
const traces = `File: kube-apiserver
Type: cpu
Duration: 20s, Total samples = 1.5s (7.50%)
-----------+-------------------------------------------------------
      10ms   cel.(*prog).Eval
             k8s.io/apiserver/pkg/admission/plugin/policy/validating.(*validator).Validate
             k8s.io/apiserver/pkg/registry/generic/registry.(*Store).create
             k8s.io/apiextensions-apiserver/pkg/apiserver.(*crdHandler).serveResource.CreateResource.createHandler.func9.2
             net/http.(*conn).serve
-----------+-------------------------------------------------------
     1.20s   runtime.memmove (inline)
             k8s.io/apiserver/pkg/registry/generic/registry.(*Store).create
             k8s.io/apiextensions-apiserver/pkg/apiserver.(*crdHandler).serveResource.CreateResource.createHandler.func9.2
             net/http.(*conn).serve
-----------+-------------------------------------------------------
     200ms   runtime.gcBgMarkWorker
-----------+-------------------------------------------------------
      90ms   runtime.futex
             runtime.notesleep
-----------+-------------------------------------------------------
`

func TestSplitTraces(t *testing.T) {
	parts := []profilePart{
		{"policy", regexp.MustCompile(`/policy/validating\.`)},
		{"create", regexp.MustCompile(`\.CreateResource\.`)},
		{"gc", regexp.MustCompile(`^runtime\.gcBgMarkWorker$`)},
		{"server", regexp.MustCompile(`^net/http\.\(\*conn\)\.serve$`)},
	}
	tests := []struct {
		name      string
		in        string
		want      []float64
		rest      float64
		wantError string
	}{
		// The policy's sample matches the create and the server too, and
		// goes to the first part; the memmove's to the create, not the
		// server; the futex's to none.
		{name: "first part that matches", in: traces, want: []float64{0.01, 1.2, 0.2, 0}, rest: 0.09},
		{name: "no traces", in: "File: kube-apiserver\nType: cpu\n", want: []float64{0, 0, 0, 0}},
		{name: "a trace without a value", in: "-----------+----\n   runtime.futex\n", wantError: `starts with "runtime.futex"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := splitTraces(strings.NewReader(tc.in), parts)
			if tc.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantError) {
					t.Fatalf("error %v, want one with %q", err, tc.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			total := tc.rest
			for i, w := range tc.want {
				total += w
				if math.Abs(got.parts[i]-w) > 1e-9 {
					t.Errorf("%s: %v s, want %v", parts[i].name, got.parts[i], w)
				}
			}
			if math.Abs(got.rest-tc.rest) > 1e-9 || math.Abs(got.total-total) > 1e-9 {
				t.Errorf("rest %v and total %v, want %v and %v", got.rest, got.total, tc.rest, total)
			}
		})
	}
}

// TestAPIServerPartsSection scales each part's share of a mode's profile
// by the API server's CPU per create in the mode's first round, and says
// when a round was shorter than the profile.
func TestAPIServerPartsSection(t *testing.T) {
	split := func(vals ...float64) *profileSplit {
		s := &profileSplit{parts: make([]float64, len(apiserverParts))}
		for i, v := range vals[:len(vals)-1] {
			s.parts[i] = v
			s.total += v
		}
		s.rest = vals[len(vals)-1]
		s.total += s.rest
		return s
	}
	round := func(m mode, created int, rate, apiserver float64) roundStat {
		return roundStat{mode: m, round: 1, created: created, rate: rate, cpu: cpuSample{procs: map[string]float64{"kube-apiserver": apiserver}}}
	}
	// With vmipam: 4 s of the API server's CPU for 1,000 creates, a
	// quarter of its profile in the policy; through the no-op: 3 s, none.
	with := split(1, 1, 0, 0, 0, 0, 0, 0, 0, 2)
	noop := split(0, 1, 0, 0, 0, 0, 0, 0, 0, 3)
	tests := []struct {
		name   string
		rounds []roundStat
		split  apiserverSplit
		want   []string
		not    []string
	}{
		{"both modes", []roundStat{round(modeWith, 1000, 50, 4), round(modeNoop, 1000, 50, 3)}, apiserverSplit{modeWith: with, modeNoop: noop},
			[]string{
				"| vmipam's admission policies (ValidatingAdmissionPolicy, CEL) | 1.000 | 0.000 | +1.000 |",
				"| the mutating webhook's call (the review's encoding, the round trip, the answer's decoding, the patch) | 1.000 | 0.750 | +0.250 |",
				"| the rest | 2.000 | 2.250 | -0.250 |",
				"| all | 4.000 | 3.000 | +1.000 |",
			}, []string{"lasted less than the profile"}},
		{"a short round", []roundStat{round(modeWith, 1000, 500, 4), round(modeNoop, 1000, 50, 3)}, apiserverSplit{modeWith: with, modeNoop: noop},
			[]string{"The first round with vmipam (2.0 s) lasted less than the profile", "| all | 4.000 | 3.000 | +1.000 |"}, nil},
		{"no profile of the no-op's round", []roundStat{round(modeWith, 1000, 50, 4), round(modeNoop, 1000, 50, 3)}, apiserverSplit{modeWith: with},
			nil, []string{"Where the API server's CPU"}},
		{"no no-op round", []roundStat{round(modeWith, 1000, 50, 4)}, apiserverSplit{modeWith: with, modeNoop: noop},
			nil, []string{"Where the API server's CPU"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &report{opts: options{profile: 10 * time.Second}, rounds: tc.rounds, apiserverSplit: tc.split}
			var b strings.Builder
			r.apiserverPartsSection(&b)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("no %q in:\n%s", w, b.String())
				}
			}
			for _, n := range tc.not {
				if strings.Contains(b.String(), n) {
					t.Errorf("%q in:\n%s", n, b.String())
				}
			}
		})
	}
}
