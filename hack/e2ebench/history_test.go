package main

import (
	"maps"
	"testing"

	"github.com/vmipam/vmipam/test/harness"
)

func TestWritesByResource(t *testing.T) {
	tests := map[string]struct {
		reqs map[string]float64
		want map[string]float64
	}{
		"none":       {reqs: map[string]float64{}, want: map[string]float64{}},
		"reads only": {reqs: map[string]float64{"GET ipblocks": 3, "LIST virtualmachines": 2, "WATCH iphistories": 1}, want: map[string]float64{}},
		"writes by resource, subresources apart": {
			reqs: map[string]float64{
				"POST virtualmachines": 10, "PATCH virtualmachines": 4, "DELETE virtualmachines": 10, "GET virtualmachines": 99,
				"PUT ipblocks": 3, "APPLY iphistories": 1, "POST iphistories": 2, "PUT ippools/status": 1, "DELETECOLLECTION leases": 1,
			},
			want: map[string]float64{"virtualmachines": 24, "ipblocks": 3, "iphistories": 3, "ippools/status": 1, "leases": 1},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := writesByResource(tt.reqs); !maps.Equal(got, tt.want) {
				t.Errorf("writesByResource(%v) = %v, want %v", tt.reqs, got, tt.want)
			}
		})
	}
}

func TestRequestDelta(t *testing.T) {
	s := func(verb, res, sub string, v float64) harness.Sample {
		l := map[string]string{"verb": verb, "resource": res}
		if sub != "" {
			l["subresource"] = sub
		}
		return harness.Sample{Name: "apiserver_request_total", Labels: l, Value: v}
	}
	a0 := metricSet{s("POST", "virtualmachines", "", 5), s("PUT", "ipblocks", "", 7)}
	a1 := metricSet{s("POST", "virtualmachines", "", 8), s("PUT", "ipblocks", "", 7), s("PUT", "ippools", "status", 2)}
	want := map[string]float64{"POST virtualmachines": 3, "PUT ippools/status": 2}
	if got := requestDelta(a0, a1); !maps.Equal(got, want) {
		t.Errorf("requestDelta = %v, want %v", got, want)
	}
}
