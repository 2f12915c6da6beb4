package harness

import (
	"errors"
	"io"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// Assets returns the folder of the control-plane binaries the tests run
// (KUBEBUILDER_ASSETS), or an error that says how to get them.
func Assets() (string, error) {
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if dir == "" {
		return "", errors.New("KUBEBUILDER_ASSETS is not set: run the tests with 'make test', or with KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh), which builds kube-apiserver, etcd and kubectl once")
	}
	return dir, nil
}

// SetTestLogger sends controller-runtime's log to stderr when verbose and
// discards it, and klog's, otherwise: tests that stop managers on purpose
// would fill the output with expected errors.
func SetTestLogger(verbose bool) {
	if verbose {
		logf.SetLogger(zap.New(zap.UseDevMode(true)))
		return
	}
	logf.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	klog.SetLogger(logr.Discard())
}
