package lbproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// Defaults of Options.
const (
	DefaultProbeInterval = 100 * time.Millisecond
	// DefaultProbeTimeout is the kubelet's default timeoutSeconds.
	DefaultProbeTimeout = time.Second
	DefaultDialTimeout  = time.Second
)

// Backend is one endpoint of the stand-in Service.
type Backend struct {
	// Name labels the backend in logs and Status (a replica's holder name,
	// say); it need not be unique.
	Name string
	// Addr is the TCP address connections are forwarded to. It identifies
	// the backend: two backends cannot share it.
	Addr string
	// ReadyURL is polled with GET; a status from 200 to 399 means ready,
	// as for a kubelet httpGet probe.
	ReadyURL string
}

// Options tune a Proxy; zero values take the defaults.
type Options struct {
	// ProbeInterval is the time between the start of one readiness probe
	// of a backend and the next.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe; a probe that takes longer fails.
	ProbeTimeout time.Duration
	// DialTimeout bounds the connection to the chosen backend.
	DialTimeout time.Duration
	// Log receives readiness changes and errors, and each forwarded
	// connection at V(1). The zero value discards.
	Log logr.Logger
}

// BackendStatus is a backend's state and counts.
type BackendStatus struct {
	Backend
	// Ready is the outcome of the last probe; a backend not yet probed is
	// not ready.
	Ready bool
	// ProbeError is why the last probe failed, empty when it passed.
	ProbeError string
	// Connections is how many connections were forwarded to the backend
	// since it was added, Active how many of them are still open.
	Connections, Active int64
	// DialFailures counts connections routed to the backend that could
	// not reach it (they were reset).
	DialFailures int64
}

// Status is a snapshot of a Proxy.
type Status struct {
	// Backends in rotation order.
	Backends []BackendStatus
	// NoBackend counts connections reset because no backend was ready.
	NoBackend int64
}

// Proxy forwards each connection accepted on its listener to the next
// ready backend. Its methods are safe for concurrent use.
type Proxy struct {
	o      Options
	ln     net.Listener
	probe  *http.Client
	dialer net.Dialer
	ctx    context.Context // ends on Close; pollers run under it
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	backends []*backend // rotation order
	next     int        // where the round robin resumes
	conns    map[*conn]struct{}
	// interval is the probes' interval now (SetProbeInterval);
	// retick is closed, and replaced, when it changes.
	interval time.Duration
	retick   chan struct{}

	noBackend atomic.Int64
}

type backend struct {
	Backend
	cancel context.CancelFunc
	done   chan struct{} // closed when its poller has returned

	ready       atomic.Bool
	probeError  atomic.Pointer[string]
	connections atomic.Int64
	active      atomic.Int64
	dialFailed  atomic.Int64
}

// conn is a forwarded connection: both ends, so that Close can end it.
type conn struct{ client, upstream net.Conn }

// Listen listens on the TCP address addr (host:port; port 0 picks one)
// and forwards connections until Close. It starts with no backends.
func Listen(addr string, o Options) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return New(ln, o), nil
}

// New forwards the connections accepted on ln until Close, which closes
// ln. It starts with no backends.
func New(ln net.Listener, o Options) *Proxy {
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = DefaultProbeInterval
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = DefaultProbeTimeout
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		o:  o,
		ln: ln,
		// A fresh connection per probe, as the kubelet's prober does: a
		// pooled connection would hide a backend that no longer accepts.
		probe:    &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: o.ProbeTimeout},
		dialer:   net.Dialer{Timeout: o.DialTimeout},
		ctx:      ctx,
		cancel:   cancel,
		conns:    map[*conn]struct{}{},
		interval: o.ProbeInterval,
		retick:   make(chan struct{}),
	}
	p.wg.Go(p.serve)
	return p
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

// Add puts b into rotation at the end and starts probing it at once; it
// receives connections from its first passed probe on, as a new pod's
// endpoint does once it is ready.
func (p *Proxy) Add(b Backend) error {
	if _, _, err := net.SplitHostPort(b.Addr); err != nil {
		return fmt.Errorf("backend %s: address %q: %w", b.Name, b.Addr, err)
	}
	if u, err := url.Parse(b.ReadyURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("backend %s: readiness URL %q is not an http(s) URL", b.Name, b.ReadyURL)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("proxy closed")
	}
	if slices.ContainsFunc(p.backends, func(o *backend) bool { return o.Addr == b.Addr }) {
		return fmt.Errorf("backend %s: address %s is already a backend", b.Name, b.Addr)
	}
	ctx, cancel := context.WithCancel(p.ctx)
	nb := &backend{Backend: b, cancel: cancel, done: make(chan struct{})}
	p.backends = append(p.backends, nb)
	p.wg.Go(func() { p.poll(ctx, nb) })
	p.o.Log.Info("Adding backend", "backend", b.Name, "addr", b.Addr, "readyURL", b.ReadyURL)
	return nil
}

// Remove takes the backend at addr out of rotation and stops probing it,
// and returns its last status. Its open connections stay until either
// side closes them, as established flows outlive an endpoint's removal.
func (p *Proxy) Remove(addr string) (BackendStatus, bool) {
	p.mu.Lock()
	i := slices.IndexFunc(p.backends, func(b *backend) bool { return b.Addr == addr })
	if i < 0 {
		p.mu.Unlock()
		return BackendStatus{}, false
	}
	b := p.backends[i]
	p.backends = slices.Delete(p.backends, i, i+1)
	if p.next > i {
		p.next--
	}
	p.mu.Unlock()
	b.cancel()
	<-b.done
	s := b.status()
	p.o.Log.Info("Removed backend", "backend", b.Name, "addr", b.Addr, "connections", s.Connections, "active", s.Active)
	return s, true
}

// Status returns the backends' states and counts.
func (p *Proxy) Status() Status {
	p.mu.Lock()
	bs := slices.Clone(p.backends)
	p.mu.Unlock()
	s := Status{NoBackend: p.noBackend.Load(), Backends: make([]BackendStatus, 0, len(bs))}
	for _, b := range bs {
		s.Backends = append(s.Backends, b.status())
	}
	return s
}

// Backend returns the status of the backend at addr.
func (p *Proxy) Backend(addr string) (BackendStatus, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.backends {
		if b.Addr == addr {
			return b.status(), true
		}
	}
	return BackendStatus{}, false
}

// Close stops listening and probing and closes every forwarded
// connection, as the proxy's process exiting would.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.cancel()
	for _, c := range conns {
		_ = c.client.Close()
		_ = c.upstream.Close()
	}
	p.wg.Wait()
	return err
}

func (b *backend) status() BackendStatus {
	s := BackendStatus{
		Backend: b.Backend, Ready: b.ready.Load(),
		Connections: b.connections.Load(), Active: b.active.Load(), DialFailures: b.dialFailed.Load(),
	}
	if e := b.probeError.Load(); e != nil {
		s.ProbeError = *e
	}
	return s
}

func (p *Proxy) serve() {
	var delay time.Duration
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: back off as net/http does
			// rather than spin, and keep serving.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			p.o.Log.Error(err, "Accepting a connection failed", "retryIn", delay)
			select {
			case <-time.After(delay):
				continue
			case <-p.ctx.Done():
				return
			}
		}
		delay = 0
		p.wg.Go(func() { p.forward(c) })
	}
}

// pick returns the next ready backend in rotation, or nil.
func (p *Proxy) pick() *backend {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.backends)
	for k := range n {
		i := (p.next + k) % n
		if b := p.backends[i]; b.ready.Load() {
			p.next = i + 1
			return b
		}
	}
	return nil
}

func (p *Proxy) forward(client net.Conn) {
	b := p.pick()
	if b == nil {
		p.noBackend.Add(1)
		p.o.Log.V(1).Info("Resetting a connection: no backend is ready", "client", client.RemoteAddr())
		reset(client)
		return
	}
	upstream, err := p.dialer.DialContext(p.ctx, "tcp", b.Addr)
	if err != nil {
		if p.ctx.Err() != nil {
			reset(client) // closing
			return
		}
		b.dialFailed.Add(1)
		p.o.Log.Info("Resetting a connection: its backend is unreachable", "backend", b.Name, "addr", b.Addr, "err", err.Error())
		reset(client)
		return
	}
	c := &conn{client: client, upstream: upstream}
	if !p.track(c) {
		_ = client.Close()
		_ = upstream.Close()
		return
	}
	defer p.untrack(c)
	b.connections.Add(1)
	b.active.Add(1)
	defer b.active.Add(-1)
	p.o.Log.V(1).Info("Forwarding a connection", "client", client.RemoteAddr(), "backend", b.Name, "addr", b.Addr)
	pipe(client, upstream)
}

func (p *Proxy) track(c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c *conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// pipe copies both ways until the backend closes its side (or either end
// fails), then closes both. A client that only stops sending (half-close)
// is passed on as such, so the backend may still answer.
func pipe(client, upstream net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(upstream, client); err != nil {
			_ = upstream.Close()
			return
		}
		if cw, ok := upstream.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}()
	_, _ = io.Copy(client, upstream)
	_ = client.Close()
	_ = upstream.Close()
	<-done
}

// reset closes c with a TCP reset rather than a clean end of stream, the
// nearest a proxy that has accepted can come to refusing.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// SetProbeInterval changes the interval between the readiness probes of
// every backend, from the next probe on. A benchmark measuring the
// replicas' CPU probes at a Deployment's rate (the kubelet's, every few
// seconds) rather than every 100 ms, which costs an idle replica a
// connection and a goroutine ten times a second.
func (p *Proxy) SetProbeInterval(d time.Duration) {
	if d <= 0 {
		d = DefaultProbeInterval
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if d != p.interval {
		p.interval = d
		close(p.retick)
		p.retick = make(chan struct{})
	}
}

// ProbeInterval returns the interval between a backend's readiness probes
// now: Options.ProbeInterval, or the default when it was not positive, as
// SetProbeInterval last changed it.
func (p *Proxy) ProbeInterval() time.Duration {
	d, _ := p.probeInterval()
	return d
}

// probeInterval returns the probes' interval now, and a channel closed
// when it changes.
func (p *Proxy) probeInterval() (time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.interval, p.retick
}

// poll probes b every interval until ctx ends.
func (p *Proxy) poll(ctx context.Context, b *backend) {
	defer close(b.done)
	d, changed := p.probeInterval()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		err := p.check(ctx, b.ReadyURL)
		if ctx.Err() != nil {
			return
		}
		p.note(b, err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changed:
			// Probe again now, then at the new interval.
			d, changed = p.probeInterval()
			t.Reset(d)
		}
	}
}

func (p *Proxy) check(ctx context.Context, u string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := p.probe.Do(req)
	if err != nil {
		return err
	}
	// Read a little of the body, as the kubelet does, for the message.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
	}
	return nil
}

// note records a probe's outcome and logs a change.
func (p *Proxy) note(b *backend, err error) {
	if err == nil {
		b.probeError.Store(nil)
		if !b.ready.Swap(true) {
			p.o.Log.Info("Backend ready", "backend", b.Name, "addr", b.Addr, "connections", b.connections.Load())
		}
		return
	}
	msg := err.Error()
	b.probeError.Store(&msg)
	if b.ready.Swap(false) {
		p.o.Log.Info("Backend not ready", "backend", b.Name, "addr", b.Addr, "reason", msg,
			"connections", b.connections.Load(), "active", b.active.Load())
	}
}
