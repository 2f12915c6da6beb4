package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/healthz"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
)

// shutdownTimeout bounds how long a stopping Listener waits for the
// requests in flight.
const shutdownTimeout = time.Minute

// Listener is vmipam's webhook server, the controller-runtime
// webhook.Server the manager runs: it serves admission webhooks over TLS,
// as controller-runtime's default webhook server does, and can close its
// idle connections: after CloseIdle, the connections idle at that moment
// are closed and every response closes its connection, while the listener
// still accepts new ones. The API server keeps connections to a webhook alive and reuses
// them long after the Service stopped routing new ones to a terminating
// replica. A drain closes each connection after its response (the safe
// way: the client knows not to reuse it), but a connection that carried
// no request during the drain would bring the next one to a replica that
// is sealing its pools; CloseIdle at the end of the drain closes those.
// (Closing an idle connection races with a client that picks it at that
// moment, and a POST is not retried: hence after the drain, when the
// connections left idle are the ones the client has not needed for the
// whole drain, not at its start; and only after WaitConnectionsClosed
// gave the client the time to close them itself, which is race-free. The
// API server's transports close a connection idle for 90s.)
//
// CloseIdle is complete over HTTP/1.1, which is what the server speaks
// unless a TLS option offers "h2".
type Listener struct {
	host    string
	port    int
	tlsOpts []func(*tls.Config)
	mux     *http.ServeMux

	mu       sync.Mutex
	srv      *http.Server
	addr     net.Addr
	started  bool
	draining bool
	// open counts the connections accepted and not closed yet.
	open int
}

var _ crwebhook.Server = (*Listener)(nil)

// NewListener returns a server that will listen on host:port with the
// TLS configuration that tlsOpts make, starting from HTTP/1.1 only; one
// of them must set a certificate (GetCertificate or Certificates).
func NewListener(host string, port int, tlsOpts []func(*tls.Config)) *Listener {
	return &Listener{host: host, port: port, tlsOpts: tlsOpts, mux: http.NewServeMux()}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every
// replica serves.
func (s *Listener) NeedLeaderElection() bool { return false }

// Register serves hook at path. It panics if path is registered twice.
func (s *Listener) Register(path string, hook http.Handler) {
	s.mux.Handle(path, hook)
}

// WebhookMux returns the server's mux.
func (s *Listener) WebhookMux() *http.ServeMux { return s.mux }

// StartedChecker reports healthy once the server listens.
func (s *Listener) StartedChecker() healthz.Checker {
	return func(*http.Request) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.started {
			return errors.New("webhook server has not been started yet")
		}
		return nil
	}
}

// Addr returns the address the server listens on, or nil before Start.
func (s *Listener) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// CloseIdle closes the connections idle now and makes every later
// response close its connection. It may be called before Start; it cannot
// be undone.
func (s *Listener) CloseIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draining = true
	if s.srv != nil {
		s.srv.SetKeepAlivesEnabled(false)
	}
}

// WaitConnectionsClosed waits until no connection to the server is open,
// or ctx ends, and reports whether none is. While draining, a connection
// closes after its next response; one its client keeps idle closes when
// the client's idle timeout ends it.
func (s *Listener) WaitConnectionsClosed(ctx context.Context) bool {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		s.mu.Lock()
		open := s.open
		s.mu.Unlock()
		if open == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// connState counts the open connections.
func (s *Listener) connState(_ net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st {
	case http.StateNew:
		s.open++
	case http.StateClosed, http.StateHijacked:
		s.open--
	}
}

// Start listens and serves until ctx ends, then stops accepting and waits
// up to a minute for the requests in flight.
func (s *Listener) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("webhook-server")
	cfg := &tls.Config{NextProtos: []string{"http/1.1"}} //nolint:gosec // TLS options set the versions (certs.HardenTLS)
	for _, op := range s.tlsOpts {
		op(cfg)
	}
	if cfg.GetCertificate == nil && len(cfg.Certificates) == 0 {
		return errors.New("webhook server: no TLS option sets a certificate")
	}
	addr := net.JoinHostPort(s.host, strconv.Itoa(s.port))
	ln, err := tls.Listen("tcp", addr, cfg)
	if err != nil {
		return fmt.Errorf("webhook server: listen on %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           s.mux,
		ReadHeaderTimeout: 32 * time.Second,
		IdleTimeout:       90 * time.Second, // as http.DefaultTransport keeps connections
		MaxHeaderBytes:    1 << 20,
		ConnState:         s.connState,
		// The requests in flight when ctx ends are answered, not cancelled.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	s.mu.Lock()
	s.srv, s.addr, s.started = srv, ln.Addr(), true
	if s.draining {
		srv.SetKeepAlivesEnabled(false)
	}
	s.mu.Unlock()
	log.Info("Serving webhook server", "addr", ln.Addr().String())

	stopped := make(chan error, 1)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		stopped <- srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("webhook server: %w", err)
	}
	if err := <-stopped; err != nil {
		return fmt.Errorf("webhook server: shut down: %w", err)
	}
	return nil
}
