package lbproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// replica is a backend: an HTTP server answering its name, with /readyz
// following ready.
type replica struct {
	name  string
	ready atomic.Bool
	srv   *httptest.Server
}

func newReplica(t *testing.T, name string, ready bool) *replica {
	t.Helper()
	r := &replica{name: name}
	r.ready.Store(ready)
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/readyz" {
			if !r.ready.Load() {
				http.Error(w, "not ready", http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, "ok")
			return
		}
		_, _ = io.WriteString(w, r.name)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *replica) backend() Backend {
	return Backend{Name: r.name, Addr: r.srv.Listener.Addr().String(), ReadyURL: r.srv.URL + "/readyz"}
}

func newProxy(t *testing.T, rs ...*replica) *Proxy {
	t.Helper()
	p, err := Listen("127.0.0.1:0", Options{ProbeInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	for _, r := range rs {
		if err := p.Add(r.backend()); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// settle waits until the proxy's view of readiness matches the replicas'.
func settle(t *testing.T, p *Proxy, rs ...*replica) {
	t.Helper()
	waitFor(t, "the proxy to see every backend's readiness", func() bool {
		for _, r := range rs {
			s, ok := p.Backend(r.backend().Addr)
			if !ok || s.Ready != r.ready.Load() {
				return false
			}
		}
		return true
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// wait, not harness.Poll: the harness imports this package.
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	}); err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// fresh makes one request on a new connection and returns the body.
func fresh(p *Proxy) (string, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.Addr().String() + "/")
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func freshN(t *testing.T, p *Proxy, n int) []string {
	t.Helper()
	var got []string
	for range n {
		name, err := fresh(p)
		if err != nil {
			t.Fatalf("request through the proxy: %v", err)
		}
		got = append(got, name)
	}
	return got
}

// kept is a client connection kept open across requests.
type kept struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, p *Proxy) *kept {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &kept{c: c, r: bufio.NewReader(c)}
}

func (k *kept) get() (string, error) {
	_ = k.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(k.c, "GET / HTTP/1.1\r\nHost: backend\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func count(names []string) map[string]int {
	m := map[string]int{}
	for _, n := range names {
		m[n]++
	}
	return m
}

func TestRoundRobin(t *testing.T) {
	a, b, c := newReplica(t, "a", true), newReplica(t, "b", true), newReplica(t, "c", true)
	p := newProxy(t, a, b, c)
	settle(t, p, a, b, c)
	got := freshN(t, p, 9)
	if want := []string{"a", "b", "c", "a", "b", "c", "a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("connections went to %v, want %v", got, want)
	}
	for _, s := range p.Status().Backends {
		if s.Connections != 3 {
			t.Errorf("backend %s: %d connections counted, want 3", s.Name, s.Connections)
		}
	}
}

func TestOnlyReadyBackends(t *testing.T) {
	tests := map[string]struct {
		ready []bool
		want  map[string]int // of 6 connections
	}{
		"one of three unready": {ready: []bool{true, false, true}, want: map[string]int{"r0": 3, "r2": 3}},
		"one of three ready":   {ready: []bool{false, false, true}, want: map[string]int{"r2": 6}},
		"the first unready":    {ready: []bool{false, true, true}, want: map[string]int{"r1": 3, "r2": 3}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var rs []*replica
			for i, ready := range tt.ready {
				rs = append(rs, newReplica(t, fmt.Sprintf("r%d", i), ready))
			}
			p := newProxy(t, rs...)
			settle(t, p, rs...)
			if got := count(freshN(t, p, 6)); !maps.Equal(got, tt.want) {
				t.Fatalf("connections went to %v, want %v", got, tt.want)
			}
		})
	}
}

func TestReadinessChanges(t *testing.T) {
	a, b := newReplica(t, "a", true), newReplica(t, "b", true)
	p := newProxy(t, a, b)
	settle(t, p, a, b)
	a.ready.Store(false)
	settle(t, p, a, b)
	if got := count(freshN(t, p, 4)); !maps.Equal(got, map[string]int{"b": 4}) {
		t.Fatalf("with a unready, connections went to %v", got)
	}
	a.ready.Store(true)
	settle(t, p, a, b)
	if got := count(freshN(t, p, 4)); !maps.Equal(got, map[string]int{"a": 2, "b": 2}) {
		t.Fatalf("with a ready again, connections went to %v", got)
	}
}

// TestSetProbeInterval slows the probes down, then back: an unready
// backend is noticed at the interval in force, and at once when it
// changes.
func TestSetProbeInterval(t *testing.T) {
	probes := atomic.Int64{}
	ready := atomic.Bool{}
	ready.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		probes.Add(1)
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	p := newProxy(t)
	if err := p.Add(Backend{Name: "a", Addr: srv.Listener.Addr().String(), ReadyURL: srv.URL + "/readyz"}); err != nil {
		t.Fatal(err)
	}
	settleReady := func(want bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true,
			func(context.Context) (bool, error) { return p.Status().Backends[0].Ready == want, nil }); err != nil {
			t.Fatalf("backend not ready=%v: %v", want, err)
		}
	}
	settleReady(true)
	p.SetProbeInterval(time.Hour)
	// The change itself probes once; then none for an hour.
	time.Sleep(50 * time.Millisecond)
	before := probes.Load()
	ready.Store(false)
	time.Sleep(200 * time.Millisecond)
	if n := probes.Load() - before; n != 0 || !p.Status().Backends[0].Ready {
		t.Fatalf("at an hour's interval: %d probes in 200ms, ready %v; want none, still ready", n, p.Status().Backends[0].Ready)
	}
	p.SetProbeInterval(5 * time.Millisecond)
	settleReady(false)
}

// TestProbeInterval reports the interval in force: the option's, the
// default for none, and what SetProbeInterval set (the default for none).
func TestProbeInterval(t *testing.T) {
	for _, tc := range []struct {
		name   string
		option time.Duration
		set    []time.Duration
		want   time.Duration
	}{
		{name: "option", option: 7 * time.Millisecond, want: 7 * time.Millisecond},
		{name: "no option", want: DefaultProbeInterval},
		{name: "negative option", option: -time.Second, want: DefaultProbeInterval},
		{name: "set", option: 7 * time.Millisecond, set: []time.Duration{time.Hour}, want: time.Hour},
		{name: "set to none", option: 7 * time.Millisecond, set: []time.Duration{time.Hour, 0}, want: DefaultProbeInterval},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Listen("127.0.0.1:0", Options{ProbeInterval: tc.option})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			for _, d := range tc.set {
				p.SetProbeInterval(d)
			}
			if got := p.ProbeInterval(); got != tc.want {
				t.Errorf("ProbeInterval() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNoReadyBackendResets(t *testing.T) {
	tests := map[string]struct{ backends int }{
		"no backends":           {backends: 0},
		"every backend unready": {backends: 2},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var rs []*replica
			for i := range tt.backends {
				rs = append(rs, newReplica(t, fmt.Sprintf("r%d", i), false))
			}
			p := newProxy(t, rs...)
			// Probed at least once, and still not ready.
			waitFor(t, "the backends to be probed", func() bool {
				for _, s := range p.Status().Backends {
					if s.ProbeError == "" {
						return false
					}
				}
				return true
			})
			start := time.Now()
			// The reset may reach the client before its connect returns.
			if c, err := net.Dial("tcp", p.Addr().String()); err == nil {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, err := c.Read(make([]byte, 1))
				_ = c.Close()
				if err == nil || isTimeout(err) {
					t.Fatalf("read %d bytes, err %v: want the connection closed", n, err)
				}
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("closed after %s, want at once", d)
			}
			if got := p.Status().NoBackend; got != 1 {
				t.Errorf("NoBackend = %d, want 1", got)
			}
		})
	}
}

func TestEstablishedConnectionOutlivesUnreadiness(t *testing.T) {
	a, b := newReplica(t, "a", true), newReplica(t, "b", false)
	p := newProxy(t, a, b)
	settle(t, p, a, b)
	k := dial(t, p)
	if got, err := k.get(); err != nil || got != "a" {
		t.Fatalf("first request: %q, %v; want a", got, err)
	}

	// a turns unready: new connections go to b, the open one stays on a.
	a.ready.Store(false)
	b.ready.Store(true)
	settle(t, p, a, b)
	if got, err := k.get(); err != nil || got != "a" {
		t.Fatalf("on the open connection after a turned unready: %q, %v; want a", got, err)
	}
	if got := count(freshN(t, p, 3)); !maps.Equal(got, map[string]int{"b": 3}) {
		t.Fatalf("new connections went to %v, want b only", got)
	}

	// Removed, too: the flow stays.
	if s, ok := p.Remove(a.backend().Addr); !ok || s.Connections != 1 || s.Active != 1 {
		t.Fatalf("Remove(a) = %+v, %v; want 1 connection, 1 active", s, ok)
	}
	if got, err := k.get(); err != nil || got != "a" {
		t.Fatalf("on the open connection after a was removed: %q, %v; want a", got, err)
	}

	// The backend closes it: so does the proxy.
	a.srv.CloseClientConnections()
	_ = k.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := k.r.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("after the backend closed: read %d bytes, err %v; want the connection closed", n, err)
	}
}

func TestAddRemove(t *testing.T) {
	a, b := newReplica(t, "a", true), newReplica(t, "b", true)
	p := newProxy(t, a)
	settle(t, p, a)
	if got := count(freshN(t, p, 2)); !maps.Equal(got, map[string]int{"a": 2}) {
		t.Fatalf("with a alone, connections went to %v", got)
	}

	// A rolling restart: the replacement joins, then the old one leaves.
	if err := p.Add(b.backend()); err != nil {
		t.Fatal(err)
	}
	settle(t, p, a, b)
	if got := count(freshN(t, p, 4)); !maps.Equal(got, map[string]int{"a": 2, "b": 2}) {
		t.Fatalf("with a and b, connections went to %v", got)
	}
	waitFor(t, "a's connections to end", func() bool { s, _ := p.Backend(a.backend().Addr); return s.Active == 0 })
	s, ok := p.Remove(a.backend().Addr)
	if !ok || s.Connections != 4 || s.Active != 0 {
		t.Fatalf("Remove(a) = %+v, %v; want 4 connections, none active", s, ok)
	}
	if got := count(freshN(t, p, 3)); !maps.Equal(got, map[string]int{"b": 3}) {
		t.Fatalf("after removing a, connections went to %v", got)
	}
	if bs := p.Status().Backends; len(bs) != 1 || bs[0].Name != "b" {
		t.Fatalf("backends after Remove: %+v", bs)
	}

	if _, ok := p.Remove(a.backend().Addr); ok {
		t.Error("a second Remove of a reported a backend")
	}
	if err := p.Add(b.backend()); err == nil || !strings.Contains(err.Error(), "already a backend") {
		t.Errorf("adding b twice: %v", err)
	}
	for name, bad := range map[string]Backend{
		"no port":          {Name: "x", Addr: "127.0.0.1", ReadyURL: "http://127.0.0.1:1/readyz"},
		"no readiness URL": {Name: "x", Addr: "127.0.0.1:1"},
		"not http":         {Name: "x", Addr: "127.0.0.1:1", ReadyURL: "tcp://127.0.0.1:1"},
	} {
		if err := p.Add(bad); err == nil {
			t.Errorf("Add with %s: no error", name)
		}
	}
	// Back in, a backend starts counting afresh.
	if err := p.Add(a.backend()); err != nil {
		t.Fatal(err)
	}
	settle(t, p, a, b)
	if s, _ := p.Backend(a.backend().Addr); s.Connections != 0 {
		t.Errorf("a added again: %d connections, want 0", s.Connections)
	}
}

func TestUnreachableBackendResets(t *testing.T) {
	// Its probe passes, but nothing listens at its address any more: the
	// window between a crash and the failed probe.
	r := newReplica(t, "r", true)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	_ = l.Close()
	p := newProxy(t)
	if err := p.Add(Backend{Name: "dead", Addr: dead, ReadyURL: r.srv.URL + "/readyz"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the backend to be ready", func() bool { s, _ := p.Backend(dead); return s.Ready })
	if _, err := fresh(p); err == nil {
		t.Fatal("a request through an unreachable backend succeeded")
	}
	if s, _ := p.Backend(dead); s.DialFailures != 1 || s.Connections != 0 {
		t.Errorf("status %+v, want 1 dial failure and no connection", s)
	}
}

func TestCloseEndsConnections(t *testing.T) {
	a := newReplica(t, "a", true)
	p := newProxy(t, a)
	settle(t, p, a)
	k := dial(t, p)
	if got, err := k.get(); err != nil || got != "a" {
		t.Fatalf("request: %q, %v", got, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := k.get(); err == nil {
		t.Fatal("the connection outlived the proxy")
	}
	if err := p.Add(newReplica(t, "b", true).backend()); err == nil {
		t.Error("Add after Close: no error")
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return err != nil && errors.As(err, &ne) && ne.Timeout()
}
