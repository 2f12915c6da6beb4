// Package binary runs the vmipam binary as users do, against a real
// kube-apiserver and etcd: self-managed certificates injected into webhook
// configurations that point at it, the API server calling it over TLS,
// probes, metrics and a graceful stop.
package binary

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
)

func TestBinary(t *testing.T) {
	harness.NeedControlPlane(t)
	ctx := t.Context()
	cl, err := harness.Start(ctx, filepath.Join("..", ".."), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Stop() })
	var logs bytes.Buffer
	p, err := cl.StartVMIPAM(ctx, &logs)
	if err != nil {
		t.Fatalf("%v\nlogs:\n%s", err, logs.String())
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("vmipam's logs:\n%s", logs.String())
		}
	})
	c := cl.Client
	// Ready means the CA is in the webhook configurations and the
	// certificate persisted.
	var vwc admissionregv1.ValidatingWebhookConfiguration
	if err := c.Get(ctx, client.ObjectKey{Name: "vmipam-validating"}, &vwc); err != nil || len(vwc.Webhooks[0].ClientConfig.CABundle) == 0 {
		t.Fatalf("caBundle of vmipam-validating not injected: %v", err)
	}
	var secret corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: harness.Namespace, Name: "vmipam-webhook-tls"}, &secret); err != nil {
		t.Fatalf("certificate Secret: %v", err)
	}

	// The API server calls the binary's webhooks over TLS with that CA.
	pool := fixture.Pool("bin", fixture.WithDefault(), fixture.WithCIDRs("10.200.0.0/24"))
	if err := c.Create(ctx, pool); err != nil {
		t.Fatalf("create IPPool (through the validating webhook): %v", err)
	}
	vm := &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "vm-"}}
	harness.Eventually(t, 30*time.Second, "a VirtualMachine with an address", func() error {
		vm.Name = ""
		if err := c.Create(ctx, vm); err != nil {
			return err // 503 while the new pool recovers
		}
		if len(vm.Spec.Addresses) != 1 || !strings.HasPrefix(vm.Spec.Addresses[0], "10.200.0.") {
			return fmt.Errorf("created without an address: %v", vm.Spec.Addresses)
		}
		return nil
	})
	harness.Eventually(t, 30*time.Second, "the metrics to show the allocation", func() error {
		body, err := cl.Metrics()
		if err != nil {
			return err
		}
		for _, want := range []string{
			`vmipam_pool_addresses{pool="bin",state="allocated"} 1`,
			`vmipam_admission_duration_seconds_count{outcome="allowed",webhook="virtualmachine-mutating"}`,
			`vmipam_certificate_expiry_timestamp_seconds `,
		} {
			if !strings.Contains(body, want) {
				return fmt.Errorf("no %q in /metrics", want)
			}
		}
		if strings.Contains(body, "vmipam_certificate_expiry_timestamp_seconds 0\n") {
			return errors.New("certificate expiry unknown")
		}
		return nil
	})
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}

	// The drain waits for the clients to close the connections they keep
	// idle (the API server does after 90s; this client after 1s), and
	// closes from its side only those still open after
	// --shutdown-connection-wait: a close from the server's side races with
	// a request the client may be sending on the connection.
	for _, tt := range []struct {
		name string
		// idle is when the client closes its idle connection; 0 never.
		idle         time.Duration
		wait         time.Duration
		closedBySelf bool
	}{
		{"the client closes its idle connection", time.Second, 20 * time.Second, false},
		{"the client keeps it", 0, 3 * time.Second, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			p, err := cl.StartVMIPAM(ctx, &logs, "--shutdown-drain=500ms", "--shutdown-connection-wait="+tt.wait.String())
			if err != nil {
				t.Fatalf("%v\nlogs:\n%s", err, logs.String())
			}
			defer p.Kill()
			conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", cl.WebhookPort), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only the connection matters here
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			// One request, answered, leaves the connection idle.
			if _, err := io.WriteString(conn, "POST /mutate-vmipam-io-v1alpha1-virtualmachine HTTP/1.1\r\nHost: vmipam\r\n"+
				"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.Close {
				t.Fatalf("the server closed the connection after a response before the drain")
			}
			// The server's close shows as the end of the stream.
			serverClosed := make(chan struct{})
			go func() {
				_, _ = br.ReadByte()
				close(serverClosed)
			}()
			began := time.Now()
			stopped := make(chan error, 1)
			go func() { stopped <- p.Stop(60 * time.Second) }()
			byServer := false
			if tt.idle > 0 {
				select {
				case <-serverClosed:
					byServer = true
				case <-time.After(tt.idle):
					_ = conn.Close()
				}
			} else {
				<-serverClosed
				byServer = true
			}
			if err := <-stopped; err != nil {
				t.Fatalf("SIGTERM: %v\nlogs:\n%s", err, logs.String())
			}
			t.Logf("stopped %s after SIGTERM; the server closed the idle connection: %v", time.Since(began).Round(100*time.Millisecond), byServer)
			if byServer != tt.closedBySelf {
				t.Errorf("the server closed the idle connection: %v, want %v (the client closes it after %s, --shutdown-connection-wait %s)",
					byServer, tt.closedBySelf, tt.idle, tt.wait)
			}
			if said := strings.Contains(logs.String(), "Closing the connections left open"); said != tt.closedBySelf {
				t.Errorf("the log says it closed connections left open: %v, want %v", said, tt.closedBySelf)
			}
		})
	}
}
