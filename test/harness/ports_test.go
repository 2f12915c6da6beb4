package harness

import "testing"

// TestFreePorts: the ports handed to vmipam are distinct and lie below the
// kernel's ephemeral range, where no outgoing connection takes them.
func TestFreePorts(t *testing.T) {
	lo, hi := portRange()
	if lo < 1024 || hi <= lo {
		t.Fatalf("port range [%d, %d)", lo, hi)
	}
	ps, err := freePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if p < lo || p >= hi || seen[p] {
			t.Errorf("ports %v: want distinct ports in [%d, %d)", ps, lo, hi)
		}
		seen[p] = true
	}
}
