package harness

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one sample of the Prometheus text format, as a line of it
// reads: a histogram gives its <name>_bucket (with le), <name>_sum and
// <name>_count samples, a summary its quantiles, _sum and _count.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Samples reads text in the Prometheus text format (prometheus/common's
// expfmt), metric family after metric family in name order, each
// family's samples in their order in text.
func Samples(text string) ([]Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("read the metrics text: %w", err)
	}
	var out []Sample
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		vec, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{Timestamp: model.Earliest}, fams[name])
		if err != nil {
			return nil, fmt.Errorf("read the samples of %s: %w", name, err)
		}
		for _, s := range vec {
			labels := make(map[string]string, len(s.Metric)-1)
			for k, v := range s.Metric {
				if k != model.MetricNameLabel {
					labels[string(k)] = string(v)
				}
			}
			out = append(out, Sample{Name: string(s.Metric[model.MetricNameLabel]), Labels: labels, Value: float64(s.Value)})
		}
	}
	return out, nil
}

// Has reports whether s's labels include every one of labels; as in
// Prometheus, a label missing is one whose value is empty.
func (s Sample) Has(labels map[string]string) bool {
	for k, v := range labels {
		if s.Labels[k] != v {
			return false
		}
	}
	return true
}

// Metric returns the value of the first sample of name in text (the
// Prometheus text format) whose labels include labels, and whether there
// is one; false also when text is not the text format.
func Metric(text, name string, labels map[string]string) (float64, bool) {
	samples, err := Samples(text)
	if err != nil {
		return 0, false
	}
	for _, s := range samples {
		if s.Name == name && s.Has(labels) {
			return s.Value, true
		}
	}
	return 0, false
}
