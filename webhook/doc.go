// Package webhook holds vmipam's admission handlers: the mutating handler
// that gives a new object its address on CREATE, the validating handler
// that keeps addresses and reservation tokens immutable, and the IPPool
// validator. Handlers are structs holding their dependencies; they never
// cause a side effect on a dry run.
//
// The handlers take an admission.Request and answer an admission.Response;
// they hold no HTTP plumbing. Reading reviews off the wire, under bounds,
// and serving them over TLS is webhook/transport's job, which knows
// nothing of these handlers.
package webhook
