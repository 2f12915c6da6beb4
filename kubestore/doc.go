// Package kubestore persists the blocks of one pool as IPBlock custom
// resources: it implements ipam.Store on top of a controller-runtime client,
// so that the allocator replicas of a pool share their claims and cooldowns
// through the API server.
//
// Every write is a compare-and-swap on the object's resourceVersion: the API
// server arbitrates between replicas, and a lost race comes back as an error
// matching ipam.ErrStoreConflict for the Manager to re-read and retry. Reads
// must go to the API server itself (pass mgr.GetAPIReader()), never to an
// informer cache, whose stale versions would only turn into more conflicts
// and whose missing objects would look like unclaimed blocks.
//
// Each IPBlock is owned by its IPPool through a controller owner reference,
// so deleting the pool garbage-collects its blocks; this package never
// deletes a block itself. It decides nothing about addresses: what to claim
// and when is the ipam package's business.
package kubestore
