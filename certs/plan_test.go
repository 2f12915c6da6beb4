package certs

import (
	"crypto/x509"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/vmipam/vmipam/certs/pki"
)

const day = 24 * time.Hour

var planT0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func testPolicy() policy {
	o, err := Options{Client: fake.NewClientBuilder().Build(), Namespace: "ns", IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}.withDefaults()
	if err != nil {
		panic(err)
	}
	return o.policy()
}

// material is a Secret's worth of PEM, built for a test.
type material struct {
	ca, serving *pki.KeyPair
}

func newMaterial(t *testing.T, p policy, now time.Time) material {
	t.Helper()
	ca, err := pki.NewCA("test-ca", now, p.caValidity)
	if err != nil {
		t.Fatal(err)
	}
	return material{ca: ca, serving: issue(t, ca, p.names, now, p.certValidity)}
}

func (m material) data() map[string][]byte {
	return map[string][]byte{keyCACert: m.ca.CertPEM, keyCAKey: m.ca.KeyPEM, keyCert: m.serving.CertPEM, keyKey: m.serving.KeyPEM,
		KeyCABundle: m.ca.CertPEM}
}

func issue(t *testing.T, ca *pki.KeyPair, names pki.Names, now time.Time, validity time.Duration) *pki.KeyPair {
	t.Helper()
	kp, err := pki.NewServingCert(ca, names, now, validity)
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// TestPlan checks single decisions: what is kept, what is replaced and
// what the bundle holds.
func TestPlan(t *testing.T) {
	p := testPolicy()
	base := newMaterial(t, p, planT0)
	caDue := planT0.Add(p.caValidity * 2 / 3).Add(day)
	// The base CA near its renewal, with a fresh serving certificate.
	late := base
	late.serving = issue(t, base.ca, p.names, caDue.Add(-10*day), p.certValidity)
	junk := []byte("junk")
	otherKey := newMaterial(t, p, planT0).serving.KeyPEM
	wrongNames := issue(t, base.ca, pki.Names{DNSNames: []string{"elsewhere"}}, planT0, p.certValidity)
	stranger := newMaterial(t, p, planT0).ca.Cert

	type want struct {
		newCA, newServing bool
		// previous: the CAs kept next to the current one.
		previous []*x509.Certificate
		// servingByOld: the serving certificate is still the old CA's.
		servingByOld bool
		unchanged    bool
	}
	tests := map[string]struct {
		m            material
		now          time.Time
		data         map[string][]byte
		bundles      [][]byte
		servedIssuer *x509.Certificate
		want         want
	}{
		"no Secret": {now: planT0, data: nil,
			want: want{newCA: true, newServing: true}},
		"empty Secret": {now: planT0, data: map[string][]byte{},
			want: want{newCA: true, newServing: true}},
		"no Secret, stale bundles": {now: planT0, data: nil, bundles: [][]byte{pki.EncodeCertificates(stranger)},
			want: want{newCA: true, newServing: true, previous: []*x509.Certificate{stranger}}},
		"steady": {now: planT0.Add(30 * day), data: base.data(),
			want: want{unchanged: true}},
		"serving certificate due": {now: planT0.Add(61 * day), data: base.data(),
			want: want{newServing: true}},
		"serving certificate expired": {now: planT0.Add(91 * day), data: base.data(),
			want: want{newServing: true}},
		"garbled serving certificate": {now: planT0, data: with(base.data(), keyCert, junk),
			want: want{newServing: true}},
		"serving key of another certificate": {now: planT0, data: with(base.data(), keyKey, otherKey),
			want: want{newServing: true}},
		"serving certificate lacks a name": {now: planT0, data: with(with(base.data(), keyCert, wrongNames.CertPEM), keyKey, wrongNames.KeyPEM),
			want: want{newServing: true}},
		"CA due: new CA joins, serving certificate stays": {m: late, now: caDue, data: late.data(),
			want: want{newCA: true, previous: []*x509.Certificate{base.ca.Cert}, servingByOld: true}},
		"garbled CA key: its certificate stays trusted": {now: planT0, data: with(base.data(), keyCAKey, junk),
			want: want{newCA: true, previous: []*x509.Certificate{base.ca.Cert}, servingByOld: true}},
		"garbled CA, issuer known from memory": {now: planT0, data: with(with(base.data(), keyCAKey, junk), keyCACert, junk),
			servedIssuer: base.ca.Cert, want: want{newCA: true, previous: []*x509.Certificate{base.ca.Cert}, servingByOld: true}},
		"garbled CA, issuer known from the bundles": {now: planT0, data: with(with(base.data(), keyCAKey, junk), keyCACert, junk),
			bundles: [][]byte{base.ca.CertPEM}, want: want{newCA: true, previous: []*x509.Certificate{base.ca.Cert}, servingByOld: true}},
		"garbled CA, issuer unknown": {now: planT0, data: with(with(base.data(), keyCAKey, junk), keyCACert, junk),
			want: want{newCA: true, newServing: true}},
		"garbled everything, issuers known": {now: planT0,
			data:         map[string][]byte{keyCert: junk, keyKey: junk, keyCACert: junk, keyCAKey: junk},
			servedIssuer: base.ca.Cert, bundles: [][]byte{pki.EncodeCertificates(base.ca.Cert, stranger)},
			want: want{newCA: true, newServing: true, previous: []*x509.Certificate{base.ca.Cert, stranger}}},
		"CA expired": {now: planT0.Add(p.caValidity + day), data: base.data(), bundles: [][]byte{base.ca.CertPEM},
			want: want{newCA: true, newServing: true}},
		"previous CAs garbled": {now: planT0, data: with(base.data(), keyPreviousCA, junk),
			want: want{}},
		"previous CAs garbled, recovered from the bundles": {now: planT0, data: with(base.data(), keyPreviousCA, junk),
			bundles: [][]byte{pki.EncodeCertificates(base.ca.Cert, stranger)}, want: want{previous: []*x509.Certificate{stranger}}},
		"previous CA expired": {now: planT0.Add(30 * day), data: with(base.data(), keyPreviousCA, pki.EncodeCertificates(
			issue(t, base.ca, p.names, planT0, day).Cert)), want: want{}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			m := tt.m
			if m.ca == nil {
				m = base
			}
			d, err := plan(observed{now: tt.now, data: tt.data, bundles: tt.bundles, servedIssuer: tt.servedIssuer}, p)
			if err != nil {
				t.Fatal(err)
			}
			if got := !d.ca.Cert.Equal(m.ca.Cert); got != tt.want.newCA {
				t.Errorf("new CA: %v, want %v", got, tt.want.newCA)
			}
			if got := !d.serving.Cert.Equal(m.serving.Cert); got != tt.want.newServing {
				t.Errorf("new serving certificate: %v, want %v", got, tt.want.newServing)
			}
			if !slices.EqualFunc(d.previous, tt.want.previous, (*x509.Certificate).Equal) {
				t.Errorf("previous CAs %v, want %v", commonNames(d.previous), commonNames(tt.want.previous))
			}
			wantIssuer := d.ca.Cert
			if tt.want.servingByOld {
				wantIssuer = m.ca.Cert
			}
			if !d.issuer.Equal(wantIssuer) {
				t.Errorf("serving certificate issued by %s, want %s", d.issuer.Subject, wantIssuer.Subject)
			}
			checkDecision(t, d, p, tt.now)
			if _, _, changed := d.apply(tt.data, nil); changed == tt.want.unchanged {
				t.Errorf("Secret changed: %v, want %v", changed, !tt.want.unchanged)
			}
		})
	}
}

// TestPlanCARotation walks a CA rotation step by step: the new CA's
// certificate is served only once every bundle has trusted the new CA for
// switchDelay, and the old CA leaves dropDelay after the switch.
func TestPlanCARotation(t *testing.T) {
	p := testPolicy()
	base := newMaterial(t, p, planT0)
	now := planT0.Add(p.caValidity * 2 / 3).Add(day)
	base.serving = issue(t, base.ca, p.names, now.Add(-10*day), p.certValidity)
	data, ann := base.data(), map[string]string(nil)
	step := func(bundles [][]byte) *decision {
		t.Helper()
		d, err := plan(observed{now: now, data: data, annotations: ann, bundles: bundles}, p)
		if err != nil {
			t.Fatal(err)
		}
		checkDecision(t, d, p, now)
		data, ann, _ = d.apply(data, ann)
		return d
	}

	d := step([][]byte{base.ca.CertPEM, base.ca.CertPEM})
	newCA := d.ca.Cert
	if newCA.Equal(base.ca.Cert) || !d.issuer.Equal(base.ca.Cert) || !d.trustedAt.IsZero() {
		t.Fatalf("phase 1: CA %s, serving by %s, trusted at %s", d.ca.Cert.Subject, d.issuer.Subject, d.trustedAt)
	}
	if cas, _ := pki.ParseCertificates(d.bundle()); len(cas) != 2 || !cas[0].Equal(newCA) || !cas[1].Equal(base.ca.Cert) {
		t.Fatalf("phase 1: bundle of %d CAs, want the new then the old", len(cas))
	}
	injected := [][]byte{d.bundle(), d.bundle()}

	// One configuration still has the old bundle: no progress.
	now = now.Add(time.Hour)
	if d = step([][]byte{d.bundle(), base.ca.CertPEM}); !d.trustedAt.IsZero() || !d.issuer.Equal(base.ca.Cert) {
		t.Fatalf("moved on while a bundle lacks the new CA: trusted at %s, serving by %s", d.trustedAt, d.issuer.Subject)
	}
	// Every bundle trusts it: the clock starts.
	now = now.Add(time.Second)
	if d = step(injected); !d.trustedAt.Equal(now) || !d.issuer.Equal(base.ca.Cert) {
		t.Fatalf("trusted at %s, serving by %s", d.trustedAt, d.issuer.Subject)
	}
	trustedAt := now
	now = trustedAt.Add(p.switchDelay - time.Second)
	if d = step(injected); !d.issuer.Equal(base.ca.Cert) {
		t.Fatal("switched before switchDelay")
	}
	now = trustedAt.Add(p.switchDelay)
	if d = step(injected); !d.issuer.Equal(newCA) || !d.switchedAt.Equal(now) || len(d.previous) != 1 {
		t.Fatalf("phase 2: serving by %s, switched at %s, previous %v", d.issuer.Subject, d.switchedAt, commonNames(d.previous))
	}
	switchedAt := now
	now = switchedAt.Add(p.dropDelay - time.Second)
	if d = step(injected); len(d.previous) != 1 {
		t.Fatal("dropped the previous CA before dropDelay")
	}
	now = switchedAt.Add(p.dropDelay)
	if d = step(injected); d.previous != nil || len(ann) != 0 {
		t.Fatalf("phase 3: previous %v, annotations %v", commonNames(d.previous), ann)
	}
	if !d.ca.Cert.Equal(newCA) {
		t.Fatal("the CA changed again")
	}
}

// TestPlanSimulation runs two replicas over two years (CAs of 240 days), each making a pass
// at every step, and checks after every pass that what each serves is valid
// and trusted both by the bundles now and by the bundles as they were
// before the step (what a lagging API server may still use).
func TestPlanSimulation(t *testing.T) {
	for _, garble := range []bool{false, true} {
		name := "rotations"
		if garble {
			name = "rotations and garbled Secrets"
		}
		t.Run(name, func(t *testing.T) {
			p := testPolicy()
			p.caValidity, p.certValidity = 240*day, 60*day
			rng := rand.New(rand.NewPCG(1, 2))
			now := planT0
			var (
				data     map[string][]byte
				ann      map[string]string
				bundles  = [][]byte{nil, nil, nil}
				replicas [2]*served
				cas      = map[string]bool{}
				certs    = map[string]bool{}
			)
			steps := []time.Duration{30 * time.Second, time.Minute, 7 * time.Minute, 6 * time.Hour, day, 2 * day, 3 * day}
			for i := 0; now.Before(planT0.Add(2 * 365 * day)); i++ {
				now = now.Add(steps[rng.IntN(len(steps))])
				if garble && rng.IntN(200) == 0 {
					data = garbleSecret(rng, data)
				}
				view := clone(bundles)
				for r := range replicas {
					before := clone(bundles)
					d, err := plan(observed{now: now, data: data, annotations: ann, bundles: before, servedIssuer: issuerOf(replicas[r])}, p)
					if err != nil {
						t.Fatal(err)
					}
					checkDecision(t, d, p, now)
					data, ann, _ = d.apply(data, ann)
					if string(data[KeyCABundle]) != string(d.bundle()) {
						t.Fatalf("step %d: the Secret's %s is not the bundle injected", i, KeyCABundle)
					}
					for j := range bundles {
						bundles[j] = d.bundle()
					}
					if replicas[r] == nil || !replicas[r].cert.Leaf.Equal(d.serving.Cert) {
						if switchServed(replicas[r], d, before, bundles, now) {
							replicas[r] = &served{cert: d.serving.TLSCertificate(), issuer: d.issuer}
						}
					}
					cas[string(d.ca.Cert.Raw)], certs[string(d.serving.Cert.Raw)] = true, true
					for q, s := range replicas {
						if s == nil {
							continue
						}
						if err := pki.CheckValidity(s.cert.Leaf, now); err != nil {
							t.Fatalf("step %d at %s: replica %d serves %v", i, now, q, err)
						}
						if !allContain(bundles, s.issuer) {
							t.Fatalf("step %d at %s: replica %d serves a certificate of %s, not in the bundles", i, now, q, s.issuer.Subject)
						}
						if i > 0 && !garble && !allContain(view, s.issuer) {
							t.Fatalf("step %d at %s: replica %d serves a certificate of %s, not in the bundles an API server may still use", i, now, q, s.issuer.Subject)
						}
					}
				}
			}
			if !garble && (len(cas) < 4 || len(certs) < 15) {
				t.Errorf("%d CAs and %d serving certificates in 2 years, want at least 4 and 15", len(cas), len(certs))
			}
			t.Logf("%d CAs, %d serving certificates", len(cas), len(certs))
		})
	}
}

// checkDecision checks what every decision must satisfy: valid material,
// the serving certificate signed by a CA of the bundle.
func checkDecision(t *testing.T, d *decision, p policy, now time.Time) {
	t.Helper()
	if err := pki.CheckValidity(d.ca.Cert, now); err != nil || pki.NeedsRotation(d.ca.Cert, now, p.caRenewBefore) {
		t.Fatalf("CA unfit at %s: %v", now, err)
	}
	cas, err := pki.ParseCertificates(d.bundle())
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := pki.VerifyServing(d.serving.Cert, cas, p.names, now)
	if err != nil {
		t.Fatalf("serving certificate unfit at %s: %v", now, err)
	}
	if !issuer.Equal(d.issuer) {
		t.Fatalf("serving certificate issued by %s, decision says %s", issuer.Subject, d.issuer.Subject)
	}
}

func garbleSecret(rng *rand.Rand, data map[string][]byte) map[string][]byte {
	switch rng.IntN(5) {
	case 0:
		return nil
	case 4:
		if _, ok := data[keyPreviousCA]; ok {
			return with(data, keyPreviousCA, []byte("junk"))
		}
		return data
	case 1:
		return with(data, keyCert, []byte("junk"))
	case 2:
		return with(with(data, keyCACert, []byte("junk")), keyCAKey, nil)
	default:
		return map[string][]byte{keyCert: []byte("junk"), keyCACert: []byte("junk")}
	}
}

// with returns a copy of data with key set to value.
func with(data map[string][]byte, key string, value []byte) map[string][]byte {
	out := maps.Clone(data)
	if out == nil {
		out = map[string][]byte{}
	}
	out[key] = value
	return out
}

func clone(b [][]byte) [][]byte { return append([][]byte(nil), b...) }

func issuerOf(s *served) *x509.Certificate {
	if s == nil {
		return nil
	}
	return s.issuer
}

// TestPlanExtraServices: adding a Service to the certificate's names (the
// metrics Service, on an upgrade) re-issues the serving certificate at once
// from the same CA, which every configuration already trusts, and the new
// certificate serves both Services.
func TestPlanExtraServices(t *testing.T) {
	before := testPolicy()
	m := newMaterial(t, before, planT0)
	o, err := Options{Client: fake.NewClientBuilder().Build(), Namespace: "ns", ExtraServices: []string{"vmipam-metrics", DefaultServiceName}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	after := o.policy()
	want := []string{
		"vmipam-webhook", "vmipam-webhook.ns", "vmipam-webhook.ns.svc", "vmipam-webhook.ns.svc.cluster.local",
		"vmipam-metrics", "vmipam-metrics.ns", "vmipam-metrics.ns.svc", "vmipam-metrics.ns.svc.cluster.local",
	}
	if !slices.Equal(after.names.DNSNames, want) {
		t.Fatalf("names %v, want %v", after.names.DNSNames, want)
	}
	now := planT0.Add(day)
	d, err := plan(observed{now: now, data: m.data(), bundles: [][]byte{m.ca.CertPEM}}, after)
	if err != nil {
		t.Fatal(err)
	}
	checkDecision(t, d, after, now)
	if !d.ca.Cert.Equal(m.ca.Cert) || d.previous != nil {
		t.Errorf("the CA changed (%s) or previous CAs %v: a new name needs no new CA", d.ca.Cert.Subject, commonNames(d.previous))
	}
	if d.serving.Cert.Equal(m.serving.Cert) {
		t.Fatal("the serving certificate lacking the metrics Service's names was kept")
	}
	for _, n := range want {
		if err := d.serving.Cert.VerifyHostname(n); err != nil {
			t.Errorf("new serving certificate: %v", err)
		}
	}
	if d.serving.Cert.Subject.CommonName != "vmipam-webhook" {
		t.Errorf("common name %q, want the webhook Service's", d.serving.Cert.Subject.CommonName)
	}
}
