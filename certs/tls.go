package certs

import "crypto/tls"

// cipherSuites are the TLS 1.2 suites vmipam's servers accept: ECDHE key
// exchange (forward secrecy) with an AEAD cipher. Every Go client, so
// kube-apiserver and Prometheus, offers them. TLS 1.3 suites are all AEAD
// with ephemeral keys and crypto/tls does not let them be chosen.
var cipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// HardenTLS restricts c to TLS 1.2 and later and, for TLS 1.2, to ECDHE
// suites with AES-GCM or ChaCha20-Poly1305: no CBC, no RSA key exchange, no
// 3DES or RC4, whatever Go's defaults become. vmipam applies it to the
// webhook server and the metrics server alike; it has the signature of a
// controller-runtime TLSOpts entry.
func HardenTLS(c *tls.Config) {
	c.MinVersion = tls.VersionTLS12
	c.CipherSuites = append([]uint16(nil), cipherSuites...)
}
