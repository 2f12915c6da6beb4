package main

import (
	"math"
	"sort"
	"strconv"

	"github.com/vmipam/vmipam/test/harness"
)

// metricSet is the samples of one /metrics text.
type metricSet []harness.Sample

// parseMetrics reads the Prometheus text format (harness.Samples).
func parseMetrics(text string) (metricSet, error) {
	samples, err := harness.Samples(text)
	return metricSet(samples), err
}

// sum adds the values of the series of name whose labels include want.
func (m metricSet) sum(name string, want map[string]string) float64 {
	var t float64
	for _, s := range m {
		if s.Name == name && s.Has(want) {
			t += s.Value
		}
	}
	return t
}

// histogram is a cumulative Prometheus histogram: counts[i] observations
// were at most les[i]; the last bound is +Inf.
type histogram struct {
	les    []float64
	counts []float64
}

// histogram sums the buckets of the series of a histogram whose labels
// include want.
func (m metricSet) histogram(name string, want map[string]string) histogram {
	byLE := map[float64]float64{}
	for _, s := range m {
		if s.Name != name+"_bucket" || !s.Has(want) {
			continue
		}
		le, err := strconv.ParseFloat(s.Labels["le"], 64)
		if err != nil {
			continue
		}
		byLE[le] += s.Value
	}
	var h histogram
	for le := range byLE {
		h.les = append(h.les, le)
	}
	sort.Float64s(h.les)
	for _, le := range h.les {
		h.counts = append(h.counts, byLE[le])
	}
	return h
}

// sub returns the observations made between o and h.
func (h histogram) sub(o histogram) histogram {
	prev := map[float64]float64{}
	for i, le := range o.les {
		prev[le] = o.counts[i]
	}
	d := histogram{les: h.les, counts: make([]float64, len(h.counts))}
	for i, le := range h.les {
		d.counts[i] = h.counts[i] - prev[le]
	}
	return d
}

func (h histogram) total() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// quantile estimates the q-quantile as Prometheus's histogram_quantile
// does: linear interpolation inside the bucket that holds the rank, the
// lowest bucket starting at 0, and the highest finite bound when the rank
// falls in the +Inf bucket. NaN without observations.
func (h histogram) quantile(q float64) float64 {
	n := len(h.les)
	if n < 2 || !math.IsInf(h.les[n-1], 1) || h.total() == 0 {
		return math.NaN()
	}
	rank := q * h.total()
	i := sort.Search(n, func(i int) bool { return h.counts[i] >= rank })
	if i == n-1 {
		return h.les[n-2]
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = h.les[i-1], h.counts[i-1]
	}
	if h.counts[i] == below {
		return h.les[i]
	}
	return lower + (h.les[i]-lower)*(rank-below)/(h.counts[i]-below)
}

// atMost is the share of observations at most le (a bucket bound), exact
// where quantile only estimates; NaN if le is no bound.
func (h histogram) atMost(le float64) float64 {
	for i, b := range h.les {
		if b == le && h.total() > 0 {
			return h.counts[i] / h.total()
		}
	}
	return math.NaN()
}

// webhookResult holds the admission latencies measured around the rounds.
type webhookResult struct {
	// mutating and validating: vmipam's handlers, as its own metric sees
	// them (the Handle call: decoding, selection, allocation, the patch).
	mutating, validating histogram
	// serve: controller-runtime's histogram of the whole mutating HTTP
	// handler (reading the request, decoding the review, the handler,
	// encoding the response).
	serve histogram
	// apiMutating and apiValidating: the calls as the API server sees
	// them, TLS and loopback included (coarse buckets).
	apiMutating, apiValidating histogram
	// noopMutating: the calls of the no-op mutating webhook as the API
	// server sees them (during the no-op rounds).
	noopMutating histogram
	// alloc: vmipam's allocator, per allocation.
	alloc histogram
	// storeWrites during the rounds.
	storeWrites float64
	// allocations, and storeWaits: those that found the ready list empty
	// and waited for the store.
	allocations, storeWaits float64
}

func webhookStats(vBefore, vAfter, aBefore, aAfter metricSet) webhookResult {
	delta := func(before, after metricSet, name string, want map[string]string) histogram {
		return after.histogram(name, want).sub(before.histogram(name, want))
	}
	const adm = "vmipam_admission_duration_seconds"
	const api = "apiserver_admission_webhook_admission_duration_seconds"
	pool := map[string]string{"pool": poolName}
	return webhookResult{
		mutating:   delta(vBefore, vAfter, adm, map[string]string{"webhook": "virtualmachine-mutating", "outcome": "allowed"}),
		validating: delta(vBefore, vAfter, adm, map[string]string{"webhook": "virtualmachine-validating", "outcome": "allowed"}),
		serve: delta(vBefore, vAfter, "vmipam_webhook_http_duration_seconds",
			map[string]string{"webhook": "/mutate-vmipam-io-v1alpha1-virtualmachine", "code": "200"}),
		apiMutating: delta(aBefore, aAfter, api,
			map[string]string{"name": "mvirtualmachine.vmipam.io", "operation": "CREATE", "rejected": "false"}),
		apiValidating: delta(aBefore, aAfter, api,
			map[string]string{"name": "vvirtualmachine.vmipam.io", "operation": "CREATE", "rejected": "false"}),
		noopMutating: delta(aBefore, aAfter, api,
			map[string]string{"name": noopMutatingName, "operation": "CREATE", "rejected": "false"}),
		alloc:       delta(vBefore, vAfter, "vmipam_allocation_duration_seconds", pool),
		storeWrites: vAfter.sum("vmipam_store_writes_total", pool) - vBefore.sum("vmipam_store_writes_total", pool),
		allocations: vAfter.sum("vmipam_allocations_total", pool) - vBefore.sum("vmipam_allocations_total", pool),
		storeWaits:  vAfter.sum("vmipam_allocation_store_waits_total", pool) - vBefore.sum("vmipam_allocation_store_waits_total", pool),
	}
}
