package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/vmipam/vmipam/certs"
	"github.com/vmipam/vmipam/test/harness"
)

const dashboardFile = "deploy/monitoring/grafana-dashboard.json"

// metrics are the series vmipam exports, with their labels, and the
// histograms among them.
var (
	metrics = map[string][]string{
		"vmipam_pool_addresses":                       {"pool", "state"},
		"vmipam_allocations_total":                    {"pool"},
		"vmipam_releases_total":                       {"pool"},
		"vmipam_exhausted_total":                      {"pool"},
		"vmipam_conflicts_total":                      {"pool"},
		"vmipam_expired_pendings_total":               {"pool"},
		"vmipam_duplicates_found_total":               {"pool"},
		"vmipam_store_conflicts_total":                {"pool"},
		"vmipam_store_writes_total":                   {"pool"},
		"vmipam_store_write_failures_total":           {"pool"},
		"vmipam_rebalances_total":                     {"pool"},
		"vmipam_rebalance_failures_total":             {"pool"},
		"vmipam_allocation_duration_seconds":          {"pool"},
		"vmipam_admission_duration_seconds":           {"webhook", "outcome"},
		"vmipam_certificate_expiry_timestamp_seconds": nil,
	}
	histograms = []string{"vmipam_allocation_duration_seconds", "vmipam_admission_duration_seconds"}
	poolStates = []string{"allocated", "pending", "free", "cooldown", "claimed", "usable"}
)

func TestMonitoring(t *testing.T) {
	harness.NeedControlPlane(t)
	tests := map[string]struct {
		dir, install string
		// trusted returns the Secret and key holding the CA that signs
		// what the install's metrics endpoint serves.
		trusted func(t *testing.T, install *rendered) (secret, key string)
	}{
		"self-managed certificates": {dir: "deploy/monitoring", install: "deploy/overlays/default", trusted: selfManagedCA},
		"cert-manager":              {dir: "deploy/monitoring-cert-manager", install: "deploy/overlays/cert-manager", trusted: certManagerCA},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { checkMonitoring(t, tc.dir, tc.install, tc.trusted) })
	}
}

// selfManagedCA: vmipam's Secret and the key that holds every CA it may be
// serving a certificate of; its certificate covers the metrics Service
// when the metrics endpoint serves HTTPS (see certs.Options.ExtraServices).
func selfManagedCA(t *testing.T, install *rendered) (string, string) {
	_, c := manager(t, install)
	if v := flagValue(t, c, "metrics-secure"); v != "" && v != "true" {
		t.Errorf("--metrics-secure=%s: the ServiceMonitor scrapes HTTPS", v)
	}
	if v := flagValue(t, c, "metrics-service"); v != "" && v != metricsService {
		t.Errorf("--metrics-service=%s, want %s", v, metricsService)
	}
	secret := flagValue(t, c, "cert-secret")
	if secret == "" {
		secret = certs.DefaultSecretName
	}
	return secret, certs.KeyCABundle
}

// certManagerCA: the Secret of the serving Certificate, whose ca.crt is the
// CA that issued it; the Certificate must cover the metrics Service.
func certManagerCA(t *testing.T, install *rendered) (string, string) {
	for _, o := range install.ofKind("Certificate") {
		if isCA, _, _ := unstructured.NestedBool(o.Object, "spec", "isCA"); isCA {
			continue
		}
		dnsNames, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "dnsNames")
		if want := metricsService + "." + namespace + ".svc"; !slices.Contains(dnsNames, want) {
			t.Errorf("Certificate %s does not cover %s", o.GetName(), want)
		}
		secret, _, _ := unstructured.NestedString(o.Object, "spec", "secretName")
		return secret, "ca.crt"
	}
	t.Fatal("no serving Certificate")
	return "", ""
}

func checkMonitoring(t *testing.T, dir, installDir string, trusted func(*testing.T, *rendered) (string, string)) {
	r := mustRender(t, dir)
	install := mustRender(t, installDir)

	var metricsSvc, webhookSvc corev1.Service
	install.get(t, "Service", namespace, metricsService, &metricsSvc)
	install.get(t, "Service", namespace, webhookService, &webhookSvc)

	t.Run("service monitor", func(t *testing.T) {
		sms := r.ofKind("ServiceMonitor")
		if len(sms) != 1 {
			t.Fatalf("%d ServiceMonitors, want 1", len(sms))
		}
		sm := sms[0]
		if sm.GetNamespace() != namespace {
			t.Errorf("ServiceMonitor in %q, want %s", sm.GetNamespace(), namespace)
		}
		match, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		sel := labels.SelectorFromSet(match)
		if len(match) == 0 || !sel.Matches(labels.Set(metricsSvc.Labels)) || sel.Matches(labels.Set(webhookSvc.Labels)) {
			t.Errorf("ServiceMonitor selector %v must pick Service %s and not %s", match, metricsService, webhookService)
		}
		names, _, _ := unstructured.NestedStringSlice(sm.Object, "spec", "namespaceSelector", "matchNames")
		if !slices.Contains(names, namespace) {
			t.Errorf("ServiceMonitor namespaceSelector %v misses %s", names, namespace)
		}
		endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		if len(endpoints) != 1 {
			t.Fatalf("%d endpoints, want 1", len(endpoints))
		}
		ep := &unstructured.Unstructured{Object: endpoints[0].(map[string]any)}
		str := func(path ...string) string { s, _, _ := unstructured.NestedString(ep.Object, path...); return s }
		if p := str("port"); p != metricsSvc.Spec.Ports[0].Name {
			t.Errorf("endpoint port %q, want the Service's port name %q", p, metricsSvc.Spec.Ports[0].Name)
		}
		if str("scheme") != "https" {
			t.Errorf("endpoint scheme %q, want https", str("scheme"))
		}
		if p := str("path"); p != "" && p != "/metrics" {
			t.Errorf("endpoint path %q, want /metrics", p)
		}
		if str("bearerTokenFile") == "" {
			t.Errorf("the endpoint sends no bearer token: vmipam refuses anonymous scrapes")
		}
		// Prometheus verifies vmipam's certificate before it sends its
		// token: against the CA the install keeps, for the metrics
		// Service's name.
		tlsConfig, ok, _ := unstructured.NestedMap(ep.Object, "tlsConfig")
		if !ok {
			t.Fatalf("the endpoint has no tlsConfig")
		}
		if skip, found, _ := unstructured.NestedBool(tlsConfig, "insecureSkipVerify"); found && skip {
			t.Errorf("tlsConfig.insecureSkipVerify: Prometheus would send its token to whoever answers")
		}
		if _, found, _ := unstructured.NestedFieldNoCopy(tlsConfig, "ca", "configMap"); found {
			t.Errorf("tlsConfig.ca names a ConfigMap; the CA is in a Secret")
		}
		secret, key := trusted(t, install)
		gotSecret, _, _ := unstructured.NestedString(tlsConfig, "ca", "secret", "name")
		gotKey, _, _ := unstructured.NestedString(tlsConfig, "ca", "secret", "key")
		if gotSecret != secret || gotKey != key {
			t.Errorf("tlsConfig.ca is key %q of Secret %q, want %q of %q", gotKey, gotSecret, key, secret)
		}
		if got, want := str("tlsConfig", "serverName"), metricsService+"."+namespace+".svc"; got != want {
			t.Errorf("tlsConfig.serverName %q, want %q", got, want)
		}
	})

	t.Run("metrics reader binding", func(t *testing.T) {
		for _, o := range r.ofKind("ClusterRoleBinding") {
			var b rbacv1.ClusterRoleBinding
			convert(t, o, &b)
			if b.RoleRef.Kind != "ClusterRole" || install.find("ClusterRole", "", b.RoleRef.Name) == nil {
				t.Errorf("ClusterRoleBinding %s refers to %s %s, not a ClusterRole of the install", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
			}
		}
	})

	t.Run("dashboard config map", func(t *testing.T) {
		var found int
		for _, o := range r.ofKind("ConfigMap") {
			if o.GetLabels()["grafana_dashboard"] != "1" {
				continue
			}
			found++
			var cm corev1.ConfigMap
			convert(t, o, &cm)
			if len(cm.Data) != 1 {
				t.Errorf("ConfigMap %s holds %d keys, want the dashboard alone", cm.Name, len(cm.Data))
			}
			want, err := os.ReadFile(filepath.Join(root, dashboardFile))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range cm.Data {
				if !strings.HasSuffix(k, ".json") || !jsonEqual(t, []byte(v), want) {
					t.Errorf("ConfigMap %s key %s is not %s", cm.Name, k, dashboardFile)
				}
			}
		}
		if found != 1 {
			t.Errorf("%d ConfigMaps labelled grafana_dashboard=1, want 1", found)
		}
	})

	t.Run("server-side dry-run", r.dryRun)
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Errorf("invalid JSON: %v", err)
		return false
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Errorf("invalid JSON: %v", err)
		return false
	}
	return reflect.DeepEqual(x, y)
}

type panel struct {
	Type       string
	Title      string
	Datasource *struct{ Type, UID string }
	GridPos    struct{ H, W, X, Y int }
	Targets    []struct {
		Expr  string
		RefID string `json:"refId"`
	}
	Panels []panel
}

type dashboard struct {
	UID        string
	Title      string
	Panels     []panel
	Templating struct {
		List []struct {
			Name, Type string
			Query      any
		}
	}
}

var (
	metricRE = regexp.MustCompile(`\bvmipam_[a-z_]+\b`)
	stateRE  = regexp.MustCompile(`state=~?"([^"]*)"`)
	byRE     = regexp.MustCompile(`by \(([^)]*)\)`)
)

// TestDashboard checks the Grafana dashboard against the metrics vmipam
// exports: every query names real series and labels, every series is
// shown, and the panels the operators need are there.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("the dashboard needs a uid and a title")
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["pool"] != "query" {
		t.Errorf("template variables %v, want a datasource variable and a pool query", vars)
	}

	var panels []panel
	for _, p := range d.Panels {
		panels = append(panels, p)
		panels = append(panels, p.Panels...) // collapsed rows hold theirs
	}
	var exprs []string
	used := map[string]bool{}
	states := map[string]bool{}
	for i, p := range panels {
		for _, q := range panels[i+1:] {
			if overlap(p, q) {
				t.Errorf("panels %q and %q overlap", p.Title, q.Title)
			}
		}
		if p.GridPos.W < 1 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H < 1 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" || len(p.Targets) == 0 {
			t.Errorf("panel %q has no title or no query", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the datasource variable", p.Title)
		}
		refs := map[string]bool{}
		for _, q := range p.Targets {
			if refs[q.RefID] {
				t.Errorf("panel %q: refId %s twice", p.Title, q.RefID)
			}
			refs[q.RefID] = true
			checkExpr(t, p.Title, q.Expr, used, states)
			exprs = append(exprs, q.Expr)
		}
	}
	for m := range metrics {
		if !used[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
	for _, s := range poolStates {
		if !states[s] {
			t.Errorf("no panel shows the %s addresses", s)
		}
	}

	wantQuery := func(what string, ok func(string) bool) {
		t.Helper()
		if !slices.ContainsFunc(exprs, ok) {
			t.Errorf("no query for %s", what)
		}
	}
	for _, q := range []string{"0.5", "0.99"} {
		wantQuery("allocation latency p"+strings.TrimPrefix(q, "0."), func(e string) bool {
			return strings.Contains(e, "histogram_quantile("+q+",") && strings.Contains(e, "vmipam_allocation_duration_seconds_bucket")
		})
	}
	wantQuery("admission latency by outcome", func(e string) bool {
		return strings.Contains(e, "histogram_quantile(") && strings.Contains(e, "vmipam_admission_duration_seconds_bucket") && groupsBy(e, "outcome")
	})
	wantQuery("addresses per state and pool", func(e string) bool {
		return strings.Contains(e, "vmipam_pool_addresses") && groupsBy(e, "pool") && groupsBy(e, "state")
	})
}

// checkExpr checks one PromQL expression: known series, counters through
// rate or increase, histograms through their buckets, labels that exist,
// the pool variable applied, brackets balanced.
func checkExpr(t *testing.T, title, expr string, used, states map[string]bool) {
	t.Helper()
	if strings.TrimSpace(expr) == "" {
		t.Errorf("panel %q: empty query", title)
		return
	}
	if !balanced(expr) {
		t.Errorf("panel %q: unbalanced brackets in %s", title, expr)
	}
	var series []string
	for _, m := range metricRE.FindAllString(expr, -1) {
		name := m
		for _, h := range histograms {
			if m == h+"_bucket" || m == h+"_count" || m == h+"_sum" {
				name = h
			}
		}
		if _, ok := metrics[name]; !ok || (name == m && slices.Contains(histograms, name)) {
			t.Errorf("panel %q: %s is not a series vmipam exports", title, m)
			continue
		}
		used[name] = true
		series = append(series, name)
		if strings.HasSuffix(m, "_total") && !strings.Contains(expr, "rate(") && !strings.Contains(expr, "increase(") {
			t.Errorf("panel %q: counter %s shown without rate or increase", title, m)
		}
		if slices.Contains(metrics[name], "pool") && !strings.Contains(expr, `pool=~"$pool"`) {
			t.Errorf("panel %q: %s is not filtered by the pool variable", title, m)
		}
	}
	if strings.Contains(expr, "histogram_quantile(") && !groupsBy(expr, "le") {
		t.Errorf("panel %q: histogram_quantile over buckets not grouped by le", title)
	}
	for _, by := range byRE.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(by[1], ",") {
			l = strings.TrimSpace(l)
			if l != "le" && !slices.ContainsFunc(series, func(s string) bool { return slices.Contains(metrics[s], l) }) {
				t.Errorf("panel %q: groups by %q, a label none of its series has", title, l)
			}
		}
	}
	for _, m := range stateRE.FindAllStringSubmatch(expr, -1) {
		for _, s := range strings.Split(m[1], "|") {
			if !slices.Contains(poolStates, s) {
				t.Errorf("panel %q: state %q does not exist", title, s)
			}
			states[s] = true
		}
	}
}

func groupsBy(expr, label string) bool {
	for _, by := range byRE.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(by[1], ",") {
			if strings.TrimSpace(l) == label {
				return true
			}
		}
	}
	return false
}

func balanced(s string) bool {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	inString := false
	for _, c := range s {
		switch {
		case c == '"':
			inString = !inString
		case inString:
		case c == '(' || c == '[' || c == '{':
			stack = append(stack, c)
		case pairs[c] != 0:
			if len(stack) == 0 || stack[len(stack)-1] != pairs[c] {
				return false
			}
			stack = stack[:len(stack)-1]
		}
	}
	return len(stack) == 0 && !inString
}

func overlap(a, b panel) bool {
	return a.GridPos.X < b.GridPos.X+b.GridPos.W && b.GridPos.X < a.GridPos.X+a.GridPos.W &&
		a.GridPos.Y < b.GridPos.Y+b.GridPos.H && b.GridPos.Y < a.GridPos.Y+a.GridPos.H
}
