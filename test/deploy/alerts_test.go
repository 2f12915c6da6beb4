package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestAlertRules runs `promtool test rules` (testdata/alerts/alerts_test.yaml)
// on the alerting rules of deploy/monitoring/prometheus_rule.yaml, which
// TestChartMatchesKustomize holds equal to the chart's: on synthetic series,
// the forecast alert fires before the exhaustion alert on a steadily
// filling pool, neither fires on a steady one, and every other alert fires
// on the series it watches. promtool is $PROMTOOL, which make test builds
// into bin/.
func TestAlertRules(t *testing.T) {
	promtool := tool(t, "PROMTOOL", "promtool")
	var rule struct {
		Kind string         `json:"kind"`
		Spec map[string]any `json:"spec"`
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "monitoring", "prometheus_rule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rule); err != nil || rule.Kind != "PrometheusRule" {
		t.Fatalf("deploy/monitoring/prometheus_rule.yaml: kind %q, %v", rule.Kind, err)
	}
	// The PrometheusRule's spec is a Prometheus rule file.
	rules, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(t.Context(), promtool, "check", "rules", filepath.Join(dir, "rules.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	cmd := exec.CommandContext(t.Context(), promtool, "test", "rules", "alerts_test.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
