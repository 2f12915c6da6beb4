package clientauth

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/certs/pki"
	"github.com/vmipam/vmipam/test/harness"
)

// validatePath is a webhook path vmipam serves; any request reaching it
// gets an HTTP answer.
const validatePath = "/validate-vmipam-io-v1alpha1-ippool"

// TestAdmission: the API server's admission calls, made with the client
// certificate of the kubeconfig entry named after the Service, are served:
// the IPPool passes the validating webhook and the VirtualMachine gets its
// address from the mutating one.
func TestAdmission(t *testing.T) {
	ctx := t.Context()
	pool := &vmipamv1.IPPool{}
	if err := json.Unmarshal([]byte(`{"metadata": {"name": "clientauth"}, "spec": {
		"default": true, "ranges": [{"cidr": "10.210.0.0/24"}], "cooldown": "1m", "pendingTTL": "1m"}}`), pool); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Client.Create(ctx, pool); err != nil {
		t.Fatalf("create IPPool through the validating webhook: %v", err)
	}
	createVM(t)
}

// createVM creates a VirtualMachine and checks that the mutating webhook
// gave it an address.
func createVM(t *testing.T) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, "a VirtualMachine with an address", func() error {
		vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "vm-"}}
		if err := cluster.Client.Create(t.Context(), vm); err != nil {
			return err // 503 while the new pool recovers
		}
		if len(vm.Spec.Addresses) != 1 || !strings.HasPrefix(vm.Spec.Addresses[0], "10.210.0.") {
			return fmt.Errorf("created without an address: %v", vm.Spec.Addresses)
		}
		return nil
	})
}

// TestDirectCallers posts to the webhook with TLS 1.2 and 1.3, trusting
// vmipam's certificate, and each certificate but the API server's is
// refused during the handshake: the client sees a TLS alert, and vmipam
// logs the failed handshake with the reason, so no HTTP was served.
func TestDirectCallers(t *testing.T) {
	now := time.Now()
	mustIssue := func(ca *pki.KeyPair, cn string, notBefore time.Time, eku x509.ExtKeyUsage) *tls.Certificate {
		kp, err := issue(ca, cn, notBefore, time.Hour, eku)
		if err != nil {
			t.Fatal(err)
		}
		c := tlsCert(kp)
		return &c
	}
	apiServer := mustIssue(clientCA, apiServerCN, now, x509.ExtKeyUsageClientAuth)
	tests := map[string]struct {
		cert *tls.Certificate
		// reason is in vmipam's log line of the refused handshake; empty
		// for a caller that is served.
		reason string
	}{
		"the API server's certificate": {cert: apiServer},
		"no certificate":               {reason: "didn't provide a certificate"},
		"wrong common name": {cert: mustIssue(clientCA, "system:admin", now, x509.ExtKeyUsageClientAuth),
			reason: `common name "system:admin", want "kube-apiserver"`},
		"another CA": {cert: mustIssue(otherCA, apiServerCN, now, x509.ExtKeyUsageClientAuth),
			reason: "certificate signed by unknown authority"},
		"expired": {cert: mustIssue(clientCA, apiServerCN, now.Add(-2*time.Hour), x509.ExtKeyUsageClientAuth),
			reason: "certificate has expired or is not yet valid"},
		"not for client authentication": {cert: mustIssue(clientCA, apiServerCN, now, x509.ExtKeyUsageServerAuth),
			reason: "incompatible key usage"},
	}
	for name, tc := range tests {
		for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
			t.Run(name+" "+tls.VersionName(v), func(t *testing.T) {
				before := strings.Count(logs.String(), tc.reason)
				code, err := post(t, v, tc.cert)
				if tc.reason == "" {
					if err != nil {
						t.Fatalf("refused: %v", err)
					}
					t.Logf("served: HTTP %d", code)
					return
				}
				if err == nil {
					t.Fatalf("served: HTTP %d", code)
				}
				if !strings.Contains(err.Error(), "remote error: tls:") {
					t.Errorf("refused with %v, want a TLS alert", err)
				}
				harness.Eventually(t, 10*time.Second, "vmipam to log the refused handshake", func() error {
					if strings.Count(logs.String(), tc.reason) <= before {
						return fmt.Errorf("no new log line with %q", tc.reason)
					}
					return nil
				})
			})
		}
	}
}

// post sends a request to the webhook with TLS version v, presenting cert
// (none if nil), and returns the HTTP status.
func post(t *testing.T, v uint16, cert *tls.Certificate) (int, error) {
	t.Helper()
	cfg := &tls.Config{RootCAs: servingCAs(t), ServerName: webhookHost(), MinVersion: v, MaxVersion: v}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+webhookAddr()+validatePath, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// TestTLS: both of vmipam's servers speak TLS 1.2 with AEAD ECDHE suites
// and TLS 1.3 only, and serve a certificate that the Secret's CA bundle
// verifies for their Service's name.
func TestTLS(t *testing.T) {
	apiServer, err := issueClient(clientCA, apiServerCN, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	servers := map[string]struct {
		addr, host string
		certs      []tls.Certificate
	}{
		"webhook": {addr: webhookAddr(), host: webhookHost(), certs: []tls.Certificate{tlsCert(apiServer)}},
		"metrics": {addr: metricsAddr(), host: metricsHost()},
	}
	cases := map[string]struct {
		min, max uint16
		suites   []uint16
		ok       bool
	}{
		"TLS 1.3":                      {min: tls.VersionTLS13, max: tls.VersionTLS13, ok: true},
		"TLS 1.2 AES-GCM":              {min: tls.VersionTLS12, max: tls.VersionTLS12, suites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}, ok: true},
		"TLS 1.2 ChaCha20-Poly1305":    {min: tls.VersionTLS12, max: tls.VersionTLS12, suites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256}, ok: true},
		"TLS 1.2 CBC":                  {min: tls.VersionTLS12, max: tls.VersionTLS12, suites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256}},
		"TLS 1.2 RSA key exchange":     {min: tls.VersionTLS12, max: tls.VersionTLS12, suites: []uint16{tls.TLS_RSA_WITH_AES_128_GCM_SHA256}},
		"TLS 1.1":                      {min: tls.VersionTLS11, max: tls.VersionTLS11},
		"TLS 1.0":                      {min: tls.VersionTLS10, max: tls.VersionTLS10},
		"TLS 1.2 ECDHE 3DES, insecure": {min: tls.VersionTLS12, max: tls.VersionTLS12, suites: []uint16{tls.TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA}},
	}
	for sname, s := range servers {
		for cname, tc := range cases {
			t.Run(sname+" "+cname, func(t *testing.T) {
				cfg := &tls.Config{
					RootCAs: servingCAs(t), ServerName: s.host, Certificates: s.certs,
					MinVersion: tc.min, MaxVersion: tc.max, CipherSuites: tc.suites,
				}
				state, err := handshake(s.addr, cfg)
				if tc.ok && err != nil {
					t.Fatalf("refused: %v", err)
				}
				if !tc.ok && err == nil {
					t.Fatalf("accepted %s %s", tls.VersionName(state.Version), tls.CipherSuiteName(state.CipherSuite))
				}
				if tc.ok && !slices.Contains(state.PeerCertificates[0].DNSNames, s.host) {
					t.Errorf("served a certificate for %v", state.PeerCertificates[0].DNSNames)
				}
			})
		}
		// The verification above is real: another name fails it.
		t.Run(sname+" another server name", func(t *testing.T) {
			_, err := handshake(s.addr, &tls.Config{RootCAs: servingCAs(t), ServerName: "elsewhere.example", Certificates: s.certs})
			var hostErr x509.HostnameError
			if !errors.As(err, &hostErr) {
				t.Fatalf("handshake for elsewhere.example: %v, want a host name error", err)
			}
		})
	}
}

// handshake dials addr and completes a TLS handshake, then reads the
// server's first answer so that a refusal of a TLS 1.3 client certificate
// shows too.
func handshake(addr string, cfg *tls.Config) (tls.ConnectionState, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return tls.ConnectionState{}, err
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return tls.ConnectionState{}, err
	}
	return conn.ConnectionState(), nil
}

// TestClientCARotation rewrites the file --webhook-client-ca names, as an
// update of a mounted ConfigMap does: vmipam follows it without a restart.
// When the API server's CA leaves the file, the API server's own calls
// are refused and creates fail closed; when it is back, they succeed.
func TestClientCARotation(t *testing.T) {
	newCA, err := pki.NewCA("rotated-client-ca", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := issueClient(newCA, apiServerCN, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rotated := tlsCert(kp)
	oldKP, err := issueClient(clientCA, apiServerCN, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	old := tlsCert(oldKP)
	t.Cleanup(func() { replace(t, clientCA.CertPEM) })

	expect := func(what string, cert *tls.Certificate, served bool) {
		t.Helper()
		harness.Eventually(t, 40*time.Second, what, func() error {
			_, err := post(t, tls.VersionTLS13, cert)
			switch {
			case served && err != nil:
				return fmt.Errorf("refused: %w", err)
			case !served && err == nil:
				return errors.New("served")
			}
			return nil
		})
	}
	if _, err := post(t, tls.VersionTLS13, &rotated); err == nil {
		t.Fatal("a certificate of the new CA is served before the rotation")
	}

	replace(t, append(append([]byte(nil), newCA.CertPEM...), clientCA.CertPEM...))
	expect("a certificate of the new CA to be served", &rotated, true)
	expect("a certificate of the old CA to be served still", &old, true)
	createVM(t)

	replace(t, newCA.CertPEM)
	expect("a certificate of the old CA to be refused", &old, false)
	before := strings.Count(logs.String(), "Refusing a request")
	harness.Eventually(t, 40*time.Second, "the API server's calls to be refused", func() error {
		vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "vm-"}}
		err := cluster.Client.Create(t.Context(), vm)
		if err == nil {
			return errors.New("created, want a failed webhook call")
		}
		var st apierrors.APIStatus
		if !errors.As(err, &st) || !strings.Contains(st.Status().Message, "failed calling webhook") {
			return fmt.Errorf("create: %w, want a failed webhook call", err)
		}
		return nil
	})
	// The API server's calls on connections kept alive from before are
	// refused per request, new ones at the handshake.
	t.Logf("requests refused on kept-alive connections: %d", strings.Count(logs.String(), "Refusing a request")-before)

	replace(t, clientCA.CertPEM)
	expect("a certificate of the old CA to be served again", &old, true)
	createVM(t)
}

// replace swaps the client CA file's content atomically, as the kubelet
// does for a mounted ConfigMap.
func replace(t *testing.T, b []byte) {
	t.Helper()
	tmp := clientCAFile + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, clientCAFile); err != nil {
		t.Fatal(err)
	}
}
