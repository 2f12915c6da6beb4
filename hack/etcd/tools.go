//go:build tools

// Package tools pins the etcd server binary needed by envtest.
// Build it with hack/envtest-assets.sh.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
