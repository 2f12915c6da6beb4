// Package deploy checks the install manifests under deploy/: every
// kustomization renders, holds the objects vmipam relies on with the
// settings it relies on, and is accepted by a real kube-apiserver
// (controller-runtime envtest) in a server-side dry-run apply.
package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/vmipam/vmipam/test/harness"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// Names the manifests promise to the vmipam binary and to users.
const (
	namespace      = "vmipam-system"
	serviceAccount = "vmipam"
	webhookService = "vmipam-webhook"
	metricsService = "vmipam-metrics"
	mutatingName   = "vmipam-mutating"
	validatingName = "vmipam-validating"
	image          = "ghcr.io/vmipam/vmipam"
	certDir        = "/tmp/k8s-webhook-server/serving-certs"
)

var (
	// root is the repository root, seen from this package.
	root = filepath.Join("..", "..")

	kubectlPath string
	kubeconfig  string
	cacheDir    string
	cfg         *rest.Config
)

// TestMain starts the control plane and installs what every dry-run needs;
// under -short it starts none and only the tests that need no kubectl and
// no API server run.
func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, setup))
}

// setup starts the control plane, installs what every dry-run needs (vmipam's
// namespace and CRDs, applied for real from the default overlay, and
// stand-in CRDs for cert-manager and the Prometheus Operator), and returns
// how to stop it.
func setup() (func(bool) error, error) {
	logf.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	assets, err := harness.Assets()
	if err != nil {
		return nil, err
	}
	kubectlPath = filepath.Join(assets, "kubectl")
	if _, err := os.Stat(kubectlPath); err != nil {
		return nil, fmt.Errorf("no kubectl in KUBEBUILDER_ASSETS (%w): rebuild the assets with hack/envtest-assets.sh", err)
	}
	tmp, err := os.MkdirTemp("", "vmipam-deploy-test-")
	if err != nil {
		return nil, fmt.Errorf("temporary directory: %w", err)
	}
	// kubectl caches discovery; keep that out of the user's home directory.
	cacheDir = filepath.Join(tmp, "cache")
	env, err := harness.StartEnv(harness.EnvOptions{CRDs: []string{"testdata"}})
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(tmp))
	}
	cfg = env.Config
	teardown := func(bool) error { return errors.Join(env.Stop(), os.RemoveAll(tmp)) }
	kubeconfig = filepath.Join(tmp, "kubeconfig")
	if err := env.WriteKubeconfig(kubeconfig, "admin"); err != nil {
		return nil, errors.Join(err, teardown(false))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := installPrerequisites(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("install vmipam's namespace and CRDs: %w", err), teardown(false))
	}
	return teardown, nil
}

// installPrerequisites applies, for real, the Namespace and the
// CustomResourceDefinitions of the default overlay: a dry-run of namespaced
// objects needs their namespace, and of custom objects their CRD.
func installPrerequisites(ctx context.Context) error {
	out, err := render(ctx, "deploy/overlays/default")
	if err != nil {
		return err
	}
	objs, err := decode(out)
	if err != nil {
		return err
	}
	var pre []*unstructured.Unstructured
	var crds []string
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace":
			pre = append(pre, o)
		case "CustomResourceDefinition":
			pre = append(pre, o)
			crds = append(crds, "crd/"+o.GetName())
		}
	}
	if len(crds) == 0 {
		return errors.New("the default overlay renders no CustomResourceDefinition")
	}
	if _, stderr, err := apply(ctx, pre, false); err != nil {
		return fmt.Errorf("apply: %w: %s", err, stderr)
	}
	args := append([]string{"wait", "--for=condition=Established", "--timeout=30s"}, crds...)
	if _, stderr, err := kubectl(ctx, nil, args...); err != nil {
		return fmt.Errorf("wait for the CRDs: %w: %s", err, stderr)
	}
	return nil
}

// kubectl runs the envtest kubectl against the envtest API server.
func kubectl(ctx context.Context, stdin []byte, args ...string) (stdout, stderr string, err error) {
	args = append(args, "--kubeconfig="+kubeconfig, "--cache-dir="+cacheDir)
	cmd := exec.CommandContext(ctx, kubectlPath, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG=")
	var out, errOut bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(stdin), &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

// render builds the kustomization in dir (relative to the repository root,
// or absolute) as the install instructions in deploy/README.md do. The base references
// the generated manifests in deploy/crd, deploy/rbac and deploy/webhook,
// outside its directory, hence the load restrictor.
func render(ctx context.Context, dir string) ([]byte, error) {
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(root, dir)
	}
	cmd := exec.CommandContext(ctx, kubectlPath, "kustomize", dir)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kubectl kustomize %s: %w: %s", dir, err, errOut.String())
	}
	return out.Bytes(), nil
}

// apply applies objs with server-side apply, for real or as a server-side
// dry-run, and returns kubectl's output.
func apply(ctx context.Context, objs []*unstructured.Unstructured, dryRun bool) (stdout, stderr string, err error) {
	items := make([]any, 0, len(objs))
	for _, o := range objs {
		items = append(items, o.Object)
	}
	list, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		return "", "", err
	}
	args := []string{"apply", "--server-side", "--field-manager=vmipam-deploy-test", "-f", "-"}
	if dryRun {
		args = append(args, "--dry-run=server")
	}
	return kubectl(ctx, list, args...)
}

// decode splits a multi-document YAML stream into objects.
func decode(b []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("decode: %w", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// readObjects decodes a file of the repository.
func readObjects(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	objs, err := decode(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return objs
}

// rendered is the output of one kustomization.
type rendered struct {
	dir  string
	objs []*unstructured.Unstructured
}

func mustRender(t *testing.T, dir string) *rendered {
	t.Helper()
	out, err := render(t.Context(), dir)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(out)
	if err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	if len(objs) == 0 {
		t.Fatalf("%s renders no object", dir)
	}
	return &rendered{dir: dir, objs: objs}
}

// find returns the object of that kind, namespace and name, or nil.
func (r *rendered) find(kind, ns, name string) *unstructured.Unstructured {
	for _, o := range r.objs {
		if o.GetKind() == kind && o.GetNamespace() == ns && o.GetName() == name {
			return o
		}
	}
	return nil
}

// get converts the object of that kind, namespace and name into out, and
// fails the test if the render lacks it.
func (r *rendered) get(t *testing.T, kind, ns, name string, out any) {
	t.Helper()
	o := r.find(kind, ns, name)
	if o == nil {
		t.Fatalf("%s renders no %s %s", r.dir, kind, key(ns, name))
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out); err != nil {
		t.Fatalf("%s: %s %s: %v", r.dir, kind, key(ns, name), err)
	}
}

func (r *rendered) ofKind(kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range r.objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// dryRun applies the whole render with a server-side dry-run and fails on
// any error or warning: the API server validates every object against its
// schema, field validation is strict, and the Pod Security admission of
// vmipam's namespace (warn: restricted) warns about a pod template that
// breaks the restricted profile.
func (r *rendered) dryRun(t *testing.T) {
	t.Helper()
	stdout, stderr, err := apply(t.Context(), r.objs, true)
	if err != nil {
		t.Fatalf("server-side dry-run of %s: %v\n%s%s", r.dir, err, stdout, stderr)
	}
	if strings.Contains(stderr, "Warning") {
		t.Errorf("server-side dry-run of %s warned:\n%s", r.dir, stderr)
	}
	// Every object must have been applied, none skipped.
	for _, o := range r.objs {
		want := strings.ToLower(o.GetKind())
		if !strings.Contains(stdout, "/"+o.GetName()+" serverside-applied (server dry run)") {
			t.Errorf("dry-run of %s did not report %s %s as applied:\n%s", r.dir, want, o.GetName(), stdout)
		}
	}
}

func key(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}
