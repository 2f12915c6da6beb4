// Package e2e is vmipam's end-to-end suite: vmipam installed by its Helm
// chart, from the image `make image` builds, as three Pods behind its
// Service in a real single-node cluster (kubelet, containerd, kube-proxy,
// kube-controller-manager and kube-scheduler; hack/e2e/cluster.sh).
//
// `make e2e` brings the cluster up, runs the suite inside the cluster's
// network namespace and tears everything down. Without the environment it
// sets (E2E_HELM, E2E_CHART, E2E_IMAGE, E2E_KUBECTL and KUBECONFIG), every
// test skips, so `go test ./...` passes over it.
package e2e
