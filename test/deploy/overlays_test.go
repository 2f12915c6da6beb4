package deploy

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/vmipam/vmipam/test/harness"
)

func TestOverlays(t *testing.T) {
	harness.NeedControlPlane(t)
	tests := map[string]struct {
		dir   string
		certs func(t *testing.T, r *rendered)
	}{
		"default":      {dir: "deploy/overlays/default", certs: checkSelfManagedCerts},
		"cert-manager": {dir: "deploy/overlays/cert-manager", certs: checkCertManagerCerts},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := mustRender(t, tc.dir)
			t.Run("objects", func(t *testing.T) { checkObjects(t, r) })
			t.Run("webhook configurations", func(t *testing.T) { checkWebhooks(t, r) })
			t.Run("deployment", func(t *testing.T) { checkDeployment(t, r) })
			t.Run("services", func(t *testing.T) { checkServices(t, r) })
			t.Run("rbac", func(t *testing.T) { checkRBAC(t, r) })
			t.Run("disruption budget", func(t *testing.T) { checkPDB(t, r) })
			t.Run("network policy", func(t *testing.T) { checkNetworkPolicy(t, r, nil) })
			t.Run("certificates", func(t *testing.T) { tc.certs(t, r) })
			t.Run("server-side dry-run", r.dryRun)
		})
	}
}

// checkObjects: the objects vmipam needs are there, every generated
// manifest is included, and nothing lands outside vmipam's namespace.
func checkObjects(t *testing.T, r *rendered) {
	want := []struct{ kind, ns, name string }{
		{"Namespace", "", namespace},
		{"ServiceAccount", namespace, serviceAccount},
		{"Deployment", namespace, "vmipam"},
		{"Service", namespace, webhookService},
		{"Service", namespace, metricsService},
		{"PodDisruptionBudget", namespace, "vmipam"},
		{"NetworkPolicy", namespace, "vmipam"},
		{"ClusterRoleBinding", "", "vmipam"},
		{"Role", namespace, "vmipam-leases"},
		{"RoleBinding", namespace, "vmipam-leases"},
		{"ClusterRole", "", "vmipam-metrics-reader"},
		{"ClusterRole", "", "vmipam-metrics-auth"},
		{"ClusterRoleBinding", "", "vmipam-metrics-auth"},
		{"MutatingWebhookConfiguration", "", mutatingName},
		{"ValidatingWebhookConfiguration", "", validatingName},
	}
	for _, w := range want {
		if r.find(w.kind, w.ns, w.name) == nil {
			t.Errorf("no %s %s", w.kind, key(w.ns, w.name))
		}
	}

	// The generated manifests are included as generated: a new CRD file or
	// a new object in the RBAC file must reach the install.
	crdFiles, err := filepath.Glob(filepath.Join(root, "deploy", "crd", "*.yaml"))
	if err != nil || len(crdFiles) == 0 {
		t.Fatalf("no generated CRDs in deploy/crd (%v)", err)
	}
	var generated []*unstructured.Unstructured
	for _, f := range crdFiles {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		rel, _ := filepath.Rel(root, f)
		generated = append(generated, readObjects(t, rel)...)
	}
	generated = append(generated, readObjects(t, "deploy/rbac/role.yaml")...)
	for _, g := range generated {
		ns := g.GetNamespace()
		if ns != "" {
			ns = namespace // controller-gen's namespace is rewritten by the base
		}
		if r.find(g.GetKind(), ns, g.GetName()) == nil {
			t.Errorf("generated %s %s is not in the render: list its file in the kustomization.yaml beside it", g.GetKind(), key(ns, g.GetName()))
		}
	}

	for _, o := range r.objs {
		if ns := o.GetNamespace(); ns != "" && ns != namespace {
			t.Errorf("%s %s is outside %s", o.GetKind(), key(ns, o.GetName()), namespace)
		}
	}
	// controller-gen's generic names must not survive next to vmipam's.
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		for _, o := range r.ofKind(kind) {
			if o.GetName() != mutatingName && o.GetName() != validatingName {
				t.Errorf("unexpected %s %s", kind, o.GetName())
			}
		}
	}
}

// hook is what the test looks at in a mutating or validating webhook.
type hook struct {
	ClientConfig      admissionregistrationv1.WebhookClientConfig
	Rules             []admissionregistrationv1.RuleWithOperations
	FailurePolicy     *admissionregistrationv1.FailurePolicyType
	SideEffects       *admissionregistrationv1.SideEffectClass
	TimeoutSeconds    *int32
	NamespaceSelector *metav1.LabelSelector
	AdmissionReviews  []string
}

// hooks returns the webhooks of a configuration by name.
func hooks(t *testing.T, o *unstructured.Unstructured) map[string]hook {
	t.Helper()
	out := map[string]hook{}
	switch o.GetKind() {
	case "MutatingWebhookConfiguration":
		var c admissionregistrationv1.MutatingWebhookConfiguration
		convert(t, o, &c)
		for _, w := range c.Webhooks {
			out[w.Name] = hook{w.ClientConfig, w.Rules, w.FailurePolicy, w.SideEffects, w.TimeoutSeconds, w.NamespaceSelector, w.AdmissionReviewVersions}
		}
	case "ValidatingWebhookConfiguration":
		var c admissionregistrationv1.ValidatingWebhookConfiguration
		convert(t, o, &c)
		for _, w := range c.Webhooks {
			out[w.Name] = hook{w.ClientConfig, w.Rules, w.FailurePolicy, w.SideEffects, w.TimeoutSeconds, w.NamespaceSelector, w.AdmissionReviewVersions}
		}
	default:
		t.Fatalf("%s is no webhook configuration", o.GetKind())
	}
	return out
}

func convert(t *testing.T, o *unstructured.Unstructured, out any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out); err != nil {
		t.Fatalf("%s %s: %v", o.GetKind(), key(o.GetNamespace(), o.GetName()), err)
	}
}

// checkWebhooks compares every generated webhook with its rendered form:
// renamed configuration, vmipam's Service, vmipam's namespace excluded, and
// everything else (failurePolicy, timeoutSeconds, rules, path) as generated.
func checkWebhooks(t *testing.T, r *rendered) {
	var svc corev1.Service
	r.get(t, "Service", namespace, webhookService, &svc)

	renamed := map[string]string{"MutatingWebhookConfiguration": mutatingName, "ValidatingWebhookConfiguration": validatingName}
	for _, g := range readObjects(t, "deploy/webhook/manifests.yaml") {
		name, ok := renamed[g.GetKind()]
		if !ok {
			t.Errorf("deploy/webhook/manifests.yaml holds a %s; the test knows no rendered name for it", g.GetKind())
			continue
		}
		o := r.find(g.GetKind(), "", name)
		if o == nil {
			t.Errorf("no %s %s", g.GetKind(), name)
			continue
		}
		want, got := hooks(t, g), hooks(t, o)
		if !reflect.DeepEqual(slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got))) {
			t.Errorf("%s: webhooks %v, generated %v", name, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
		}
		for hn, w := range want {
			h, ok := got[hn]
			if !ok {
				continue
			}
			where := name + "/" + hn
			if h.FailurePolicy == nil || *h.FailurePolicy != admissionregistrationv1.Fail || !reflect.DeepEqual(h.FailurePolicy, w.FailurePolicy) {
				t.Errorf("%s: failurePolicy %v, want Fail as generated", where, deref(h.FailurePolicy))
			}
			if !reflect.DeepEqual(h.TimeoutSeconds, w.TimeoutSeconds) {
				t.Errorf("%s: timeoutSeconds %v, generated %v", where, deref(h.TimeoutSeconds), deref(w.TimeoutSeconds))
			}
			if !reflect.DeepEqual(h.Rules, w.Rules) || !reflect.DeepEqual(h.SideEffects, w.SideEffects) || !reflect.DeepEqual(h.AdmissionReviews, w.AdmissionReviews) {
				t.Errorf("%s: rules, sideEffects or admissionReviewVersions differ from the generated ones", where)
			}
			s := h.ClientConfig.Service
			if s == nil || h.ClientConfig.URL != nil {
				t.Errorf("%s: clientConfig must name a Service", where)
				continue
			}
			if s.Name != svc.Name || s.Namespace != svc.Namespace {
				t.Errorf("%s: service %s, want %s", where, key(s.Namespace, s.Name), key(svc.Namespace, svc.Name))
			}
			if w.ClientConfig.Service == nil || !reflect.DeepEqual(s.Path, w.ClientConfig.Service.Path) {
				t.Errorf("%s: path %v differs from the generated one", where, deref(s.Path))
			}
			port := int32(443)
			if s.Port != nil {
				port = *s.Port
			}
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == port }) {
				t.Errorf("%s: service port %d is not a port of Service %s", where, port, svc.Name)
			}
			if len(h.ClientConfig.CABundle) != 0 {
				t.Errorf("%s: a caBundle in the manifests would fight the one vmipam or cert-manager injects", where)
			}
			checkNamespaceSelector(t, where, h.NamespaceSelector)
		}
	}
}

// checkNamespaceSelector: the webhook skips vmipam's namespace (so vmipam
// can always start) and nothing else.
func checkNamespaceSelector(t *testing.T, where string, ls *metav1.LabelSelector) {
	t.Helper()
	if ls == nil {
		t.Errorf("%s: no namespaceSelector", where)
		return
	}
	found := slices.ContainsFunc(ls.MatchExpressions, func(e metav1.LabelSelectorRequirement) bool {
		return e.Key == corev1.LabelMetadataName && e.Operator == metav1.LabelSelectorOpNotIn && slices.Contains(e.Values, namespace)
	})
	if !found {
		t.Errorf("%s: namespaceSelector lacks %s NotIn [%s]", where, corev1.LabelMetadataName, namespace)
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		t.Errorf("%s: namespaceSelector: %v", where, err)
		return
	}
	if sel.Matches(labels.Set{corev1.LabelMetadataName: namespace}) {
		t.Errorf("%s: namespaceSelector matches %s", where, namespace)
	}
	if !sel.Matches(labels.Set{corev1.LabelMetadataName: "default"}) {
		t.Errorf("%s: namespaceSelector skips an ordinary namespace", where)
	}
}

// manager returns the Deployment and its manager container.
func manager(t *testing.T, r *rendered) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	var d appsv1.Deployment
	r.get(t, "Deployment", namespace, "vmipam", &d)
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == "manager" {
			return &d, c
		}
	}
	t.Fatalf("Deployment vmipam has no container named manager")
	return nil, nil
}

// flags returns the values of the container's --name=value arguments by
// name; a bare --name has the value "true".
func flags(c *corev1.Container) map[string][]string {
	out := map[string][]string{}
	for _, a := range c.Args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok {
			value = "true"
		}
		out[name] = append(out[name], value)
	}
	return out
}

// flagValue returns the single value of a flag, or "" if it is absent.
func flagValue(t *testing.T, c *corev1.Container, name string) string {
	t.Helper()
	v := flags(c)[name]
	if len(v) > 1 {
		t.Errorf("--%s is given %d times: %v", name, len(v), v)
	}
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// bindPort returns the numeric port of a bind address such as ":8443".
func bindPort(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, ok := strings.Cut(addr, ":")
	n, err := strconv.ParseInt(p, 10, 32)
	if !ok || err != nil {
		t.Errorf("bind address %q has no port", addr)
	}
	return int32(n)
}

// containerPort resolves a Service targetPort or probe port on c.
func containerPort(c *corev1.Container, p intstr.IntOrString) (int32, bool) {
	if p.Type == intstr.Int {
		return p.IntVal, slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.ContainerPort == p.IntVal })
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

func checkDeployment(t *testing.T, r *rendered) {
	d, c := manager(t, r)
	pod := &d.Spec.Template.Spec

	if d.Spec.Replicas == nil || *d.Spec.Replicas < 3 {
		t.Errorf("replicas %v: the webhooks fail closed, so run at least 3 replicas (one may be down while two answer)", deref(d.Spec.Replicas))
	}
	// With holder slots a pod stops before its replacement starts, which
	// takes its slot: a surge pod would find none and open another, whose
	// claims the others would take over at the end of the rollout.
	slots := slices.Contains(c.Args, "--holder-slots")
	if ru := d.Spec.Strategy.RollingUpdate; d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil ||
		ru.MaxUnavailable == nil || ru.MaxSurge == nil {
		t.Errorf("strategy %+v: want RollingUpdate", d.Spec.Strategy)
	} else if slots && (ru.MaxUnavailable.String() != "1" || ru.MaxSurge.String() != "0") {
		t.Errorf("strategy %+v with --holder-slots: want maxSurge 0 and maxUnavailable 1, so each replacement finds the slot of the pod it replaces", d.Spec.Strategy)
	} else if !slots && (ru.MaxUnavailable.String() != "0" || ru.MaxSurge.String() != "1") {
		t.Errorf("strategy %+v: want maxSurge 1 and maxUnavailable 0, so a replacement is ready before an old pod stops", d.Spec.Strategy)
	}
	if !slots {
		t.Errorf("args %v: want --holder-slots, so that a rollout hands each slot on and relabels no VM", c.Args)
	}
	if pod.ServiceAccountName != serviceAccount {
		t.Errorf("serviceAccountName %q, want %q", pod.ServiceAccountName, serviceAccount)
	}
	if strings.HasPrefix(pod.PriorityClassName, "system-") {
		t.Errorf("priorityClassName %q is refused outside kube-system in many clusters", pod.PriorityClassName)
	}
	// The drain, the wait for the API server's idle connections and the
	// manager's 45s graceful shutdown (sealing the blocks) must all fit
	// before the kubelet's SIGKILL.
	drain, wait := 10*time.Second, 85*time.Second
	for flag, d := range map[string]*time.Duration{"shutdown-drain": &drain, "shutdown-connection-wait": &wait} {
		if v := flagValue(t, c, flag); v != "" {
			var err error
			if *d, err = time.ParseDuration(v); err != nil {
				t.Errorf("--%s=%q: %v", flag, v, err)
			}
		}
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < drain+wait+45*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v: must cover --shutdown-drain (%s), --shutdown-connection-wait (%s) and the manager's 45s graceful shutdown", deref(g), drain, wait)
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Errorf("the pod shares a host namespace")
	}

	// Restricted Pod Security, checked here field by field and by the API
	// server in the dry-run.
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Errorf("pod securityContext.runAsNonRoot is not true")
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccompProfile is not RuntimeDefault")
	}
	if psc != nil && psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		t.Errorf("pod runs as root")
	}
	if len(pod.InitContainers) != 0 || len(pod.Containers) != 1 {
		t.Errorf("want exactly one container, the manager")
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Errorf("manager has no securityContext")
		sc = &corev1.SecurityContext{}
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("allowPrivilegeEscalation is not false")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("manager is privileged")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("readOnlyRootFilesystem is not true")
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) != 0 {
		t.Errorf("capabilities must drop ALL and add none")
	}
	if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
		t.Errorf("manager runs as root")
	}

	if repo, _, _ := strings.Cut(c.Image, ":"); repo != image {
		t.Errorf("image %q, want %s (tag overridable with kustomize images:)", c.Image, image)
	}
	if !reflect.DeepEqual(c.Command, []string{"/vmipam"}) {
		t.Errorf("command %v, want [/vmipam]", c.Command)
	}
	if v := flagValue(t, c, "holder"); v != "" {
		t.Errorf("--holder=%q: replicas would share one holder; leave it to $POD_NAME", v)
	}
	if v := flagValue(t, c, "leader-elect"); v != "" {
		t.Errorf("--leader-elect=%q: vmipam has no leader; the flag is ignored", v)
	}
	env := func(name string) *corev1.EnvVar {
		for i := range c.Env {
			if c.Env[i].Name == name {
				return &c.Env[i]
			}
		}
		return nil
	}
	for name, path := range map[string]string{"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"} {
		if e := env(name); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != path {
			t.Errorf("%s is not taken from %s", name, path)
		}
	}

	// The ports the flags bind are the ports the pod declares.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if got, want := ports["webhook"], mustAtoi(t, flagValue(t, c, "webhook-port")); got != want || want != 9443 {
		t.Errorf("container port webhook %d, --webhook-port %d, want both 9443", got, want)
	}
	if got, want := ports["https"], bindPort(t, flagValue(t, c, "metrics-bind-address")); got != want || want != 8443 {
		t.Errorf("container port https %d, --metrics-bind-address port %d, want both 8443", got, want)
	}
	health := bindPort(t, flagValue(t, c, "health-probe-bind-address"))
	if health != 8081 {
		t.Errorf("--health-probe-bind-address port %d, want 8081", health)
	}
	for name, tc := range map[string]struct {
		probe *corev1.Probe
		path  string
	}{"liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
		if tc.probe == nil || tc.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", name)
			continue
		}
		p, ok := containerPort(c, tc.probe.HTTPGet.Port)
		if tc.probe.HTTPGet.Path != tc.path || !ok || p != health {
			t.Errorf("%s probe %s on port %d, want %s on %d", name, tc.probe.HTTPGet.Path, p, tc.path, health)
		}
	}

	res := c.Resources
	if res.Requests.Cpu().IsZero() || res.Requests.Memory().IsZero() {
		t.Errorf("cpu and memory requests must be set")
	}
	if res.Limits.Memory().IsZero() || res.Limits.Memory().Cmp(*res.Requests.Memory()) < 0 {
		t.Errorf("memory limit must be set, at least the request")
	}
	if _, ok := res.Limits[corev1.ResourceCPU]; ok {
		t.Errorf("no CPU limit: throttling adds latency to every admission")
	}

	// Every mount has its volume.
	for _, m := range c.VolumeMounts {
		if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }) {
			t.Errorf("volumeMount %s has no volume", m.Name)
		}
	}

	podLabels := labels.Set(d.Spec.Template.Labels)
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || !sel.Matches(podLabels) {
		t.Errorf("the Deployment's selector does not match its pods (%v)", err)
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.PeriodSeconds > 5 {
		t.Errorf("readiness periodSeconds %d: a draining replica must leave the Service well within --shutdown-drain", c.ReadinessProbe.PeriodSeconds)
	}
	if a := pod.Affinity; a != nil && a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 0 {
		t.Errorf("required anti-affinity could leave replicas unschedulable")
	}
	var spread bool
	for _, tsc := range pod.TopologySpreadConstraints {
		s, err := metav1.LabelSelectorAsSelector(tsc.LabelSelector)
		if tsc.WhenUnsatisfiable != corev1.ScheduleAnyway {
			t.Errorf("topology spread on %s is %s: a cluster with fewer nodes could not run every replica", tsc.TopologyKey, tsc.WhenUnsatisfiable)
		}
		spread = spread || (err == nil && tsc.TopologyKey == corev1.LabelHostname && tsc.MaxSkew == 1 && s.Matches(podLabels))
	}
	if !spread {
		t.Errorf("no topology spread with maxSkew 1 on %s for vmipam's pods", corev1.LabelHostname)
	}
}

func checkServices(t *testing.T, r *rendered) {
	d, c := manager(t, r)
	for _, tc := range []struct {
		name, portName   string
		port, targetPort int32
	}{
		{webhookService, "webhook", 443, 9443},
		{metricsService, "https", 8443, 8443},
	} {
		var svc corev1.Service
		r.get(t, "Service", namespace, tc.name, &svc)
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) || len(svc.Spec.Selector) == 0 {
			t.Errorf("Service %s does not select vmipam's pods", tc.name)
		}
		if len(svc.Spec.Ports) != 1 {
			t.Errorf("Service %s: %d ports, want 1", tc.name, len(svc.Spec.Ports))
			continue
		}
		p := svc.Spec.Ports[0]
		target, ok := containerPort(c, p.TargetPort)
		if p.Name != tc.portName || p.Port != tc.port || !ok || target != tc.targetPort {
			t.Errorf("Service %s: port %s %d -> %d, want %s %d -> %d", tc.name, p.Name, p.Port, target, tc.portName, tc.port, tc.targetPort)
		}
	}
}

// checkRBAC: every binding points at vmipam's ServiceAccount and at a role
// in the render; what the roles allow is checked against the API server's
// authorizer in TestPermissions.
func checkRBAC(t *testing.T, r *rendered) {
	roles := map[string]bool{}
	for _, kind := range []string{"ClusterRole", "Role"} {
		for _, o := range r.ofKind(kind) {
			roles[kind+"/"+key(o.GetNamespace(), o.GetName())] = true
		}
	}
	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: serviceAccount, Namespace: namespace}
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, o := range r.ofKind(kind) {
			var b rbacv1.RoleBinding // the fields read are common to both kinds
			convert(t, o, &b)
			ref := b.RoleRef.Kind + "/" + b.RoleRef.Name
			if b.RoleRef.Kind == "Role" {
				ref = b.RoleRef.Kind + "/" + key(b.Namespace, b.RoleRef.Name)
			}
			if !roles[ref] {
				t.Errorf("%s %s refers to %s, which is not in the render", kind, key(b.Namespace, b.Name), ref)
			}
			if !slices.Contains(b.Subjects, sa) {
				t.Errorf("%s %s does not bind ServiceAccount %s/%s", kind, key(b.Namespace, b.Name), namespace, serviceAccount)
			}
		}
	}
	var reader rbacv1.ClusterRole
	r.get(t, "ClusterRole", "", "vmipam-metrics-reader", &reader)
	want := []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}
	if !reflect.DeepEqual(reader.Rules, want) {
		t.Errorf("vmipam-metrics-reader rules %+v, want %+v", reader.Rules, want)
	}
}

func checkPDB(t *testing.T, r *rendered) {
	d, _ := manager(t, r)
	var pdb policyv1.PodDisruptionBudget
	r.get(t, "PodDisruptionBudget", namespace, "vmipam", &pdb)
	// With one replica, minAvailable: 1 would block every node drain.
	if pdb.Spec.MinAvailable != nil || pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable != intstr.FromInt32(1) {
		t.Errorf("want maxUnavailable: 1 and no minAvailable while vmipam runs one replica")
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the budget does not select vmipam's pods (%v)", err)
	}
}

// checkNetworkPolicy checks the policy of a render. webhookFrom is what
// the webhook port's rule must allow: nil for any source (the base), or
// exactly the peers a component sets.
func checkNetworkPolicy(t *testing.T, r *rendered, webhookFrom []networkingv1.NetworkPolicyPeer) {
	d, _ := manager(t, r)
	var np networkingv1.NetworkPolicy
	r.get(t, "NetworkPolicy", namespace, "vmipam", &np)
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("the policy does not select vmipam's pods (%v)", err)
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
		t.Errorf("policyTypes %v, want Ingress and Egress", np.Spec.PolicyTypes)
	}
	hasPort := func(ports []networkingv1.NetworkPolicyPort, n int32) bool {
		return slices.ContainsFunc(ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.IntVal == n })
	}
	var webhookRules, metricsFromMonitoring int
	for _, in := range np.Spec.Ingress {
		if hasPort(in.Ports, 9443) {
			webhookRules++
			if len(in.Ports) != 1 {
				t.Errorf("the webhook rule opens other ports too: %v", in.Ports)
			}
			if !equality.Semantic.DeepEqual(in.From, webhookFrom) {
				t.Errorf("the webhook port 9443 accepts %s, want %s", peers(in.From), peers(webhookFrom))
			}
		}
		if hasPort(in.Ports, 8443) {
			if len(in.From) == 0 {
				t.Errorf("metrics port 8443 is open to every source")
			}
			for _, peer := range in.From {
				if peer.NamespaceSelector == nil || peer.IPBlock != nil {
					t.Errorf("metrics port 8443 is open to a peer that is not a namespace selector")
					continue
				}
				s, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
				if err == nil && s.Matches(labels.Set{corev1.LabelMetadataName: "monitoring"}) {
					metricsFromMonitoring++
				}
			}
		}
	}
	if webhookRules != 1 {
		t.Errorf("%d ingress rules for the webhook port 9443, want 1", webhookRules)
	}
	if metricsFromMonitoring == 0 {
		t.Errorf("the metrics port 8443 does not accept the monitoring namespace")
	}
	apiServer := map[int32]bool{}
	for _, out := range np.Spec.Egress {
		anywhere := slices.ContainsFunc(out.To, func(p networkingv1.NetworkPolicyPeer) bool {
			return p.IPBlock != nil && p.IPBlock.CIDR == "0.0.0.0/0" && len(p.IPBlock.Except) == 0
		})
		for _, n := range []int32{443, 6443} {
			if anywhere && hasPort(out.Ports, n) {
				apiServer[n] = true
			}
		}
	}
	if !apiServer[443] || !apiServer[6443] {
		t.Errorf("egress to the API server on 443 and 6443 is not allowed")
	}
}

// peers prints a NetworkPolicy "from" list; nil is any source.
func peers(p []networkingv1.NetworkPolicyPeer) string {
	if p == nil {
		return "any source"
	}
	b, _ := json.Marshal(p)
	return string(b)
}

func checkSelfManagedCerts(t *testing.T, r *rendered) {
	_, c := manager(t, r)
	if mode := flagValue(t, c, "cert-mode"); mode != "" && mode != "self" {
		t.Errorf("--cert-mode=%s, want self (the default)", mode)
	}
	// The certificate Secret is granted once, by the generated Role, and
	// only in vmipam's namespace.
	if got := secretGrants(t, r); !slices.Equal(got, []string{"Role/" + namespace + "/vmipam"}) {
		t.Errorf("Secrets are granted to vmipam by %v, want by the generated Role %s/vmipam alone", got, namespace)
	}
	for _, kind := range []string{"Issuer", "Certificate"} {
		if len(r.ofKind(kind)) != 0 {
			t.Errorf("a %s in the self-managed install", kind)
		}
	}
	for _, name := range []string{mutatingName, validatingName} {
		for _, o := range r.objs {
			if o.GetName() == name && o.GetAnnotations()["cert-manager.io/inject-ca-from"] != "" {
				t.Errorf("%s asks cert-manager for its CA, but vmipam injects it", name)
			}
		}
	}
	var ca rbacv1.ClusterRole
	r.get(t, "ClusterRole", "", "vmipam-webhook-ca-injector", &ca)
}

func checkCertManagerCerts(t *testing.T, r *rendered) {
	d, c := manager(t, r)
	if mode := flagValue(t, c, "cert-mode"); mode != "cert-manager" {
		t.Errorf("--cert-mode=%s, want cert-manager", mode)
	}
	if dir := flagValue(t, c, "cert-dir"); dir != "" && dir != certDir {
		t.Errorf("--cert-dir=%s, want %s", dir, certDir)
	}
	if r.find("ClusterRole", "", "vmipam-webhook-ca-injector") != nil {
		t.Errorf("vmipam may not write webhook configurations when cert-manager injects the CA")
	}

	// vmipam reads no Secret with cert-manager, so cannot read the CA's key.
	if got := secretGrants(t, r); len(got) != 0 {
		t.Errorf("Secrets are granted to vmipam by %v; with cert-manager it needs none", got)
	}

	str := func(o *unstructured.Unstructured, path ...string) string {
		s, _, _ := unstructured.NestedString(o.Object, path...)
		return s
	}
	issuerOf := func(cert *unstructured.Unstructured) *unstructured.Unstructured {
		kind, name := str(cert, "spec", "issuerRef", "kind"), str(cert, "spec", "issuerRef", "name")
		if kind == "" {
			kind = "Issuer"
		}
		issuer := r.find(kind, cert.GetNamespace(), name)
		if kind != "Issuer" || issuer == nil {
			t.Fatalf("Certificate %s refers to %s %s, not an Issuer of the render", cert.GetName(), kind, name)
		}
		return issuer
	}
	var cert, caCert *unstructured.Unstructured
	for _, o := range r.ofKind("Certificate") {
		if isCA, _, _ := unstructured.NestedBool(o.Object, "spec", "isCA"); isCA {
			caCert = o
		} else if cert != nil {
			t.Fatalf("Certificates %s and %s both serve", cert.GetName(), o.GetName())
		} else {
			cert = o
		}
	}
	if cert == nil || caCert == nil {
		t.Fatalf("want a serving Certificate and a CA Certificate")
	}
	// The serving certificate comes from a CA Issuer whose key is the CA
	// Certificate's, itself self-signed: renewals of the serving
	// certificate leave the CA that the bundles and Prometheus trust alone.
	caSecret := str(caCert, "spec", "secretName")
	if issuer := issuerOf(cert); str(issuer, "spec", "ca", "secretName") != caSecret || caSecret == "" {
		t.Errorf("Certificate %s is not issued by the CA of Certificate %s", cert.GetName(), caCert.GetName())
	}
	if _, ok, _ := unstructured.NestedMap(issuerOf(caCert).Object, "spec", "selfSigned"); !ok {
		t.Errorf("the CA's Issuer is not selfSigned")
	}
	dnsNames, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	for _, svc := range []string{webhookService, metricsService} {
		for _, want := range []string{
			fmt.Sprintf("%s.%s.svc", svc, namespace),
			fmt.Sprintf("%s.%s.svc.cluster.local", svc, namespace),
		} {
			if !slices.Contains(dnsNames, want) {
				t.Errorf("Certificate %s lacks dnsName %s", cert.GetName(), want)
			}
		}
	}
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == caSecret {
			t.Errorf("the CA's Secret %s is mounted: the serving pod must hold the serving key only", caSecret)
		}
	}

	secret := str(cert, "spec", "secretName")
	if secret != "vmipam-webhook-cert" {
		t.Errorf("Certificate secretName %q, want vmipam-webhook-cert", secret)
	}
	var mounted bool
	for _, m := range c.VolumeMounts {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if m.Name == v.Name && m.MountPath == certDir && v.Secret != nil && v.Secret.SecretName == secret {
				mounted = m.ReadOnly && m.SubPath == "" // a subPath mount never sees a renewal
			}
		}
	}
	if !mounted {
		t.Errorf("Secret %s is not mounted read-only at %s", secret, certDir)
	}

	want := cert.GetNamespace() + "/" + cert.GetName()
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		for _, o := range r.ofKind(kind) {
			if got := o.GetAnnotations()["cert-manager.io/inject-ca-from"]; got != want {
				t.Errorf("%s %s: cert-manager.io/inject-ca-from %q, want %q", kind, o.GetName(), got, want)
			}
		}
	}
}

// secretGrants returns the roles of the render, as "Kind/namespace/name",
// that a binding grants vmipam's ServiceAccount and that allow anything on
// Secrets.
func secretGrants(t *testing.T, r *rendered) []string {
	t.Helper()
	sa := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: serviceAccount, Namespace: namespace}
	var out []string
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, o := range r.ofKind(kind) {
			var b rbacv1.RoleBinding
			convert(t, o, &b)
			if !slices.Contains(b.Subjects, sa) {
				continue
			}
			ns := ""
			if b.RoleRef.Kind == "Role" {
				ns = b.Namespace
			}
			role := r.find(b.RoleRef.Kind, ns, b.RoleRef.Name)
			if role == nil {
				continue
			}
			var cr rbacv1.ClusterRole // a Role's rules read the same
			convert(t, role, &cr)
			for _, rule := range cr.Rules {
				core := slices.Contains(rule.APIGroups, "") || slices.Contains(rule.APIGroups, "*")
				if core && (slices.Contains(rule.Resources, "secrets") || slices.Contains(rule.Resources, "*")) {
					out = append(out, b.RoleRef.Kind+"/"+key(ns, b.RoleRef.Name))
					break
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func mustAtoi(t *testing.T, s string) int32 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		t.Errorf("%q is not a port number", s)
	}
	return int32(n)
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
