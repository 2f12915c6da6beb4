// Package clientauth runs the vmipam binary behind a kube-apiserver that
// presents a client certificate to webhooks, as deploy/README.md tells an
// administrator to configure it: an AdmissionConfiguration whose
// WebhookAdmissionConfiguration names a kubeconfig with a user entry named
// after the webhook Service's DNS name. vmipam runs with
// --webhook-client-ca and --webhook-client-cn and must serve the API
// server's admission calls, refuse every other caller during the TLS
// handshake, follow a rotation of the CA file, and serve on the webhook and
// metrics ports only TLS 1.2+ with AEAD suites and a certificate its CA
// bundle verifies.
package clientauth

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/vmipam/vmipam/certs"
	"github.com/vmipam/vmipam/certs/pki"
	"github.com/vmipam/vmipam/kinds"
	"github.com/vmipam/vmipam/kinds/manifests"
	"github.com/vmipam/vmipam/test/harness"
)

const (
	namespace = harness.Namespace
	service   = "vmipam-webhook"
	// apiServerCN is the common name of the API server's client
	// certificate, vmipam's default --webhook-client-cn.
	apiServerCN = "kube-apiserver"
)

var (
	root = filepath.Join("..", "..")

	cluster *harness.Cluster
	logs    = &harness.LogBuffer{}
	// clientCAFile is what --webhook-client-ca names; the rotation test
	// rewrites it.
	clientCAFile string
	// clientCA signs the API server's client certificate; otherCA signs
	// certificates vmipam must refuse.
	clientCA, otherCA *pki.KeyPair
)

// TestMain starts the control plane and vmipam once for the package. Every
// test needs them: under -short none runs.
func TestMain(m *testing.M) {
	os.Exit(harness.MainControlPlaneOnly(m, setup))
}

// setup starts the control plane and vmipam, and returns how to stop them.
func setup() (teardown func(failed bool) error, err error) {
	harness.SetTestLogger(testing.Verbose())
	dir, err := os.MkdirTemp("", "vmipam-clientauth-")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := start(ctx, dir)
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	cluster = c
	stop := func() error { return errors.Join(c.Stop(), os.RemoveAll(dir)) }
	p, err := c.StartVMIPAM(ctx, logs,
		"--webhook-client-ca", clientCAFile, "--webhook-client-cn", apiServerCN,
		// The metrics endpoint serves vmipam's certificate over HTTPS,
		// as deployed.
		"--metrics-secure=true")
	if err != nil {
		return nil, errors.Join(fmt.Errorf("%w\nvmipam's logs:\n%s", err, logs.String()), stop())
	}
	return func(failed bool) error {
		p.Kill()
		if failed {
			fmt.Fprintf(os.Stderr, "vmipam's logs:\n%s\n", logs.String())
		}
		return stop()
	}, nil
}

// start builds vmipam, creates the PKI and the admission configuration,
// starts a control plane that uses it, and installs the webhook Service and
// configurations vmipam serves.
func start(ctx context.Context, dir string) (*harness.Cluster, error) {
	return harness.StartWith(ctx, root, dir, harness.ClusterOptions{
		Configure: func(c *harness.Cluster, env *envtest.Environment) error {
			var err error
			if clientCA, err = pki.NewCA("webhook-client-ca", time.Now(), 24*time.Hour); err != nil {
				return err
			}
			if otherCA, err = pki.NewCA("other-ca", time.Now(), 24*time.Hour); err != nil {
				return err
			}
			clientCAFile = filepath.Join(dir, "client-ca.crt")
			if err := os.WriteFile(clientCAFile, clientCA.CertPEM, 0o600); err != nil {
				return err
			}
			admissionConfig, err := writeAdmissionConfig(dir, c.WebhookPort)
			if err != nil {
				return err
			}
			env.ControlPlane.GetAPIServer().Configure().Set("admission-control-config-file", admissionConfig)
			return nil
		},
		Install: func(ctx context.Context, c *harness.Cluster) error { return install(ctx, c.Client, c.WebhookPort) },
	})
}

// writeAdmissionConfig writes what an administrator gives kube-apiserver
// with --admission-control-config-file (deploy/README.md): both webhook
// admission plugins read a kubeconfig whose user entry, named after the
// Service's DNS name, holds the client certificate. The name carries the
// port because the test cannot serve on 443; for the Service's port 443
// the API server also looks the name up without it.
//
// A second entry, "*", holds a certificate vmipam refuses: the API server
// falls back to it for any webhook no other entry names, so admissions
// succeed only if it picked the entry named after the Service.
func writeAdmissionConfig(dir string, port int) (string, error) {
	write := func(name string, b []byte) (string, error) {
		p := filepath.Join(dir, name)
		return p, os.WriteFile(p, b, 0o600)
	}
	writePair := func(prefix string, kp *pki.KeyPair) (certFile, keyFile string, err error) {
		if certFile, err = write(prefix+".crt", kp.CertPEM); err != nil {
			return "", "", err
		}
		keyFile, err = write(prefix+".key", kp.KeyPEM)
		return certFile, keyFile, err
	}
	good, err := issueClient(clientCA, apiServerCN, time.Now(), 24*time.Hour)
	if err != nil {
		return "", err
	}
	decoy, err := issueClient(clientCA, "not-the-apiserver", time.Now(), 24*time.Hour)
	if err != nil {
		return "", err
	}
	goodCert, goodKey, err := writePair("apiserver-client", good)
	if err != nil {
		return "", err
	}
	decoyCert, decoyKey, err := writePair("decoy-client", decoy)
	if err != nil {
		return "", err
	}
	kubeconfig, err := write("webhook-kubeconfig.yaml", fmt.Appendf(nil, `apiVersion: v1
kind: Config
users:
- name: %s.%s.svc:%d
  user:
    client-certificate: %s
    client-key: %s
- name: "*"
  user:
    client-certificate: %s
    client-key: %s
`, service, namespace, port, goodCert, goodKey, decoyCert, decoyKey))
	if err != nil {
		return "", err
	}
	return write("admission-config.yaml", fmt.Appendf(nil, `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]s
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]s
`, kubeconfig))
}

// install creates vmipam's namespace, the webhook Service and the
// generated webhook configurations pointing at it, as the install does.
// The Service is an ExternalName for localhost, the one kind of Service
// the API server can reach here (no kube-proxy, no cluster network): the
// API server still calls the webhook as the Service, with its DNS name as
// the TLS server name and as the kubeconfig user it looks up.
func install(ctx context.Context, c client.Client, port int) error {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: service},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"},
	}
	if err := c.Create(ctx, svc); err != nil {
		return fmt.Errorf("create Service: %w", err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "webhook", "manifests.yaml"))
	if err != nil {
		return err
	}
	exclude := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
		Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{namespace},
	}}}
	p := int32(port)
	toService := func(cc *admissionregv1.WebhookClientConfig) {
		cc.Service.Name, cc.Service.Namespace, cc.Service.Port = service, namespace, &p
	}
	// The kinds' wiring, as vmipam manifests renders it.
	m := manifests.Mutating(kinds.Default(), manifests.Options{Namespace: namespace, Service: service})
	for i := range m.Webhooks {
		toService(&m.Webhooks[i].ClientConfig)
	}
	for _, o := range append(manifests.Policies(kinds.Default(), manifests.Options{Namespace: namespace, Service: service}), m) {
		if err := c.Create(ctx, o.(client.Object)); err != nil {
			return fmt.Errorf("create %s: %w", o.(client.Object).GetName(), err)
		}
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("parse webhook manifests: %w", err)
		}
		var obj client.Object
		switch doc["kind"] {
		case "ValidatingWebhookConfiguration":
			v := &admissionregv1.ValidatingWebhookConfiguration{}
			if err := convert(doc, v); err != nil {
				return err
			}
			v.Name = "vmipam-validating"
			for i := range v.Webhooks {
				toService(&v.Webhooks[i].ClientConfig)
				v.Webhooks[i].NamespaceSelector = exclude
			}
			obj = v
		default:
			continue
		}
		if err := c.Create(ctx, obj); err != nil {
			return fmt.Errorf("create %s: %w", obj.GetName(), err)
		}
	}
}

// issueClient issues a client-authentication certificate for cn.
func issueClient(ca *pki.KeyPair, cn string, notBefore time.Time, validity time.Duration) (*pki.KeyPair, error) {
	return issue(ca, cn, notBefore, validity, x509.ExtKeyUsageClientAuth)
}

func issue(ca *pki.KeyPair, cn string, notBefore time.Time, validity time.Duration, eku x509.ExtKeyUsage) (*pki.KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 64))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore.Add(-time.Minute), NotAfter: notBefore.Add(validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{eku},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pki.ParseKeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
}

// servingCAs returns the CAs vmipam's serving certificate chains to, as
// the Secret publishes them for other clients (certs.KeyCABundle).
func servingCAs(t *testing.T) *x509.CertPool {
	t.Helper()
	var s corev1.Secret
	if err := cluster.Client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: certs.DefaultSecretName}, &s); err != nil {
		t.Fatalf("read the certificate Secret: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.Data[certs.KeyCABundle]) {
		t.Fatalf("Secret %s has no CA in %s", certs.DefaultSecretName, certs.KeyCABundle)
	}
	return pool
}

func webhookAddr() string                     { return net.JoinHostPort("127.0.0.1", strconv.Itoa(cluster.WebhookPort)) }
func metricsAddr() string                     { return net.JoinHostPort("127.0.0.1", strconv.Itoa(cluster.MetricsPort)) }
func webhookHost() string                     { return service + "." + namespace + ".svc" }
func metricsHost() string                     { return "vmipam-metrics." + namespace + ".svc" }
func tlsCert(kp *pki.KeyPair) tls.Certificate { return *kp.TLSCertificate() }

func convert(doc map[string]any, out any) error {
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}
