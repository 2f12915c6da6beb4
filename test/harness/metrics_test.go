package harness_test

import (
	"testing"

	"github.com/vmipam/vmipam/test/harness"
)

const metricsText = `# HELP vmipam_pool_addresses Addresses of a pool by state.
# TYPE vmipam_pool_addresses gauge
vmipam_pool_addresses{pool="a",state="allocated"} 3
vmipam_pool_addresses{pool="b",state="allocated"} 7
vmipam_pool_addresses{pool="b",state="free"} 1e+02
vmipam_pool_addresses{pool="with \"quotes\", and a comma",state="free"} 5
# TYPE vmipam_store_writes_total counter
vmipam_store_writes_total 12
# HELP vmipam_allocation_duration_seconds How long an allocation took.
# TYPE vmipam_allocation_duration_seconds histogram
vmipam_allocation_duration_seconds_bucket{pool="a",le="0.001"} 2
vmipam_allocation_duration_seconds_bucket{pool="a",le="0.01"} 5
vmipam_allocation_duration_seconds_bucket{pool="a",le="+Inf"} 6
vmipam_allocation_duration_seconds_sum{pool="a"} 0.042
vmipam_allocation_duration_seconds_count{pool="a"} 6
`

func TestMetric(t *testing.T) {
	tests := map[string]struct {
		text   string
		metric string
		labels map[string]string
		want   float64
		found  bool
	}{
		"first match":          {metricsText, "vmipam_pool_addresses", map[string]string{"pool": "b"}, 7, true},
		"every label":          {metricsText, "vmipam_pool_addresses", map[string]string{"pool": "b", "state": "free"}, 100, true},
		"escaped label value":  {metricsText, "vmipam_pool_addresses", map[string]string{"pool": `with "quotes", and a comma`}, 5, true},
		"no labels":            {metricsText, "vmipam_store_writes_total", nil, 12, true},
		"missing label, empty": {metricsText, "vmipam_store_writes_total", map[string]string{"pool": ""}, 12, true},
		"no such labels":       {metricsText, "vmipam_pool_addresses", map[string]string{"pool": "c"}, 0, false},
		"no such metric":       {metricsText, "vmipam_pool", nil, 0, false},
		"histogram bucket":     {metricsText, "vmipam_allocation_duration_seconds_bucket", map[string]string{"le": "0.01"}, 5, true},
		"histogram +Inf":       {metricsText, "vmipam_allocation_duration_seconds_bucket", map[string]string{"le": "+Inf"}, 6, true},
		"histogram count":      {metricsText, "vmipam_allocation_duration_seconds_count", map[string]string{"pool": "a"}, 6, true},
		"histogram sum":        {metricsText, "vmipam_allocation_duration_seconds_sum", nil, 0.042, true},
		"untyped":              {"up 1\n", "up", nil, 1, true},
		"not the text format":  {"vmipam_pool_addresses{pool=\"a\" 3\n", "vmipam_pool_addresses", nil, 0, false},
		"empty":                {"", "up", nil, 0, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, found := harness.Metric(tc.text, tc.metric, tc.labels)
			if got != tc.want || found != tc.found {
				t.Errorf("Metric(%s, %v) = %v, %v; want %v, %v", tc.metric, tc.labels, got, found, tc.want, tc.found)
			}
		})
	}
}

func TestSamples(t *testing.T) {
	tests := map[string]struct {
		text    string
		want    int
		wantErr bool
	}{
		// 4 gauges, 1 counter, 3 buckets, a sum and a count.
		"every sample":                      {text: metricsText, want: 10},
		"a histogram without +Inf gets one": {text: "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", want: 4},
		"empty":                             {text: "", want: 0},
		"broken labels":                     {text: "m{a=\"1\" 1\n", wantErr: true},
		"broken value":                      {text: "m one\n", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := harness.Samples(tc.text)
			if (err != nil) != tc.wantErr || len(got) != tc.want {
				t.Errorf("Samples: %d samples, error %v; want %d, error %v", len(got), err, tc.want, tc.wantErr)
			}
		})
	}
}
