package clientauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	stdlog "log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vmipam/vmipam/certs/pki"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// TestVerify runs real handshakes against a server configured by
// ConfigureTLS: only a certificate for client authentication that chains
// to the file's CA and carries the common name is served.
func TestVerify(t *testing.T) {
	ca := newCA(t, "client-ca")
	other := newCA(t, "other-ca")
	inter := ca.issue(t, "intermediate", t0.Add(-time.Hour), t0.Add(24*time.Hour), true, x509.ExtKeyUsageAny)
	srv := serverConfig(t)
	clk := clocktesting.NewFakeClock(t0)
	v, err := New(Options{CAFile: writeFile(t, ca.certPEM()), CommonName: "kube-apiserver", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	v.ConfigureTLS(srv)

	valid := func(s *signer, cn string) *tls.Certificate {
		return s.issue(t, cn, t0.Add(-time.Hour), t0.Add(time.Hour), false, x509.ExtKeyUsageClientAuth).tls()
	}
	tests := map[string]struct {
		cert    *tls.Certificate
		wantErr string
	}{
		"the API server":          {cert: valid(ca, "kube-apiserver")},
		"through an intermediate": {cert: chain(valid(inter, "kube-apiserver"), inter)},
		"no certificate":          {wantErr: "certificate"},
		"wrong common name":       {cert: valid(ca, "system:admin"), wantErr: `common name "system:admin", want "kube-apiserver"`},
		"another CA":              {cert: valid(other, "kube-apiserver"), wantErr: "unknown authority"},
		"self-signed":             {cert: newCA(t, "kube-apiserver").tls(), wantErr: "unknown authority"},
		"expired": {cert: ca.issue(t, "kube-apiserver", t0.Add(-2*time.Hour), t0.Add(-time.Hour), false, x509.ExtKeyUsageClientAuth).tls(),
			wantErr: "expired"},
		"not yet valid": {cert: ca.issue(t, "kube-apiserver", t0.Add(time.Hour), t0.Add(2*time.Hour), false, x509.ExtKeyUsageClientAuth).tls(),
			wantErr: "expired or is not yet valid"},
		"a server certificate": {cert: ca.issue(t, "kube-apiserver", t0.Add(-time.Hour), t0.Add(time.Hour), false, x509.ExtKeyUsageServerAuth).tls(),
			wantErr: "incompatible key usage"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := handshake(t, srv, tc.cert)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.wantErr != "" && err == nil:
				t.Errorf("accepted")
			case tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr):
				t.Errorf("refused with %q, want it to mention %q", err, tc.wantErr)
			}
		})
	}
}

// TestRotation replaces the CA file under a running Verifier: the new CA is
// trusted and the old one refused from the first handshake after the next
// read, and a broken file leaves the CAs in force.
func TestRotation(t *testing.T) {
	oldCA, newCAs := newCA(t, "old"), newCA(t, "new")
	oldClient := oldCA.issue(t, "kube-apiserver", t0.Add(-time.Hour), t0.Add(time.Hour), false, x509.ExtKeyUsageClientAuth).tls()
	newClient := newCAs.issue(t, "kube-apiserver", t0.Add(-time.Hour), t0.Add(time.Hour), false, x509.ExtKeyUsageClientAuth).tls()
	file := writeFile(t, oldCA.certPEM())
	clk := clocktesting.NewFakeClock(t0)
	v, err := New(Options{CAFile: file, CommonName: "kube-apiserver", Clock: clk, Interval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	srv := serverConfig(t)
	v.ConfigureTLS(srv)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- v.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})

	// tick lets the Verifier's ticker fire and waits for its read.
	tick := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !clk.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatal("the Verifier does not wait on its ticker")
			}
			time.Sleep(time.Millisecond)
		}
		clk.Step(time.Minute)
	}
	expect := func(what string, cert *tls.Certificate, ok bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := handshake(t, srv, cert)
			if (err == nil) == ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: handshake error %v, want success %v", what, err, ok)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	expect("before the rotation, the old CA", oldClient, true)
	expect("before the rotation, the new CA", newClient, false)

	// Both, as during a rotation of the API server's client certificate.
	replace(t, file, append(newCAs.certPEM(), oldCA.certPEM()...))
	tick()
	expect("during the rotation, the new CA", newClient, true)
	expect("during the rotation, the old CA", oldClient, true)

	replace(t, file, newCAs.certPEM())
	tick()
	expect("after the rotation, the old CA", oldClient, false)
	expect("after the rotation, the new CA", newClient, true)

	replace(t, file, []byte("garbage"))
	tick()
	if _, err := v.Reload(); !errors.Is(err, pki.ErrMalformed) {
		t.Fatalf("Reload of a garbled file: %v, want ErrMalformed", err)
	}
	expect("with a garbled file, the new CA", newClient, true)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Reload(); err == nil {
		t.Fatal("Reload of a missing file succeeded")
	}
	expect("with no file, the new CA", newClient, true)
}

func TestNew(t *testing.T) {
	ca := newCA(t, "ca")
	tests := map[string]struct {
		o       Options
		wantErr string
	}{
		"no file":           {o: Options{CommonName: "kube-apiserver"}, wantErr: "no CA file"},
		"no common name":    {o: Options{CAFile: writeFile(t, ca.certPEM())}, wantErr: "no common name"},
		"missing file":      {o: Options{CAFile: filepath.Join(t.TempDir(), "none"), CommonName: "x"}, wantErr: "no such file"},
		"no certificate":    {o: Options{CAFile: writeFile(t, []byte("\n")), CommonName: "x"}, wantErr: "no certificate"},
		"a key, not a cert": {o: Options{CAFile: writeFile(t, ca.kp.KeyPEM), CommonName: "x"}, wantErr: "unexpected PEM block"},
		"negative interval": {o: Options{CAFile: writeFile(t, ca.certPEM()), CommonName: "x", Interval: -1}, wantErr: "negative interval"},
		"valid":             {o: Options{CAFile: writeFile(t, ca.certPEM()), CommonName: "x"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.o)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("New: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// ConfigureTLS keeps a VerifyConnection already set, and runs it only
// after its own check.
func TestConfigureTLSChains(t *testing.T) {
	ca := newCA(t, "ca")
	v, err := New(Options{CAFile: writeFile(t, ca.certPEM()), CommonName: "kube-apiserver", Clock: clocktesting.NewFakeClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	srv := serverConfig(t)
	var called int
	srv.VerifyConnection = func(tls.ConnectionState) error { called++; return errors.New("refused by the next check") }
	v.ConfigureTLS(srv)
	if err := handshake(t, srv, ca.issue(t, "other", t0.Add(-time.Hour), t0.Add(time.Hour), false, x509.ExtKeyUsageClientAuth).tls()); err == nil || called != 0 {
		t.Fatalf("a wrong common name: %v, next check called %d times", err, called)
	}
	err = handshake(t, srv, ca.issue(t, "kube-apiserver", t0.Add(-time.Hour), t0.Add(time.Hour), false, x509.ExtKeyUsageClientAuth).tls())
	if err == nil || !strings.Contains(err.Error(), "refused by the next check") || called != 1 {
		t.Fatalf("the next check: %v, called %d times", err, called)
	}
}

// TestHandler keeps one connection alive across a rotation: its requests
// are served while its certificate's CA is in force and refused, with the
// connection closed, once it is not, or once the certificate expires.
func TestHandler(t *testing.T) {
	oldCA, newCAs := newCA(t, "old"), newCA(t, "new")
	client := oldCA.issue(t, "kube-apiserver", t0.Add(-time.Hour), t0.Add(time.Hour), false, x509.ExtKeyUsageClientAuth).tls()
	file := writeFile(t, oldCA.certPEM())
	clk := clocktesting.NewFakeClock(t0)
	v, err := New(Options{CAFile: file, CommonName: "kube-apiserver", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	srv := httptest.NewUnstartedServer(v.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) })))
	srv.Config.ErrorLog = stdlog.New(io.Discard, "", 0) // handshakes fail on purpose
	srv.TLS = serverConfig(t)
	v.ConfigureTLS(srv.TLS)
	var conns atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{*client}, InsecureSkipVerify: true, //nolint:gosec // the server's identity is not under test
	}}}
	get := func() (int, error) {
		resp, err := hc.Get(srv.URL)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}
	for range 3 {
		if code, err := get(); err != nil || code != http.StatusOK {
			t.Fatalf("GET: %d %v", code, err)
		}
	}
	if served.Load() != 3 || conns.Load() != 1 {
		t.Fatalf("%d requests served on %d connections, want 3 on 1", served.Load(), conns.Load())
	}

	replace(t, file, newCAs.certPEM())
	if _, err := v.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, err := get(); err != nil || code != http.StatusForbidden {
		t.Fatalf("GET on the kept-alive connection after its CA left: %d %v, want 403", code, err)
	}
	if _, err := get(); err == nil {
		t.Fatal("a new connection with a certificate of the old CA was served")
	}
	if served.Load() != 3 || conns.Load() != 2 {
		t.Fatalf("%d requests served on %d connections, want 3 on 2", served.Load(), conns.Load())
	}

	// Expiry on a kept-alive connection.
	replace(t, file, oldCA.certPEM())
	if _, err := v.Reload(); err != nil {
		t.Fatal(err)
	}
	if code, err := get(); err != nil || code != http.StatusOK {
		t.Fatalf("GET after the CA came back: %d %v", code, err)
	}
	clk.Step(2 * time.Hour)
	if code, err := get(); err != nil || code != http.StatusForbidden {
		t.Fatalf("GET on the kept-alive connection after the certificate expired: %d %v, want 403", code, err)
	}
}

// handshake runs a TLS 1.3 handshake of a client presenting cert (none if
// nil) with server over a pipe and returns the server's error, or the
// client's: in TLS 1.3 the server judges the client's certificate after the
// client has sent its last flight.
func handshake(t *testing.T, server *tls.Config, cert *tls.Certificate) error {
	t.Helper()
	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	_ = a.SetDeadline(deadline)
	_ = b.SetDeadline(deadline)
	client := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the test checks the server's judgement of the client
	if cert != nil {
		client.Certificates = []tls.Certificate{*cert}
	}
	srv, cli := tls.Server(a, server), tls.Client(b, client)
	errc := make(chan error, 1)
	go func() {
		err := srv.Handshake()
		_ = a.Close()
		errc <- err
	}()
	cerr := cli.Handshake()
	if cerr == nil {
		// Read the server's verdict: an alert, or the close after success.
		_, cerr = cli.Read(make([]byte, 1))
	}
	if serr := <-errc; serr != nil {
		return serr
	}
	if cerr != nil && !isClosed(cerr) {
		return cerr
	}
	return nil
}

func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) || strings.Contains(err.Error(), "EOF") ||
		strings.Contains(err.Error(), "closed pipe")
}

func serverConfig(t *testing.T) *tls.Config {
	t.Helper()
	ca := newCA(t, "server-ca")
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{*ca.issue(t, "server", t0.Add(-time.Hour), t0.Add(time.Hour), false, x509.ExtKeyUsageServerAuth).tls()},
		// The server's own clock plays no part in the client check.
		Time: func() time.Time { return t0 },
	}
}

// signer is a CA, or an intermediate, with its key.
type signer struct{ kp *pki.KeyPair }

func newCA(t *testing.T, cn string) *signer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	// Not pki.NewCA: its CAs may not sign an intermediate.
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: t0.Add(-time.Hour), NotAfter: t0.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &signer{kp: &pki.KeyPair{Cert: cert, Key: key, CertPEM: pki.EncodeCertificates(cert),
		KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})}}
}

func (s *signer) certPEM() []byte { return s.kp.CertPEM }

func (s *signer) tls() *tls.Certificate { return s.kp.TLSCertificate() }

// issue signs a certificate for cn valid in [notBefore, notAfter], a CA
// (intermediate) or a leaf with the extended key usage eku.
func (s *signer) issue(t *testing.T, cn string, notBefore, notAfter time.Time, isCA bool, eku x509.ExtKeyUsage) *signer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{eku}, BasicConstraintsValid: true, IsCA: isCA,
	}
	if cn == "server" {
		tmpl.DNSNames = []string{"server"}
	}
	if isCA {
		tmpl.KeyUsage |= x509.KeyUsageCertSign
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.kp.Cert, key.Public(), s.kp.Key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &signer{kp: &pki.KeyPair{Cert: cert, Key: key, CertPEM: pki.EncodeCertificates(cert)}}
}

// chain appends an intermediate's certificate to a leaf's chain.
func chain(leaf *tls.Certificate, inter *signer) *tls.Certificate {
	leaf.Certificate = append(leaf.Certificate, inter.kp.Cert.Raw)
	return leaf
}

func writeFile(t *testing.T, b []byte) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(f, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// replace swaps the file's content atomically, as the kubelet does for a
// mounted ConfigMap or Secret.
func replace(t *testing.T, file string, b []byte) {
	t.Helper()
	tmp := file + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}
