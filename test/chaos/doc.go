// Package chaos is vmipam's reliability suite. TestChaos runs the vmipam
// binary against a real kube-apiserver and etcd (test/harness) while
// CHAOS_CLIENTS clients (8) create VirtualMachines and delete random ones
// of their own (each keeps at most CHAOS_MAX_VMS_PER_CLIENT, 16), retrying
// every refusal with a backoff and counting it by reason. vmipam runs as
// CHAOS_REPLICAS replicas (3) behind the stand-in for the Service
// (test/lbproxy), with a 10s holder lease. Meanwhile a replica is
// SIGKILLed CHAOS_KILLS times (3) and replaced, under its holder (a
// container restart) and under a new one (a pod replaced, taken over by
// the others) in turn; every replica is replaced one at a time
// CHAOS_ROLLS times (1: SIGTERM, drain, seal); and the kube-apiserver is
// restarted CHAOS_APISERVER_RESTARTS times (1) on the same address and
// certificates, for at least CHAOS_DURATION (40s) of load. A replica
// exiting on its own is counted and restarted. With CHAOS_REPLICAS=1 the
// one process is killed and restarted instead. `make test-chaos` runs these
// defaults (about two and a half minutes); `make chaos` runs three
// minutes, 12 kills and 3 rolling restarts. CHAOS_CIDR (10.99.0.0/23),
// CHAOS_THINK, CHAOS_SEED (to replay a schedule), CHAOS_LOGS (a file for
// vmipam's whole log) and CHAOS_VMIPAM_FLAGS (more flags for vmipam) tune
// it further. CHAOS_DUAL=1 makes it dual-stack: the pool gets an IPv6
// range as large as CHAOS_CIDR, every VM is RequireDualStack, and every
// check below holds for each address of each family (`make chaos
// CHAOS_DUAL=1`).
//
// Everything is checked from the API server, never from vmipam's memory:
//
//   - as the run goes, each create's address against its previous holder's:
//     a holder never deleted means a duplicate; a new holder's response
//     before the delete of the previous one was issued plus the cooldown is
//     a reuse inside the cooldown (exact: the address was handed out
//     before the response, and released after the delete was issued);
//   - every second, a consistent snapshot of the IPBlocks and then the VMs:
//     no two live VMs share an address, each has one, and no live VM holds
//     an address whose persisted cooldown outlasts the snapshot (VMs
//     created within 10s of a vmipam restart excepted: an admission in
//     flight at the crash rests by design until vmipam adopts it);
//   - after the run, from a watch of the namespace: a new holder's
//     creationTimestamp (whole seconds) is not earlier than its previous
//     holder's observed deletion plus the cooldown, less 2s (1s for the
//     truncation, 1s for the watch's latency and the moment between the
//     release and the removal of the finalizer);
//   - once every deletion has completed and the pending TTL and the
//     cooldown have passed since the load, the last restart and the last
//     release: distinct addresses inside the pool on every VM, each fully
//     stamped; the IPPool status at its generation with allocated equal to
//     the VMs, pending and cooldown 0, Ready True, DuplicateAddress False;
//     the IPBlocks claimed by running holders only, inside the pool, every
//     live address claimed, no cooldown deadline ahead, and as many claimed
//     addresses on no VM as the status has free;
//   - then the pool is filled: a VM for every address on no live VM, each
//     must get one (none leaked), one more must be refused as exhausted,
//     the status must show it full, and no address may go into cooldown
//     meanwhile (nothing is deleted), in the IPBlocks or in vmipam's log;
//   - vmipam's log: its allocator must not retry failed writes in a loop.
//
// It prints a table of figures (operations, kills, restarts, duplicates,
// leaks, VMs without address, refusals by reason and by what was going on)
// and fails on any of the above. The fast, deterministic regression tests
// for the two vmipam bugs the suite found live beside the code they test:
// pools/resync_test.go and ipam/run_test.go.
package chaos
