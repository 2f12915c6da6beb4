// Package v1alpha1 holds vmipam's API types, group vmipam.io, version
// v1alpha1: IPPool (configuration and status of an address pool), IPBlock
// (the persisted claims and cooldowns of one block of a pool) and
// VirtualMachine (a minimal reference kind that receives addresses).
//
// +kubebuilder:object:generate=true
// +groupName=vmipam.io
package v1alpha1
