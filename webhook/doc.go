// Package webhook holds vmipam's admission handlers: the mutating handler
// that gives a new object its address on CREATE, the validating handler
// that keeps addresses and reservation tokens immutable, and the IPPool
// validator. Handlers are structs holding their dependencies; they never
// cause a side effect on a dry run.
package webhook
