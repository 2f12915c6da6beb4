package deploy

import (
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/test/harness"
)

// TestPermissions applies the RBAC of the default install and of
// deploy/monitoring for real and asks the API server's authorizer what
// vmipam's ServiceAccount, and Prometheus's, may do.
func TestPermissions(t *testing.T) {
	harness.NeedControlPlane(t)
	var objs []*unstructured.Unstructured
	for _, dir := range []string{"deploy/overlays/default", "deploy/monitoring"} {
		for _, o := range mustRender(t, dir).objs {
			switch o.GetKind() {
			case "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding":
				objs = append(objs, o)
			}
		}
	}
	if stdout, stderr, err := apply(t.Context(), objs, false); err != nil {
		t.Fatalf("apply the RBAC: %v\n%s%s", err, stdout, stderr)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}

	const (
		vmipam     = "system:serviceaccount:" + namespace + ":" + serviceAccount
		prometheus = "system:serviceaccount:monitoring:prometheus-k8s"
	)
	res := func(verb, group, resource, ns, name string) *authorizationv1.ResourceAttributes {
		return &authorizationv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Namespace: ns, Name: name}
	}
	tests := map[string]struct {
		user    string
		res     *authorizationv1.ResourceAttributes
		path    string
		allowed bool
	}{
		"renew its holder lease":        {user: vmipam, res: res("patch", "coordination.k8s.io", "leases", namespace, ""), allowed: true},
		"mark a takeover":               {user: vmipam, res: res("update", "coordination.k8s.io", "leases", namespace, ""), allowed: true},
		"create the lease":              {user: vmipam, res: res("create", "coordination.k8s.io", "leases", namespace, ""), allowed: true},
		"list the peers' leases":        {user: vmipam, res: res("list", "coordination.k8s.io", "leases", namespace, ""), allowed: true},
		"delete a taken-over lease":     {user: vmipam, res: res("delete", "coordination.k8s.io", "leases", namespace, ""), allowed: true},
		"record events.k8s.io events":   {user: vmipam, res: res("patch", "events.k8s.io", "events", namespace, ""), allowed: true},
		"read the certificate Secret":   {user: vmipam, res: res("get", "", "secrets", namespace, "vmipam-webhook-tls"), allowed: true},
		"create the certificate Secret": {user: vmipam, res: res("create", "", "secrets", namespace, ""), allowed: true},
		"update the certificate Secret": {user: vmipam, res: res("update", "", "secrets", namespace, "vmipam-webhook-tls"), allowed: true},
		"watch Secrets":                 {user: vmipam, res: res("watch", "", "secrets", namespace, ""), allowed: true},
		"no Secrets elsewhere":          {user: vmipam, res: res("get", "", "secrets", "default", ""), allowed: false},
		"no leases elsewhere":           {user: vmipam, res: res("update", "coordination.k8s.io", "leases", "kube-system", ""), allowed: false},
		"review metrics tokens":         {user: vmipam, res: res("create", "authentication.k8s.io", "tokenreviews", "", ""), allowed: true},
		"authorise metrics scrapes":     {user: vmipam, res: res("create", "authorization.k8s.io", "subjectaccessreviews", "", ""), allowed: true},
		"watch webhook configurations":  {user: vmipam, res: res("watch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", ""), allowed: true},
		"inject the mutating CA":        {user: vmipam, res: res("patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", mutatingName), allowed: true},
		"inject the validating CA":      {user: vmipam, res: res("update", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", validatingName), allowed: true},
		"watch VirtualMachines":         {user: vmipam, res: res("watch", "vmipam.io", "virtualmachines", "", ""), allowed: true},
		"remove a VM's finalizer":       {user: vmipam, res: res("update", "vmipam.io", "virtualmachines", "default", "vm"), allowed: true},
		"write IPBlocks":                {user: vmipam, res: res("update", "vmipam.io", "ipblocks", "", ""), allowed: true},
		"write IPBlockShares":           {user: vmipam, res: res("update", "vmipam.io", "ipblockshares", "", ""), allowed: true},
		"delete a block's shares":       {user: vmipam, res: res("deletecollection", "vmipam.io", "ipblockshares", "", ""), allowed: true},
		"report pool status":            {user: vmipam, res: res("update", "vmipam.io", "ippools/status", "", ""), allowed: true},
		"Prometheus scrapes /metrics":   {user: prometheus, path: "/metrics", allowed: true},
		"others do not":                 {user: "system:serviceaccount:default:default", path: "/metrics", allowed: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:               tc.user,
				Groups:             []string{"system:serviceaccounts", "system:authenticated"},
				ResourceAttributes: tc.res,
			}}
			if tc.path != "" {
				sar.Spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: tc.path, Verb: "get"}
			}
			if err := c.Create(t.Context(), sar); err != nil {
				t.Fatalf("SubjectAccessReview: %v", err)
			}
			if sar.Status.Allowed != tc.allowed {
				t.Errorf("%s: allowed %t, want %t (%s)", tc.user, sar.Status.Allowed, tc.allowed, sar.Status.Reason)
			}
		})
	}
}
