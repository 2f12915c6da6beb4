package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/certs/pki"
	"github.com/vmipam/vmipam/test/harness"
)

// fixture is one Manager with its own namespace, webhook configurations and
// webhook server: the API server calls the server, over TLS with the
// Manager's certificate, on every ConfigMap created in the namespace.
type fixture struct {
	ns                   string
	clk                  *clocktesting.FakeClock
	mgr                  *Manager
	mutating, validating string
	url                  string

	// calls counts admission requests answered; handshakes counts TLS
	// handshakes by the serial of the certificate served.
	calls      atomic.Int64
	mu         sync.Mutex
	handshakes map[string]int
}

type fixtureOptions struct {
	start time.Time
	opts  func(*Options)
	// noValidating leaves the ValidatingWebhookConfiguration to the test.
	noValidating bool
}

func newFixture(t *testing.T, fo fixtureOptions) *fixture {
	t.Helper()
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "certs-"}}
	if err := k8sClient.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	f := &fixture{
		ns: ns.Name, clk: clocktesting.NewFakeClock(fo.start),
		mutating: ns.Name + "-mutating", validating: ns.Name + "-validating",
		handshakes: map[string]int{},
	}
	opts := Options{
		Client: k8sClient, Namespace: f.ns, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		MutatingWebhookConfigurations:   []string{f.mutating},
		ValidatingWebhookConfigurations: []string{f.validating},
		Clock:                           f.clk,
	}
	if fo.opts != nil {
		fo.opts(&opts)
	}
	var err error
	if f.mgr, err = New(opts); err != nil {
		t.Fatalf("new Manager: %v", err)
	}
	f.serve(t)
	f.createMutating(t)
	if !fo.noValidating {
		f.createValidating(t)
	}
	return f
}

// serve starts the webhook server. Keep-alives are off so that every
// admission request makes a new handshake and meets the certificate
// served at that moment, not one from a pooled connection.
func (f *fixture) serve(t *testing.T) {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		review := &admissionv1.AdmissionReview{}
		if err := json.NewDecoder(r.Body).Decode(review); err != nil || review.Request == nil {
			http.Error(w, "bad review", http.StatusBadRequest)
			return
		}
		f.calls.Add(1)
		review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		review.Request = nil
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(review)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		// Handshakes fail on purpose before the first pass.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	srv.SetKeepAlivesEnabled(false)
	tlsConfig := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, err := f.mgr.GetCertificate(hello)
			if err == nil {
				f.mu.Lock()
				f.handshakes[c.Leaf.SerialNumber.Text(16)]++
				f.mu.Unlock()
			}
			return c, err
		},
	}
	go func() { _ = srv.Serve(tls.NewListener(ln, tlsConfig)) }()
	t.Cleanup(func() { _ = srv.Close() })
	f.url = "https://" + ln.Addr().String()
}

func (f *fixture) webhook(name, path string) (admissionregistrationv1.WebhookClientConfig, []admissionregistrationv1.RuleWithOperations, *metav1.LabelSelector) {
	return admissionregistrationv1.WebhookClientConfig{URL: ptr.To(f.url + path)},
		[]admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
		}},
		&metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": f.ns}}
}

// createMutating creates a configuration of two webhooks, so that "every
// webhook's caBundle" is exercised.
func (f *fixture) createMutating(t *testing.T) {
	t.Helper()
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: f.mutating}}
	for _, name := range []string{"first", "second"} {
		cc, rules, sel := f.webhook(name, "/mutate/"+name)
		cfg.Webhooks = append(cfg.Webhooks, admissionregistrationv1.MutatingWebhook{
			Name: name + ".certs.vmipam.io", ClientConfig: cc, Rules: rules, NamespaceSelector: sel,
			FailurePolicy: ptr.To(admissionregistrationv1.Fail), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: ptr.To[int32](10),
		})
	}
	if err := k8sClient.Create(t.Context(), cfg); err != nil {
		t.Fatalf("create MutatingWebhookConfiguration: %v", err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), cfg) })
}

func (f *fixture) createValidating(t *testing.T) {
	t.Helper()
	cc, rules, sel := f.webhook("validate", "/validate")
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: f.validating},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "validate.certs.vmipam.io", ClientConfig: cc, Rules: rules, NamespaceSelector: sel,
			FailurePolicy: ptr.To(admissionregistrationv1.Fail), SideEffects: ptr.To(admissionregistrationv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: ptr.To[int32](10),
		}},
	}
	if err := k8sClient.Create(t.Context(), cfg); err != nil {
		t.Fatalf("create ValidatingWebhookConfiguration: %v", err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), cfg) })
}

// sync runs one pass and checks the invariant: the bundle of every webhook
// of every configuration holds the issuer of the certificate served.
func (f *fixture) sync(t *testing.T) {
	t.Helper()
	if err := f.mgr.Sync(t.Context()); err != nil {
		t.Fatalf("Sync: %v", err)
	}
	f.checkInvariant(t)
}

func (f *fixture) checkInvariant(t *testing.T) {
	t.Helper()
	leaf := f.served(t)
	for kind, bundles := range f.bundles(t) {
		for i, b := range bundles {
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(b) {
				t.Fatalf("%s webhook %d: caBundle holds no certificate", kind, i)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{
				Roots: pool, DNSName: "127.0.0.1", CurrentTime: f.clk.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			}); err != nil {
				t.Fatalf("%s webhook %d: caBundle does not trust the served certificate (issuer %s): %v", kind, i, leaf.Issuer, err)
			}
		}
	}
}

// bundles returns the caBundle of every webhook, by configuration kind.
func (f *fixture) bundles(t *testing.T) map[string][][]byte {
	t.Helper()
	m := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := k8sClient.Get(t.Context(), client.ObjectKey{Name: f.mutating}, m); err != nil {
		t.Fatal(err)
	}
	out := map[string][][]byte{kindMutating: bundlesOf(m)}
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := k8sClient.Get(t.Context(), client.ObjectKey{Name: f.validating}, v); err == nil {
		out[kindValidating] = bundlesOf(v)
	}
	return out
}

// bundleCAs returns the CAs in the caBundle, checking that every webhook
// has the same one.
func (f *fixture) bundleCAs(t *testing.T) []*x509.Certificate {
	t.Helper()
	var first []byte
	for kind, bundles := range f.bundles(t) {
		for _, b := range bundles {
			if first == nil {
				first = b
			} else if string(b) != string(first) {
				t.Fatalf("%s: webhooks have different caBundles", kind)
			}
		}
	}
	cas, err := pki.ParseCertificates(first)
	if err != nil {
		t.Fatalf("caBundle: %v", err)
	}
	return cas
}

func (f *fixture) served(t *testing.T) *x509.Certificate {
	t.Helper()
	c, err := f.mgr.GetCertificate(nil)
	if err != nil {
		t.Fatalf("GetCertificate: %v", err)
	}
	return c.Leaf
}

func (f *fixture) secret(t *testing.T) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := k8sClient.Get(t.Context(), client.ObjectKey{Namespace: f.ns, Name: DefaultSecretName}, s); err != nil {
		t.Fatalf("get Secret: %v", err)
	}
	return s
}

// secretCA returns the Secret's current CA certificate.
func (f *fixture) secretCA(t *testing.T) *x509.Certificate {
	t.Helper()
	cas, err := pki.ParseCertificates(f.secret(t).Data[keyCACert])
	if err != nil {
		t.Fatalf("Secret ca.crt: %v", err)
	}
	return cas[0]
}

// checkSecret checks that the Secret holds valid material for the names,
// and, with served, that it is what is served.
func (f *fixture) checkSecret(t *testing.T, served bool) {
	t.Helper()
	s := f.secret(t)
	if s.Type != corev1.SecretTypeTLS {
		t.Errorf("Secret type %s", s.Type)
	}
	ca, err := pki.ParseCA(s.Data[keyCACert], s.Data[keyCAKey])
	if err != nil {
		t.Fatalf("Secret CA: %v", err)
	}
	kp, err := pki.ParseKeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatalf("Secret serving pair: %v", err)
	}
	cas := []*x509.Certificate{ca.Cert}
	if prev, ok := s.Data[keyPreviousCA]; ok {
		p, err := pki.ParseCertificates(prev)
		if err != nil {
			t.Fatalf("Secret previous CAs: %v", err)
		}
		cas = append(cas, p...)
	}
	if _, err := pki.VerifyServing(kp.Cert, cas, f.mgr.policy.names, f.clk.Now()); err != nil {
		t.Fatalf("Secret serving certificate: %v", err)
	}
	if served && !kp.Cert.Equal(f.served(t)) {
		t.Errorf("served certificate %s is not the Secret's %s", describe(f.served(t)), describe(kp.Cert))
	}
}

// create creates a ConfigMap through both configurations' webhooks.
func (f *fixture) create(ctx context.Context) error {
	return k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, GenerateName: "cm-"}})
}

// admitted waits until a ConfigMap create goes through: the API server
// needs a moment to see a newly injected bundle.
func (f *fixture) admitted(t *testing.T) {
	t.Helper()
	before := f.calls.Load()
	harness.Eventually(t, 20*time.Second, "a ConfigMap create to be admitted", func() error { return f.create(t.Context()) })
	if f.calls.Load() < before+3 {
		t.Fatalf("%d admission requests, want the 3 webhooks called", f.calls.Load()-before)
	}
}

func (f *fixture) handshakesWith(serial string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.handshakes[serial]
}

// realNow is the API server's time, which judges the certificates: fake
// clocks in these tests start in the past so that every certificate issued
// while they advance is valid now.
func realNow() time.Time { return time.Now().Truncate(time.Second) }

// TestFirstStart runs the Manager as the controller manager would: the
// first pass creates the Secret and injects the bundle, readiness waits for
// a configuration created late, and the API server trusts the certificate.
func TestFirstStart(t *testing.T) {
	harness.NeedControlPlane(t)
	start := realNow()
	f := newFixture(t, fixtureOptions{start: start, noValidating: true})
	if err := f.mgr.ReadyCheck(nil); err == nil {
		t.Fatal("ready before the first pass")
	}
	if f.mgr.NeedLeaderElection() {
		t.Fatal("needs leader election")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- f.mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Start returned %v", err)
		}
	})

	harness.Eventually(t, 10*time.Second, "readiness to name the missing configuration", func() error {
		err := f.mgr.ReadyCheck(nil)
		switch {
		case err == nil:
			return errors.New("ready with a configuration missing")
		case !strings.Contains(err.Error(), f.validating+" not found"):
			return fmt.Errorf("ReadyCheck: %w", err)
		}
		return nil
	})
	f.checkSecret(t, true)
	f.createValidating(t)
	// Not ready: the loop waits the short retry interval, not a resync.
	harness.Eventually(t, 10*time.Second, "the loop to wait", func() error {
		if !f.clk.HasWaiters() {
			return errors.New("no timer")
		}
		return nil
	})
	f.clk.Step(retryInterval)
	harness.Eventually(t, 10*time.Second, "readiness", func() error { return f.mgr.ReadyCheck(nil) })
	f.checkInvariant(t)
	f.checkSecret(t, true)

	s := f.secret(t)
	if _, ok := s.Data[keyPreviousCA]; ok {
		t.Error("a previous CA on first start")
	}
	if cas := f.bundleCAs(t); len(cas) != 1 || !cas[0].Equal(f.secretCA(t)) {
		t.Errorf("caBundle of %d CAs, want the Secret's CA alone", len(cas))
	}
	leaf := f.served(t)
	if !f.mgr.NotAfter().Equal(leaf.NotAfter) || !leaf.NotAfter.Equal(start.Add(pki.DefaultCertValidity)) {
		t.Errorf("NotAfter %s, served certificate's %s", f.mgr.NotAfter(), leaf.NotAfter)
	}
	wantDNS := []string{"vmipam-webhook", "vmipam-webhook." + f.ns, "vmipam-webhook." + f.ns + ".svc", "vmipam-webhook." + f.ns + ".svc.cluster.local"}
	if fmt.Sprint(leaf.DNSNames) != fmt.Sprint(wantDNS) || len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("names %v %v", leaf.DNSNames, leaf.IPAddresses)
	}
	f.admitted(t)

	// A steady pass writes nothing.
	rv := f.secret(t).ResourceVersion
	f.sync(t)
	if got := f.secret(t).ResourceVersion; got != rv {
		t.Errorf("a steady pass rewrote the Secret (%s to %s)", rv, got)
	}
}

// TestRotationUnderLoad rotates the serving certificate, then the CA, while
// ConfigMaps are created without pause through three webhooks: not one
// create may fail.
func TestRotationUnderLoad(t *testing.T) {
	harness.NeedControlPlane(t)
	now := realNow()
	// Certificates of 90 days under a CA of 111 days, from 80 days ago: the
	// serving certificate is due 61 days in, the CA 75 days in, and every
	// certificate issued on the way is valid today.
	f := newFixture(t, fixtureOptions{start: now.Add(-80 * day), opts: func(o *Options) {
		o.CertValidity, o.CAValidity = 90*day, 111*day
	}})
	f.sync(t)
	f.checkSecret(t, true)
	f.admitted(t)
	first, caA := f.served(t), f.secretCA(t)

	var ok, failed atomic.Int64
	var errMu sync.Mutex
	var errs []error
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := f.create(ctx); err == nil {
					ok.Add(1)
				} else if ctx.Err() == nil {
					failed.Add(1)
					errMu.Lock()
					errs = append(errs, err)
					errMu.Unlock()
				}
			}
		})
	}
	stop := func() {
		cancel()
		wg.Wait()
	}
	defer stop()
	// settle lets creates run against the state a pass left, long enough
	// for the API server to see any bundle it injected.
	settle := func(what string) {
		t.Helper()
		before, start := ok.Load(), time.Now()
		harness.Eventually(t, 30*time.Second, "creates after "+what, func() error {
			if n := ok.Load() - before; n < 30 || time.Since(start) < time.Second {
				return fmt.Errorf("%d creates", n)
			}
			return nil
		})
	}
	settle("the first pass")

	// 1. The serving certificate is due; the CA is not.
	f.clk.SetTime(now.Add(-19 * day))
	f.sync(t)
	f.checkSecret(t, true)
	second := f.served(t)
	if second.Equal(first) || !f.secretCA(t).Equal(caA) || second.Issuer.String() != caA.Subject.String() {
		t.Fatalf("serving rotation: served %s by %s", describe(second), second.Issuer)
	}
	settle("the serving certificate's rotation")

	// 2. The CA is due: the new CA joins the bundle, the old certificate
	// is still served.
	f.clk.SetTime(now.Add(-5 * day))
	f.sync(t)
	caB := f.secretCA(t)
	if caB.Equal(caA) || !f.served(t).Equal(second) {
		t.Fatal("CA rotation did not start, or switched the served certificate at once")
	}
	if cas := f.bundleCAs(t); len(cas) != 2 || !cas[0].Equal(caB) || !cas[1].Equal(caA) {
		t.Fatalf("caBundle of %d CAs, want the new then the old", len(cas))
	}
	settle("the new CA's injection")

	// 3. A pass sees every configuration trust the new CA; the next, a
	// resync later, switches.
	f.clk.Step(time.Minute)
	f.sync(t)
	if f.secret(t).Annotations[annTrustedAt] == "" || !f.served(t).Equal(second) {
		t.Fatal("not waiting for the switch")
	}
	settle("a pass seeing the new CA everywhere")
	f.clk.Step(time.Minute)
	f.sync(t)
	f.checkSecret(t, true)
	third := f.served(t)
	if third.Equal(second) || third.Issuer.String() != caB.Subject.String() {
		t.Fatalf("served %s by %s after the switch, want one by the new CA", describe(third), third.Issuer)
	}
	if len(f.bundleCAs(t)) != 2 {
		t.Fatal("dropped the old CA at the switch")
	}
	settle("the switch to the new CA")

	// 4. Two resyncs later the old CA leaves the bundle.
	f.clk.Step(time.Minute)
	f.sync(t)
	if len(f.bundleCAs(t)) != 2 {
		t.Fatal("dropped the old CA one resync after the switch")
	}
	f.clk.Step(time.Minute)
	f.sync(t)
	if cas := f.bundleCAs(t); len(cas) != 1 || !cas[0].Equal(caB) {
		t.Fatalf("caBundle of %d CAs after the drop, want the new CA alone", len(cas))
	}
	if s := f.secret(t); s.Data[keyPreviousCA] != nil || len(s.Annotations) != 0 {
		t.Fatalf("rotation state left in the Secret: %v", s.Annotations)
	}
	settle("the old CA's removal")

	stop()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d creates failed during the rotations, first: %v", n, n+ok.Load(), errs[0])
	}
	for _, c := range []*x509.Certificate{first, second, third} {
		if f.handshakesWith(c.SerialNumber.Text(16)) == 0 {
			t.Errorf("no handshake with %s", describe(c))
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t.Logf("%d creates, %d admission requests, handshakes by serial %v", ok.Load(), f.calls.Load(), f.handshakes)
}

// TestRecovery breaks the Secret, or lets it expire, and checks that the
// Manager serves and injects valid material again and admissions go
// through.
func TestRecovery(t *testing.T) {
	harness.NeedControlPlane(t)
	now := realNow()
	junk := []byte("junk")
	tests := map[string]struct {
		start time.Time
		opts  func(*Options)
		// breakIt damages the Secret's data, or moves the clock.
		breakIt func(f *fixture, data map[string][]byte)
		// admittedBefore: the first material is valid today.
		admittedBefore bool
		newCA          bool
	}{
		"garbled serving certificate": {start: now, admittedBefore: true,
			breakIt: func(_ *fixture, d map[string][]byte) { d[corev1.TLSCertKey] = junk }},
		"serving key of another certificate": {start: now, admittedBefore: true,
			breakIt: func(f *fixture, d map[string][]byte) {
				ca, _ := pki.NewCA("other", f.clk.Now(), day)
				d[corev1.TLSPrivateKeyKey] = ca.KeyPEM
			}},
		"serving certificate for other names": {start: now, admittedBefore: true,
			breakIt: func(f *fixture, d map[string][]byte) {
				ca, _ := pki.ParseCA(d[keyCACert], d[keyCAKey])
				kp, _ := pki.NewServingCert(ca, pki.Names{DNSNames: []string{"elsewhere"}}, f.clk.Now(), day)
				d[corev1.TLSCertKey], d[corev1.TLSPrivateKeyKey] = kp.CertPEM, kp.KeyPEM
			}},
		"garbled CA": {start: now, admittedBefore: true, newCA: true,
			breakIt: func(_ *fixture, d map[string][]byte) { d[keyCACert], d[keyCAKey] = junk, junk }},
		"garbled everything": {start: now, admittedBefore: true, newCA: true,
			breakIt: func(_ *fixture, d map[string][]byte) {
				for k := range d {
					d[k] = junk
				}
			}},
		"expired serving certificate": {start: now.Add(-100 * day),
			opts:    func(o *Options) { o.CertValidity = 90 * day },
			breakIt: func(f *fixture, _ map[string][]byte) { f.clk.SetTime(now.Add(-5 * day)) }},
		"expired CA": {start: now.Add(-200 * day), newCA: true,
			opts:    func(o *Options) { o.CertValidity, o.CAValidity = 90*day, 150*day },
			breakIt: func(f *fixture, _ map[string][]byte) { f.clk.SetTime(now.Add(-5 * day)) }},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, fixtureOptions{start: tt.start, opts: tt.opts})
			f.sync(t)
			if tt.admittedBefore {
				f.admitted(t)
			}
			before, caBefore := f.served(t), f.secretCA(t)

			s := f.secret(t)
			tt.breakIt(f, s.Data)
			if err := k8sClient.Update(t.Context(), s); err != nil {
				t.Fatalf("break the Secret: %v", err)
			}
			// Repair, then let any rotation it started run its course.
			for i := 0; ; i++ {
				f.sync(t)
				// A certificate of a new CA waits a pass to be served.
				f.checkSecret(t, false)
				if tt.admittedBefore || i > 0 {
					f.admitted(t)
				}
				if _, rotating := f.secret(t).Data[keyPreviousCA]; !rotating {
					break
				}
				if i == 10 {
					t.Fatal("rotation does not end")
				}
				f.clk.Step(time.Minute)
			}
			f.checkSecret(t, true)
			f.admitted(t)
			if err := f.mgr.ReadyCheck(nil); err != nil {
				t.Fatalf("not ready: %v", err)
			}
			if f.served(t).Equal(before) {
				t.Error("still serving the broken or expired certificate")
			}
			if gotNewCA := !f.secretCA(t).Equal(caBefore); gotNewCA != tt.newCA {
				t.Errorf("new CA: %v, want %v", gotNewCA, tt.newCA)
			}
		})
	}
}

// TestReinject re-applies a configuration without its caBundle, as a
// re-applied manifest would: the next pass puts the bundle back.
func TestReinject(t *testing.T) {
	harness.NeedControlPlane(t)
	f := newFixture(t, fixtureOptions{start: realNow()})
	f.sync(t)
	f.admitted(t)
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := k8sClient.Get(t.Context(), client.ObjectKey{Name: f.validating}, v); err != nil {
		t.Fatal(err)
	}
	v.Webhooks[0].ClientConfig.CABundle = nil
	if err := k8sClient.Update(t.Context(), v); err != nil {
		t.Fatal(err)
	}
	f.sync(t)
	f.checkSecret(t, true)
	if err := f.mgr.ReadyCheck(nil); err != nil {
		t.Fatalf("not ready: %v", err)
	}
	f.admitted(t)
}

// TestReplicas runs two Managers on one Secret, their passes racing: the
// API server lets one write win, the other adopts what it wrote, and both
// end up serving the same certificate, trusted by the bundle.
func TestReplicas(t *testing.T) {
	harness.NeedControlPlane(t)
	now := realNow()
	f := newFixture(t, fixtureOptions{start: now.Add(-70 * day)})
	other, err := New(f.mgr.opts)
	if err != nil {
		t.Fatal(err)
	}
	race := func(what string) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, m := range []*Manager{f.mgr, other} {
			wg.Go(func() { errs[i] = m.Sync(t.Context()) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		f.checkInvariant(t)
		f.checkSecret(t, true)
		a, _ := f.mgr.GetCertificate(nil)
		b, _ := other.GetCertificate(nil)
		if !a.Leaf.Equal(b.Leaf) {
			t.Fatalf("%s: replicas serve %s and %s", what, describe(a.Leaf), describe(b.Leaf))
		}
	}
	race("first start")
	ca, first := f.secretCA(t), f.served(t)
	if cas := f.bundleCAs(t); len(cas) != 1 || !cas[0].Equal(ca) {
		t.Fatalf("caBundle of %d CAs after the first start, want one", len(cas))
	}
	f.admitted(t)
	f.clk.SetTime(now.Add(-5 * day))
	race("serving certificate renewal")
	if f.served(t).Equal(first) || !f.secretCA(t).Equal(ca) {
		t.Fatal("no renewal, or a new CA")
	}
	f.admitted(t)
}
