// Command lbproxy runs test/lbproxy as a process: a round-robin TCP
// proxy that stands in for the Service in front of several vmipam
// replicas on one machine (`make local-up REPLICAS=3`). It is not kube-proxy;
// see test/lbproxy for how it differs.
//
//	lbproxy --listen 127.0.0.1:9443 \
//	  --backend vmipam-0,127.0.0.1:9444,http://127.0.0.1:8082/readyz \
//	  --backend vmipam-1,127.0.0.1:9445,http://127.0.0.1:8083/readyz
//
// The backends are fixed for the process's life: a replica restarted on
// the same ports is back in rotation once its probe passes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/vmipam/vmipam/test/lbproxy"
)

// backends is a repeatable --backend flag.
type backends []lbproxy.Backend

func (b *backends) String() string { return fmt.Sprint(*b) }

func (b *backends) Set(v string) error {
	parts := strings.Split(v, ",")
	if len(parts) != 3 || parts[0] == "" {
		return fmt.Errorf("want NAME,HOST:PORT,READY-URL, got %q", v)
	}
	*b = append(*b, lbproxy.Backend{Name: parts[0], Addr: parts[1], ReadyURL: parts[2]})
	return nil
}

type options struct {
	listen, statusAddr string
	backends           backends
	proxy              lbproxy.Options
	statsInterval      time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.listen, "listen", "127.0.0.1:9443", "Address to accept connections on.")
	flag.Var(&o.backends, "backend", "A backend as NAME,HOST:PORT,READY-URL (repeat for each).")
	flag.DurationVar(&o.proxy.ProbeInterval, "probe-interval", lbproxy.DefaultProbeInterval, "How often each backend's readiness URL is polled.")
	flag.DurationVar(&o.proxy.ProbeTimeout, "probe-timeout", lbproxy.DefaultProbeTimeout, "How long one readiness probe may take.")
	flag.StringVar(&o.statusAddr, "status-bind-address", "", "If set, serve /readyz (200 while a backend is ready) and /status (backends, readiness, connection counts) here.")
	flag.DurationVar(&o.statsInterval, "stats-interval", 10*time.Second, "Log the connection counts this often when they changed; 0 logs them only on exit.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	log := zap.New(zap.UseFlagOptions(&zapOpts)).WithName("lbproxy")
	o.proxy.Log = log
	if err := run(o, log); err != nil {
		log.Error(err, "lbproxy stopped")
		os.Exit(1)
	}
}

func run(o options, log logr.Logger) error {
	if len(o.backends) == 0 {
		return errors.New("no --backend given")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	p, err := lbproxy.Listen(o.listen, o.proxy)
	if err != nil {
		return fmt.Errorf("--listen=%s: %w", o.listen, err)
	}
	defer func() {
		logCounts(log, p.Status())
		_ = p.Close()
	}()
	for _, b := range o.backends {
		if err := p.Add(b); err != nil {
			return fmt.Errorf("--backend: %w", err)
		}
	}
	if o.statusAddr != "" {
		srv, err := serveStatus(o.statusAddr, p, log)
		if err != nil {
			return fmt.Errorf("--status-bind-address=%s: %w", o.statusAddr, err)
		}
		defer func() { _ = srv.Close() }()
	}
	log.Info("Proxying", "listen", p.Addr().String(), "backends", len(o.backends), "probeInterval", p.ProbeInterval())
	var tick <-chan time.Time
	if o.statsInterval > 0 {
		t := time.NewTicker(o.statsInterval)
		defer t.Stop()
		tick = t.C
	}
	var last string
	for {
		select {
		case <-ctx.Done():
			log.Info("Stopping")
			return nil
		case <-tick:
			s := p.Status()
			if key := countsKey(s); key != last {
				last = key
				logCounts(log, s)
			}
		}
	}
}

// countsKey is what logCounts would show, less the probe errors.
func countsKey(s lbproxy.Status) string {
	var b strings.Builder
	fmt.Fprint(&b, s.NoBackend)
	for _, bs := range s.Backends {
		fmt.Fprint(&b, " ", bs.Addr, bs.Ready, bs.Connections, bs.Active, bs.DialFailures)
	}
	return b.String()
}

func logCounts(log logr.Logger, s lbproxy.Status) {
	kv := []any{"noBackend", s.NoBackend}
	for _, b := range s.Backends {
		kv = append(kv, b.Name, fmt.Sprintf("ready=%t connections=%d active=%d dialFailures=%d", b.Ready, b.Connections, b.Active, b.DialFailures))
	}
	log.Info("Connections", kv...)
}

func serveStatus(addr string, p *lbproxy.Proxy, log logr.Logger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		for _, b := range p.Status().Backends {
			if b.Ready {
				_, _ = fmt.Fprintln(w, "ok")
				return
			}
		}
		http.Error(w, "no backend is ready", http.StatusServiceUnavailable)
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		s := p.Status()
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		_, _ = fmt.Fprintln(tw, "NAME\tADDRESS\tREADY\tCONNECTIONS\tACTIVE\tDIAL FAILURES\tPROBE ERROR")
		for _, b := range s.Backends {
			_, _ = fmt.Fprintf(tw, "%s\t%s\t%t\t%d\t%d\t%d\t%s\n", b.Name, b.Addr, b.Ready, b.Connections, b.Active, b.DialFailures, b.ProbeError)
		}
		_ = tw.Flush()
		_, _ = fmt.Fprintf(w, "\nconnections reset with no backend ready: %d\n", s.NoBackend)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "Status server stopped")
		}
	}()
	return srv, nil
}
