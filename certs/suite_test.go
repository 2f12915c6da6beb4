package certs

import (
	"os"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/test/harness"
)

var k8sClient client.Client

// TestMain starts one kube-apiserver and etcd for the package: the Manager's
// tests prove rotations against the API server's own webhook client. Under
// -short it starts none, and only the pure tests (the plan, TLS settings)
// run.
func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, func() (func(bool) error, error) {
		harness.SetTestLogger(testing.Verbose())
		env, err := harness.StartEnv(harness.EnvOptions{})
		if err != nil {
			return nil, err
		}
		k8sClient = env.Client
		return func(bool) error { return env.Stop() }, nil
	}))
}
