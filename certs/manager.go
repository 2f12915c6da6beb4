package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/vmipam/vmipam/certs/pki"
)

// maxAttempts bounds the retries of a write that lost a race to another
// replica (Conflict or AlreadyExists).
const maxAttempts = 5

var errNotServing = errors.New("no serving certificate yet")

// The right to update the two configurations vmipam owns, and no others, is
// granted by name in deploy/overlays/default. The Secret marker below is the
// only grant of Secrets to vmipam: the generated Role vmipam, in vmipam's
// namespace, bound by deploy/base/role_binding.yaml (and unbound by the
// cert-manager overlay, where no Secret is read).
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations;validatingwebhookconfigurations,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=vmipam-system,resources=secrets,verbs=get;list;watch;create;update;patch

// Manager keeps the webhook's serving certificate, the Secret that persists
// it and the caBundle of the named webhook configurations, and serves the
// certificate from memory through GetCertificate. Add it to the controller
// manager: it runs on every replica, leader or not, since every replica
// serves the webhook. It is safe for concurrent use.
type Manager struct {
	opts   Options
	policy policy
	secret client.ObjectKey

	// mu serialises passes.
	mu     sync.Mutex
	served atomic.Pointer[served]
	ready  atomic.Pointer[readiness]
}

// served is the certificate being served and the CA that signed it.
type served struct {
	cert   *tls.Certificate
	issuer *x509.Certificate
}

type readiness struct{ err error }

var (
	_ manager.Runnable               = (*Manager)(nil)
	_ manager.LeaderElectionRunnable = (*Manager)(nil)
)

// New returns a Manager; it serves nothing until its first pass (Start or
// Sync).
func New(opts Options) (*Manager, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("webhook certificate options: %w", err)
	}
	m := &Manager{
		opts:   opts,
		policy: opts.policy(),
		secret: client.ObjectKey{Namespace: opts.Namespace, Name: opts.SecretName},
	}
	m.ready.Store(&readiness{err: errNotServing})
	return m, nil
}

// NeedLeaderElection returns false: every replica serves the webhook, so
// every replica needs a certificate.
func (m *Manager) NeedLeaderElection() bool { return false }

// Start runs a pass at once, then one every resync interval (more often
// while not ready) until ctx ends. A failed pass is logged and retried; it
// never stops the manager.
func (m *Manager) Start(ctx context.Context) error {
	log := logf.FromContext(ctx)
	for {
		interval := m.opts.ResyncInterval
		if err := m.Sync(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			log.Error(err, "Syncing webhook certificates")
			interval = min(interval, retryInterval)
		} else if err := m.ReadyCheck(nil); err != nil {
			log.V(1).Info("Webhook certificates not ready", "reason", err.Error())
			interval = min(interval, retryInterval)
		}
		t := m.opts.Clock.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// Sync runs one pass: it reads the Secret and the webhook configurations,
// repairs, renews or moves a rotation on, writes the Secret if that changed
// it, injects the CA bundle where it is stale, and serves the Secret's
// certificate once every configuration trusts its CA. A write that loses a
// race to another replica is re-decided from what that replica wrote.
func (m *Manager) Sync(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var err error
	for range maxAttempts {
		if err = m.sync(ctx); !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			break
		}
	}
	return err
}

func (m *Manager) sync(ctx context.Context) error {
	log := logf.FromContext(ctx).WithValues("secret", klog.KRef(m.secret.Namespace, m.secret.Name))
	now := m.opts.Clock.Now()
	secret := &corev1.Secret{}
	if err := m.opts.APIReader.Get(ctx, m.secret, secret); apierrors.IsNotFound(err) {
		secret = nil
	} else if err != nil {
		return fmt.Errorf("read Secret %s: %w", m.secret, err)
	}
	configs, err := m.readConfigs(ctx)
	if err != nil {
		return err
	}

	obs := observed{now: now, bundles: allBundles(configs)}
	if secret != nil {
		obs.data, obs.annotations = secret.Data, secret.Annotations
		if obs.data == nil {
			obs.data = map[string][]byte{}
		}
	}
	if cur := m.served.Load(); cur != nil {
		obs.servedIssuer = cur.issuer
	}
	d, err := plan(obs, m.policy)
	if err != nil {
		return fmt.Errorf("plan webhook certificates: %w", err)
	}
	if err := m.writeSecret(ctx, secret, d); err != nil {
		return err
	}
	for _, e := range d.events {
		log.Info(e.msg, e.kv...)
	}

	var errs []error
	bundle := d.bundle()
	for _, c := range configs {
		if err := m.inject(ctx, log, c, bundle); err != nil {
			errs = append(errs, err)
		}
	}
	m.serve(log, d, obs.bundles, allBundles(configs), now)
	m.ready.Store(&readiness{err: m.readiness(configs)})
	return errors.Join(errs...)
}

// readConfigs reads the named webhook configurations; a missing one has a
// nil obj.
func (m *Manager) readConfigs(ctx context.Context) ([]*webhookConfig, error) {
	var configs []*webhookConfig
	for _, n := range m.opts.MutatingWebhookConfigurations {
		configs = append(configs, &webhookConfig{kind: kindMutating, name: n})
	}
	for _, n := range m.opts.ValidatingWebhookConfigurations {
		configs = append(configs, &webhookConfig{kind: kindValidating, name: n})
	}
	for _, c := range configs {
		obj := c.newObject()
		if err := m.opts.APIReader.Get(ctx, client.ObjectKey{Name: c.name}, obj); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("read %s %s: %w", c.kind, c.name, err)
		}
		c.obj = obj
	}
	return configs, nil
}

func allBundles(configs []*webhookConfig) [][]byte {
	var out [][]byte
	for _, c := range configs {
		if c.obj != nil {
			out = append(out, bundlesOf(c.obj)...)
		}
	}
	return out
}

// writeSecret creates or updates the Secret to hold d; the update is a
// compare-and-swap on the resourceVersion read.
func (m *Manager) writeSecret(ctx context.Context, secret *corev1.Secret, d *decision) error {
	if secret == nil {
		data, ann, _ := d.apply(nil, nil)
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: m.secret.Namespace, Name: m.secret.Name, Annotations: ann,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "vmipam"},
			},
			Type: corev1.SecretTypeTLS,
			Data: data,
		}
		if err := m.opts.Client.Create(ctx, secret); err != nil {
			return fmt.Errorf("create Secret %s: %w", m.secret, err)
		}
		return nil
	}
	data, ann, changed := d.apply(secret.Data, secret.Annotations)
	if !changed {
		return nil
	}
	secret = secret.DeepCopy()
	secret.Data, secret.Annotations = data, ann
	if err := m.opts.Client.Update(ctx, secret); err != nil {
		return fmt.Errorf("update Secret %s: %w", m.secret, err)
	}
	return nil
}

// inject sets every webhook's caBundle in c to bundle, re-reading and
// retrying on conflicts. c.obj keeps what the API server holds.
func (m *Manager) inject(ctx context.Context, log logr.Logger, c *webhookConfig, bundle []byte) error {
	for attempt := 1; c.obj != nil; attempt++ {
		obj := c.obj.DeepCopyObject().(client.Object)
		if !setBundle(obj, bundle) {
			return nil
		}
		log.Info("Injecting CA bundle", "kind", c.kind, "name", c.name, "cas", countCerts(bundle))
		err := m.opts.Client.Update(ctx, obj)
		if err == nil {
			c.obj = obj
			return nil
		}
		if !apierrors.IsConflict(err) || attempt == maxAttempts {
			return fmt.Errorf("inject CA bundle into %s %s: %w", c.kind, c.name, err)
		}
		fresh := c.newObject()
		if err := m.opts.APIReader.Get(ctx, client.ObjectKey{Name: c.name}, fresh); apierrors.IsNotFound(err) {
			c.obj = nil
		} else if err != nil {
			return fmt.Errorf("re-read %s %s: %w", c.kind, c.name, err)
		} else {
			c.obj = fresh
		}
	}
	return nil
}

func countCerts(bundle []byte) int {
	certs, _ := pki.ParseCertificates(bundle)
	return len(certs)
}

// serve switches to d's serving certificate unless that would serve a
// certificate whose CA the configurations did not trust before this pass
// while the current one is still good: then it waits for the next pass, so
// that the API servers have seen the new bundle.
func (m *Manager) serve(log logr.Logger, d *decision, before, after [][]byte, now time.Time) {
	cur := m.served.Load()
	if cur != nil && cur.cert.Leaf.Equal(d.serving.Cert) {
		return
	}
	if !switchServed(cur, d, before, after, now) {
		log.V(1).Info("Keeping the served certificate until every webhook configuration has trusted its successor's CA",
			"ca", d.issuer.Subject.CommonName)
		return
	}
	m.served.Store(&served{cert: d.serving.TLSCertificate(), issuer: d.issuer})
	log.Info("Serving certificate", "serial", d.serving.Cert.SerialNumber.Text(16),
		"ca", d.issuer.Subject.CommonName, "notAfter", d.serving.Cert.NotAfter)
}

// switchServed reports whether to serve d's certificate in place of cur:
// yes if its CA was in every bundle before this pass (the API servers have
// had time to see it), or if cur is gone, expired or no longer trusted
// after this pass's injections anyway.
func switchServed(cur *served, d *decision, before, after [][]byte, now time.Time) bool {
	return cur == nil || allContain(before, d.issuer) ||
		pki.CheckValidity(cur.cert.Leaf, now) != nil || !allContain(after, cur.issuer)
}

// readiness is nil once a certificate is served and every named
// configuration exists and trusts its CA.
func (m *Manager) readiness(configs []*webhookConfig) error {
	cur := m.served.Load()
	if cur == nil {
		return errNotServing
	}
	var errs []error
	for _, c := range configs {
		if c.obj == nil {
			errs = append(errs, fmt.Errorf("%s %s not found", c.kind, c.name))
			continue
		}
		if !allContain(bundlesOf(c.obj), cur.issuer) {
			errs = append(errs, fmt.Errorf("%s %s: caBundle lacks the CA %s of the served certificate", c.kind, c.name, describe(cur.issuer)))
		}
	}
	return errors.Join(errs...)
}

// GetCertificate returns the certificate being served; set it as the
// webhook server's tls.Config.GetCertificate. A rotation takes effect on
// the next handshake.
func (m *Manager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if cur := m.served.Load(); cur != nil {
		return cur.cert, nil
	}
	return nil, errNotServing
}

// ReadyCheck is a healthz.Checker: nil once a certificate is served and
// every named webhook configuration exists and has its CA in the caBundle
// of each of its webhooks, as of the last pass.
func (m *Manager) ReadyCheck(*http.Request) error {
	return m.ready.Load().err
}

// NotAfter returns when the served certificate expires, the zero time if
// none is served yet.
func (m *Manager) NotAfter() time.Time {
	if cur := m.served.Load(); cur != nil {
		return cur.cert.Leaf.NotAfter
	}
	return time.Time{}
}
