//go:build tools

// Package tools pins the Kubernetes control-plane binaries needed by envtest.
// Build them with hack/envtest-assets.sh.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
