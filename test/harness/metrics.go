package harness

import (
	"regexp"
	"strconv"
	"strings"
)

// metricLine is one sample of the Prometheus text format.
var metricLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ([^ ]+)`)

// Metric returns the value of the first sample of name in text (the
// Prometheus text format) whose labels include labels, and whether there
// is one.
func Metric(text, name string, labels map[string]string) (float64, bool) {
	for line := range strings.SplitSeq(text, "\n") {
		m := metricLine.FindStringSubmatch(line)
		if m == nil || m[1] != name {
			continue
		}
		have := map[string]string{}
		for kv := range strings.SplitSeq(m[2], ",") {
			k, v, ok := strings.Cut(kv, "=")
			if ok {
				have[k] = strings.Trim(v, `"`)
			}
		}
		match := true
		for k, v := range labels {
			match = match && have[k] == v
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		return v, err == nil
	}
	return 0, false
}
