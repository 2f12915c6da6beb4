// Package audit is a placeholder for the audit helper's package: the
// consistency report of kubectl vmipam check. It declares the interface
// the plugin calls and does nothing yet; the audit helper's package
// replaces this file at merge.
package audit

import (
	"context"
	"errors"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/kinds"
)

// Sources are where audit reads the cluster.
type Sources struct {
	Reader    client.Reader
	Discovery discovery.DiscoveryInterface
	Metadata  metadata.Interface
}

// Options configure Run.
type Options struct {
	// Kinds are the kinds vmipam serves; nil reads them from the holder
	// Leases, else the default.
	Kinds []kinds.Kind
	// Namespace is vmipam's namespace.
	Namespace string
	// Grace is added to a pool's pending TTL before an address no object
	// holds counts as leaked; default 30s.
	Grace time.Duration
}

// Finding is one inconsistency, with its fix.
type Finding struct {
	Type                          string
	Pool, Address, Object, Holder string
	Message                       string
	Fix                           string
}

// Report is what Run found and how much it read.
type Report struct {
	Findings                   []Finding
	Objects, Blocks, Addresses int
}

// Run reads the cluster and reports its inconsistencies. The placeholder
// is not built yet.
func Run(ctx context.Context, src Sources, opts Options) (Report, error) {
	return Report{}, errors.New("not built yet")
}
