// Command vmipam runs vmipam: the admission webhooks that give
// VirtualMachines their addresses, the controller that releases them into
// cooldown, and the pools' allocators, in one controller-runtime manager.
package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/vmipam/vmipam/certs"
	"github.com/vmipam/vmipam/internal/app"
	"github.com/vmipam/vmipam/metrics"
)

var setupLog = ctrl.Log.WithName("setup")

type options struct {
	metricsAddr, probeAddr        string
	pprofAddr                     string
	metricsSecure, enableHTTP2    bool
	leaderElect                   bool
	leaseDuration, renewDeadline  time.Duration
	retryPeriod                   time.Duration
	namespace, holder             string
	webhookHost                   string
	webhookPort                   int
	certMode, certDir, certSecret string
	serviceName                   string
	extraSANs                     string
	mutatingConfig, validatingCfg string
	resync                        time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "Address the metrics endpoint binds to; \"0\" disables it.")
	flag.BoolVar(&o.metricsSecure, "metrics-secure", true, "Serve metrics over HTTPS with authentication and authorization; false serves plain HTTP.")
	flag.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address /healthz and /readyz bind to.")
	flag.StringVar(&o.pprofAddr, "pprof-bind-address", "", "Address net/http/pprof binds to, for profiling (off when empty; bind it to localhost).")
	flag.BoolVar(&o.enableHTTP2, "enable-http2", false, "Serve HTTP/2 on the webhook and metrics servers (off by default: CVE-2023-44487 and CVE-2023-39325).")
	flag.BoolVar(&o.leaderElect, "leader-elect", false, "Run the address controller under leader election (the webhook serves on every replica).")
	flag.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "How long a replica that is not the leader waits, after the last renewal it saw, before it takes the lease.")
	flag.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "How long the leader keeps trying to renew before it gives up the lease and exits (so that a restart starts afresh). Raise it, with the lease duration, to ride out longer API server outages.")
	flag.DurationVar(&o.retryPeriod, "leader-elect-retry-period", 2*time.Second, "How often the leader renews, and the others try to take, the lease.")
	flag.StringVar(&o.namespace, "namespace", envOr("POD_NAMESPACE", "vmipam-system"), "vmipam's own namespace: its Secret, lease and events.")
	flag.StringVar(&o.holder, "holder", "vmipam", "This replica's stable name in the pools' claims.")
	flag.StringVar(&o.webhookHost, "webhook-host", "", "Address the webhook server binds to (all interfaces when empty).")
	flag.IntVar(&o.webhookPort, "webhook-port", 9443, "Port of the webhook server.")
	flag.StringVar(&o.certMode, "cert-mode", "self", "Serving certificates: \"self\" (vmipam keeps a CA and a certificate in a Secret and injects the CA) or \"cert-manager\" (files in --cert-dir, reloaded on change).")
	flag.StringVar(&o.certDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "With --cert-mode=cert-manager: the directory holding tls.crt and tls.key.")
	flag.StringVar(&o.certSecret, "cert-secret", "vmipam-webhook-tls", "With --cert-mode=self: the Secret holding the CA and the serving certificate.")
	flag.StringVar(&o.serviceName, "webhook-service", "vmipam-webhook", "The Service in front of the webhook: its DNS names go into the certificate.")
	flag.StringVar(&o.extraSANs, "webhook-extra-sans", "", "Comma-separated extra DNS names or IPs for the serving certificate (127.0.0.1 for a local run).")
	flag.StringVar(&o.mutatingConfig, "mutating-webhook-configuration", "vmipam-mutating", "With --cert-mode=self: the MutatingWebhookConfiguration whose CA bundle vmipam keeps.")
	flag.StringVar(&o.validatingCfg, "validating-webhook-configuration", "vmipam-validating", "With --cert-mode=self: the ValidatingWebhookConfiguration whose CA bundle vmipam keeps.")
	flag.DurationVar(&o.resync, "resync-interval", 5*time.Minute, "How often each pool is reconciled against every live object.")
	zapOpts := zap.Options{Development: false}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

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
		return errors.New("--leader-elect-lease-duration, --leader-elect-renew-deadline and --leader-elect-retry-period must be positive")
	case o.leaseDuration <= o.renewDeadline:
		return fmt.Errorf("--leader-elect-lease-duration (%s) must be longer than --leader-elect-renew-deadline (%s)", o.leaseDuration, o.renewDeadline)
	case float64(o.renewDeadline) <= 1.2*float64(o.retryPeriod):
		return fmt.Errorf("--leader-elect-renew-deadline (%s) must be longer than 1.2 × --leader-elect-retry-period (%s)", o.renewDeadline, o.retryPeriod)
	}
	return nil
}

func run(o options) error {
	if err := o.validate(); err != nil {
		return err
	}
	var tlsOpts []func(*tls.Config)
	if !o.enableHTTP2 {
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} })
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	// In self mode the certificate manager, created with the manager's
	// client below, serves the certificate from memory.
	var certMgr *certs.Manager
	webhookTLS := tlsOpts
	switch o.certMode {
	case "self":
		webhookTLS = append(webhookTLS, func(c *tls.Config) {
			c.GetCertificate = func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return certMgr.GetCertificate(h) }
		})
	case "cert-manager":
		// The webhook server reads --cert-dir and reloads on change.
	default:
		return fmt.Errorf("--cert-mode=%q: use \"self\" or \"cert-manager\"", o.certMode)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        app.Scheme,
		Metrics:                       metricsOptions(o, tlsOpts),
		HealthProbeBindAddress:        o.probeAddr,
		PprofBindAddress:              o.pprofAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "vmipam.vmipam.io",
		LeaderElectionNamespace:       o.namespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &o.leaseDuration,
		RenewDeadline:                 &o.renewDeadline,
		RetryPeriod:                   &o.retryPeriod,
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: o.webhookHost, Port: o.webhookPort, CertDir: o.certDir, TLSOpts: webhookTLS,
		}),
		// vmipam reads Secrets only in its own namespace, and RBAC grants
		// no more.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&corev1.Secret{}: {Namespaces: map[string]cache.Config{o.namespace: {}}},
		}},
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if o.certMode == "self" {
		if certMgr, err = setupCerts(mgr, o); err != nil {
			return err
		}
	}
	if _, err := app.Setup(mgr, app.Options{Holder: o.holder, ResyncInterval: o.resync}); err != nil {
		return err
	}
	setupLog.Info("Starting vmipam", "namespace", o.namespace, "holder", o.holder, "certMode", o.certMode, "webhookPort", o.webhookPort)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}

func metricsOptions(o options, tlsOpts []func(*tls.Config)) metricsserver.Options {
	m := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.metricsSecure, TLSOpts: tlsOpts}
	if o.metricsSecure {
		m.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return m
}

// setupCerts adds the self-managed certificate manager to mgr: it keeps the
// CA and the serving certificate in a Secret and the CA in the webhook
// configurations, and readiness waits for both.
func setupCerts(mgr ctrl.Manager, o options) (*certs.Manager, error) {
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
	m, err := certs.New(certs.Options{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Namespace: o.namespace, SecretName: o.certSecret, ServiceName: o.serviceName,
		DNSNames: dns, IPAddresses: ips,
		MutatingWebhookConfigurations:   []string{o.mutatingConfig},
		ValidatingWebhookConfigurations: []string{o.validatingCfg},
	})
	if err != nil {
		return nil, fmt.Errorf("set up certificates: %w", err)
	}
	if err := mgr.Add(m); err != nil {
		return nil, fmt.Errorf("add certificate manager: %w", err)
	}
	if err := mgr.AddReadyzCheck("certificates", m.ReadyCheck); err != nil {
		return nil, fmt.Errorf("add readyz check: %w", err)
	}
	metrics.SetCertificateExpiry(m.NotAfter)
	return m, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
