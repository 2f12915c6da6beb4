// Package clientauth makes a TLS server serve only clients that present a
// certificate chaining to a CA read from a file and carrying a given common
// name. vmipam's webhook server uses it to tell kube-apiserver, configured
// to present a client certificate to webhooks, from anyone else who can
// reach its port; the others are refused during the TLS handshake, before
// any HTTP is read.
//
// The CA file is re-read periodically and a changed file takes effect on
// the next handshake, so the CA can be rotated (for example by updating the
// ConfigMap or Secret mounted there) without a restart. A file that cannot
// be read or parsed leaves the CAs loaded last in force.
//
// The check runs in tls.Config.VerifyConnection, which crypto/tls calls on
// every handshake, resumed sessions included, so a session established
// before a rotation is held to the CAs in force when it resumes. A
// connection kept alive across a rotation is not handshaken again: wrap
// the server's handlers with Handler, which checks every request against
// the CAs in force (a map lookup once a certificate has been verified
// against them) and refuses, closing the connection, a request whose
// certificate they no longer trust.
package clientauth

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/vmipam/vmipam/certs/pki"
)

// DefaultInterval is how often the CA file is re-read: as often as
// controller-runtime's certificate watcher polls the serving certificate.
const DefaultInterval = 10 * time.Second

// Options configure a Verifier.
type Options struct {
	// CAFile holds, in PEM, the CA certificates a client certificate may
	// chain to. Required.
	CAFile string
	// CommonName is the subject common name the client certificate must
	// carry. Required: a CA may sign certificates for other clients too.
	CommonName string
	// Interval is how often CAFile is re-read, DefaultInterval if zero.
	Interval time.Duration
	// Clock defaults to the system clock; certificates are checked for
	// validity at its time.
	Clock clock.WithTicker
}

// Verifier checks TLS clients' certificates against the CAs in a file and
// a common name. Apply ConfigureTLS to the server's tls.Config, wrap its
// handlers with Handler, and add the Verifier to the controller manager so
// that it re-reads the file. It is safe for concurrent use.
type Verifier struct {
	opts  Options
	trust atomic.Pointer[trust]

	// mu serialises reloads; loaded is the file content in force.
	mu     sync.Mutex
	loaded []byte
}

// trust is one set of CAs in force.
type trust struct {
	roots *x509.CertPool
	// verified maps the DER of each client certificate verified against
	// roots to when its chain stops being valid, so that Handler checks a
	// request with a lookup. Only certificates that passed a handshake get
	// here.
	verified sync.Map
}

var log = logf.Log.WithName("clientauth")

var (
	_ manager.Runnable               = (*Verifier)(nil)
	_ manager.LeaderElectionRunnable = (*Verifier)(nil)
)

// New returns a Verifier with the CAs of o.CAFile loaded; it fails if the
// file cannot be read or holds no certificate.
func New(o Options) (*Verifier, error) {
	switch {
	case o.CAFile == "":
		return nil, errors.New("client authentication: no CA file")
	case o.CommonName == "":
		return nil, errors.New("client authentication: no common name")
	case o.Interval < 0:
		return nil, fmt.Errorf("client authentication: negative interval %s", o.Interval)
	}
	if o.Interval == 0 {
		o.Interval = DefaultInterval
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	v := &Verifier{opts: o}
	if _, err := v.Reload(); err != nil {
		return nil, err
	}
	return v, nil
}

// ConfigureTLS makes c require a client certificate and check it with v; it
// has the signature of a controller-runtime TLSOpts entry. A
// VerifyConnection already set on c still runs, after v's check.
func (v *Verifier) ConfigureTLS(c *tls.Config) {
	// Any certificate at the protocol level: the chain is verified in
	// VerifyConnection against the CAs in force at that handshake, which
	// a static ClientCAs pool could not follow.
	c.ClientAuth = tls.RequireAnyClientCert
	next := c.VerifyConnection
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := v.Verify(cs); err != nil {
			return err
		}
		if next != nil {
			return next(cs)
		}
		return nil
	}
}

// Verify returns nil if the peer's certificate chains, for client
// authentication and at the clock's time, to a CA loaded from the file and
// carries the common name.
func (v *Verifier) Verify(cs tls.ConnectionState) error {
	_, err := v.verify(cs, v.trust.Load())
	return err
}

// verify checks cs against t and returns when the verified chain expires.
func (v *Verifier) verify(cs tls.ConnectionState, t *trust) (time.Time, error) {
	if len(cs.PeerCertificates) == 0 {
		return time.Time{}, errors.New("no client certificate")
	}
	leaf := cs.PeerCertificates[0]
	opts := x509.VerifyOptions{
		Roots:         t.roots,
		Intermediates: x509.NewCertPool(),
		CurrentTime:   v.opts.Clock.Now(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	chains, err := leaf.Verify(opts)
	if err != nil {
		return time.Time{}, fmt.Errorf("client certificate %q: %w", leaf.Subject.String(), err)
	}
	if leaf.Subject.CommonName != v.opts.CommonName {
		return time.Time{}, fmt.Errorf("client certificate %q: common name %q, want %q", leaf.Subject.String(), leaf.Subject.CommonName, v.opts.CommonName)
	}
	until := leaf.NotAfter
	for _, c := range chains[0] {
		if c.NotAfter.Before(until) {
			until = c.NotAfter
		}
	}
	return until, nil
}

// Handler wraps h so that each request's client certificate is checked
// against the CAs in force: a request on a connection whose certificate
// they no longer trust, or that expired, is answered 403 Forbidden and the
// connection closed, so that the client's next connection meets the
// handshake's check.
func (v *Verifier) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := v.checkRequest(r.TLS); err != nil {
			log.Info("Refusing a request: its client certificate is no longer trusted", "remote", r.RemoteAddr, "reason", err.Error())
			w.Header().Set("Connection", "close")
			http.Error(w, "client certificate not trusted", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (v *Verifier) checkRequest(cs *tls.ConnectionState) error {
	if cs == nil {
		return errors.New("not a TLS connection")
	}
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no client certificate")
	}
	t, now := v.trust.Load(), v.opts.Clock.Now()
	key := string(cs.PeerCertificates[0].Raw)
	if until, ok := t.verified.Load(key); ok && !now.After(until.(time.Time)) {
		return nil
	}
	until, err := v.verify(*cs, t)
	if err != nil {
		return err
	}
	t.verified.Store(key, until)
	return nil
}

// Reload reads the CA file and, if it changed and parses, puts its CAs in
// force for the next handshakes. It reports whether they changed.
func (v *Verifier) Reload() (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	b, err := os.ReadFile(v.opts.CAFile)
	if err != nil {
		return false, fmt.Errorf("read client CA file: %w", err)
	}
	if v.loaded != nil && bytes.Equal(b, v.loaded) {
		return false, nil
	}
	cas, err := pki.ParseCertificates(b)
	if err != nil {
		return false, fmt.Errorf("client CA file %s: %w", v.opts.CAFile, err)
	}
	t := &trust{roots: x509.NewCertPool()}
	for _, c := range cas {
		t.roots.AddCert(c)
	}
	v.trust.Store(t)
	v.loaded = b
	return true, nil
}

// Start re-reads the CA file every interval until ctx ends. A failed read
// is logged (once until the error changes) and the CAs in force stay.
func (v *Verifier) Start(ctx context.Context) error {
	log := logf.FromContext(ctx, "file", v.opts.CAFile)
	t := v.opts.Clock.NewTicker(v.opts.Interval)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		changed, err := v.Reload()
		switch {
		case err != nil:
			if err.Error() != lastErr {
				log.Error(err, "Reloading client CAs; the CAs loaded before stay in force")
			}
			lastErr = err.Error()
		case changed:
			log.Info("Loaded new client CAs", "commonName", v.opts.CommonName)
			lastErr = ""
		default:
			lastErr = ""
		}
	}
}

// NeedLeaderElection returns false: every replica serves the webhook.
func (v *Verifier) NeedLeaderElection() bool { return false }
