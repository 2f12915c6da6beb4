package certs

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/vmipam/vmipam/certs/pki"
)

// KeyCABundle is the key of the Secret that holds what the webhook
// configurations' caBundle holds: the current CA, then the previous ones
// during a rotation. It always contains the issuer of the certificate being
// served, which ca.crt alone does not while a new CA waits to be trusted, so
// it is what other clients of that certificate should trust: Prometheus,
// when the metrics server serves it.
const KeyCABundle = "ca-bundle.crt"

// What the Secret holds. tls.crt and tls.key are what a kubernetes.io/tls
// Secret must hold, so the Secret can also be mounted by hand.
const (
	keyCert       = "tls.crt"
	keyKey        = "tls.key"
	keyCACert     = "ca.crt"
	keyCAKey      = "ca.key"
	keyPreviousCA = "ca-previous.crt"
	// annTrustedAt records when a pass first saw every configuration's
	// bundle hold the new CA during a CA rotation.
	annTrustedAt = "vmipam.io/ca-trusted-at"
	// annSwitchedAt records when the serving certificate moved to the new
	// CA, while the previous CAs stay in the bundle.
	annSwitchedAt = "vmipam.io/ca-switched-at"
)

// policy is what plan needs to know of the Options.
type policy struct {
	names                      pki.Names
	caCommonName               string
	caValidity, certValidity   time.Duration
	caRenewBefore, renewBefore time.Duration
	// switchDelay is how long every configuration must have trusted a new
	// CA before its serving certificate is served: time for the API
	// servers' informers to pick up the bundle.
	switchDelay time.Duration
	// dropDelay is how long after the switch the previous CAs stay in the
	// bundle: time for every replica to re-read the Secret and stop
	// serving a certificate a previous CA signed.
	dropDelay time.Duration
}

// observed is what one pass gathered.
type observed struct {
	now time.Time
	// data and annotations of the Secret; nil if there is none.
	data        map[string][]byte
	annotations map[string]string
	// bundles holds the caBundle of every webhook of every existing
	// configuration.
	bundles [][]byte
	// servedIssuer is the CA of the certificate this replica serves, if
	// any: a CA to keep trusting if the Secret lost it.
	servedIssuer *x509.Certificate
}

// decision is the state the Secret should hold.
type decision struct {
	ca *pki.KeyPair
	// previous are the CAs kept in the bundle during a rotation or repair.
	previous []*x509.Certificate
	serving  *pki.KeyPair
	// issuer is the serving certificate's CA: ca.Cert or a previous one.
	issuer                *x509.Certificate
	trustedAt, switchedAt time.Time
	// events says what changed and why, for the log.
	events []event
}

type event struct {
	msg string
	kv  []any
}

// bundle is the caBundle to inject: the current CA, then the previous ones.
func (d *decision) bundle() []byte {
	return pki.EncodeCertificates(append([]*x509.Certificate{d.ca.Cert}, d.previous...)...)
}

// apply writes the decision into a Secret's data and annotations (either
// may be nil) and reports whether they changed.
func (d *decision) apply(data map[string][]byte, annotations map[string]string) (map[string][]byte, map[string]string, bool) {
	newData := maps.Clone(data)
	if newData == nil {
		newData = map[string][]byte{}
	}
	newData[keyCert] = d.serving.CertPEM
	newData[keyKey] = d.serving.KeyPEM
	newData[keyCACert] = d.ca.CertPEM
	newData[keyCAKey] = d.ca.KeyPEM
	newData[KeyCABundle] = d.bundle()
	delete(newData, keyPreviousCA)
	if len(d.previous) > 0 {
		newData[keyPreviousCA] = pki.EncodeCertificates(d.previous...)
	}
	newAnn := maps.Clone(annotations)
	if newAnn == nil {
		newAnn = map[string]string{}
	}
	for k, t := range map[string]time.Time{annTrustedAt: d.trustedAt, annSwitchedAt: d.switchedAt} {
		delete(newAnn, k)
		if !t.IsZero() {
			newAnn[k] = t.UTC().Format(time.RFC3339)
		}
	}
	changed := !maps.EqualFunc(data, newData, func(a, b []byte) bool { return string(a) == string(b) }) ||
		!maps.Equal(annotations, newAnn)
	return newData, newAnn, changed
}

// plan decides what the Secret should hold at o.now. It repairs what is
// unusable, renews what is due, and moves a CA rotation on by at most one
// step:
//
//  1. a new CA joins the bundle next to the previous ones, while the
//     serving certificate a previous CA signed is still served;
//  2. once every configuration has been seen trusting the new CA for
//     switchDelay, a serving certificate signed by the new CA replaces it;
//  3. dropDelay later, the previous CAs leave the bundle.
//
// The only error is a failure to generate keys.
func plan(o observed, p policy) (*decision, error) {
	d := &decision{
		trustedAt:  parseTime(o.annotations[annTrustedAt]),
		switchedAt: parseTime(o.annotations[annSwitchedAt]),
	}
	now := o.now
	valid := func(cs ...*x509.Certificate) []*x509.Certificate {
		var out []*x509.Certificate
		for _, c := range cs {
			if c != nil && pki.CheckValidity(c, now) == nil && !slices.ContainsFunc(out, c.Equal) {
				out = append(out, c)
			}
		}
		return out
	}
	// The CA certificate alone may survive a garbled key: keep trusting it.
	var oldCA *x509.Certificate
	if cs, err := pki.ParseCertificates(o.data[keyCACert]); err == nil {
		oldCA = cs[0]
	}
	if pem, ok := o.data[keyPreviousCA]; ok {
		cs, err := pki.ParseCertificates(pem)
		if err != nil {
			// The bundles hold what the Secret lost.
			cs = trustedCAs(o.bundles)
			d.event("Replacing unusable previous CAs by those of the bundles", "reason", err.Error(), "previousCAs", commonNames(cs))
		}
		d.previous = valid(cs...)
	}
	ca, caErr := pki.ParseCA(o.data[keyCACert], o.data[keyCAKey])
	if caErr == nil {
		caErr = pki.CheckValidity(ca.Cert, now)
	}
	serving, servingErr := pki.ParseKeyPair(o.data[keyCert], o.data[keyKey])

	caReason := ""
	switch {
	case o.data == nil:
		caReason = "no Secret"
	case caErr != nil:
		caReason = caErr.Error()
	case pki.NeedsRotation(ca.Cert, now, p.caRenewBefore):
		caReason = "due for renewal at " + pki.RenewalTime(ca.Cert, p.caRenewBefore).UTC().Format(time.RFC3339)
	}
	if caReason != "" {
		newCA, err := pki.NewCA(p.caCommonName, now, p.caValidity)
		if err != nil {
			return nil, err
		}
		// Keep trusting every CA that may have signed a certificate some
		// replica still serves: the Secret's, the previous ones, this
		// replica's, and those the configurations trust now (what other
		// replicas serve, if the Secret lost it).
		keep := append([]*x509.Certificate{oldCA, o.servedIssuer}, d.previous...)
		d.previous = valid(append(keep, trustedCAs(o.bundles)...)...)
		ca, d.trustedAt, d.switchedAt = newCA, time.Time{}, time.Time{}
		msg := "Rotating CA"
		if len(o.data[keyCACert]) == 0 {
			msg = "Creating CA"
		}
		d.event(msg, "reason", caReason, "ca", newCA.Cert.Subject.CommonName, "notAfter", newCA.Cert.NotAfter,
			"previousCAs", commonNames(d.previous))
	}
	d.previous = slices.DeleteFunc(d.previous, ca.Cert.Equal)
	d.ca = ca

	if len(o.data[keyCert]) == 0 {
		servingErr = errors.New("no serving certificate")
	}
	if servingErr == nil {
		d.issuer, servingErr = pki.VerifyServing(serving.Cert, append([]*x509.Certificate{ca.Cert}, d.previous...), p.names, now)
	}
	d.serving = serving
	switch {
	case servingErr != nil:
		// Nothing valid to protect: issue at once.
		if err := d.issue(p, now, servingErr.Error()); err != nil {
			return nil, err
		}
		if len(d.previous) > 0 {
			d.switchedAt = now
		}
		d.trustedAt = time.Time{}
	case d.issuer.Equal(ca.Cert):
		if pki.NeedsRotation(serving.Cert, now, p.renewBefore) {
			if err := d.issue(p, now, "due for renewal at "+pki.RenewalTime(serving.Cert, p.renewBefore).UTC().Format(time.RFC3339)); err != nil {
				return nil, err
			}
		}
	default:
		// Signed by a previous CA: a CA rotation waits for every
		// configuration to trust the new CA, long enough for the API
		// servers to have noticed.
		switch {
		case !allContain(o.bundles, ca.Cert):
			d.trustedAt = time.Time{}
		case d.trustedAt.IsZero() || d.trustedAt.After(now):
			d.trustedAt = now
			d.event("Every webhook configuration trusts the new CA", "ca", ca.Cert.Subject.CommonName)
		case !now.Before(d.trustedAt.Add(p.switchDelay)):
			if err := d.issue(p, now, "CA rotation: every webhook configuration trusts the new CA since "+d.trustedAt.UTC().Format(time.RFC3339)); err != nil {
				return nil, err
			}
			d.trustedAt, d.switchedAt = time.Time{}, now
		}
	}
	if len(d.previous) > 0 && d.issuer.Equal(ca.Cert) {
		switch {
		case d.switchedAt.IsZero() || d.switchedAt.After(now):
			d.switchedAt = now
		case !now.Before(d.switchedAt.Add(p.dropDelay)):
			d.event("Dropping previous CAs from the bundle", "previousCAs", commonNames(d.previous))
			d.previous = nil
		}
	}
	if len(d.previous) == 0 {
		d.previous, d.trustedAt, d.switchedAt = nil, time.Time{}, time.Time{}
	}
	return d, nil
}

// issue replaces the serving certificate with one signed by the current CA.
func (d *decision) issue(p policy, now time.Time, why string) error {
	kp, err := pki.NewServingCert(d.ca, p.names, now, p.certValidity)
	if err != nil {
		return err
	}
	d.serving, d.issuer = kp, d.ca.Cert
	d.event("Rotating serving certificate", "reason", why, "serial", kp.Cert.SerialNumber.Text(16),
		"ca", d.ca.Cert.Subject.CommonName, "notAfter", kp.Cert.NotAfter)
	return nil
}

func (d *decision) event(msg string, kv ...any) {
	d.events = append(d.events, event{msg: msg, kv: kv})
}

// allContain reports whether every bundle holds ca.
func allContain(bundles [][]byte, ca *x509.Certificate) bool {
	for _, b := range bundles {
		if !pki.BundleContains(b, ca) {
			return false
		}
	}
	return true
}

// trustedCAs returns the CA certificates in the bundles.
func trustedCAs(bundles [][]byte) []*x509.Certificate {
	var out []*x509.Certificate
	for _, b := range bundles {
		for rest := b; ; {
			var block *pem.Block
			if block, rest = pem.Decode(rest); block == nil {
				break
			}
			c, err := x509.ParseCertificate(block.Bytes)
			if err == nil && c.IsCA {
				out = append(out, c)
			}
		}
	}
	return out
}

func commonNames(certs []*x509.Certificate) []string {
	var out []string
	for _, c := range certs {
		out = append(out, c.Subject.CommonName)
	}
	return out
}

func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// describe names a certificate in errors.
func describe(c *x509.Certificate) string {
	return fmt.Sprintf("%s (serial %s)", c.Subject.CommonName, c.SerialNumber.Text(16))
}
