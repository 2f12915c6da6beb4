package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"slices"
	"testing"
	"time"
)

// TestHardenTLS offers a hardened server every suite and version Go can
// speak, one at a time, and checks that exactly TLS 1.2 with ECDHE and an
// AEAD, and TLS 1.3, are accepted. The server holds an ECDSA and an RSA
// certificate so that the ECDHE_RSA suites can be negotiated too.
func TestHardenTLS(t *testing.T) {
	server := &tls.Config{Certificates: []tls.Certificate{
		selfSigned(t, mustECDSA(t)),
		selfSigned(t, mustRSA(t)),
	}}
	HardenTLS(server)

	allowed := map[uint16]bool{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256:       true,
		tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256:         true,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384:       true,
		tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384:         true,
		tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256: true,
		tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256:   true,
	}
	var tls12 int
	for _, s := range append(tls.CipherSuites(), tls.InsecureCipherSuites()...) {
		if !slices.Contains(s.SupportedVersions, tls.VersionTLS12) {
			continue // a TLS 1.3 suite, or one of TLS 1.0 only
		}
		tls12++
		t.Run("TLS 1.2 "+s.Name, func(t *testing.T) {
			state, err := handshake(t, server, &tls.Config{
				MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12,
				CipherSuites: []uint16{s.ID}, InsecureSkipVerify: true, //nolint:gosec // the test checks the server's choice, not its identity
			})
			switch {
			case allowed[s.ID] && err != nil:
				t.Errorf("refused: %v", err)
			case allowed[s.ID] && state.CipherSuite != s.ID:
				t.Errorf("negotiated %s", tls.CipherSuiteName(state.CipherSuite))
			case !allowed[s.ID] && err == nil:
				t.Errorf("accepted %s", tls.CipherSuiteName(state.CipherSuite))
			}
		})
	}
	if tls12 < len(allowed)+4 {
		t.Fatalf("only %d TLS 1.2 suites tried", tls12)
	}

	versions := map[string]struct {
		v  uint16
		ok bool
	}{
		"TLS 1.0": {tls.VersionTLS10, false},
		"TLS 1.1": {tls.VersionTLS11, false},
		"TLS 1.3": {tls.VersionTLS13, true},
	}
	for name, tc := range versions {
		t.Run(name, func(t *testing.T) {
			state, err := handshake(t, server, &tls.Config{
				MinVersion: tc.v, MaxVersion: tc.v, InsecureSkipVerify: true, //nolint:gosec // as above
			})
			if tc.ok && (err != nil || state.Version != tc.v) {
				t.Errorf("refused (%v) or negotiated %s", err, tls.VersionName(state.Version))
			}
			if !tc.ok && err == nil {
				t.Errorf("accepted %s", tls.VersionName(state.Version))
			}
		})
	}
}

// handshake runs a TLS handshake between server and client over a pipe and
// returns what the client negotiated, or the first error of either side.
func handshake(t *testing.T, server, client *tls.Config) (tls.ConnectionState, error) {
	t.Helper()
	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	_ = a.SetDeadline(deadline)
	_ = b.SetDeadline(deadline)
	srv, cli := tls.Server(a, server), tls.Client(b, client)
	errc := make(chan error, 1)
	go func() {
		err := srv.Handshake()
		if err != nil {
			// Unblock a client still waiting for the server's flight.
			_ = a.Close()
		}
		errc <- err
	}()
	cerr := cli.Handshake()
	if cerr != nil {
		_ = b.Close()
	}
	serr := <-errc
	if cerr != nil {
		return tls.ConnectionState{}, cerr
	}
	if serr != nil {
		return tls.ConnectionState{}, serr
	}
	return cli.ConnectionState(), nil
}

func mustECDSA(t *testing.T) crypto.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mustRSA(t *testing.T) crypto.Signer {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func selfSigned(t *testing.T, key crypto.Signer) tls.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
