// Package chaos is vmipam's reliability suite: many clients create and
// delete VirtualMachines while the vmipam binary is killed with SIGKILL and
// restarted at random moments and the kube-apiserver is restarted, then
// everything vmipam promises is checked from the API server: no duplicate,
// no VM without an address, no leaked address, no reuse inside the cooldown,
// and IPPool status counts that match the cluster.
//
// The test is TestChaos (chaos_test.go); `make test` runs a short version,
// `make chaos` a long one. It only uses the API server and the binary: it
// never reads vmipam's memory.
package chaos
