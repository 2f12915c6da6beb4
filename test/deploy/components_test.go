package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/vmipam/vmipam/test/harness"
)

const (
	sourcesPatch   = "deploy/components/webhook-sources/webhook_sources.yaml"
	clientCAConfig = "vmipam-webhook-client-ca"
)

// TestComponents renders overlays that add the optional components to an
// install, as a user's overlay does (test/deploy/testdata), and checks that
// each changes what it promises and nothing else, and that the API server
// accepts the result.
func TestComponents(t *testing.T) {
	harness.NeedControlPlane(t)
	sources := webhookSources(t)
	tests := map[string]struct {
		dir, install string
		clientAuth   bool
		certs        func(t *testing.T, r *rendered)
	}{
		"webhook sources on the default install": {
			dir: "test/deploy/testdata/webhook-sources", install: "deploy/overlays/default", certs: checkSelfManagedCerts,
		},
		"webhook sources and client authentication with cert-manager": {
			dir: "test/deploy/testdata/webhook-client-auth", install: "deploy/overlays/cert-manager", clientAuth: true, certs: checkCertManagerCerts,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r, install := mustRender(t, tc.dir), mustRender(t, tc.install)
			t.Run("network policy", func(t *testing.T) { checkNetworkPolicy(t, r, sources) })
			t.Run("nothing else changes", func(t *testing.T) { checkOnlyComponents(t, install, r, tc.clientAuth) })
			t.Run("deployment", func(t *testing.T) { checkDeployment(t, r) })
			t.Run("certificates", func(t *testing.T) { tc.certs(t, r) })
			if tc.clientAuth {
				t.Run("client authentication", func(t *testing.T) { checkClientAuth(t, r) })
			}
			t.Run("server-side dry-run", r.dryRun)
		})
	}
}

// webhookSources returns the peers the webhook-sources component sets: the
// value of its patch's add operation on the first ingress rule's sources.
func webhookSources(t *testing.T) []networkingv1.NetworkPolicyPeer {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, sourcesPatch))
	if err != nil {
		t.Fatal(err)
	}
	var ops []struct {
		Op, Path string
		Value    json.RawMessage
	}
	if err := utilyaml.Unmarshal(b, &ops); err != nil {
		t.Fatalf("%s: %v", sourcesPatch, err)
	}
	for _, op := range ops {
		if op.Op == "add" && op.Path == "/spec/ingress/0/from" {
			var peers []networkingv1.NetworkPolicyPeer
			if err := json.Unmarshal(op.Value, &peers); err != nil {
				t.Fatalf("%s: %v", sourcesPatch, err)
			}
			if len(peers) == 0 {
				t.Fatalf("%s sets no source", sourcesPatch)
			}
			return peers
		}
	}
	t.Fatalf("%s does not set /spec/ingress/0/from", sourcesPatch)
	return nil
}

// checkOnlyComponents compares a render with components to the install it
// extends: the same objects, equal but for the webhook rule's sources and,
// with client authentication, the manager's flags and the client CA's
// volume.
func checkOnlyComponents(t *testing.T, install, r *rendered, clientAuth bool) {
	if len(r.objs) != len(install.objs) {
		t.Errorf("%d objects, the install has %d", len(r.objs), len(install.objs))
	}
	for _, want := range install.objs {
		got := r.find(want.GetKind(), want.GetNamespace(), want.GetName())
		if got == nil {
			t.Errorf("no %s %s", want.GetKind(), key(want.GetNamespace(), want.GetName()))
			continue
		}
		got = got.DeepCopy()
		switch got.GetKind() {
		case "NetworkPolicy":
			ingress, _, _ := unstructured.NestedSlice(got.Object, "spec", "ingress")
			if len(ingress) > 0 {
				delete(ingress[0].(map[string]any), "from")
				_ = unstructured.SetNestedSlice(got.Object, ingress, "spec", "ingress")
			}
		case "Deployment":
			if clientAuth {
				dropClientAuth(t, got)
			}
		}
		if !reflect.DeepEqual(got.Object, want.Object) {
			t.Errorf("%s %s differs from the install's", want.GetKind(), key(want.GetNamespace(), want.GetName()))
		}
	}
}

// dropClientAuth removes from a Deployment what webhook-client-auth adds.
func dropClientAuth(t *testing.T, d *unstructured.Unstructured) {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	args = slices.DeleteFunc(args, func(a string) bool {
		name, _, _ := strings.Cut(a, "=")
		return name == "--webhook-client-ca" || name == "--webhook-client-cn"
	})
	_ = unstructured.SetNestedStringSlice(c, args, "args")
	mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	mounts = slices.DeleteFunc(mounts, func(m any) bool { return m.(map[string]any)["name"] == "webhook-client-ca" })
	_ = unstructured.SetNestedSlice(c, mounts, "volumeMounts")
	_ = unstructured.SetNestedSlice(d.Object, containers, "spec", "template", "spec", "containers")
	volumes, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
	volumes = slices.DeleteFunc(volumes, func(v any) bool { return v.(map[string]any)["name"] == "webhook-client-ca" })
	_ = unstructured.SetNestedSlice(d.Object, volumes, "spec", "template", "spec", "volumes")
}

// checkClientAuth: the flags name a file of the mounted client CA
// ConfigMap and the API server's common name.
func checkClientAuth(t *testing.T, r *rendered) {
	d, c := manager(t, r)
	ca := flagValue(t, c, "webhook-client-ca")
	if cn := flagValue(t, c, "webhook-client-cn"); cn != "kube-apiserver" {
		t.Errorf("--webhook-client-cn=%q, want kube-apiserver", cn)
	}
	var mounted bool
	for _, m := range c.VolumeMounts {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if m.Name != v.Name || v.ConfigMap == nil || filepath.Join(m.MountPath, "ca.crt") != ca {
				continue
			}
			cm := v.ConfigMap
			// Not optional: without its CA vmipam would not start, rather
			// than serve anyone. No subPath and no items: the kubelet
			// refreshes the file when the ConfigMap changes.
			mounted = cm.Name == clientCAConfig && (cm.Optional == nil || !*cm.Optional) && len(cm.Items) == 0 &&
				m.ReadOnly && m.SubPath == ""
		}
	}
	if !mounted {
		t.Errorf("--webhook-client-ca=%s is not key ca.crt of ConfigMap %s, mounted read-only without subPath", ca, clientCAConfig)
	}
}
