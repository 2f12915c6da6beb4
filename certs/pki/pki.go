package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

const (
	// DefaultCAValidity is how long a new CA is valid: five years. The CA
	// is trusted only through the caBundle of our own webhook
	// configurations, and its key lives in the same Secret as the serving
	// key, so a shorter CA life would add no protection a leaked Secret
	// does not already defeat; a long one makes the one delicate step, the
	// two-phase CA rotation, rare (every 40 months with the default renewal
	// at a third of the lifetime left), while the certificate exposed on
	// the wire still changes every two months.
	DefaultCAValidity = 5 * 365 * 24 * time.Hour
	// DefaultCertValidity is how long a serving certificate is valid: 90
	// days, renewed with a third of it (30 days) left, which leaves a month
	// for a broken rotation to be noticed before anything fails.
	DefaultCertValidity = 90 * 24 * time.Hour
	// Backdate is how far before now a new certificate's NotBefore is set,
	// so that an API server whose clock lags ours still accepts it.
	Backdate = time.Hour
)

// Errors for the conditions callers act on; match them with errors.Is.
var (
	// ErrMalformed means the PEM input holds no usable certificate or key.
	ErrMalformed = errors.New("malformed PEM")
	// ErrKeyMismatch means a private key is not the certificate's.
	ErrKeyMismatch = errors.New("private key does not match the certificate")
	// ErrNotCA means a certificate cannot sign certificates.
	ErrNotCA = errors.New("certificate is not a CA")
	// ErrExpired means a certificate's NotAfter has passed.
	ErrExpired = errors.New("certificate has expired")
	// ErrNotYetValid means a certificate's NotBefore lies in the future.
	ErrNotYetValid = errors.New("certificate is not valid yet")
	// ErrUntrusted means a certificate is not signed by any of the given CAs.
	ErrUntrusted = errors.New("certificate is not signed by a trusted CA")
	// ErrNameMissing means a certificate does not cover a required name.
	ErrNameMissing = errors.New("certificate does not cover a required name")
)

// Names are the subject alternative names a serving certificate covers.
type Names struct {
	// DNSNames are host names such as "svc.ns.svc".
	DNSNames []string
	// IPAddresses are addresses such as 127.0.0.1 for a webhook reached by
	// IP.
	IPAddresses []net.IP
}

// KeyPair is a certificate with its private key, both parsed and in PEM.
type KeyPair struct {
	// Cert is the parsed certificate.
	Cert *x509.Certificate
	// Key is its private key.
	Key crypto.Signer
	// CertPEM is Cert in PEM.
	CertPEM []byte
	// KeyPEM is Key in PEM.
	KeyPEM []byte
}

// TLSCertificate returns the pair as crypto/tls serves it, Leaf included.
func (kp *KeyPair) TLSCertificate() *tls.Certificate {
	return &tls.Certificate{Certificate: [][]byte{kp.Cert.Raw}, PrivateKey: kp.Key, Leaf: kp.Cert}
}

// NewCA creates a self-signed ECDSA P-256 CA valid from now (backdated by
// Backdate) for validity. The current time is appended to commonName so that
// successive CAs in one bundle can be told apart.
func NewCA(commonName string, now time.Time, validity time.Duration) (*KeyPair, error) {
	if validity <= 0 {
		return nil, fmt.Errorf("create CA: validity %s is not positive", validity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("create CA: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("create CA: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: fmt.Sprintf("%s@%d", commonName, now.Unix())},
		NotBefore:    now.Add(-Backdate),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		IsCA:         true,
		// It signs serving certificates only, never another CA.
		MaxPathLenZero:        true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("create CA: sign: %w", err)
	}
	return newKeyPair(der, key)
}

// NewServingCert issues an ECDSA P-256 server certificate for names, signed
// by ca, valid from now (backdated by Backdate) for validity but never past
// the CA's own NotAfter.
func NewServingCert(ca *KeyPair, names Names, now time.Time, validity time.Duration) (*KeyPair, error) {
	if validity <= 0 {
		return nil, fmt.Errorf("issue serving certificate: validity %s is not positive", validity)
	}
	if len(names.DNSNames) == 0 && len(names.IPAddresses) == 0 {
		return nil, errors.New("issue serving certificate: no names")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("issue serving certificate: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("issue serving certificate: %w", err)
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	var cn string
	if len(names.DNSNames) > 0 {
		cn = names.DNSNames[0]
	} else {
		cn = names.IPAddresses[0].String()
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     names.DNSNames,
		IPAddresses:  names.IPAddresses,
		NotBefore:    now.Add(-Backdate),
		NotAfter:     notAfter,
		// ECDSA keys sign the handshake; they never encipher a key.
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("issue serving certificate: sign: %w", err)
	}
	return newKeyPair(der, key)
}

func newSerial() (*big.Int, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	return serial, nil
}

func newKeyPair(der []byte, key *ecdsa.PrivateKey) (*KeyPair, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse new certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	return &KeyPair{
		Cert:    cert,
		Key:     key,
		CertPEM: EncodeCertificates(cert),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// EncodeCertificates returns certs in PEM, one block each, in order: the
// form of a caBundle.
func EncodeCertificates(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// ParseCertificates returns every certificate in pemBytes, in order. It
// fails with ErrMalformed if there is none, or if any block is not a
// parseable certificate: a bundle with junk in it is not trusted blindly.
func ParseCertificates(pemBytes []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for rest := pemBytes; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%w: unexpected PEM block %q", ErrMalformed, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%w: no certificate", ErrMalformed)
	}
	return certs, nil
}

// ParseKeyPair parses a certificate (the first PEM block of certPEM) and its
// private key (PKCS#8, SEC 1 or PKCS#1) and checks that they belong
// together.
func ParseKeyPair(certPEM, keyPEM []byte) (*KeyPair, error) {
	certs, err := ParseCertificates(certPEM)
	if err != nil {
		return nil, fmt.Errorf("parse certificate: %w", err)
	}
	key, err := parsePrivateKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parse private key: %w", err)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(certs[0].PublicKey) {
		return nil, ErrKeyMismatch
	}
	return &KeyPair{Cert: certs[0], Key: key, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// ParseCA is ParseKeyPair for a CA: the certificate must also be allowed to
// sign certificates.
func ParseCA(certPEM, keyPEM []byte) (*KeyPair, error) {
	kp, err := ParseKeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	if !kp.Cert.IsCA || !kp.Cert.BasicConstraintsValid || kp.Cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotCA, kp.Cert.Subject)
	}
	return kp, nil
}

func parsePrivateKey(keyPEM []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, fmt.Errorf("%w: no PEM block", ErrMalformed)
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("%w: unexpected PEM block %q", ErrMalformed, block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: unsupported key type %T", ErrMalformed, key)
	}
	return signer, nil
}

// CheckValidity reports whether now lies within cert's validity period.
func CheckValidity(cert *x509.Certificate, now time.Time) error {
	switch {
	case now.After(cert.NotAfter):
		return fmt.Errorf("%w: %s expired at %s", ErrExpired, cert.Subject, cert.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(cert.NotBefore):
		return fmt.Errorf("%w: %s is valid from %s", ErrNotYetValid, cert.Subject, cert.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// VerifyServing checks that cert can serve names at now: it is within its
// validity period, covers every name and chains to one of cas, which must
// be valid at now too. It returns the CA that signed it.
func VerifyServing(cert *x509.Certificate, cas []*x509.Certificate, names Names, now time.Time) (*x509.Certificate, error) {
	if err := CheckValidity(cert, now); err != nil {
		return nil, err
	}
	for _, n := range names.DNSNames {
		if err := cert.VerifyHostname(n); err != nil {
			return nil, fmt.Errorf("%w: %s", ErrNameMissing, n)
		}
	}
	for _, ip := range names.IPAddresses {
		if err := cert.VerifyHostname(ip.String()); err != nil {
			return nil, fmt.Errorf("%w: %s", ErrNameMissing, ip)
		}
	}
	pool := x509.NewCertPool()
	for _, ca := range cas {
		if ca != nil {
			pool.AddCert(ca)
		}
	}
	chains, err := cert.Verify(x509.VerifyOptions{
		Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUntrusted, err)
	}
	// The pool holds roots only, so every chain is [cert, root].
	return chains[0][len(chains[0])-1], nil
}

// RenewalTime returns when cert should be replaced: renewBefore ahead of its
// NotAfter, or, if renewBefore is zero or not shorter than the certificate's
// lifetime, when a third of that lifetime is left.
func RenewalTime(cert *x509.Certificate, renewBefore time.Duration) time.Time {
	lifetime := cert.NotAfter.Sub(cert.NotBefore)
	if renewBefore <= 0 || renewBefore >= lifetime {
		renewBefore = lifetime / 3
	}
	return cert.NotAfter.Add(-renewBefore)
}

// NeedsRotation reports whether cert is due for replacement at now (see
// RenewalTime).
func NeedsRotation(cert *x509.Certificate, now time.Time, renewBefore time.Duration) bool {
	return !now.Before(RenewalTime(cert, renewBefore))
}

// BundleContains reports whether the PEM bundle holds cert. Junk in the
// bundle is skipped: this asks what the bundle trusts.
func BundleContains(bundle []byte, cert *x509.Certificate) bool {
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return false
		}
		if block.Type == "CERTIFICATE" && bytes.Equal(block.Bytes, cert.Raw) {
			return true
		}
	}
}
