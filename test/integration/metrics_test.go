package integration

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// find returns the metric of family name whose labels include want.
func find(t *testing.T, name string, want map[string]string) *dto.Metric {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			for k, v := range want {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == k && l.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			return m
		}
	}
	t.Fatalf("no metric %s%v", name, want)
	return nil
}

func gauge(t *testing.T, name string, labels map[string]string) int {
	t.Helper()
	return int(find(t, name, labels).GetGauge().GetValue())
}

func histogramCount(t *testing.T, name string, labels map[string]string) int {
	t.Helper()
	return int(find(t, name, labels).GetHistogram().GetSampleCount())
}

// admissions counts the requests a webhook of vmipam answered, whatever
// their outcome.
func admissions(t *testing.T, webhook string) int {
	t.Helper()
	return sum(t, "vmipam_admission_duration_seconds", "webhook", webhook, func(m *dto.Metric) float64 { return float64(m.GetHistogram().GetSampleCount()) })
}

// reconciles counts the reconciles controller ran, whatever their result.
func reconciles(t *testing.T, controller string) int {
	t.Helper()
	return sum(t, "controller_runtime_reconcile_total", "controller", controller, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() })
}

// sum adds up value over the metrics of family name whose label is v.
func sum(t *testing.T, name, label, v string, value func(*dto.Metric) float64) int {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	n := 0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == v {
					n += int(value(m))
				}
			}
		}
	}
	return n
}
