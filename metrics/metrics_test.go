package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestInstrumentHTTP: each request to a webhook path is counted under its
// path and the status code its handler wrote (200 when it wrote none).
func TestInstrumentHTTP(t *testing.T) {
	for _, tt := range []struct {
		name, path string
		write      int
		code       string
	}{
		{"answered", "/test-answered", 0, "200"},
		{"refused", "/test-refused", http.StatusRequestEntityTooLarge, "413"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := InstrumentHTTP(tt.path, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if tt.write != 0 {
					w.WriteHeader(tt.write)
				}
				_, _ = w.Write([]byte("{}"))
			}))
			if err := http.NewResponseController(&statusWriter{ResponseWriter: deadlineRecorder{httptest.NewRecorder()}}).SetReadDeadline(time.Time{}); err != nil {
				t.Fatalf("the wrapped writer hides the connection's read deadline: %v", err)
			}
			for range 3 {
				h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, tt.path, nil))
			}
			if n := sampleCount(t, WebhookHTTPDuration, tt.path, tt.code); n != 3 {
				t.Errorf("%s code %s counted %d requests, want 3", tt.path, tt.code, n)
			}
		})
	}
}

// deadlineRecorder is a recorder whose connection takes read deadlines.
type deadlineRecorder struct{ *httptest.ResponseRecorder }

func (deadlineRecorder) SetReadDeadline(time.Time) error { return nil }

// TestObserveResync: each resync is counted under where it read the
// objects and its outcome.
func TestObserveResync(t *testing.T) {
	for _, tt := range []struct {
		name            string
		listed          bool
		err             error
		source, outcome string
	}{
		{"from the caches", false, nil, "caches", "ok"},
		{"listed", true, nil, "list", "ok"},
		{"the list failed", true, errors.New("away"), "list", "error"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := sampleCount(t, ResyncDuration, tt.source, tt.outcome)
			ObserveResync(tt.listed, 30*time.Millisecond, tt.err)
			if n := sampleCount(t, ResyncDuration, tt.source, tt.outcome) - before; n != 1 {
				t.Errorf("source %s outcome %s counted %d resyncs, want 1", tt.source, tt.outcome, n)
			}
		})
	}
}

// sampleCount is how many observations the series of h with labels holds.
func sampleCount(t *testing.T, h *prometheus.HistogramVec, labels ...string) uint64 {
	t.Helper()
	o, err := h.GetMetricWithLabelValues(labels...)
	if err != nil {
		t.Fatal(err)
	}
	var m dto.Metric
	if err := o.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
