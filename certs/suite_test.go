package certs

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/vmipam/vmipam/test/harness"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

var (
	testEnv   *envtest.Environment
	cfg       *rest.Config
	k8sClient client.Client
)

// TestMain starts one kube-apiserver and etcd for the package: the tests
// prove rotations against the API server's own webhook client.
func TestMain(m *testing.M) {
	if _, err := harness.Assets(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	flag.Parse()
	harness.SetTestLogger(testing.Verbose())
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
