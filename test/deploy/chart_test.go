package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/vmipam/vmipam/test/harness"
)

// chart is the Helm chart, relative to the repository root.
const chart = "deploy/chart/vmipam"

// helmPath is the helm binary: $HELM, which make test and make verify set
// to the one they build into bin/.
func helmPath(t *testing.T) string {
	t.Helper()
	return tool(t, "HELM", "helm")
}

// tool returns the path in the environment variable env. Without it the
// test fails, but under -short (make test-unit, which builds no tools) it
// is skipped.
func tool(t *testing.T, env, name string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		if testing.Short() {
			t.Skipf("%s is not set: needs %s, which make test and make verify build into bin/", env, name)
		}
		t.Fatalf("%s is not set: run the tests through make test, which builds %s into bin/ and sets it", env, name)
	}
	return p
}

// helmTemplate renders the chart into namespace ns with the values files
// (relative to the chart) and the extra arguments.
func helmTemplate(t *testing.T, ns string, valuesFiles []string, extra ...string) *rendered {
	t.Helper()
	args := []string{"template", "vmipam", filepath.Join(root, chart), "--namespace", ns}
	for _, f := range valuesFiles {
		args = append(args, "-f", filepath.Join(root, chart, f))
	}
	args = append(args, extra...)
	cmd := exec.CommandContext(t.Context(), helmPath(t), args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	objs, err := decode(out.Bytes())
	if err != nil {
		t.Fatalf("helm template with %v: %v", valuesFiles, err)
	}
	return &rendered{dir: fmt.Sprintf("the chart with %v %v", valuesFiles, extra), objs: objs}
}

// renderKustomize builds dirs with the envtest kubectl, needing no control
// plane.
func renderKustomize(t *testing.T, dirs ...string) *rendered {
	t.Helper()
	if kubectlPath == "" {
		assets, err := harness.Assets()
		if err != nil && testing.Short() {
			t.Skipf("needs kubectl's kustomize: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		kubectlPath = filepath.Join(assets, "kubectl")
	}
	r := &rendered{dir: strings.Join(dirs, " + ")}
	for _, d := range dirs {
		r.objs = append(r.objs, mustRender(t, d).objs...)
	}
	return r
}

// TestChartMatchesKustomize renders the chart with the values that stand
// for each kustomize install and checks that both give the same objects,
// field for field, but for what each tool adds of its own: Helm's labels,
// the kustomize ConfigMap's hash suffix, the chart's keep annotation on the
// CRDs and its checksum annotation on the pod template. The chart does not
// create the namespace by default (Helm's --create-namespace does). make
// verify runs it: the two cannot drift. An install serving NeonVM's kind
// alone, without vmipam's VirtualMachine CRD (the component
// without-virtualmachine, crds.virtualMachine=false), is compared too, and
// both renders checked to leave the CRD and its wiring out.
func TestChartMatchesKustomize(t *testing.T) {
	withoutVM, withoutVMArgs := namesWithoutVM(t, namespace)
	tests := []struct {
		name      string
		kustomize []string
		values    []string
		extra     []string
		// withVM says whether vmipam's VirtualMachine is installed and served.
		withVM bool
	}{
		{"", []string{"deploy/overlays/default"}, []string{"ci/default-values.yaml"}, nil, true},
		{"", []string{"deploy/overlays/cert-manager"}, []string{"ci/cert-manager-values.yaml"}, nil, true},
		{"", []string{"deploy/overlays/default", "deploy/monitoring"}, []string{"ci/monitoring-values.yaml"}, nil, true},
		{"", []string{"deploy/overlays/cert-manager", "deploy/monitoring-cert-manager"}, []string{"ci/cert-manager-values.yaml", "ci/monitoring-values.yaml"}, nil, true},
		{"without-virtualmachine", []string{withoutVM}, []string{"ci/default-values.yaml"}, withoutVMArgs, false},
	}
	for _, tc := range tests {
		name := tc.name
		if name == "" {
			name = strings.Join(tc.kustomize, "+")
		}
		t.Run(name, func(t *testing.T) {
			kr, hr := renderKustomize(t, tc.kustomize...), helmTemplate(t, namespace, tc.values, tc.extra...)
			namesCheckWithoutVM(t, kr, tc.withVM)
			namesCheckWithoutVM(t, hr, tc.withVM)
			k, h := normalise(kr.objs), normalise(hr.objs)
			delete(k, "Namespace//"+namespace)
			for _, key := range sortedKeys(k) {
				hv, ok := h[key]
				if !ok {
					t.Errorf("%s: the chart renders no %s", tc.values, key)
					continue
				}
				if hv != k[key] {
					t.Errorf("%s differs between kustomize (-) and the chart (+):\n%s", key, lineDiff(k[key], hv))
				}
			}
			for _, key := range sortedKeys(h) {
				if _, ok := k[key]; !ok {
					t.Errorf("%s: the chart renders %s, which %v does not", tc.values, key, tc.kustomize)
				}
			}
		})
	}
}

// hashSuffix is the content hash kustomize appends to a generated
// ConfigMap's name.
var hashSuffix = regexp.MustCompile(`^(vmipam-kinds)-[a-z0-9]{10}$`)

// clusterScopedKinds are the cluster-scoped kinds that kustomize gives a
// namespace all the same.
var clusterScopedKinds = map[string]bool{"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true}

// normalise returns objs by kind/namespace/name, as YAML, without what
// Helm or kustomize add of their own.
func normalise(objs []*unstructured.Unstructured) map[string]string {
	out := map[string]string{}
	for _, o := range objs {
		o = o.DeepCopy()
		labels := o.GetLabels()
		for _, l := range []string{"app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version", "helm.sh/chart"} {
			delete(labels, l)
		}
		o.SetLabels(labels)
		ann := o.GetAnnotations()
		delete(ann, "helm.sh/resource-policy")
		o.SetAnnotations(ann)
		if clusterScopedKinds[o.GetKind()] {
			// kustomize's namespace transformer does not know these kinds
			// to be cluster-scoped; the API server ignores the namespace.
			o.SetNamespace("")
		}
		if m := hashSuffix.FindStringSubmatch(o.GetName()); m != nil && o.GetKind() == "ConfigMap" {
			o.SetName(m[1])
		}
		if o.GetKind() == "Deployment" {
			unstructured.RemoveNestedField(o.Object, "spec", "template", "metadata", "annotations", "checksum/kinds")
			spec, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
			vols, _, _ := unstructured.NestedSlice(spec, "volumes")
			for _, v := range vols {
				if cm, ok, _ := unstructured.NestedString(v.(map[string]any), "configMap", "name"); ok {
					if m := hashSuffix.FindStringSubmatch(cm); m != nil {
						_ = unstructured.SetNestedField(v.(map[string]any), m[1], "configMap", "name")
					}
				}
			}
			sortByName(vols)
			_ = unstructured.SetNestedSlice(spec, vols, "volumes")
			containers, _, _ := unstructured.NestedSlice(spec, "containers")
			for _, c := range containers {
				mounts, _, _ := unstructured.NestedSlice(c.(map[string]any), "volumeMounts")
				sortByName(mounts)
				_ = unstructured.SetNestedSlice(c.(map[string]any), mounts, "volumeMounts")
			}
			_ = unstructured.SetNestedSlice(spec, containers, "containers")
			_ = unstructured.SetNestedMap(o.Object, spec, "spec", "template", "spec")
		}
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			panic(err)
		}
		out[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = string(b)
	}
	return out
}

// sortByName sorts a list of objects by their name (volumes, mounts), an
// order neither tool promises.
func sortByName(l []any) {
	slices.SortFunc(l, func(a, b any) int {
		an, _ := a.(map[string]any)["name"].(string)
		bn, _ := b.(map[string]any)["name"].(string)
		return strings.Compare(an, bn)
	})
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// lineDiff shows the lines of a and b that the other lacks.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for _, l := range al {
		if !slices.Contains(bl, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// TestChart renders the chart with each values file of its ci/ folder,
// and with a foreign kind, checks what each choice changes, applies each
// with a server-side dry-run to the real API server (schemas, strict field
// validation, the namespace's Pod Security), then applies its RBAC for real
// and asks the authorizer what vmipam may do.
func TestChart(t *testing.T) {
	harness.NeedControlPlane(t)
	wiring := filepath.Join(t.TempDir(), "kubevirt-wiring.yaml")
	out, err := exec.CommandContext(t.Context(), "go", "run", filepath.Join(root, "cmd", "vmipam"), "manifests",
		"--kinds-config", filepath.Join(root, "deploy/kinds/examples/kubevirt.yaml"), "--namespace", "chart-kubevirt").Output()
	if err != nil {
		t.Fatalf("vmipam manifests: %v", err)
	}
	if err := os.WriteFile(wiring, out, 0o644); err != nil {
		t.Fatal(err)
	}
	_, withoutVMArgs := namesWithoutVM(t, "chart-without-virtualmachine")
	type check func(t *testing.T, r *rendered, ns string)
	tests := []struct {
		name    string
		values  []string
		extra   []string
		secrets bool
		checks  []check
	}{
		{name: "default", values: []string{"ci/default-values.yaml"}, secrets: true},
		{name: "cert-manager", values: []string{"ci/cert-manager-values.yaml"}, checks: []check{checkChartCertManager}},
		{name: "provided", values: []string{"ci/provided-values.yaml"}, extra: []string{"--set", "monitoring.serviceMonitor.enabled=true"}, checks: []check{checkChartProvided}},
		{name: "one-replica", values: []string{"ci/one-replica-values.yaml"}, secrets: true, checks: []check{checkChartOneReplica}},
		{name: "monitoring", values: []string{"ci/monitoring-values.yaml"}, secrets: true},
		{
			name: "kubevirt", values: []string{"ci/default-values.yaml"}, secrets: true,
			extra:  []string{"--set-file", "kinds.config=" + filepath.Join(root, "deploy/kinds/examples/kubevirt.yaml"), "--set-file", "kinds.wiring=" + wiring},
			checks: []check{checkChartKubeVirt},
		},
		{name: "without-virtualmachine", values: []string{"ci/default-values.yaml"}, secrets: true, extra: withoutVMArgs},
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := "chart-" + tc.name
			r := helmTemplate(t, ns, tc.values, append([]string{"--set", "namespace.create=true"}, tc.extra...)...)
			for _, ch := range tc.checks {
				ch(t, r, ns)
			}
			// Nothing of the default namespace is left in a release
			// elsewhere: not in names, flags, DNS names, RBAC subjects, nor
			// the admission policies' CEL naming vmipam's ServiceAccount.
			for _, o := range r.objs {
				if b, _ := json.Marshal(o.Object); strings.Contains(string(b), namespace) {
					t.Errorf("%s %s, released into %s, still names %s: %s", o.GetKind(), o.GetName(), ns, namespace, b)
				}
			}
			// The namespace first, for real: the dry-run of what is in it
			// needs it.
			if stdout, stderr, err := apply(t.Context(), r.ofKind("Namespace"), false); err != nil {
				t.Fatalf("create namespace %s: %v\n%s%s", ns, err, stdout, stderr)
			}
			r.dryRun(t)
			var rbac []*unstructured.Unstructured
			for _, o := range r.objs {
				switch o.GetKind() {
				case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
					rbac = append(rbac, o)
				}
			}
			if stdout, stderr, err := apply(t.Context(), rbac, false); err != nil {
				t.Fatalf("apply the RBAC: %v\n%s%s", err, stdout, stderr)
			}
			sa := "system:serviceaccount:" + ns + ":vmipam"
			can := func(verb, group, resource, where, name string) bool {
				sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
					User: sa, Groups: []string{"system:serviceaccounts", "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Namespace: where, Name: name},
				}}
				if err := c.Create(t.Context(), sar); err != nil {
					t.Fatalf("SubjectAccessReview: %v", err)
				}
				return sar.Status.Allowed
			}
			for _, p := range []struct{ verb, group, resource, ns string }{
				{"update", "coordination.k8s.io", "leases", ns},
				{"update", "vmipam.io", "ipblocks", ""},
				{"update", "vmipam.io", "ippools/status", ""},
				{"create", "authentication.k8s.io", "tokenreviews", ""},
				{"patch", "events.k8s.io", "events", "default"},
			} {
				if !can(p.verb, p.group, p.resource, p.ns, "") {
					t.Errorf("%s may not %s %s.%s in %q", sa, p.verb, p.resource, p.group, p.ns)
				}
			}
			if can("update", "coordination.k8s.io", "leases", "kube-system", "") {
				t.Errorf("%s may update leases outside its namespace", sa)
			}
			if got := can("get", "", "secrets", ns, "vmipam-webhook-tls"); got != tc.secrets {
				t.Errorf("%s may read its certificate Secret: %t, want %t (only where vmipam keeps it: tls.method=self)", sa, got, tc.secrets)
			}
			if can("get", "", "secrets", "default", "") {
				t.Errorf("%s may read Secrets outside its namespace", sa)
			}
			if got := can("patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", mutatingName); got != tc.secrets {
				t.Errorf("%s may patch %s: %t, want %t (only to inject its own CA: tls.method=self)", sa, mutatingName, got, tc.secrets)
			}
			kubevirt, neonvm := tc.name == "kubevirt", tc.name == "without-virtualmachine"
			if got := can("patch", "kubevirt.io", "virtualmachines", "default", "vm"); got != kubevirt {
				t.Errorf("%s may patch KubeVirt VirtualMachines: %t, want %t", sa, got, kubevirt)
			}
			if got := can("patch", "vm.neon.tech", "virtualmachines", "default", "vm"); got != neonvm {
				t.Errorf("%s may patch NeonVM VirtualMachines: %t, want %t", sa, got, neonvm)
			}
			if got, want := can("patch", "vmipam.io", "virtualmachines", "default", "vm"), !kubevirt && !neonvm; got != want {
				t.Errorf("%s may patch vmipam's VirtualMachines: %t, want %t", sa, got, want)
			}
		})
	}
}

// webhooksOf returns the webhooks of the webhook configuration name.
func webhooksOf(t *testing.T, r *rendered, kind, name string) []map[string]any {
	t.Helper()
	o := r.find(kind, "", name)
	if o == nil {
		t.Fatalf("%s renders no %s %s", r.dir, kind, name)
	}
	l, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
	var out []map[string]any
	for _, w := range l {
		out = append(out, w.(map[string]any))
	}
	return out
}

func checkChartCertManager(t *testing.T, r *rendered, ns string) {
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		o := r.find(kind, "", map[string]string{"MutatingWebhookConfiguration": mutatingName, "ValidatingWebhookConfiguration": validatingName}[kind])
		if o == nil {
			t.Fatalf("no %s", kind)
		}
		if got, want := o.GetAnnotations()["cert-manager.io/inject-ca-from"], ns+"/vmipam-webhook"; got != want {
			t.Errorf("%s: inject-ca-from %q, want %q", kind, got, want)
		}
	}
	if r.find("Certificate", ns, "vmipam-webhook") == nil || r.find("Issuer", ns, "vmipam-ca") == nil {
		t.Errorf("no Certificate vmipam-webhook or Issuer vmipam-ca in %s", ns)
	}
	if r.find("RoleBinding", ns, "vmipam-secrets") != nil {
		t.Error("vmipam is bound to read Secrets, with cert-manager holding the certificate")
	}
}

func checkChartProvided(t *testing.T, r *rendered, ns string) {
	for _, w := range append(webhooksOf(t, r, "MutatingWebhookConfiguration", mutatingName), webhooksOf(t, r, "ValidatingWebhookConfiguration", validatingName)...) {
		if cb, _, _ := unstructured.NestedString(w, "clientConfig", "caBundle"); cb == "" {
			t.Errorf("webhook %s has no caBundle with tls.method=provided", w["name"])
		}
	}
	var d appsv1.Deployment
	r.get(t, "Deployment", ns, "vmipam", &d)
	found := false
	for _, v := range d.Spec.Template.Spec.Volumes {
		found = found || v.Secret != nil && v.Secret.SecretName == "my-vmipam-cert"
	}
	if !found {
		t.Error("the Deployment does not mount the provided Secret my-vmipam-cert")
	}
	if len(r.ofKind("Certificate")) > 0 {
		t.Error("a cert-manager Certificate with tls.method=provided")
	}
	// Prometheus verifies vmipam against the provided CA, which the
	// provided Secret need not hold.
	sm := r.find("ServiceMonitor", ns, "vmipam")
	if sm == nil {
		t.Fatal("no ServiceMonitor")
	}
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v, want one", eps)
	}
	if name, _, _ := unstructured.NestedString(eps[0].(map[string]any), "tlsConfig", "ca", "configMap", "name"); name != "vmipam-webhook-ca" {
		t.Errorf("the ServiceMonitor trusts %v, want the ConfigMap vmipam-webhook-ca", eps[0])
	}
	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", ns, "vmipam-webhook-ca", &cm)
	if !strings.Contains(cm.Data["ca.crt"], "BEGIN CERTIFICATE") {
		t.Errorf("ConfigMap vmipam-webhook-ca holds %q, want the provided CA", cm.Data["ca.crt"])
	}
}

func checkChartOneReplica(t *testing.T, r *rendered, ns string) {
	var d appsv1.Deployment
	r.get(t, "Deployment", ns, "vmipam", &d)
	if *d.Spec.Replicas != 1 || d.Spec.Template.Spec.PriorityClassName != "system-cluster-critical" || len(d.Spec.Template.Spec.TopologySpreadConstraints) != 0 {
		t.Errorf("Deployment: replicas %d, priorityClassName %q, %d spread constraints; want 1, system-cluster-critical, none",
			*d.Spec.Replicas, d.Spec.Template.Spec.PriorityClassName, len(d.Spec.Template.Spec.TopologySpreadConstraints))
	}
	if r.find("PodDisruptionBudget", ns, "vmipam") != nil {
		t.Error("a PodDisruptionBudget with podDisruptionBudget.enabled=false")
	}
	for _, w := range webhooksOf(t, r, "MutatingWebhookConfiguration", mutatingName) {
		sel, _ := json.Marshal(w["namespaceSelector"])
		if fmt.Sprint(w["failurePolicy"]) != "Ignore" || fmt.Sprint(w["timeoutSeconds"]) != "10" || !strings.Contains(string(sel), `"kube-system"`) || !strings.Contains(string(sel), `"`+ns+`"`) {
			t.Errorf("webhook %s: failurePolicy %v, timeoutSeconds %v, namespaceSelector %s; want Ignore, 10, both %s and kube-system left out",
				w["name"], w["failurePolicy"], w["timeoutSeconds"], sel, ns)
		}
	}
	np := r.find("NetworkPolicy", ns, "vmipam")
	if np == nil {
		t.Fatal("no NetworkPolicy")
	}
	if b, _ := json.Marshal(np.Object["spec"]); !strings.Contains(string(b), "192.0.2.0/24") {
		t.Errorf("the NetworkPolicy does not take the webhook's sources: %s", b)
	}
}

func checkChartKubeVirt(t *testing.T, r *rendered, ns string) {
	hooks := webhooksOf(t, r, "MutatingWebhookConfiguration", mutatingName)
	if len(hooks) != 1 || hooks[0]["name"] != "virtualmachines.kubevirt.io.vmipam.io" {
		t.Fatalf("mutating webhooks %v, want KubeVirt's only", hooks)
	}
	if svc, _, _ := unstructured.NestedString(hooks[0], "clientConfig", "service", "namespace"); svc != ns {
		t.Errorf("KubeVirt's webhook calls the Service in %q, want %q", svc, ns)
	}
	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", ns, "vmipam-kinds", &cm)
	if !strings.Contains(cm.Data["kinds.yaml"], "group: kubevirt.io") {
		t.Errorf("the kinds ConfigMap does not hold the KubeVirt configuration:\n%s", cm.Data["kinds.yaml"])
	}
}

// TestChartRefusesBadValues renders the chart with values a user gets
// wrong and checks that helm refuses each with a message that names the
// value (the chart's values.schema.json, and its own checks of values that
// only work together).
func TestChartRefusesBadValues(t *testing.T) {
	helm := helmPath(t)
	tests := []struct {
		set  []string
		want string
	}{
		{[]string{"replicas=3"}, "'replicas' not allowed"},
		{[]string{"webhook.failurePolicy=fail"}, "/webhook/failurePolicy"},
		{[]string{"webhook.timeoutSeconds=40"}, "/webhook/timeoutSeconds"},
		{[]string{"tls.method=files"}, "/tls/method"},
		{[]string{"replicaCount=0"}, "/replicaCount"},
		{[]string{"monitoring.prometheusRule.forecastWindow=1 hour"}, "/monitoring/prometheusRule/forecastWindow"},
		{[]string{"tls.method=provided"}, "tls.provided.secretName"},
		{[]string{"kinds.config=x"}, "kinds.wiring"},
		{[]string{"kinds.wiring=x"}, "kinds.config"},
		{[]string{"webhook.clientAuth.enabled=true"}, "webhook.clientAuth.caBundle"},
		{[]string{"crds.virtualMachine=false"}, "crds.virtualMachine=false leaves out vmipam's VirtualMachine CRD, but the kinds configuration serves that kind"},
		{[]string{"crds.virtualMachine=no"}, "/crds/virtualMachine"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.set, ","), func(t *testing.T) {
			args := []string{"template", "vmipam", filepath.Join(root, chart)}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := exec.CommandContext(t.Context(), helm, args...).CombinedOutput()
			if err == nil {
				t.Fatalf("helm template with %v succeeded, want it refused", tc.set)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Errorf("helm template with %v: %s\nwant a message naming %q", tc.set, out, tc.want)
			}
		})
	}
}
