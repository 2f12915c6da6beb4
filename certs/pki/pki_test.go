package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	t0    = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	day   = 24 * time.Hour
	names = Names{DNSNames: []string{"svc", "svc.ns", "svc.ns.svc"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
)

func mustCA(t *testing.T, now time.Time, validity time.Duration) *KeyPair {
	t.Helper()
	ca, err := NewCA("test-ca", now, validity)
	if err != nil {
		t.Fatalf("NewCA: %v", err)
	}
	return ca
}

func mustServing(t *testing.T, ca *KeyPair, n Names, now time.Time, validity time.Duration) *KeyPair {
	t.Helper()
	kp, err := NewServingCert(ca, n, now, validity)
	if err != nil {
		t.Fatalf("NewServingCert: %v", err)
	}
	return kp
}

func TestNewCA(t *testing.T) {
	ca := mustCA(t, t0, DefaultCAValidity)
	c := ca.Cert
	if !c.IsCA || !c.BasicConstraintsValid || !c.MaxPathLenZero || c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("not a leaf-signing CA: IsCA=%v basic=%v maxPathLenZero=%v usage=%b", c.IsCA, c.BasicConstraintsValid, c.MaxPathLenZero, c.KeyUsage)
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("key is %T, want ECDSA P-256", c.PublicKey)
	}
	if err := c.CheckSignatureFrom(c); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
	if !c.NotBefore.Equal(t0.Add(-Backdate)) || !c.NotAfter.Equal(t0.Add(DefaultCAValidity)) {
		t.Errorf("validity %s..%s", c.NotBefore, c.NotAfter)
	}
	if want := "test-ca@" + strconv.FormatInt(t0.Unix(), 10); c.Subject.CommonName != want {
		t.Errorf("CN %q, want %q", c.Subject.CommonName, want)
	}
	back, err := ParseCA(ca.CertPEM, ca.KeyPEM)
	if err != nil {
		t.Fatalf("ParseCA of a new CA: %v", err)
	}
	if !back.Cert.Equal(c) {
		t.Error("round trip changed the certificate")
	}
	if _, err := NewCA("x", t0, 0); err == nil {
		t.Error("NewCA accepted a zero validity")
	}
}

func TestNewServingCert(t *testing.T) {
	ca := mustCA(t, t0, 100*day)
	kp := mustServing(t, ca, names, t0, DefaultCertValidity)
	c := kp.Cert
	if c.IsCA || len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Errorf("not a server certificate: IsCA=%v ext=%v", c.IsCA, c.ExtKeyUsage)
	}
	if !c.NotAfter.Equal(t0.Add(DefaultCertValidity)) {
		t.Errorf("NotAfter %s, want %s", c.NotAfter, t0.Add(DefaultCertValidity))
	}
	if issuer, err := VerifyServing(c, []*x509.Certificate{ca.Cert}, names, t0); err != nil || !issuer.Equal(ca.Cert) {
		t.Errorf("VerifyServing = %v, %v", issuer, err)
	}
	if _, err := ParseKeyPair(kp.CertPEM, kp.KeyPEM); err != nil {
		t.Errorf("ParseKeyPair of a new pair: %v", err)
	}

	// Never outlive the CA.
	late := mustServing(t, ca, names, t0.Add(50*day), DefaultCertValidity)
	if !late.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("NotAfter %s, want the CA's %s", late.Cert.NotAfter, ca.Cert.NotAfter)
	}
	if _, err := NewServingCert(ca, Names{}, t0, day); err == nil {
		t.Error("issued a certificate without names")
	}
}

func TestVerifyServing(t *testing.T) {
	ca := mustCA(t, t0, 365*day)
	other := mustCA(t, t0, 365*day)
	shortCA := mustCA(t, t0, 10*day)
	good := mustServing(t, ca, names, t0, 90*day).Cert
	byOther := mustServing(t, other, names, t0, 90*day).Cert
	byShort := mustServing(t, shortCA, names, t0, 90*day).Cert
	// An uncapped certificate outliving its CA, as another tool might make.
	outliving := mustServing(t, ca, names, t0, 90*day)
	outliving.Cert.NotAfter = t0.Add(400 * day)
	outlivingDER, err := x509.CreateCertificate(rand.Reader, outliving.Cert, ca.Cert, outliving.Key.Public(), ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	outlivingCert, _ := x509.ParseCertificate(outlivingDER)

	tests := map[string]struct {
		cert       *x509.Certificate
		cas        []*x509.Certificate
		names      Names
		now        time.Time
		wantErr    error
		wantIssuer *x509.Certificate
	}{
		"valid":                    {cert: good, cas: []*x509.Certificate{ca.Cert}, names: names, now: t0, wantIssuer: ca.Cert},
		"valid, second of two CAs": {cert: good, cas: []*x509.Certificate{other.Cert, ca.Cert}, names: names, now: t0, wantIssuer: ca.Cert},
		"valid at NotAfter":        {cert: good, cas: []*x509.Certificate{ca.Cert}, names: names, now: good.NotAfter, wantIssuer: ca.Cert},
		"expired":                  {cert: good, cas: []*x509.Certificate{ca.Cert}, names: names, now: good.NotAfter.Add(time.Second), wantErr: ErrExpired},
		"not yet valid":            {cert: good, cas: []*x509.Certificate{ca.Cert}, names: names, now: t0.Add(-2 * Backdate), wantErr: ErrNotYetValid},
		"missing DNS name": {cert: good, cas: []*x509.Certificate{ca.Cert}, now: t0, wantErr: ErrNameMissing,
			names: Names{DNSNames: []string{"svc.ns.svc.cluster.local"}}},
		"missing IP": {cert: good, cas: []*x509.Certificate{ca.Cert}, now: t0, wantErr: ErrNameMissing,
			names: Names{IPAddresses: []net.IP{net.ParseIP("10.0.0.1")}}},
		"signed by another CA": {cert: byOther, cas: []*x509.Certificate{ca.Cert}, names: names, now: t0, wantErr: ErrUntrusted},
		"no CA":                {cert: good, names: names, now: t0, wantErr: ErrUntrusted},
		"CA expired":           {cert: outlivingCert, cas: []*x509.Certificate{ca.Cert}, names: names, now: t0.Add(380 * day), wantErr: ErrUntrusted},
		"capped by its CA":     {cert: byShort, cas: []*x509.Certificate{shortCA.Cert}, names: names, now: t0.Add(11 * day), wantErr: ErrExpired},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			issuer, err := VerifyServing(tt.cert, tt.cas, tt.names, tt.now)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if tt.wantIssuer != nil && (issuer == nil || !issuer.Equal(tt.wantIssuer)) {
				t.Errorf("issuer %v, want %v", issuer, tt.wantIssuer.Subject)
			}
		})
	}
}

func TestParse(t *testing.T) {
	ca := mustCA(t, t0, 365*day)
	kp := mustServing(t, ca, names, t0, 90*day)
	other := mustServing(t, ca, names, t0, 90*day)
	ecKey, _ := x509.MarshalECPrivateKey(kp.Key.(*ecdsa.PrivateKey))
	secKeyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: ecKey})
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rsaKeyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rsaKey)})
	junk := []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")

	tests := map[string]struct {
		cert, key []byte
		asCA      bool
		wantErr   error
	}{
		"valid":                  {cert: kp.CertPEM, key: kp.KeyPEM},
		"SEC 1 key":              {cert: kp.CertPEM, key: secKeyPEM},
		"valid CA":               {cert: ca.CertPEM, key: ca.KeyPEM, asCA: true},
		"empty":                  {wantErr: ErrMalformed},
		"garbled certificate":    {cert: []byte("junk"), key: kp.KeyPEM, wantErr: ErrMalformed},
		"undecodable DER":        {cert: junk, key: kp.KeyPEM, wantErr: ErrMalformed},
		"junk after certificate": {cert: append(append([]byte{}, kp.CertPEM...), junk...), key: kp.KeyPEM, wantErr: ErrMalformed},
		"key in place of cert":   {cert: kp.KeyPEM, key: kp.KeyPEM, wantErr: ErrMalformed},
		"garbled key":            {cert: kp.CertPEM, key: []byte("junk"), wantErr: ErrMalformed},
		"truncated key":          {cert: kp.CertPEM, key: kp.KeyPEM[:len(kp.KeyPEM)/2], wantErr: ErrMalformed},
		"another ECDSA key":      {cert: kp.CertPEM, key: other.KeyPEM, wantErr: ErrKeyMismatch},
		"an RSA key":             {cert: kp.CertPEM, key: rsaKeyPEM, wantErr: ErrKeyMismatch},
		"CA's key":               {cert: kp.CertPEM, key: ca.KeyPEM, wantErr: ErrKeyMismatch},
		"leaf as CA":             {cert: kp.CertPEM, key: kp.KeyPEM, asCA: true, wantErr: ErrNotCA},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			parse := ParseKeyPair
			if tt.asCA {
				parse = ParseCA
			}
			got, err := parse(tt.cert, tt.key)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if err == nil && got.Cert == nil {
				t.Fatal("no certificate")
			}
		})
	}
}

func TestNeedsRotation(t *testing.T) {
	ca := mustCA(t, t0, 365*day)
	// Lifetime 90 days + Backdate; a third of it is 30 days + Backdate/3.
	c := mustServing(t, ca, names, t0, 90*day).Cert
	third := c.NotAfter.Sub(c.NotBefore) / 3
	tests := map[string]struct {
		now         time.Time
		renewBefore time.Duration
		want        bool
	}{
		"fresh":                        {now: t0, want: false},
		"just before a third left":     {now: c.NotAfter.Add(-third - time.Nanosecond), want: false},
		"a third left":                 {now: c.NotAfter.Add(-third), want: true},
		"expired":                      {now: c.NotAfter.Add(day), want: true},
		"window: just before":          {now: c.NotAfter.Add(-10*day - time.Nanosecond), renewBefore: 10 * day, want: false},
		"window: reached":              {now: c.NotAfter.Add(-10 * day), renewBefore: 10 * day, want: true},
		"window: a third left":         {now: c.NotAfter.Add(-third), renewBefore: 10 * day, want: false},
		"window longer than lifetime":  {now: t0, renewBefore: 100 * day, want: false},
		"window longer, a third left":  {now: c.NotAfter.Add(-third), renewBefore: 100 * day, want: true},
		"negative window is a default": {now: c.NotAfter.Add(-third), renewBefore: -day, want: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if got := NeedsRotation(c, tt.now, tt.renewBefore); got != tt.want {
				t.Errorf("NeedsRotation at %s = %v, want %v (renewal at %s)", tt.now, got, tt.want, RenewalTime(c, tt.renewBefore))
			}
		})
	}
}

func TestBundleContains(t *testing.T) {
	a, b := mustCA(t, t0, day), mustCA(t, t0, day)
	bundle := EncodeCertificates(a.Cert, b.Cert)
	if !BundleContains(bundle, a.Cert) || !BundleContains(bundle, b.Cert) {
		t.Error("bundle lacks a CA it holds")
	}
	if BundleContains(EncodeCertificates(a.Cert), b.Cert) || BundleContains(nil, a.Cert) {
		t.Error("bundle holds a CA it lacks")
	}
	withJunk := append([]byte("junk\n-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), bundle...)
	if !BundleContains(withJunk, b.Cert) {
		t.Error("junk hid a CA")
	}
	certs, err := ParseCertificates(bundle)
	if err != nil || len(certs) != 2 || !certs[0].Equal(a.Cert) || !certs[1].Equal(b.Cert) {
		t.Errorf("ParseCertificates = %d certificates, %v", len(certs), err)
	}
}

// TestHandshake proves the material works where it matters: a TLS client
// trusting exactly a caBundle completes a handshake with a server using the
// issued certificate only if the bundle holds its issuer.
func TestHandshake(t *testing.T) {
	now := t0
	oldCA, newCA, stranger := mustCA(t, now, 365*day), mustCA(t, now, 365*day), mustCA(t, now, 365*day)
	served := mustServing(t, oldCA, names, now, 90*day)
	tests := map[string]struct {
		bundle     []byte
		serverName string
		wantOK     bool
	}{
		"bundle of the issuer":                  {bundle: EncodeCertificates(oldCA.Cert), serverName: "svc.ns.svc", wantOK: true},
		"by IP":                                 {bundle: EncodeCertificates(oldCA.Cert), serverName: "127.0.0.1", wantOK: true},
		"rotation bundle, issuer second":        {bundle: EncodeCertificates(newCA.Cert, oldCA.Cert), serverName: "svc.ns.svc", wantOK: true},
		"bundle without the issuer":             {bundle: EncodeCertificates(newCA.Cert, stranger.Cert), serverName: "svc.ns.svc"},
		"name not covered":                      {bundle: EncodeCertificates(oldCA.Cert), serverName: "svc.other.svc"},
		"bundle of the issuer, expired at time": {bundle: EncodeCertificates(oldCA.Cert), serverName: "svc.ns.svc"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			clientNow := now
			if strings.Contains(name, "expired") {
				clientNow = served.Cert.NotAfter.Add(time.Minute)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(tt.bundle) {
				t.Fatal("bundle holds no certificate")
			}
			err := handshake(t, served.TLSCertificate(), &tls.Config{
				RootCAs: pool, ServerName: tt.serverName, Time: func() time.Time { return clientNow }, MinVersion: tls.VersionTLS12,
			})
			if tt.wantOK && err != nil {
				t.Fatalf("handshake failed: %v", err)
			}
			if !tt.wantOK && err == nil {
				t.Fatal("handshake succeeded")
			}
		})
	}
}

// handshake runs a TLS server with cert on a loopback port and dials it.
func handshake(t *testing.T, cert *tls.Certificate, clientConfig *tls.Config) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert, nil }, MinVersion: tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer func() { _ = conn.Close() }()
		_ = conn.(*tls.Conn).Handshake()
		_, _ = io.Copy(io.Discard, conn)
	}()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), clientConfig)
	if err != nil {
		return err
	}
	return conn.Close()
}

// TestPure keeps the package what its doc says: standard library only, and
// time only through a now argument. (The linter's depguard and forbidigo
// rules cover ipam/ only.)
func TestPure(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s: only the standard library is allowed", f, path)
			}
		}
		for _, banned := range []string{"time.Now(", "time.Since(", "time.Until("} {
			if strings.Contains(string(src), banned) {
				t.Errorf("%s calls %s: take a now argument", f, banned)
			}
		}
	}
}
