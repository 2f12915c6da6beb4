// Package pki is the pure cryptography behind vmipam's self-managed webhook
// certificates: it creates a CA, issues serving certificates signed by it,
// parses PEM material back and decides whether it is still fit to serve.
//
// It must stay free of Kubernetes imports and of the wall clock: every
// function that depends on time takes a now argument, so that the rotation
// logic above it can be driven by a fake clock in tests. Deciding when to
// write what where is the certs package's business, not this one's.
package pki
