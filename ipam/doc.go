// Package ipam is vmipam's allocator core: address ranges, the per-pool
// Manager with its free list, pending reservations, allocations and
// cooldown, and the block-sharded persisted format of its claims.
//
// The package is pure Go on net/netip. It must not import Kubernetes
// packages, read the wall clock directly or do I/O other than through the
// Store interface: the webhook and the controller read the cluster and hand
// plain values in, and everything time-dependent runs on an injected Clock,
// so the invariants (no address held twice, nothing leaked, no reuse inside
// the cooldown) can be tested exhaustively without an API server.
package ipam
