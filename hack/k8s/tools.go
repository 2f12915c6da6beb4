//go:build tools

// Package tools pins the Kubernetes binaries vmipam's tests run: the
// control plane envtest needs (kube-apiserver, kubectl), and the node and
// controllers of the real single-node cluster `make e2e` runs (kubelet,
// kube-proxy, kube-controller-manager, kube-scheduler). Build them with
// hack/envtest-assets.sh.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
