// Command localcluster runs a throwaway Kubernetes control plane for trying
// vmipam on one machine: etcd, kube-apiserver and kube-controller-manager
// (the binaries hack/envtest-assets.sh builds) on loopback ports, with
// vmipam's CRDs and webhook configurations installed, the webhooks
// pointing at a vmipam running on this machine.
//
// It writes two kubeconfigs into --dir: kubeconfig, for the person trying
// vmipam (a cluster administrator through RBAC, as kubeadm's admin.conf,
// not a member of system:masters, so vmipam's admission policies hold for
// it as for any user), and vmipam.kubeconfig, a token of vmipam's own
// ServiceAccount with the RBAC the deployment grants it. It runs until
// interrupted, then stops the control plane and deletes its data.
//
// kube-controller-manager deletes namespaces (and what is in them) and
// collects garbage, as in a cluster; its log is kube-controller-manager.log
// in --dir.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	vmipamscheme "github.com/vmipam/vmipam/api/scheme"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/test/localcluster"
)

func main() {
	dir := flag.String("dir", ".local", "Folder for the kubeconfig and the ready marker.")
	root := flag.String("repo", ".", "The vmipam repository (for deploy/).")
	webhookURL := flag.String("webhook-url", "https://127.0.0.1:9443", "Where the API server reaches vmipam's webhook server.")
	namespace := flag.String("namespace", "vmipam-system", "vmipam's namespace, excluded from its webhooks.")
	kindsConfig := flag.String("kinds-config", "", "The kinds configuration vmipam runs with: its kinds' webhook, admission policies and RBAC are installed (vmipam's own kind when empty).")
	var crds stringList
	flag.Var(&crds, "crd", "A file or folder of CRDs to install beside vmipam's (for the kinds of --kinds-config); repeatable.")
	flag.Parse()
	if err := run(*dir, *root, *webhookURL, *namespace, *kindsConfig, crds); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

func run(dir, root, webhookURL, namespace, kindsConfig string, crds []string) error {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return errors.New("KUBEBUILDER_ASSETS is not set: run through 'make run' or 'make local-up', which build the control plane with hack/envtest-assets.sh")
	}
	kinds, err := kinds.LoadOrDefault(kindsConfig)
	if err != nil {
		return err
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     append([]string{filepath.Join(root, "deploy", "crd")}, crds...),
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "localcluster: stop control plane:", err)
		}
	}()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	c, err := client.New(cfg, client.Options{Scheme: vmipamscheme.Scheme})
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	if err := localcluster.InstallWebhooks(ctx, c, filepath.Join(root, "deploy", "webhook", "manifests.yaml"), webhookURL, namespace, kinds); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stopKCM, err := startControllerManager(ctx, env, cfg.CAData, dir)
	if err != nil {
		return err
	}
	defer stopKCM()
	if err := installIdentity(ctx, c, root, namespace); err != nil {
		return err
	}
	if err := writeVMIPAMKubeconfig(ctx, cfg, filepath.Join(dir, "vmipam.kubeconfig"), namespace); err != nil {
		return err
	}
	path := filepath.Join(dir, "kubeconfig")
	if err := writeAdminKubeconfig(ctx, c, env, path); err != nil {
		return err
	}
	ready := filepath.Join(dir, "control-plane.ready")
	if err := os.WriteFile(ready, []byte(cfg.Host+"\n"), 0o644); err != nil {
		return err
	}
	defer func() { _ = os.Remove(ready) }()
	fmt.Fprintf(os.Stderr, "localcluster: API server at %s, kubeconfig %s\n", cfg.Host, path)
	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "localcluster: stopping")
	return nil
}
