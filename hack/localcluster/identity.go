package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// adminGroup is the group of the local administrator, bound to
// cluster-admin: like kubeadm's kubeadm:cluster-admins, it is not
// system:masters, which vmipam's admission policies let write its stamp.
const adminGroup = "vmipam-local:cluster-admins"

// identityFiles are the manifests that give vmipam's ServiceAccount its
// permissions in a deployment, installed here as they are there.
var identityFiles = []string{
	"deploy/base/service_account.yaml",
	"deploy/rbac/role.yaml",
	"deploy/base/role_binding.yaml",
	"deploy/base/lease_role.yaml",
	"deploy/base/metrics_auth_role.yaml",
	"deploy/overlays/default/webhook_ca_injector_role.yaml",
}

// installIdentity creates vmipam's ServiceAccount in namespace and the
// RBAC of identityFiles (the kinds' RBAC comes with their wiring).
func installIdentity(ctx context.Context, c client.Client, root, namespace string) error {
	for _, f := range identityFiles {
		raw, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return fmt.Errorf("parse %s: %w", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			switch u.GetKind() {
			case "ServiceAccount", "Role", "RoleBinding":
				u.SetNamespace(namespace)
			}
			if err := subjectsIn(u, namespace); err != nil {
				return fmt.Errorf("%s %s from %s: %w", u.GetKind(), u.GetName(), f, err)
			}
			if err := c.Create(ctx, u); err != nil {
				return fmt.Errorf("create %s %s from %s: %w", u.GetKind(), u.GetName(), f, err)
			}
		}
	}
	return nil
}

// subjectsIn moves the ServiceAccount subjects of a (Cluster)RoleBinding
// into namespace, where vmipam's ServiceAccount is.
func subjectsIn(u *unstructured.Unstructured, namespace string) error {
	subjects, found, err := unstructured.NestedSlice(u.Object, "subjects")
	if err != nil {
		return fmt.Errorf("subjects: %w", err)
	}
	if !found {
		return nil
	}
	for i, sub := range subjects {
		m, ok := sub.(map[string]any)
		if ok && m["kind"] == "ServiceAccount" {
			m["namespace"] = namespace
			subjects[i] = m
		}
	}
	return unstructured.SetNestedSlice(u.Object, subjects, "subjects")
}

// writeVMIPAMKubeconfig writes a kubeconfig with a token of vmipam's
// ServiceAccount, valid for a week.
func writeVMIPAMKubeconfig(ctx context.Context, cfg *rest.Config, path, namespace string) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	week := int64((7 * 24 * time.Hour).Seconds())
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "vmipam",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &week}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token of ServiceAccount %s/vmipam: %w", namespace, err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["vmipam"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["vmipam"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "vmipam", Namespace: namespace}
	kc.CurrentContext = "vmipam"
	return clientcmd.WriteToFile(*kc, path)
}

// writeAdminKubeconfig writes the kubeconfig of the local administrator:
// a user of adminGroup, bound to cluster-admin.
func writeAdminKubeconfig(ctx context.Context, c client.Client, env *envtest.Environment, path string) error {
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "vmipam-local-cluster-admins"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "Group", Name: adminGroup}}}
	if err := c.Create(ctx, crb); err != nil {
		return fmt.Errorf("bind %s to cluster-admin: %w", adminGroup, err)
	}
	user, err := env.AddUser(envtest.User{Name: "local-admin", Groups: []string{adminGroup}}, nil)
	if err != nil {
		return fmt.Errorf("add admin user: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// startControllerManager runs kube-controller-manager (from
// KUBEBUILDER_ASSETS) against the control plane, as
// system:kube-controller-manager with each controller under its own
// ServiceAccount, until the returned stop is called.
func startControllerManager(ctx context.Context, env *envtest.Environment, caData []byte, dir string) (stop func(), err error) {
	bin := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kube-controller-manager")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("no kube-controller-manager in KUBEBUILDER_ASSETS (build it: hack/envtest-assets.sh kube-controller-manager): %w", err)
	}
	user, err := env.AddUser(envtest.User{Name: "system:kube-controller-manager"}, nil)
	if err != nil {
		return nil, fmt.Errorf("add kube-controller-manager's user: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager's kubeconfig: %w", err)
	}
	kcPath, caPath := filepath.Join(dir, "kube-controller-manager.kubeconfig"), filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(kcPath, kubeconfig, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(caPath, caData, 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "kube-controller-manager.log"))
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(runCtx, bin,
		"--kubeconfig", kcPath, "--authentication-kubeconfig", kcPath, "--authorization-kubeconfig", kcPath,
		"--service-account-private-key-file", filepath.Join(env.ControlPlane.APIServer.CertDir, "sa-signer.key"),
		"--root-ca-file", caPath, "--use-service-account-credentials",
		"--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		_ = logf.Close()
		return nil, fmt.Errorf("start kube-controller-manager: %w", err)
	}
	return func() {
		cancel()
		_ = cmd.Wait()
		_ = logf.Close()
	}, nil
}
