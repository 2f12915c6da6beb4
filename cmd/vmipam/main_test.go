package main

import (
	"bytes"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmipam/vmipam/certs"
	"github.com/vmipam/vmipam/certs/pki"
	"github.com/vmipam/vmipam/webhook/transport"
)

func TestValidateLeaseFlags(t *testing.T) {
	tests := []struct {
		name                string
		lease, renew, retry time.Duration
		wantErr             string
	}{
		{"defaults", 15 * time.Second, 10 * time.Second, 2 * time.Second, ""},
		{"long outages", 120 * time.Second, 90 * time.Second, 5 * time.Second, ""},
		{"lease not longer than renew", 10 * time.Second, 10 * time.Second, 2 * time.Second, "--lease-duration (10s) must be longer"},
		{"renew too close to retry", 15 * time.Second, 2 * time.Second, 2 * time.Second, "1.2 × --lease-retry-period"},
		{"zero", 0, 10 * time.Second, 2 * time.Second, "must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := validOptions()
			o.leaseDuration, o.renewDeadline, o.retryPeriod = tt.lease, tt.renew, tt.retry
			err := o.validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("validate() = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("validate() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// validOptions are the flags' defaults.
func validOptions() options {
	return options{
		leaseDuration: 15 * time.Second, renewDeadline: 10 * time.Second, retryPeriod: 2 * time.Second,
		holder: "vmipam-0", drain: 10 * time.Second, certMode: "self", clientCN: "kube-apiserver",
		limits: transport.Limits{
			MaxBodyBytes: transport.DefaultMaxBodyBytes, MaxInflightBytes: transport.DefaultMaxInflightBytes,
			MaxConcurrent: transport.DefaultMaxConcurrent, ReadTimeout: 10 * time.Second,
		},
	}
}

func TestValidateFlags(t *testing.T) {
	valid := validOptions()
	tests := map[string]struct {
		change  func(*options)
		wantErr string
	}{
		"self":                     {change: func(*options) {}},
		"cert-manager":             {change: func(o *options) { o.certMode = "cert-manager" }},
		"unknown mode":             {change: func(o *options) { o.certMode = "vault" }, wantErr: `--cert-mode="vault"`},
		"client CA":                {change: func(o *options) { o.clientCA = "/ca.crt" }},
		"client CA and CN":         {change: func(o *options) { o.clientCA, o.clientCN, o.clientCNSet = "/ca.crt", "apiserver", true }},
		"client CA, empty CN":      {change: func(o *options) { o.clientCA, o.clientCN, o.clientCNSet = "/ca.crt", "", true }, wantErr: "--webhook-client-cn must not be empty"},
		"client CN without the CA": {change: func(o *options) { o.clientCNSet = true }, wantErr: "--webhook-client-cn needs --webhook-client-ca"},
		"no holder":                {change: func(o *options) { o.holder = "" }, wantErr: "--holder is empty"},
		"negative drain":           {change: func(o *options) { o.drain = -time.Second }, wantErr: "--shutdown-drain"},
		"no body limit":            {change: func(o *options) { o.limits.MaxBodyBytes = 0 }, wantErr: "must be positive"},
		"in-flight below a body": {change: func(o *options) { o.limits.MaxInflightBytes = o.limits.MaxBodyBytes - 1 },
			wantErr: "--webhook-max-inflight-bytes (7340031) must be at least --webhook-max-body-bytes (7340032)"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			o := valid
			tt.change(&o)
			err := o.validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("validate() = %v, want nil", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("validate() = %v, want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

// TestServingCertFromFiles: with cert-manager, the webhook and the metrics
// servers both serve the files of --cert-dir through one watcher, hardened.
func TestServingCertFromFiles(t *testing.T) {
	now := time.Now()
	ca, err := pki.NewCA("test-ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := pki.NewServingCert(ca, pki.Names{DNSNames: []string{"vmipam-metrics.vmipam-system.svc"}}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, b := range map[string][]byte{"tls.crt": kp.CertPEM, "tls.key": kp.KeyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cert := &servingCert{}
	if err := cert.watchFiles(filepath.Join(dir, "missing")); err == nil || !strings.Contains(err.Error(), "--cert-dir=") {
		t.Errorf("watchFiles of a folder without files: %v, want an error naming --cert-dir", err)
	}
	if err := cert.watchFiles(dir); err != nil {
		t.Fatal(err)
	}
	o := options{metricsAddr: ":8443", metricsSecure: true}
	tlsOpts := []func(*tls.Config){certs.HardenTLS, cert.configureTLS}
	for name, opts := range map[string][]func(*tls.Config){"webhook": tlsOpts, "metrics": metricsOptions(o, tlsOpts).TLSOpts} {
		c := &tls.Config{}
		for _, f := range opts {
			f(c)
		}
		if c.MinVersion != tls.VersionTLS12 || len(c.CipherSuites) == 0 {
			t.Errorf("%s: not hardened (min version %x, %d suites)", name, c.MinVersion, len(c.CipherSuites))
		}
		got, err := c.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil || got == nil || !bytes.Equal(got.Certificate[0], kp.Cert.Raw) {
			t.Errorf("%s: serves %v (%v), want the file's certificate", name, got, err)
		}
	}
}

// TestFullResyncInterval: --full-resync-interval=0 means that every resync
// lists every object, as the flag's help says, not pools' default of an
// hour of resyncs from the caches.
func TestFullResyncInterval(t *testing.T) {
	for _, tt := range []struct {
		full, resync, want time.Duration
	}{
		{full: time.Hour, resync: 5 * time.Minute, want: time.Hour},
		{full: 0, resync: 5 * time.Minute, want: 5 * time.Minute},
		{full: -time.Second, resync: time.Minute, want: time.Minute},
		{full: time.Minute, resync: 5 * time.Minute, want: time.Minute},
	} {
		if got := fullResyncInterval(tt.full, tt.resync); got != tt.want {
			t.Errorf("fullResyncInterval(%s, %s) = %s; want %s", tt.full, tt.resync, got, tt.want)
		}
	}
}
