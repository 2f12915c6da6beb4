// Package pools is the one door to the allocators. It keeps one allocator
// per IPPool: it builds and recovers them from the cluster's state, runs
// their background work, picks the pool for an object, proves lapsed
// reservations unused, and keeps each IPPool's status current. The
// webhook and the controller reach the allocators only through a Registry
// and the methods of its Pools, and decide nothing about addresses
// themselves: Admit is the webhook's one call for a create; PlanFamilies
// and Pool.Assign give a create its addresses (the webhook strictly, the
// garbage collector leniently); KeeperOf says which replica looks after
// an object; LabelHolder is the one writer of the holder label.
//
// The files split by role: registry.go is the Registry, its options and
// its lifecycle (Start, the pools it holds, Remove); recover.go builds a
// pool's allocators and recovers them from the cluster (Ensure); ready.go
// is this replica's readiness; live.go lists the live objects and the
// addresses they hold, which recovery, resync and Occupants read; resync.go
// reconciles the allocators with that list now and then; served.go the
// kinds the API server serves; select.go the choice of a pool; pool.go,
// families.go, admit.go and assign.go one pool's allocators and a
// create's addresses; keeper.go who looks after an address; lease.go and holders.go
// this replica's holder Lease and the other replicas (renewal, takeover,
// shutdown); shard.go the holder label on objects; unstored.go the proof
// that a lapsed reservation was never stored; status.go the IPPool status.
package pools
