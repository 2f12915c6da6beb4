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
//
// The same certificate can serve other Services (Options.ExtraServices):
// vmipam's metrics endpoint serves it, and the Secret's KeyCABundle holds
// the CAs that Prometheus should trust for it.
//
// # Why the CA's key sits in the Secret
//
// The Secret holds the CA's key next to the serving key, deliberately.
// Every replica may have to renew the serving certificate or rotate the
// CA, and no other component exists to sign for it (that is what
// --cert-mode=cert-manager is for), so whatever serves must be able to
// sign. The Secret is mounted by no pod: vmipam reads it through the API,
// so the key is never written to a node's disk. Splitting the CA into a
// Secret of its own would not narrow who can read it: vmipam's
// ServiceAccount needs both, and a namespaced Role cannot grant create by
// name, so one grant covers every Secret of the namespace anyway. It would
// only turn one compare-and-swap write into two that replicas can
// interleave: one could drop a CA from the CA Secret while another writes
// a serving certificate that CA signed into the serving Secret.
//
// Who can read the key: vmipam's ServiceAccount (the generated Role in
// vmipam's namespace), cluster administrators, and anything granted get on
// Secrets in that namespace or cluster-wide, etcd backups included unless
// Secrets are encrypted at rest. What the key allows: certificates that the
// API server accepts for vmipam's webhooks, and Prometheus for vmipam's
// metrics, because this CA is trusted only in the caBundle of vmipam's two
// webhook configurations and in vmipam's ServiceMonitor. So it lets someone
// who can also redirect the API server's connections to vmipam's Service
// impersonate vmipam: see VirtualMachine and IPPool admission requests,
// allow or change those objects, or collect Prometheus's bearer token. The
// serving key, which any server needs, allows the same until it expires (90
// days); the CA's key extends that to the CA's life and survives a
// rotation of the serving certificate. It grants nothing else in the
// cluster: the CA is not the cluster's CA and signs no client
// certificate. If it may have leaked, delete the Secret: vmipam creates a
// new CA, serves a certificate of it once the bundles trust it, and drops
// the old CA from the bundles two resync intervals later.
package certs
