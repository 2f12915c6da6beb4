package manifests

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/vmipam/vmipam/kinds"
)

// TestAll: every configured kind gets its webhook (CREATE only, its own
// path, its condition as a match condition), its policy (with the status
// subresource for a status kind) and its RBAC.
func TestAll(t *testing.T) {
	var all []kinds.Kind
	for _, f := range []string{"kinds.yaml", "examples/neonvm.yaml", "examples/kubevirt.yaml"} {
		ts, err := kinds.Load(filepath.Join("..", "..", "deploy", "kinds", f))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ts...)
	}
	objs := All(all, Options{})
	var m *admissionregv1.MutatingWebhookConfiguration
	policies := map[string]*admissionregv1.ValidatingAdmissionPolicy{}
	var role *rbacv1.ClusterRole
	for _, o := range objs {
		switch o := o.(type) {
		case *admissionregv1.MutatingWebhookConfiguration:
			m = o
		case *admissionregv1.ValidatingAdmissionPolicy:
			policies[o.Name] = o
		case *rbacv1.ClusterRole:
			role = o
		}
	}
	if m == nil || m.Name != MutatingName || len(m.Webhooks) != 3 || role == nil || len(policies) != 7 || policies[ReleasePolicyName] == nil {
		t.Fatalf("rendered %d objects: %+v", len(objs), objs)
	}
	paths := map[string]bool{}
	for i, w := range m.Webhooks {
		k := all[i]
		if p := *w.ClientConfig.Service.Path; paths[p] {
			t.Errorf("two webhooks on path %s", p)
		} else {
			paths[p] = true
		}
		if ops := w.Rules[0].Operations; len(ops) != 1 || ops[0] != admissionregv1.Create {
			t.Errorf("%s: operations %v, want CREATE only", w.Name, ops)
		}
		if (k.Condition != "") != (len(w.MatchConditions) == 1) {
			t.Errorf("%s: match conditions %v for condition %q", w.Name, w.MatchConditions, k.Condition)
		}
		if *w.FailurePolicy != admissionregv1.Fail || *w.SideEffects != admissionregv1.SideEffectClassNoneOnDryRun || w.NamespaceSelector == nil {
			t.Errorf("%s: %+v", w.Name, w)
		}
		for _, op := range []string{kinds.OpCreate, kinds.OpUpdate} {
			p := policies[PolicyName(k, op)]
			if p == nil {
				t.Fatalf("no %s policy for %s", op, k.GVR())
			}
			rule := p.Spec.MatchConstraints.ResourceRules[0]
			if len(rule.Operations) != 1 || string(rule.Operations[0]) != op {
				t.Errorf("%s: the %s policy matches %v", k.GVR(), op, rule.Operations)
			}
			if want := k.Status != nil && op == kinds.OpUpdate; slices.Contains(rule.Resources, k.Resource+"/status") != want {
				t.Errorf("%s: %s policy resources %v", k.GVR(), op, rule.Resources)
			}
			// Every variable a policy declares is read by one of its
			// rules, and none reads request.operation: the policy's
			// match says which operation it checks.
			for _, v := range p.Spec.Variables {
				if !slices.ContainsFunc(p.Spec.Validations, func(r admissionregv1.Validation) bool {
					return strings.Contains(r.Expression+" ", "variables."+v.Name+" ")
				}) {
					t.Errorf("%s: the %s policy declares variable %s, which no rule reads", k.GVR(), op, v.Name)
				}
			}
			for _, r := range p.Spec.Validations {
				if strings.Contains(r.Expression, "request.operation") {
					t.Errorf("%s: the %s policy tests the operation: %s", k.GVR(), op, r.Expression)
				}
			}
		}
		if n := len(policies[PolicyName(k, kinds.OpCreate)].Spec.Validations); n > 2 {
			t.Errorf("%s: a create evaluates %d rules", k.GVR(), n)
		}
	}
	if m.Webhooks[0].Name != "mvirtualmachine.vmipam.io" || *m.Webhooks[0].ClientConfig.Service.Path != "/mutate-vmipam-io-v1alpha1-virtualmachine" {
		t.Errorf("vmipam's own webhook lost its name or path: %s %s", m.Webhooks[0].Name, *m.Webhooks[0].ClientConfig.Service.Path)
	}
	var rules []string
	for _, r := range role.Rules {
		rules = append(rules, strings.Join(r.APIGroups, ",")+":"+strings.Join(r.Resources, ",")+":"+strings.Join(r.Verbs, ","))
	}
	for _, want := range []string{
		"kubevirt.io:virtualmachines:get,list,watch,update,patch",
		"vm.neon.tech:virtualmachines:get,list,watch,update,patch",
		"vm.neon.tech:virtualmachines/status:get,update,patch",
		"vmipam.io:virtualmachines:get,list,watch,update,patch",
	} {
		if !slices.Contains(rules, want) {
			t.Errorf("RBAC lacks %s: %v", want, rules)
		}
	}
	out, err := YAML(objs, "header")
	if err != nil || !strings.HasPrefix(string(out), "# header\n---\n") || strings.Contains(string(out), "creationTimestamp") {
		t.Errorf("YAML: %v\n%s", err, out)
	}
	u := Mutating(all[:1], Options{URL: "https://127.0.0.1:9443/"})
	if got := *u.Webhooks[0].ClientConfig.URL; got != "https://127.0.0.1:9443/mutate-vmipam-io-v1alpha1-virtualmachine" {
		t.Errorf("URL %s", got)
	}
}
