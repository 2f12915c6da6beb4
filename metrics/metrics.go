// Package metrics exports vmipam's Prometheus metrics on controller-runtime's
// registry: per pool and state gauges read from each allocator's consistent
// snapshot at scrape time, the allocators' counters, allocation and
// admission latency histograms, and the serving certificate's expiry.
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/pools"
)

var (
	// AllocationDuration is the latency of every allocation, by pool.
	AllocationDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vmipam_allocation_duration_seconds",
		Help:    "Time to hand out an address from a pool's allocator, including a synchronous claim when the free list was empty.",
		Buckets: []float64{1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1},
	}, []string{"pool"})
	// AdmissionDuration is the server-side latency of every admission
	// request, by webhook and outcome (allowed, denied, error).
	AdmissionDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vmipam_admission_duration_seconds",
		Help:    "Time vmipam's webhooks take to answer an admission request, by webhook and outcome.",
		Buckets: []float64{5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5},
	}, []string{"webhook", "outcome"})
	// WebhookHTTPDuration is the server-side latency of every HTTP request
	// to a webhook path, reading the review and writing the answer
	// included, by path and status code. (vmipam serves its webhooks from
	// its own server, so controller-runtime's webhook metrics stay empty.)
	WebhookHTTPDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vmipam_webhook_http_duration_seconds",
		Help:    "Time vmipam's webhook server takes to answer an HTTP request, by path and status code.",
		Buckets: []float64{5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5},
	}, []string{"webhook", "code"})
	// ResyncDuration is how long each resync of the pools took, by where
	// it read the live objects (caches or list) and outcome (ok, error).
	ResyncDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "vmipam_resync_duration_seconds",
		Help:    "Time a resync of the pools against the live objects took, by where it read them (caches: this replica's informer caches; list: a list from the API server) and outcome (ok, error).",
		Buckets: []float64{1e-3, 5e-3, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"source", "outcome"})
	// DuplicatesFound counts detections of two live objects on one address.
	DuplicatesFound = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vmipam_duplicates_found_total",
		Help: "Times two live objects were found carrying one address (each detection counts).",
	}, []string{"pool"})

	// KindServed is 1 for a configured kind the API server serves, 0 for
	// one whose CRD vmipam waits for.
	KindServed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vmipam_kind_served",
		Help: "1 when the API server serves a kind of the kinds configuration, 0 while vmipam waits for its CRD.",
	}, []string{"group", "version", "kind"})

	current   atomic.Pointer[pools.Registry]
	certNotAf atomic.Pointer[func() time.Time]
	once      sync.Once
)

// Register exports reg's pools. It may be called again with a new
// registry (tests restart vmipam in one process); the metrics are
// registered with controller-runtime's registry only once.
func Register(reg *pools.Registry) {
	current.Store(reg)
	once.Do(func() {
		ctrlmetrics.Registry.MustRegister(AllocationDuration, AdmissionDuration, WebhookHTTPDuration, ResyncDuration, DuplicatesFound, KindServed, poolCollector{},
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "vmipam_certificate_expiry_timestamp_seconds",
				Help: "When the webhook's serving certificate expires, as a Unix time; 0 when unknown.",
			}, func() float64 {
				if f := certNotAf.Load(); f != nil {
					if t := (*f)(); !t.IsZero() {
						return float64(t.Unix())
					}
				}
				return 0
			}))
	})
}

// SetCertificateExpiry tells the expiry gauge where to read the served
// certificate's NotAfter.
func SetCertificateExpiry(f func() time.Time) { certNotAf.Store(&f) }

// ObserveAllocation records one allocation's latency; pass it to the pool
// registry.
func ObserveAllocation(pool string, d time.Duration, _ error) {
	AllocationDuration.WithLabelValues(pool).Observe(d.Seconds())
}

// ObserveResync records one resync's duration; pass it to the pool
// registry.
func ObserveResync(listed bool, d time.Duration, err error) {
	source, outcome := "caches", "ok"
	if listed {
		source = "list"
	}
	if err != nil {
		outcome = "error"
	}
	ResyncDuration.WithLabelValues(source, outcome).Observe(d.Seconds())
}

// NoteDuplicate counts a duplicate found in pool.
func NoteDuplicate(pool string) { DuplicatesFound.WithLabelValues(pool).Inc() }

var (
	addressesDesc = prometheus.NewDesc("vmipam_pool_addresses",
		"Addresses of a pool by state: allocated, pending, free, cooldown, claimed (by this replica) and usable (in the ranges).",
		[]string{"pool", "state"}, nil)
	familyAddressesDesc = prometheus.NewDesc("vmipam_pool_family_addresses",
		"Addresses of one family of a pool by state, as vmipam_pool_addresses counts the pool's.",
		[]string{"pool", "family", "state"}, nil)
	counterDescs = []struct {
		desc *prometheus.Desc
		get  func(ipam.Stats) uint64
	}{
		{prometheus.NewDesc("vmipam_allocations_total", "Addresses handed out.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.Allocations }},
		{prometheus.NewDesc("vmipam_releases_total", "Addresses released into cooldown.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.Releases }},
		{prometheus.NewDesc("vmipam_exhausted_total", "Allocations refused because the pool was exhausted.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.Exhausted }},
		{prometheus.NewDesc("vmipam_conflicts_total", "Operations refused because another owner held the address.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.Conflicts }},
		{prometheus.NewDesc("vmipam_expired_pendings_total", "Reservations whose object never appeared, expired into cooldown.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.ExpiredPendings }},
		{prometheus.NewDesc("vmipam_store_conflicts_total", "Block writes that lost a compare-and-swap and were retried.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.StoreConflicts }},
		{prometheus.NewDesc("vmipam_store_writes_total", "Block writes to the API server.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.StoreWrites }},
		{prometheus.NewDesc("vmipam_store_write_failures_total", "Block writes that failed for another reason than a lost compare-and-swap (the API server refused or did not answer), and were retried.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.StoreFailures }},
		{prometheus.NewDesc("vmipam_rebalances_total", "Free-list rebalances (claims or returns).", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.Rebalances }},
		{prometheus.NewDesc("vmipam_rebalance_failures_total", "Rebalances that failed.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.RebalanceFailures }},
		{prometheus.NewDesc("vmipam_pending_limited_total", "Reservations refused because their namespace held as many pending reservations as the pool allows.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.PendingLimited }},
		{prometheus.NewDesc("vmipam_allocation_store_waits_total", "Allocations that found no armed address and waited for a write or a read of the store (arming, a claim, a request to another replica): the ready list ran dry.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.StoreWaits }},
		{prometheus.NewDesc("vmipam_unused_returns_total", "Lapsed reservations returned without a cooldown, proved never stored.", []string{"pool"}, nil), func(s ipam.Stats) uint64 { return s.Unused }},
	}
)

// poolCollector reads every pool's snapshot and counters at scrape time,
// so the gauges are as consistent as the allocator's own lock makes them.
type poolCollector struct{}

func (poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- addressesDesc
	ch <- familyAddressesDesc
	for _, c := range counterDescs {
		ch <- c.desc
	}
}

func (poolCollector) Collect(ch chan<- prometheus.Metric) {
	reg := current.Load()
	if reg == nil {
		return
	}
	for _, p := range reg.Pools() {
		if !p.Ready() {
			continue
		}
		for _, s := range states(p.Snapshot()) {
			ch <- prometheus.MustNewConstMetric(addressesDesc, prometheus.GaugeValue, s.v, p.Name(), s.state)
		}
		for _, f := range p.Families() {
			c, _ := p.FamilySnapshot(f)
			for _, s := range states(c) {
				ch <- prometheus.MustNewConstMetric(familyAddressesDesc, prometheus.GaugeValue, s.v, p.Name(), string(f), s.state)
			}
		}
		st := p.Stats()
		for _, d := range counterDescs {
			ch <- prometheus.MustNewConstMetric(d.desc, prometheus.CounterValue, float64(d.get(st)), p.Name())
		}
	}
}

// state is one state's count of a pool's addresses.
type state struct {
	state string
	v     float64
}

func states(c ipam.Counts) []state {
	return []state{
		{"allocated", float64(c.Allocated)}, {"pending", float64(c.Pending)}, {"free", float64(c.Free)},
		{"cooldown", float64(c.Cooldown)}, {"claimed", float64(c.Claimed)}, {"usable", float64(c.Usable)},
	}
}

// InstrumentAdmission wraps an admission handler to record its latency and
// outcome under name.
func InstrumentAdmission(name string, h admission.Handler) admission.Handler {
	return admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
		start := time.Now()
		resp := h.Handle(ctx, req)
		AdmissionDuration.WithLabelValues(name, outcome(resp)).Observe(time.Since(start).Seconds())
		return resp
	})
}

// InstrumentHTTP wraps the HTTP handler of a webhook path to record each
// request's latency and status code.
func InstrumentHTTP(path string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(sw, r)
		WebhookHTTPDuration.WithLabelValues(path, strconv.Itoa(sw.code)).Observe(time.Since(start).Seconds())
	})
}

// statusWriter remembers the status code written.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the connection: the webhook
// server sets its read deadlines through it.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func outcome(resp admission.Response) string {
	switch {
	case resp.Allowed:
		return "allowed"
	case resp.Result != nil && resp.Result.Code >= http.StatusInternalServerError:
		return "error"
	}
	return "denied"
}

// SetKindServed records whether the API server serves kind gvk.
func SetKindServed(gvk schema.GroupVersionKind, served bool) {
	v := 0.0
	if served {
		v = 1
	}
	KindServed.WithLabelValues(gvk.Group, gvk.Version, gvk.Kind).Set(v)
}
