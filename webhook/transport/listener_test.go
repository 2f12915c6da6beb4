package transport

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"testing"
	"time"
)

func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// startOKServer starts a Listener that answers "ok" at /ok, stopped
// when the test ends; the context is the server's.
func startOKServer(t *testing.T) (*Listener, context.Context) {
	t.Helper()
	cert := selfSigned(t)
	s := NewListener("127.0.0.1", 0, []func(*tls.Config){func(c *tls.Config) { c.Certificates = []tls.Certificate{cert} }})
	s.Register("/ok", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start: %v", err)
		}
	})
	for s.StartedChecker()(nil) != nil {
		time.Sleep(time.Millisecond)
	}
	return s, ctx
}

// TestListenerCloseIdle: after CloseIdle, a connection kept alive from
// before carries no further request: the next one comes on a new
// connection, and its response closes that one too. A client that kept a
// connection to a replica being shut down would otherwise send it
// requests after the drain, while it seals its pools.
func TestListenerCloseIdle(t *testing.T) {
	for _, tt := range []struct {
		name  string
		drain bool
	}{
		{"serving", false},
		{"draining", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, ctx := startOKServer(t)
			c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a test's own certificate
			get := func() (reused, closed bool) {
				t.Helper()
				tr := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, tr), http.MethodGet, "https://"+s.Addr().String()+"/ok", nil)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				return reused, resp.Close
			}
			get() // leaves a connection idle
			if tt.drain {
				// Should the client pick the connection just closed, it
				// sends the GET again on a new one.
				s.CloseIdle()
			}
			reused, closed := get()
			if reused == tt.drain || closed != tt.drain {
				t.Errorf("second request: connection reused %v, closed after the response %v; want %v, %v", reused, closed, !tt.drain, tt.drain)
			}
		})
	}
}

// TestListenerWaitConnectionsClosed: a drain can wait until the clients
// closed the connections they kept idle, which is race-free, instead of
// closing them under a client that may be sending on one: the wait ends
// once the client's idle timeout closed its connection, and not before.
func TestListenerWaitConnectionsClosed(t *testing.T) {
	for _, tt := range []struct {
		name string
		// idle is the client's idle timeout; 0 keeps the connection.
		idle   time.Duration
		closed bool
	}{
		{"the client closes its idle connection", 200 * time.Millisecond, true},
		{"the client keeps it", 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, ctx := startOKServer(t)
			tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, IdleConnTimeout: tt.idle} //nolint:gosec // a test's own certificate
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr}).Get("https://" + s.Addr().String() + "/ok")
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			wctx, wcancel := context.WithTimeout(ctx, time.Second)
			defer wcancel()
			began := time.Now()
			if got := s.WaitConnectionsClosed(wctx); got != tt.closed {
				t.Errorf("WaitConnectionsClosed = %v after %s; want %v", got, time.Since(began).Round(time.Millisecond), tt.closed)
			}
		})
	}
}
