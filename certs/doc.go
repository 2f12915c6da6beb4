// Package certs keeps the webhook's serving certificate and the caBundle of
// the webhook configurations that call it, without cert-manager: a Manager
// creates a CA and a serving certificate, keeps them in one Secret shared
// by every replica, rotates them before they expire, injects the CA bundle
// into the named MutatingWebhookConfigurations and
// ValidatingWebhookConfigurations, and serves the certificate from memory.
//
// Rotation never opens a window of failed admissions: the bundle in every
// configuration always contains the issuer of the certificate being served.
// A new CA is first added next to the old one in every bundle, the serving
// certificate it signs is served only once every configuration has trusted
// it for a while, and the old CA leaves the bundles only once no replica can
// still be serving a certificate it signed.
//
// The Secret is the only shared state and the API server arbitrates every
// write to it (create, or update on resourceVersion). What to write is
// decided by a pure function over what a pass gathered (plan.go); the
// cryptography is in the pki subpackage. This package must not read the
// wall clock except through the Clock it is given.
package certs
