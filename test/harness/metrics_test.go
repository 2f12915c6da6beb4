package harness_test

import (
	"testing"

	"github.com/vmipam/vmipam/test/harness"
)

func TestMetric(t *testing.T) {
	text := `# HELP vmipam_pool_addresses Addresses of a pool by state.
# TYPE vmipam_pool_addresses gauge
vmipam_pool_addresses{pool="a",state="allocated"} 3
vmipam_pool_addresses{pool="b",state="allocated"} 7
vmipam_pool_addresses{pool="b",state="free"} 1e+02
vmipam_store_writes_total 12
`
	for _, tc := range []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
		found  bool
	}{
		{"first match", "vmipam_pool_addresses", map[string]string{"pool": "b"}, 7, true},
		{"every label", "vmipam_pool_addresses", map[string]string{"pool": "b", "state": "free"}, 100, true},
		{"no labels", "vmipam_store_writes_total", nil, 12, true},
		{"no such labels", "vmipam_pool_addresses", map[string]string{"pool": "c"}, 0, false},
		{"no such metric", "vmipam_pool", nil, 0, false},
	} {
		got, found := harness.Metric(text, tc.metric, tc.labels)
		if got != tc.want || found != tc.found {
			t.Errorf("%s: %v, %v; want %v, %v", tc.name, got, found, tc.want, tc.found)
		}
	}
}
