package ipam

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestProperties runs thousands of random operation sequences and checks
// the invariants after every step and, at the end, that nothing leaked.
func TestProperties(t *testing.T) {
	sequences, steps := 2000, 200
	switch {
	case testing.Short():
		sequences = 200
	case raceEnabled:
		sequences = 600
	}
	// IPAM_SEQUENCES=N runs N sequences instead, for a longer search;
	// IPAM_SEED=S runs only sequence S, to replay a failure.
	if n, err := strconv.Atoi(os.Getenv("IPAM_SEQUENCES")); err == nil && n > 0 {
		sequences = n
	}
	judged := 0
	for seed := range uint64(sequences) {
		if s := os.Getenv("IPAM_SEED"); s != "" && s != fmt.Sprint(seed) {
			continue
		}
		judged += runSequence(t, seed, steps)
	}
	// Each was checked: none while another live holder held an address
	// that the store showed free.
	t.Logf("refusals as exhausted after reading the other holders' blocks, each judged right: %d", judged)
}

// regressionSeeds are sequences that once broke an invariant, run
// whatever the number of sequences (-race and -short run fewer).
var regressionSeeds = []struct {
	seed uint64
	why  string
}{
	// A claim whose write failed unanswered and did not land left its
	// addresses marked unhanded; one of them, claimed and bound by
	// another holder since, came back in a takeover whose write failed
	// but landed, and the read after it freed the live address.
	{717, "a stale unhanded mark freed a live address taken over"},
}

func TestPropertyRegressions(t *testing.T) {
	for _, r := range regressionSeeds {
		t.Run(fmt.Sprint(r.seed), func(t *testing.T) {
			t.Log(r.why)
			runSequence(t, r.seed, 200)
		})
	}
}

// runSequence runs the random operation sequence of seed for steps
// steps, checking the invariants after each, and returns the refusals
// as exhausted it judged.
func runSequence(t *testing.T, seed uint64, steps int) int {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	low := rng.IntN(3)
	target := low + 1 + rng.IntN(4)
	high := target + rng.IntN(6)
	maxPending := 0
	if rng.IntN(2) == 0 {
		maxPending = 1 + rng.IntN(4)
	}
	h, err := newHarness(rng.IntN(len(harnessPools)),
		time.Duration(rng.IntN(60))*time.Second, time.Duration(1+rng.IntN(30))*time.Second, low, target, high, maxPending, 1+rng.IntN(3))
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	if seed%2 == 1 {
		h.indexBlocks()
	}
	for i := range steps {
		if err := h.step(byte(rng.UintN(256)), rng.Uint32()); err != nil {
			t.Fatalf("seed %d step %d: %v\ntrace:\n%s", seed, i, err, h.trace())
		}
	}
	if err := h.drain(); err != nil {
		t.Fatalf("seed %d drain: %v\ntrace:\n%s", seed, err, h.trace())
	}
	return h.exhaustedJudged
}

// FuzzOperations feeds arbitrary operation sequences to the same model.
func FuzzOperations(f *testing.F) {
	f.Add([]byte{0, 0, 0, 5, 1, 7, 2, 9, 200, 11, 0, 14, 0, 3, 1})
	f.Add([]byte{4, 3, 4, 3, 0, 1, 0, 2, 13, 2, 0, 0, 11, 0, 14, 4, 5, 0, 9, 255})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 12, 0, 11, 0, 14, 8, 6, 0, 6, 1, 8, 0, 10, 90, 15, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		h, err := newHarness(int(data[0]), 10*time.Second, 5*time.Second, int(data[1]%3), 3, 5, int(data[1]/3%4), 1+int(data[0]/8%3))
		if err != nil {
			t.Fatal(err)
		}
		if data[1]&0x80 != 0 {
			h.indexBlocks()
		}
		for i := 2; i+1 < len(data) && i < 2+2*500; i += 2 {
			if err := h.step(data[i], uint32(data[i+1])*2654435761); err != nil {
				t.Fatalf("step %d: %v\ntrace:\n%s", i/2, err, h.trace())
			}
		}
		if err := h.drain(); err != nil {
			t.Fatalf("drain: %v\ntrace:\n%s", err, h.trace())
		}
	})
}
