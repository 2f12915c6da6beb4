// Package manifests renders the wiring of the kinds vmipam serves from the
// kinds configuration: the mutating webhook of each kind, the
// ValidatingAdmissionPolicy that keeps its addresses immutable in the API
// server, and the RBAC vmipam needs on it. `vmipam manifests` writes them
// (deploy/kinds/wiring.yaml comes from it), and the local runs and tests
// install what it returns, so nobody writes webhook YAML per kind.
package manifests

import (
	"bytes"
	"fmt"
	"sort"
	"strings"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/webhook"
)

// Names of the rendered objects.
const (
	// MutatingName is the MutatingWebhookConfiguration of the kinds; vmipam
	// keeps its CA bundle (--mutating-webhook-configuration).
	MutatingName = "vmipam-mutating"
	// RoleName is the ClusterRole (and its binding) granting vmipam the
	// configured kinds.
	RoleName = "vmipam-kinds"
)

// Options say where vmipam runs.
type Options struct {
	// Namespace and Service are vmipam's namespace and webhook Service.
	Namespace, Service string
	// ServiceAccount is vmipam's.
	ServiceAccount string
	// URL, if set, points the webhooks at a vmipam outside the cluster
	// (https://127.0.0.1:9443) instead of the Service.
	URL string
	// AdminGroups may write vmipam's stamp on an existing object beside
	// vmipam's ServiceAccount; system:masters when empty (an administrator
	// could remove the policy anyway, and the tests and local runs run
	// vmipam as one).
	AdminGroups []string
}

// writers is who the policies let write vmipam's stamp.
func (o Options) writers() kinds.Writers {
	o = o.withDefaults()
	return kinds.Writers{
		Users:  []string{"system:serviceaccount:" + o.Namespace + ":" + o.ServiceAccount},
		Groups: o.AdminGroups,
	}
}

func (o Options) withDefaults() Options {
	if o.Namespace == "" {
		o.Namespace = "vmipam-system"
	}
	if o.Service == "" {
		o.Service = "vmipam-webhook"
	}
	if o.ServiceAccount == "" {
		o.ServiceAccount = "vmipam"
	}
	if len(o.AdminGroups) == 0 {
		o.AdminGroups = []string{"system:masters"}
	}
	return o
}

// WebhookName is the name of kind t's mutating webhook: vmipam's own kind
// keeps the name earlier versions gave it, so that an apply updates it in
// place.
func WebhookName(t kinds.Kind) string {
	if t.GVR() == kinds.VirtualMachine.GVR() {
		return "mvirtualmachine.vmipam.io"
	}
	g := t.GVK.Group
	if g == "" {
		g = "core"
	}
	return t.Resource + "." + g + ".vmipam.io"
}

// PolicyName is the name of kind t's ValidatingAdmissionPolicy for
// operation op, and of its binding: vmipam-<resource>.<group> for updates
// (the name the single policy of earlier versions had, so that applying
// the new wiring replaces it rather than leaves it beside), and that with
// -create for creates.
func PolicyName(t kinds.Kind, op string) string {
	g := t.GVK.Group
	if g == "" {
		g = "core"
	}
	name := "vmipam-" + t.Resource + "." + g
	if op == kinds.OpCreate {
		name += "-create"
	}
	return name
}

// Mutating returns the MutatingWebhookConfiguration that calls vmipam on
// the CREATE of every object of the kinds in scope: vmipam's only call per
// VM. Updates and deletes of VMs never call vmipam.
func Mutating(ts []kinds.Kind, o Options) *admissionregv1.MutatingWebhookConfiguration {
	o = o.withDefaults()
	m := &admissionregv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: MutatingName},
	}
	for _, t := range ts {
		scope := admissionregv1.NamespacedScope
		if t.ClusterScoped {
			scope = admissionregv1.ClusterScope
		}
		w := admissionregv1.MutatingWebhook{
			Name:                    WebhookName(t),
			AdmissionReviewVersions: []string{"v1"},
			ClientConfig:            clientConfig(o, webhook.MutatePath(t)),
			Rules: []admissionregv1.RuleWithOperations{{
				Operations: []admissionregv1.OperationType{admissionregv1.Create},
				Rule: admissionregv1.Rule{
					APIGroups: []string{t.GVK.Group}, APIVersions: []string{t.GVK.Version},
					Resources: []string{t.Resource}, Scope: &scope,
				},
			}},
			// Fail closed: a VM created without vmipam would go without an
			// address until the controller gives it one.
			FailurePolicy:      ptr.To(admissionregv1.Fail),
			MatchPolicy:        ptr.To(admissionregv1.Equivalent),
			SideEffects:        ptr.To(admissionregv1.SideEffectClassNoneOnDryRun),
			TimeoutSeconds:     ptr.To[int32](5),
			ReinvocationPolicy: ptr.To(admissionregv1.NeverReinvocationPolicy),
		}
		if !t.ClusterScoped {
			// Never intercept vmipam's own namespace: with failurePolicy
			// Fail, a webhook that covered it could block what vmipam needs
			// to start.
			w.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{o.Namespace},
			}}}
		}
		if t.Condition != "" {
			w.MatchConditions = []admissionregv1.MatchCondition{{Name: "in-scope", Expression: t.Condition}}
		}
		m.Webhooks = append(m.Webhooks, w)
	}
	return m
}

func clientConfig(o Options, path string) admissionregv1.WebhookClientConfig {
	if o.URL != "" {
		u := strings.TrimSuffix(o.URL, "/") + path
		return admissionregv1.WebhookClientConfig{URL: &u}
	}
	return admissionregv1.WebhookClientConfig{Service: &admissionregv1.ServiceReference{
		Namespace: o.Namespace, Name: o.Service, Path: ptr.To(path), Port: ptr.To[int32](443),
	}}
}

// Policies returns, for each kind, the ValidatingAdmissionPolicies that
// run kinds.Kind.PolicyRules in the API server, one for creates and one
// for updates, and their bindings, which leave vmipam's own namespace out
// as the webhook does. Two policies, not one with a test of
// request.operation in every rule: a create, which every VM pays for,
// evaluates its one rule and none of the update's.
func Policies(ts []kinds.Kind, o Options) []runtime.Object {
	o = o.withDefaults()
	var out []runtime.Object
	for _, t := range ts {
		for _, op := range []string{kinds.OpCreate, kinds.OpUpdate} {
			out = append(out, policy(t, op, o)...)
		}
	}
	return out
}

// policy returns kind t's ValidatingAdmissionPolicy for operation op and
// its binding.
func policy(t kinds.Kind, op string, o Options) []runtime.Object {
	resources := []string{t.Resource}
	if t.Status != nil && op == kinds.OpUpdate {
		// The status subresource is only ever updated.
		resources = append(resources, t.Resource+"/status")
	}
	name := PolicyName(t, op)
	p := &admissionregv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregv1.Fail),
			MatchConstraints: &admissionregv1.MatchResources{
				MatchPolicy: ptr.To(admissionregv1.Equivalent),
				ResourceRules: []admissionregv1.NamedRuleWithOperations{{RuleWithOperations: admissionregv1.RuleWithOperations{
					Operations: []admissionregv1.OperationType{admissionregv1.OperationType(op)},
					Rule: admissionregv1.Rule{
						APIGroups: []string{t.GVK.Group}, APIVersions: []string{t.GVK.Version}, Resources: resources,
					},
				}}},
			},
		},
	}
	vars, rules := t.Policy(op, o.writers())
	for _, v := range vars {
		p.Spec.Variables = append(p.Spec.Variables, admissionregv1.Variable{Name: v.Name, Expression: v.Expression})
	}
	for _, r := range rules {
		reason := metav1.StatusReason(r.Reason)
		p.Spec.Validations = append(p.Spec.Validations, admissionregv1.Validation{
			Expression: r.Expression, Message: r.Message, Reason: &reason,
		})
	}
	b := &admissionregv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregv1.ValidationAction{admissionregv1.Deny},
		},
	}
	if !t.ClusterScoped {
		b.Spec.MatchResources = &admissionregv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{o.Namespace},
		}}}}
	}
	return []runtime.Object{p, b}
}

// RBAC returns the ClusterRole that grants vmipam what it does with the
// kinds (read and watch them, stamp and label them, remove its finalizer,
// fill status fields), and its binding to vmipam's ServiceAccount.
func RBAC(ts []kinds.Kind, o Options) []runtime.Object {
	o = o.withDefaults()
	byGroup := map[string][]string{}
	status := map[string][]string{}
	for _, t := range ts {
		byGroup[t.GVK.Group] = append(byGroup[t.GVK.Group], t.Resource)
		if t.Status != nil {
			status[t.GVK.Group] = append(status[t.GVK.Group], t.Resource+"/status")
		}
	}
	groups := make([]string, 0, len(byGroup))
	for g := range byGroup {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	role := &rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: RoleName},
	}
	for _, g := range groups {
		rs := byGroup[g]
		sort.Strings(rs)
		role.Rules = append(role.Rules, rbacv1.PolicyRule{
			APIGroups: []string{g}, Resources: rs, Verbs: []string{"get", "list", "watch", "update", "patch"},
		})
		if s := status[g]; len(s) > 0 {
			sort.Strings(s)
			role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{g}, Resources: s, Verbs: []string{"get", "update", "patch"}})
		}
	}
	binding := &rbacv1.ClusterRoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: RoleName},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: RoleName},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: o.ServiceAccount, Namespace: o.Namespace}},
	}
	return []runtime.Object{role, binding}
}

// All returns everything the kinds need, in the order to apply it, and
// the policy of IPReleases (ReleasePolicy).
func All(ts []kinds.Kind, o Options) []runtime.Object {
	out := RBAC(ts, o)
	out = append(out, Policies(ts, o)...)
	out = append(out, ReleasePolicy()...)
	return append(out, Mutating(ts, o))
}

// ReleasePolicyName names the ValidatingAdmissionPolicy of IPReleases.
const ReleasePolicyName = "vmipam-iprelease-requested-by"

// ReleasePolicy returns the ValidatingAdmissionPolicy, and its binding,
// that makes an IPRelease's spec.requestedBy the user who creates it, as
// the API server authenticated them: the address history records it as
// who asked. kubectl vmipam release learns the name from a
// SelfSubjectReview. The CRD keeps the spec immutable afterwards.
func ReleasePolicy() []runtime.Object {
	p := &admissionregv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: ReleasePolicyName},
		Spec: admissionregv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregv1.Fail),
			MatchConstraints: &admissionregv1.MatchResources{
				MatchPolicy: ptr.To(admissionregv1.Equivalent),
				ResourceRules: []admissionregv1.NamedRuleWithOperations{{RuleWithOperations: admissionregv1.RuleWithOperations{
					Operations: []admissionregv1.OperationType{admissionregv1.Create},
					Rule:       admissionregv1.Rule{APIGroups: []string{"vmipam.io"}, APIVersions: []string{"*"}, Resources: []string{"ipreleases"}},
				}}},
			},
			Validations: []admissionregv1.Validation{{
				Expression: "has(object.spec.requestedBy) && object.spec.requestedBy == request.userInfo.username",
				MessageExpression: `"spec.requestedBy must name the user creating the IPRelease, " + request.userInfo.username + ` +
					`", as the address history records it; kubectl vmipam release sets it"`,
				Reason: ptr.To(metav1.StatusReasonInvalid),
			}},
		},
	}
	b := &admissionregv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: ReleasePolicyName},
		Spec: admissionregv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        ReleasePolicyName,
			ValidationActions: []admissionregv1.ValidationAction{admissionregv1.Deny},
		},
	}
	return []runtime.Object{p, b}
}

// YAML writes objs as one YAML stream, with a header saying where it
// comes from.
func YAML(objs []runtime.Object, header string) ([]byte, error) {
	var b bytes.Buffer
	for _, line := range strings.Split(strings.TrimSpace(header), "\n") {
		b.WriteString("# " + line + "\n")
	}
	for _, o := range objs {
		raw, err := yaml.Marshal(o)
		if err != nil {
			return nil, fmt.Errorf("render %T: %w", o, err)
		}
		// Drop the empty creationTimestamp and status every object has.
		raw = bytes.ReplaceAll(raw, []byte("  creationTimestamp: null\n"), nil)
		raw = bytes.ReplaceAll(raw, []byte("status: {}\n"), nil)
		b.WriteString("---\n")
		b.Write(raw)
	}
	return b.Bytes(), nil
}
