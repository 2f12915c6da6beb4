// Package ctl is the kubectl plugin kubectl-vmipam: the commands an
// operator asks vmipam's questions with (who holds an address, who held it
// when, what the pools have left, is anything leaking) and the one request
// it makes (release a stuck address).
//
// Every command reads the cluster through the API server alone, as vmipam
// persists it: IPPools and their status, the pools' blocks (kubestore.Read),
// the address history (package history), the holder Leases in vmipam's
// namespace, and the objects of the kinds vmipam serves. It never writes a
// block, an object or a Lease: release creates an IPRelease, and the
// replica whose claim holds the address acts on it.
//
// The derivations (an address's state from its block, a pool's time to
// exhaustion, the time flags) are pure functions over values, tested
// without a control plane; the commands gather, derive, then print.
package ctl
