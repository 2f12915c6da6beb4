package certs

import (
	"flag"
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

var (
	testEnv   *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client
)

// TestMain starts one kube-apiserver and etcd for the package: the tests
// prove rotations against the API server's own webhook client.
func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "KUBEBUILDER_ASSETS is not set: run the tests with 'make test', which builds kube-apiserver and etcd once (hack/envtest-assets.sh)")
		os.Exit(1)
	}
	flag.Parse()
	if testing.Verbose() {
		logf.SetLogger(zap.New(zap.UseDevMode(true)))
	} else {
		logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))
		klog.SetLogger(logr.Discard())
	}
	testEnv = &envtest.Environment{}
	var err error
	if cfg, err = testEnv.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "start envtest: %v\n", err)
		os.Exit(1)
	}
	// Several goroutines create continuously: lift client-go's rate limit.
	cfg.QPS, cfg.Burst = 1000, 2000
	if k8sClient, err = client.New(cfg, client.Options{Scheme: scheme.Scheme}); err != nil {
		fmt.Fprintf(os.Stderr, "client: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := testEnv.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "stop envtest: %v\n", err)
	}
	os.Exit(code)
}
