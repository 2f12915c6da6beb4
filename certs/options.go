package certs

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/certs/pki"
)

const (
	// DefaultSecretName is the Secret that holds the CA and the serving
	// certificate.
	DefaultSecretName = "vmipam-webhook-tls"
	// DefaultServiceName is the Service in front of the webhook server.
	DefaultServiceName = "vmipam-webhook"
	// DefaultResyncInterval is how often a Manager re-reads the Secret and
	// the webhook configurations.
	DefaultResyncInterval = time.Minute
	// retryInterval bounds the wait before the next pass while the Manager
	// is not ready, so that a webhook configuration created after it
	// started is injected within seconds.
	retryInterval = 5 * time.Second
)

// Options configure a Manager.
type Options struct {
	// Client writes the Secret and the webhook configurations. Required.
	Client client.Client
	// APIReader reads them; it must read from the API server, not from an
	// informer cache (pass mgr.GetAPIReader()): a cache would start a
	// cluster-wide informer on Secrets, which the namespaced Role forbids,
	// and its stale versions would only turn into conflicts. Defaults to
	// Client.
	APIReader client.Reader
	// Namespace of the Secret and the Service. Required.
	Namespace string
	// SecretName defaults to DefaultSecretName.
	SecretName string
	// ServiceName defaults to DefaultServiceName.
	ServiceName string
	// ExtraServices name other Services in Namespace whose DNS names the
	// serving certificate covers too: the metrics Service, when the
	// metrics server serves this certificate, so that Prometheus can
	// verify it.
	ExtraServices []string
	// DNSNames are covered by the serving certificate in addition to the
	// Service's names.
	DNSNames []string
	// IPAddresses are covered by the serving certificate, e.g. 127.0.0.1
	// when the API server reaches the webhook by a URL on this host.
	IPAddresses []net.IP
	// MutatingWebhookConfigurations and ValidatingWebhookConfigurations
	// name the configurations whose every webhook's clientConfig.caBundle
	// the Manager owns and keeps current.
	MutatingWebhookConfigurations   []string
	ValidatingWebhookConfigurations []string
	// CAValidity defaults to pki.DefaultCAValidity.
	CAValidity time.Duration
	// CertValidity of the serving certificate defaults to
	// pki.DefaultCertValidity.
	CertValidity time.Duration
	// CARenewBefore and RenewBefore are how long before its NotAfter the
	// CA and the serving certificate are replaced; zero means when a third
	// of the lifetime is left.
	CARenewBefore, RenewBefore time.Duration
	// ResyncInterval is how often the Secret and the configurations are
	// re-read, defaulting to DefaultResyncInterval. It also paces a CA
	// rotation: the new CA's serving certificate is served one interval
	// after every configuration was seen trusting the new CA, and the old
	// CA leaves the bundles two intervals after that, when every replica
	// has re-read the Secret.
	ResyncInterval time.Duration
	// Clock defaults to the system clock.
	Clock clock.Clock
}

// withDefaults returns o with its defaults filled in, or an error if it
// cannot work.
func (o Options) withDefaults() (Options, error) {
	if o.Client == nil {
		return o, errors.New("no client")
	}
	if o.APIReader == nil {
		o.APIReader = o.Client
	}
	if o.Namespace == "" {
		return o, errors.New("no namespace")
	}
	if o.SecretName == "" {
		o.SecretName = DefaultSecretName
	}
	if o.ServiceName == "" {
		o.ServiceName = DefaultServiceName
	}
	if o.CAValidity == 0 {
		o.CAValidity = pki.DefaultCAValidity
	}
	if o.CertValidity == 0 {
		o.CertValidity = pki.DefaultCertValidity
	}
	if o.ResyncInterval == 0 {
		o.ResyncInterval = DefaultResyncInterval
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	switch {
	case o.CAValidity < 0 || o.CertValidity < 0 || o.ResyncInterval < 0:
		return o, errors.New("negative validity or resync interval")
	case o.CARenewBefore < 0 || o.CARenewBefore >= o.CAValidity:
		return o, fmt.Errorf("CA renew-before %s is not within the CA validity %s", o.CARenewBefore, o.CAValidity)
	case o.RenewBefore < 0 || o.RenewBefore >= o.CertValidity:
		return o, fmt.Errorf("renew-before %s is not within the certificate validity %s", o.RenewBefore, o.CertValidity)
	}
	return o, nil
}

// names returns the names the serving certificate must cover: the
// Service's, the extra Services', then the extra names.
func (o Options) names() pki.Names {
	var dns []string
	for _, svc := range append([]string{o.ServiceName}, o.ExtraServices...) {
		for _, n := range serviceNames(svc, o.Namespace) {
			if !slices.Contains(dns, n) {
				dns = append(dns, n)
			}
		}
	}
	for _, n := range o.DNSNames {
		if !slices.Contains(dns, n) {
			dns = append(dns, n)
		}
	}
	var ips []net.IP
	for _, ip := range o.IPAddresses {
		if !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}
	return pki.Names{DNSNames: dns, IPAddresses: ips}
}

// serviceNames are the DNS names by which a Service is reached in the
// cluster; clients connect with the .svc one as server name.
func serviceNames(svc, ns string) []string {
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local"}
}

// policy is what plan needs of the options.
func (o Options) policy() policy {
	return policy{
		names:         o.names(),
		caCommonName:  o.ServiceName + "-ca",
		caValidity:    o.CAValidity,
		certValidity:  o.CertValidity,
		caRenewBefore: o.CARenewBefore,
		renewBefore:   o.RenewBefore,
		switchDelay:   o.ResyncInterval,
		dropDelay:     2 * o.ResyncInterval,
	}
}
