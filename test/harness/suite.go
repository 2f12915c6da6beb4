package harness

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

// Main is the TestMain of a package that holds both pure tests and tests
// that need a control plane; it returns the exit code. Under -short (make
// test-unit) it starts nothing and runs the tests: the pure ones run, the
// others skip through NeedControlPlane. Otherwise it fails at once when
// KUBEBUILDER_ASSETS is unset, calls setup, which starts the package's
// control plane (StartEnv) and returns how to stop it, runs the tests and
// calls teardown, telling it whether a test failed (e.g. to print a
// process's logs).
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m, setup)) }
func Main(m *testing.M, setup func() (teardown func(failed bool) error, err error)) int {
	flag.Parse()
	if testing.Short() {
		return m.Run()
	}
	return run(m, setup)
}

// MainControlPlaneOnly is Main for a package every test of which needs the
// control plane: under -short it runs none.
func MainControlPlaneOnly(m *testing.M, setup func() (teardown func(failed bool) error, err error)) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("skipped: every test of this package needs a kube-apiserver and etcd, and -short runs without them")
		return 0
	}
	return run(m, setup)
}

func run(m *testing.M, setup func() (teardown func(failed bool) error, err error)) int {
	if _, err := Assets(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	teardown, err := setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	if err := teardown(code != 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	return code
}

// NeedControlPlane marks a test that needs a kube-apiserver and etcd:
// under -short it skips the test, otherwise it fails it at once when
// KUBEBUILDER_ASSETS is unset.
func NeedControlPlane(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("needs a kube-apiserver and etcd; -short runs without them")
	}
	if _, err := Assets(); err != nil {
		tb.Fatal(err)
	}
}
