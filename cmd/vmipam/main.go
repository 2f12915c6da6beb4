// Command vmipam runs vmipam: the admission webhooks that give
// VirtualMachines their addresses, the controller that releases them into
// cooldown, and the pools' allocators, in one controller-runtime manager.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/vmipam/vmipam/api/scheme"
	"github.com/vmipam/vmipam/certs"
	"github.com/vmipam/vmipam/certs/clientauth"
	"github.com/vmipam/vmipam/history"
	"github.com/vmipam/vmipam/internal/app"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/lib/lazylog"
	"github.com/vmipam/vmipam/lib/memlimit"
	"github.com/vmipam/vmipam/metrics"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/webhook/transport"
)

var setupLog = ctrl.Log.WithName("setup")

type options struct {
	metricsAddr, probeAddr        string
	pprofAddr                     string
	memoryLimitRatio              float64
	metricsSecure, enableHTTP2    bool
	leaderElect                   bool
	leaseDuration, renewDeadline  time.Duration
	retryPeriod                   time.Duration
	namespace, holder             string
	webhookHost                   string
	webhookPort                   int
	certMode, certDir, certSecret string
	serviceName, metricsService   string
	extraSANs                     string
	mutatingConfig, validatingCfg string
	resync, drain, connWait       time.Duration
	fullResync                    time.Duration
	clientCA, clientCN            string
	kindsConfig                   string
	limits                        transport.Limits
	history                       app.HistoryOptions
	// clientCNSet records that --webhook-client-cn was given, which
	// means nothing without --webhook-client-ca.
	clientCNSet bool
	// apiCompression asks the API server for compressed responses.
	apiCompression bool
	// slots takes the holder from a holder slot; --holder then names the
	// process.
	slots                 bool
	slotHandoff, slotWait time.Duration
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "manifests" {
		if err := renderManifests(os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "vmipam manifests:", err)
			os.Exit(2)
		}
		return
	}
	var o options
	flag.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "Address the metrics endpoint binds to; \"0\" disables it.")
	flag.BoolVar(&o.metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS with authentication and authorization; false serves plain HTTP.")
	flag.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address /healthz and /readyz bind to.")
	flag.StringVar(&o.pprofAddr, "pprof-bind-address", "", "Address net/http/pprof binds to, for profiling (off when empty; bind it to localhost).")
	flag.Float64Var(&o.memoryLimitRatio, "memory-limit-ratio", 0.9, "Sets the Go runtime's soft memory limit (as GOMEMLIMIT does) to this share of the container's memory limit, read from its cgroup, so that the garbage collector works harder near the limit instead of letting the heap's slack grow into it; 0, GOMEMLIMIT in the environment, or no limit leave it unset.")
	flag.BoolVar(&o.enableHTTP2, "enable-http2", false, "Serve HTTP/2 on the webhook and metrics servers (off by default: CVE-2023-44487 and CVE-2023-39325).")
	flag.BoolVar(&o.leaderElect, "leader-elect", false, "Deprecated and ignored: every replica runs every controller, each looking after the addresses it holds.")
	flag.DurationVar(&o.leaseDuration, "lease-duration", pools.DefaultLeaseDuration, "How long after a replica's last renewal of its holder lease another replica may take its claims over.")
	flag.DurationVar(&o.renewDeadline, "lease-renew-deadline", pools.DefaultRenewDeadline, "How long after the last renewal it sent a replica stops handing out addresses (fencing); shorter than --lease-duration, by more than the clock skew between nodes and the longest pause of the process. The replica keeps renewing and serves again once a renewal lands in time.")
	flag.DurationVar(&o.retryPeriod, "lease-retry-period", pools.DefaultRetryPeriod, "How often a replica renews its holder lease and looks for replicas that left.")
	flag.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", pools.DefaultLeaseDuration, "Deprecated: --lease-duration.")
	flag.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", pools.DefaultRenewDeadline, "Deprecated: --lease-renew-deadline.")
	flag.DurationVar(&o.retryPeriod, "leader-elect-retry-period", pools.DefaultRetryPeriod, "Deprecated: --lease-retry-period.")
	flag.StringVar(&o.namespace, "namespace", envOr("POD_NAMESPACE", "vmipam-system"), "vmipam's own namespace: its Secret, holder leases and events.")
	flag.StringVar(&o.holder, "holder", envOr("POD_NAME", hostname()), "This replica's name in the pools' claims and its holder lease: stable across its restarts, and used by one process at a time (the pod's name, from $POD_NAME).")
	flag.BoolVar(&o.slots, "holder-slots", false, "Take the holder from a slot (slot-0, slot-1, …: the Lease vmipam-holder-slot-N) instead of --holder, which then names this process on the slot's Lease. A slot a stopped replica released goes, with its claims and the objects labelled for it, to the next replica that starts: a rollout takes nothing over and relabels nothing (docs/design.md, \"Holder slots\"). Roll such a Deployment with maxSurge 0, so that each new pod finds the slot of the pod it replaces.")
	flag.DurationVar(&o.slotHandoff, "slot-handoff", pools.DefaultSlotHandoff, "With --holder-slots: how long a released slot waits for its next replica before the others take its claims over (a scale-down) and relabel its objects.")
	flag.DurationVar(&o.slotWait, "slot-wait", pools.DefaultSlotWait, "With --holder-slots: how long a starting replica waits for the slot of a replica that is shutting down, before it opens a slot of its own.")
	flag.DurationVar(&o.drain, "shutdown-drain", 10*time.Second, "On SIGTERM, how long to keep serving, not ready and closing connections, while the Service stops sending requests here; then shut down, sealing the pools.")
	flag.DurationVar(&o.connWait, "shutdown-connection-wait", 85*time.Second, "After --shutdown-drain, how much longer to keep serving until the API server has closed the connections it keeps idle here (its transports close one idle for 90s); those left are closed then. Closing an idle connection races with an admission the API server may be sending on it, which then fails; 0 closes them at the end of the drain.")
	flag.StringVar(&o.webhookHost, "webhook-host", "", "Address the webhook server binds to (all interfaces when empty).")
	flag.IntVar(&o.webhookPort, "webhook-port", 9443, "Port of the webhook server.")
	flag.StringVar(&o.certMode, "cert-mode", "self", "Serving certificates: \"self\" (vmipam keeps a CA and a certificate in a Secret and injects the CA) or \"cert-manager\" (files in --cert-dir, reloaded on change).")
	flag.StringVar(&o.certDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "With --cert-mode=cert-manager: the directory holding tls.crt and tls.key.")
	flag.StringVar(&o.certSecret, "cert-secret", "vmipam-webhook-tls", "With --cert-mode=self: the Secret holding the CA and the serving certificate.")
	flag.StringVar(&o.serviceName, "webhook-service", "vmipam-webhook", "The Service in front of the webhook: its DNS names go into the certificate.")
	flag.StringVar(&o.metricsService, "metrics-service", "vmipam-metrics", "With --cert-mode=self and --metrics-secure: the Service in front of the metrics endpoint. Its DNS names go into the serving certificate, which the metrics endpoint serves too, so that Prometheus can verify it.")
	flag.StringVar(&o.clientCA, "webhook-client-ca", "", "A PEM file of CA certificates. When set, the webhook server serves only callers presenting a client certificate that chains to one of them and carries the common name --webhook-client-cn (the API server, configured with an AdmissionConfiguration); anyone else is refused at the TLS handshake. The file is re-read every 10s, so the CA can be rotated without a restart.")
	flag.StringVar(&o.clientCN, "webhook-client-cn", "kube-apiserver", "With --webhook-client-ca: the common name the caller's client certificate must carry.")
	flag.Int64Var(&o.limits.MaxBodyBytes, "webhook-max-body-bytes", transport.DefaultMaxBodyBytes, "A larger admission request body is refused (413) before it is read.")
	flag.Int64Var(&o.limits.MaxInflightBytes, "webhook-max-inflight-bytes", transport.DefaultMaxInflightBytes, "The request bodies all admissions in flight may hold together; more wait for room until their deadline, then get 429.")
	flag.Int64Var(&o.limits.MaxConcurrent, "webhook-max-concurrent", transport.DefaultMaxConcurrent, "Admissions handled at once; more wait, as above.")
	flag.DurationVar(&o.limits.ReadTimeout, "webhook-read-timeout", 10*time.Second, "How long reading an admission request body may take, so a slow sender cannot hold a connection and its memory.")
	flag.StringVar(&o.extraSANs, "webhook-extra-sans", "", "Comma-separated extra DNS names or IPs for the serving certificate (127.0.0.1 for a local run).")
	flag.StringVar(&o.mutatingConfig, "mutating-webhook-configuration", "vmipam-mutating", "With --cert-mode=self: the MutatingWebhookConfiguration whose CA bundle vmipam keeps.")
	flag.StringVar(&o.validatingCfg, "validating-webhook-configuration", "vmipam-validating", "With --cert-mode=self: the ValidatingWebhookConfiguration whose CA bundle vmipam keeps.")
	flag.StringVar(&o.kindsConfig, "kinds-config", "", "The kinds configuration file: the kinds vmipam gives addresses to, and where on each the pool and the address live (see deploy/kinds). Empty serves vmipam's own VirtualMachine. `vmipam manifests --kinds-config FILE` renders the webhook, admission policies and RBAC it needs.")
	flag.BoolVar(&o.history.Off, "no-history", false, "Record no address history (who held which address when, in IPHistory objects; see kubectl vmipam history).")
	flag.IntVar(&o.history.Keep, "history-keep", history.DefaultKeep, "How many past holders of each address the history keeps.")
	flag.DurationVar(&o.history.Retention, "history-retention", history.DefaultRetention, "How long the history keeps a record; with --history-keep, whichever keeps less.")
	flag.DurationVar(&o.resync, "resync-interval", 5*time.Minute, "How often each pool is reconciled against every live object: from this replica's caches, and from the API server for the objects they lack and those whose addresses it would adopt (see --full-resync-interval).")
	flag.DurationVar(&o.fullResync, "full-resync-interval", time.Hour, "How often a resync lists every object from the API server instead of reading this replica's caches; 0 or at most --resync-interval: every resync lists.")
	flag.BoolVar(&o.apiCompression, "kube-api-compression", false, "Ask the API server for gzip-compressed responses and watch streams. Off by default: inside a cluster the bytes are cheap and the compressing (in the API server) and decompressing (here) are not, half of the cost of vmipam's watch of VMs; turn it on where vmipam reaches its API server over a slow link.")
	zapOpts := zap.Options{Development: false}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { o.clientCNSet = o.clientCNSet || f.Name == "webhook-client-cn" })
	// Every reconcile's logger gets values that are encoded only for a
	// line that is written (see lazylog).
	ctrl.SetLogger(lazylog.Wrap(zap.New(zap.UseFlagOptions(&zapOpts))))

	if err := run(o); err != nil {
		setupLog.Error(err, "vmipam stopped")
		os.Exit(1)
	}
}

// validate checks the flags that would otherwise fail deep inside the
// manager, with a message naming neither the flag nor the fix.
func (o options) validate() error {
	switch {
	case o.leaseDuration <= 0 || o.renewDeadline <= 0 || o.retryPeriod <= 0:
		return errors.New("--lease-duration, --lease-renew-deadline and --lease-retry-period must be positive")
	case o.leaseDuration <= o.renewDeadline:
		return fmt.Errorf("--lease-duration (%s) must be longer than --lease-renew-deadline (%s): a replica must stop serving before another may take its claims over", o.leaseDuration, o.renewDeadline)
	case float64(o.renewDeadline) <= 1.2*float64(o.retryPeriod):
		return fmt.Errorf("--lease-renew-deadline (%s) must be longer than 1.2 × --lease-retry-period (%s)", o.renewDeadline, o.retryPeriod)
	case o.holder == "":
		return errors.New("--holder is empty: give each replica a stable name (the pod's name, from $POD_NAME)")
	case o.slots && (o.slotHandoff <= 0 || o.slotWait < 0):
		return errors.New("--slot-handoff must be positive and --slot-wait not negative")
	case o.drain < 0 || o.connWait < 0:
		return errors.New("--shutdown-drain and --shutdown-connection-wait must not be negative")
	case o.limits.MaxBodyBytes <= 0 || o.limits.MaxInflightBytes <= 0 || o.limits.MaxConcurrent <= 0 || o.limits.ReadTimeout <= 0:
		return errors.New("--webhook-max-body-bytes, --webhook-max-inflight-bytes, --webhook-max-concurrent and --webhook-read-timeout must be positive")
	case o.limits.MaxInflightBytes < o.limits.MaxBodyBytes:
		return fmt.Errorf("--webhook-max-inflight-bytes (%d) must be at least --webhook-max-body-bytes (%d)", o.limits.MaxInflightBytes, o.limits.MaxBodyBytes)
	case o.certMode != "self" && o.certMode != "cert-manager":
		return fmt.Errorf("--cert-mode=%q: use \"self\" or \"cert-manager\"", o.certMode)
	case o.clientCA == "" && o.clientCNSet:
		return errors.New("--webhook-client-cn needs --webhook-client-ca: without a CA no caller's certificate is checked")
	case o.clientCA != "" && o.clientCN == "":
		return errors.New("--webhook-client-cn must not be empty with --webhook-client-ca: the CA may sign certificates for other clients than the API server")
	}
	return nil
}

func run(o options) error {
	if err := o.validate(); err != nil {
		return err
	}
	if set, limit, err := memlimit.Set(os.DirFS("/"), o.memoryLimitRatio); err != nil {
		return fmt.Errorf("--memory-limit-ratio: %w", err)
	} else if set > 0 {
		setupLog.Info("Set the Go runtime's memory limit from the container's", "limit", set, "containerLimit", limit, "ratio", o.memoryLimitRatio)
	}
	kinds, err := kinds.LoadOrDefault(o.kindsConfig)
	if err != nil {
		return fmt.Errorf("--kinds-config: %w", err)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.DisableCompression = !o.apiCompression
	// Both servers serve the same certificate: in self mode the certificate
	// manager's, created with the manager's client below; with cert-manager
	// the files in --cert-dir.
	cert := &servingCert{}
	if o.certMode == "cert-manager" {
		if err := cert.watchFiles(o.certDir); err != nil {
			return err
		}
	}
	tlsOpts := []func(*tls.Config){certs.HardenTLS, cert.configureTLS}
	if !o.enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	httpServer, webhookServer, clientAuth, err := newWebhookServer(o, tlsOpts)
	if err != nil {
		return err
	}
	var draining atomic.Bool
	o.limits.Draining = draining.Load
	// The holder slot first: the manager binds the probe address, which
	// answers while the slot is waited for, and its caches select by the
	// holder.
	lease := pools.LeaseOptions{Namespace: o.namespace, Duration: o.leaseDuration, RenewDeadline: o.renewDeadline, RetryPeriod: o.retryPeriod}
	holder, slot := o.holder, (*pools.Slot)(nil)
	if o.slots {
		lease.Process, lease.Handoff, lease.Draining = o.holder, o.slotHandoff, draining.Load
		if slot, err = takeSlot(cfg, lease, o.slotWait, o.probeAddr); err != nil {
			return err
		}
		holder = slot.Holder
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsOptions(o, tlsOpts),
		HealthProbeBindAddress: o.probeAddr,
		PprofBindAddress:       o.pprofAddr,
		WebhookServer:          &gatedServer{Server: webhookServer, serving: cert.serving},
		Cache:                  app.CacheOptions(o.namespace),
		// Not before the pools are sealed (Registry) and the webhook
		// drained (the signal handler below).
		GracefulShutdownTimeout: ptr.To(45 * time.Second),
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := setupCerts(mgr, o, cert); err != nil {
		return err
	}
	if clientAuth != nil {
		if err := mgr.Add(clientAuth); err != nil {
			return fmt.Errorf("add client CA watcher: %w", err)
		}
	}
	if _, err := app.Setup(mgr, app.Options{
		Holder: holder, Namespace: o.namespace, ResyncInterval: o.resync, FullResyncInterval: fullResyncInterval(o.fullResync, o.resync), Limits: o.limits, History: o.history, Draining: draining.Load, Kinds: kinds,
		Lease: lease, Slot: slot,
	}); err != nil {
		return err
	}
	if o.leaderElect {
		setupLog.Info("--leader-elect is deprecated and ignored: every replica runs every controller")
	}
	setupLog.Info("Starting vmipam", "namespace", o.namespace, "holder", holder, "process", o.holder, "certMode", o.certMode,
		"webhookPort", o.webhookPort, "webhookClientAuth", clientAuth != nil)
	if err := mgr.Start(drainingSignalHandler(o.drain, o.connWait, &draining, httpServer)); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}

// takeSlot takes a holder slot (pools.TakeSlot) with a client of its own:
// the manager's reads from caches that do not run yet, and their label
// selectors need the holder. SIGTERM or SIGINT ends the wait. Meanwhile
// probeAddr answers /healthz (alive: waiting for the slot of a replica
// that is shutting down can take its drain) and not /readyz.
func takeSlot(cfg *rest.Config, lease pools.LeaseOptions, wait time.Duration, probeAddr string) (*pools.Slot, error) {
	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("create a client to take a holder slot: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if probeAddr != "" && probeAddr != "0" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "waiting for a holder slot", http.StatusServiceUnavailable)
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		ln, err := net.Listen("tcp", probeAddr)
		if err != nil {
			return nil, fmt.Errorf("--health-probe-bind-address %s: %w", probeAddr, err)
		}
		go func() { _ = srv.Serve(ln) }()
		// Closed before the manager binds the address again.
		defer func() { _ = srv.Close() }()
	}
	slot, err := pools.TakeSlot(ctrl.LoggerInto(ctx, setupLog), c, pools.SlotOptions{Lease: lease, Wait: wait})
	if err != nil {
		return nil, fmt.Errorf("--holder-slots: %w", err)
	}
	return slot, nil
}

// drainingSignalHandler returns a context that ends after the first
// SIGTERM or SIGINT and a drain: meanwhile the replica reports not ready
// and closes each connection after its response, so that the Service and
// the API server's kept-alive connections move to the other replicas
// before this one stops (the API server keeps reusing connections to a
// terminating webhook pod otherwise: kubernetes issue 127335). The drain
// lasts drain, then up to connWait more until no connection is left: the
// API server closes those it keeps idle itself, which is race-free. Those
// still open then are closed (srv.CloseIdle). A second signal ends the
// drain at once; a third exits.
func drainingSignalHandler(drain, connWait time.Duration, draining *atomic.Bool, srv drainable) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	c := make(chan os.Signal, 3)
	signal.Notify(c, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-c
		draining.Store(true)
		setupLog.Info("Draining before shutdown: not ready, closing connections", "for", drain, "thenWaitingForConnections", connWait)
		wait, stop := context.WithCancel(context.Background())
		go func() {
			select {
			case <-c:
				stop()
			case <-wait.Done():
			}
		}()
		select {
		case <-time.After(drain):
			wctx, wcancel := context.WithTimeout(wait, connWait)
			if !srv.WaitConnectionsClosed(wctx) {
				setupLog.Info("Closing the connections left open after the drain")
			}
			wcancel()
		case <-wait.Done():
		}
		stop()
		srv.CloseIdle()
		cancel()
		<-c
		os.Exit(1)
	}()
	return ctx
}

// drainable is the webhook server as the drain sees it.
type drainable interface {
	WaitConnectionsClosed(ctx context.Context) bool
	CloseIdle()
}

// gatedServer starts the webhook server only once a certificate can be
// served, so that no caller meets a TLS error while a starting replica
// has none yet.
type gatedServer struct {
	crwebhook.Server
	serving func() bool
}

// Start waits for the certificate, then serves.
func (g *gatedServer) Start(ctx context.Context) error {
	for !g.serving() {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
	return g.Server.Start(ctx)
}

// servingCert is where the webhook and the metrics servers take their
// certificate from, on each handshake: the self-managed certificate
// manager or a watcher of cert-manager's files. The source is set before
// the manager starts the servers.
type servingCert struct {
	source interface {
		GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
	}
	// watcher is the source with cert-manager, a runnable of the manager.
	watcher *certwatcher.CertWatcher
}

// serving reports whether there is a certificate to serve.
func (s *servingCert) serving() bool {
	if s.source == nil {
		return false
	}
	_, err := s.source.GetCertificate(&tls.ClientHelloInfo{})
	return err == nil
}

// configureTLS makes a server serve the certificate; it also keeps
// controller-runtime from starting a watcher or a self-signed certificate
// of its own.
func (s *servingCert) configureTLS(c *tls.Config) {
	c.GetCertificate = func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return s.source.GetCertificate(h) }
}

// watchFiles serves tls.crt and tls.key of dir, reloaded when they change.
// One watcher serves both servers, so they never serve different
// certificates.
func (s *servingCert) watchFiles(dir string) error {
	w, err := certwatcher.New(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	if err != nil {
		return fmt.Errorf("--cert-dir=%s: %w", dir, err)
	}
	s.source, s.watcher = w, w
	return nil
}

// newWebhookServer returns the webhook server (the Listener, and what
// the manager runs) and, with --webhook-client-ca, the verifier of its
// callers' certificates, to add to the manager.
func newWebhookServer(o options, tlsOpts []func(*tls.Config)) (*transport.Listener, crwebhook.Server, *clientauth.Verifier, error) {
	if o.clientCA == "" {
		s := transport.NewListener(o.webhookHost, o.webhookPort, tlsOpts)
		return s, s, nil, nil
	}
	v, err := clientauth.New(clientauth.Options{CAFile: o.clientCA, CommonName: o.clientCN})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--webhook-client-ca=%s: %w", o.clientCA, err)
	}
	s := transport.NewListener(o.webhookHost, o.webhookPort, append(append([]func(*tls.Config){}, tlsOpts...), v.ConfigureTLS))
	setupLog.Info("Webhook callers must present a client certificate", "ca", o.clientCA, "commonName", o.clientCN)
	return s, &clientAuthServer{Server: s, verifier: v}, v, nil
}

// clientAuthServer is the webhook server when callers must present a
// client certificate. The handshake checks new connections; every webhook
// is also wrapped to check each request, since a connection kept alive
// across a rotation of the CA file is not handshaken again.
type clientAuthServer struct {
	crwebhook.Server
	verifier *clientauth.Verifier
	started  atomic.Bool
}

func (s *clientAuthServer) Register(path string, hook http.Handler) {
	s.Server.Register(path, s.verifier.Handler(hook))
}

// StartedChecker stops dialling the server once it has answered: the
// check's handshake presents no client certificate, so each probe would
// add a refused handshake to the log. The listener lives as long as the
// manager, which stops if the server fails.
func (s *clientAuthServer) StartedChecker() healthz.Checker {
	check := s.Server.StartedChecker()
	return func(req *http.Request) error {
		if s.started.Load() {
			return nil
		}
		if err := check(req); err != nil {
			return err
		}
		s.started.Store(true)
		return nil
	}
}

func metricsOptions(o options, tlsOpts []func(*tls.Config)) metricsserver.Options {
	m := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.metricsSecure, TLSOpts: tlsOpts}
	if o.metricsSecure {
		m.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return m
}

// setupCerts adds, in self mode, the certificate manager to mgr: it keeps
// the CA and the serving certificate in a Secret and the CA in the webhook
// configurations, and readiness waits for both. With cert-manager the
// files are watched.
func setupCerts(mgr ctrl.Manager, o options, cert *servingCert) error {
	if w := cert.watcher; w != nil {
		if err := mgr.Add(w); err != nil {
			return fmt.Errorf("add certificate watcher: %w", err)
		}
		metrics.SetCertificateExpiry(func() time.Time {
			if c, _ := w.GetCertificate(nil); c != nil && c.Leaf != nil {
				return c.Leaf.NotAfter
			}
			return time.Time{}
		})
		return nil
	}
	var dns []string
	var ips []net.IP
	for _, s := range strings.Split(o.extraSANs, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if ip := net.ParseIP(s); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, s)
		}
	}
	var extra []string
	if o.metricsSecure && o.metricsAddr != "0" {
		// The metrics endpoint serves this certificate too.
		extra = append(extra, o.metricsService)
	}
	m, err := certs.New(certs.Options{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Namespace: o.namespace, SecretName: o.certSecret, ServiceName: o.serviceName, ExtraServices: extra,
		DNSNames: dns, IPAddresses: ips,
		MutatingWebhookConfigurations:   []string{o.mutatingConfig},
		ValidatingWebhookConfigurations: []string{o.validatingCfg},
	})
	if err != nil {
		return fmt.Errorf("set up certificates: %w", err)
	}
	cert.source = m
	if err := mgr.Add(m); err != nil {
		return fmt.Errorf("add certificate manager: %w", err)
	}
	if err := mgr.AddReadyzCheck("certificates", m.ReadyCheck); err != nil {
		return fmt.Errorf("add readyz check: %w", err)
	}
	metrics.SetCertificateExpiry(m.NotAfter)
	return nil
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// fullResyncInterval is --full-resync-interval as pools.Options takes it:
// at 0 or below every resync lists every object, as at or below
// --resync-interval, where pools would read 0 as its default of an hour.
func fullResyncInterval(full, resync time.Duration) time.Duration {
	if full <= 0 {
		return resync
	}
	return full
}
