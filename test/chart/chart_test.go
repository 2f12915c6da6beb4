// Package chart installs vmipam's Helm chart (deploy/chart/vmipam) into a
// real kube-apiserver and etcd with helm install, runs vmipam against it,
// upgrades the release with changed values, and uninstalls it.
package chart

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/harness"
)

var root = filepath.Join("..", "..")

// helm runs the helm binary ($HELM, which make test builds into bin/)
// against the control plane of kubeconfig.
func helm(ctx context.Context, kubeconfig string, args ...string) (string, error) {
	path := os.Getenv("HELM")
	if path == "" {
		return "", fmt.Errorf("HELM is not set: run the tests through make test, which builds helm into bin/ and sets it")
	}
	cmd := exec.CommandContext(ctx, path, append(args, "--kubeconfig", kubeconfig)...)
	// Helm's own caches and configuration, out of the user's home.
	dir, err := os.MkdirTemp("", "vmipam-helm-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+dir, "HELM_CONFIG_HOME="+dir, "HELM_DATA_HOME="+dir, "KUBECONFIG=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %v: %w\n%s", args, err, out.String())
	}
	return out.String(), nil
}

// TestInstallUpgradeUninstall installs the chart with helm install (its
// webhooks pointed at a vmipam on loopback: webhook.url), runs vmipam and
// gets VMs their addresses through the chart's webhook configuration and
// admission policies, upgrades the release with changed values and checks
// that the objects changed and vmipam still serves, then uninstalls it and
// checks that the CRDs, and the VMs, are still there.
func TestInstallUpgradeUninstall(t *testing.T) {
	harness.NeedControlPlane(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	chartDir := filepath.Join(root, "deploy", "chart", "vmipam")
	var url, notes string
	install := func(ctx context.Context, c *harness.Cluster) error {
		url = "https://127.0.0.1:" + strconv.Itoa(c.WebhookPort)
		var err error
		notes, err = helm(ctx, c.Kubeconfig, "install", "vmipam", chartDir, "--namespace", harness.Namespace, "--create-namespace",
			"--set", "webhook.url="+url)
		return err
	}
	cl, err := harness.StartWith(ctx, root, t.TempDir(), harness.ClusterOptions{NoCRDs: true, Install: install})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cl.Stop(); err != nil {
			t.Error(err)
		}
	})
	// The harness's client and apiextensions' types.
	scheme := cl.Client.Scheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cl.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}

	// The notes say what uninstalling leaves.
	if !strings.Contains(notes, "leaves vmipam's CRDs") {
		t.Errorf("helm install's notes do not say that uninstalling leaves the CRDs:\n%s", notes)
	}
	// What helm install created.
	for _, crd := range []string{"virtualmachines.vmipam.io", "ippools.vmipam.io", "ipblocks.vmipam.io", "ipblockshares.vmipam.io"} {
		harness.Eventually(t, 30*time.Second, "CRD "+crd+" established", func() error {
			var o apiextensionsv1.CustomResourceDefinition
			if err := c.Get(ctx, client.ObjectKey{Name: crd}, &o); err != nil {
				return err
			}
			for _, cond := range o.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return nil
				}
			}
			return fmt.Errorf("not established: %v", o.Status.Conditions)
		})
	}
	var d appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKey{Namespace: harness.Namespace, Name: "vmipam"}, &d); err != nil {
		t.Fatalf("helm install made no Deployment: %v", err)
	}
	if *d.Spec.Replicas != 3 {
		t.Errorf("Deployment replicas %d, want the default 3", *d.Spec.Replicas)
	}

	logs := &harness.LogBuffer{}
	p, err := cl.StartVMIPAM(ctx, logs)
	if err != nil {
		t.Fatalf("%v\n%s", err, logs)
	}
	defer func() {
		if err := p.Stop(30 * time.Second); err != nil {
			t.Errorf("stop vmipam: %v", err)
		}
		if t.Failed() {
			t.Logf("vmipam's logs:\n%s", logs)
		}
	}()
	pool := &vmipamv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "chart"},
		Spec:       vmipamv1.IPPoolSpec{Default: true, Ranges: []vmipamv1.IPRange{{CIDR: "10.170.0.0/24", Gateway: "10.170.0.1"}}},
	}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatalf("create the IPPool through the chart's validating webhook: %v", err)
	}
	createVM := func(ns, name string) *vmipamv1.VirtualMachine {
		t.Helper()
		vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		var err error
		// The first create may come before vmipam has seen the pool.
		harness.Eventually(t, 30*time.Second, "create "+name, func() error {
			err = c.Create(ctx, vm)
			if apierrors.IsAlreadyExists(err) {
				return nil
			}
			return err
		})
		return vm
	}
	vm := createVM("default", "before-upgrade")
	if len(vm.Spec.Addresses) != 1 {
		t.Fatalf("VM created through the chart's webhook has addresses %v, want one", vm.Spec.Addresses)
	}

	// The upgrade: other values, objects changed in place.
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "chart-skipped"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := helm(ctx, cl.Kubeconfig, "upgrade", "vmipam", chartDir, "--namespace", harness.Namespace,
		"--set", "webhook.url="+url, "--set", "replicaCount=2", "--set", "webhook.timeoutSeconds=10",
		"--set", "webhook.excludedNamespaces={chart-skipped}", "--set", "monitoring.dashboard.enabled=true"); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: harness.Namespace, Name: "vmipam"}, &d); err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 2 {
		t.Errorf("after the upgrade the Deployment has %d replicas, want 2", *d.Spec.Replicas)
	}
	var mwc admissionregv1.MutatingWebhookConfiguration
	harness.Eventually(t, 30*time.Second, "the upgraded webhook configuration, its CA injected", func() error {
		if err := c.Get(ctx, client.ObjectKey{Name: "vmipam-mutating"}, &mwc); err != nil {
			return err
		}
		w := mwc.Webhooks[0]
		sel, _ := json.Marshal(w.NamespaceSelector)
		switch {
		case *w.TimeoutSeconds != 10:
			return fmt.Errorf("timeoutSeconds %d, want 10", *w.TimeoutSeconds)
		case !bytes.Contains(sel, []byte(`"chart-skipped"`)):
			return fmt.Errorf("namespaceSelector %s does not leave chart-skipped out", sel)
		case len(w.ClientConfig.CABundle) == 0:
			return fmt.Errorf("no caBundle")
		}
		return nil
	})
	if err := c.Get(ctx, client.ObjectKey{Namespace: harness.Namespace, Name: "vmipam-grafana-dashboard"}, &corev1.ConfigMap{}); err != nil {
		t.Errorf("the upgrade enabling the dashboard made no ConfigMap: %v", err)
	}
	if vm := createVM("default", "after-upgrade"); len(vm.Spec.Addresses) != 1 || vm.Spec.Addresses[0] == "" {
		t.Errorf("VM created after the upgrade has addresses %v, want one", vm.Spec.Addresses)
	}
	if vm := createVM("chart-skipped", "skipped"); len(vm.Spec.Addresses) != 0 {
		t.Errorf("VM created in an excluded namespace went through the webhook: addresses %v", vm.Spec.Addresses)
	}

	// Uninstall: the CRDs, and so the VMs, stay.
	if _, err := helm(ctx, cl.Kubeconfig, "uninstall", "vmipam", "--namespace", harness.Namespace); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: harness.Namespace, Name: "vmipam"}, &appsv1.Deployment{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Deployment after helm uninstall: %v, want it gone", err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := c.Get(ctx, client.ObjectKey{Name: "virtualmachines.vmipam.io"}, &crd); err != nil || crd.DeletionTimestamp != nil {
		t.Fatalf("the VirtualMachine CRD after helm uninstall: %v (deleting: %v), want it kept", err, crd.DeletionTimestamp)
	}
	var vms vmipamv1.VirtualMachineList
	if err := c.List(ctx, &vms); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range vms.Items {
		names = append(names, v.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"after-upgrade", "before-upgrade", "skipped"}) {
		t.Errorf("VMs after helm uninstall: %v, want all three kept", names)
	}
}
