package integration

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/test/fixture"
	"github.com/vmipam/vmipam/test/harness"
	"github.com/vmipam/vmipam/webhook"
)

// webhookClient reaches vmipam's webhook server as the API server does,
// over TLS, trusting envtest's serving CA.
func webhookClient(t *testing.T) (*http.Client, string) {
	t.Helper()
	wo := &testEnv.WebhookInstallOptions
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(wo.LocalServingCAData) {
		t.Fatal("envtest's serving CA does not parse")
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	return c, "https://" + net.JoinHostPort(wo.LocalServingHost, strconv.Itoa(wo.LocalServingPort))
}

// rawReview builds an AdmissionReview body around an object given as raw
// JSON, with the request's fields edited by edit.
func rawReview(t *testing.T, op, ns string, object []byte, edit func(map[string]any)) []byte {
	t.Helper()
	req := map[string]any{
		"uid": "hostile-1", "operation": op, "namespace": ns,
		"kind":     map[string]any{"group": "vmipam.io", "version": "v1alpha1", "kind": "VirtualMachine"},
		"resource": map[string]any{"group": "vmipam.io", "version": "v1alpha1", "resource": "virtualmachines"},
		"userInfo": map[string]any{"username": "mallory"},
	}
	if object != nil {
		req["object"] = "OBJECT"
	}
	if edit != nil {
		edit(req)
	}
	b, err := json.Marshal(map[string]any{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
	if err != nil {
		t.Fatal(err)
	}
	// Spliced in, not marshalled: encoding/json refuses what a hostile
	// caller would send (100,000 levels of nesting).
	return bytes.Replace(b, []byte(`"OBJECT"`), object, 1)
}

func vmRaw(ns, pool string, addrs ...string) []byte {
	spec := map[string]any{"ipPool": pool}
	if len(addrs) > 0 {
		spec["addresses"] = addrs
	}
	b, _ := json.Marshal(map[string]any{"apiVersion": "vmipam.io/v1alpha1", "kind": "VirtualMachine",
		"metadata": map[string]any{"generateName": "h-", "namespace": ns}, "spec": spec})
	return b
}

// TestHostileRequests posts raw requests at the real webhook server over
// TLS, as anyone who reaches port 9443 could: each row gives the answer,
// and no row may move the pool's counts. docs/security.md lists the rows.
func TestHostileRequests(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "hostile", []vmipamv1.IPRange{{CIDR: "10.97.0.0/24"}, {CIDR: "fd00:97::/120"}})
	hc, base := webhookClient(t)
	mutate, validate := base+webhook.AssignerPath, base+webhook.StampGuardPath
	taken := vm(ns, "holder", "hostile", "10.97.0.6")
	if err := k8sClient.Create(t.Context(), taken); err != nil {
		t.Fatal(err)
	}
	huge := func(n int, elem string) []byte {
		var b bytes.Buffer
		b.WriteByte('[')
		for i := 0; b.Len() < n; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(elem)
		}
		b.WriteByte(']')
		return b.Bytes()
	}
	deep := func(n int) []byte {
		return []byte(`{"apiVersion":"vmipam.io/v1alpha1","kind":"VirtualMachine","metadata":{"generateName":"d-","namespace":"` + ns +
			`"},"spec":{"ipPool":"hostile"},"status":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`)
	}
	type want struct {
		http    int    // HTTP status; 200 carries an AdmissionReview
		allowed bool   // for 200
		code    int32  // the denial's status code, for 200
		message string // in the body or the denial
	}
	type row struct {
		url, method, contentType string
		body                     []byte
		times                    int
		want                     want
	}
	post := func(url string, body []byte, w want) row { return row{url: url, body: body, want: w} }
	dry := func(r map[string]any) { r["dryRun"] = true }
	rows := map[string]row{
		"empty body":     post(mutate, nil, want{http: 400, message: "not a JSON object"}),
		"not JSON":       post(mutate, []byte("hello"), want{http: 400, message: "not a JSON object"}),
		"null":           post(mutate, []byte("null"), want{http: 400, message: "not a JSON object"}),
		"an array":       post(mutate, []byte("[]"), want{http: 400, message: "not a JSON object"}),
		"no request":     post(mutate, []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), want{http: 400, message: "no request with a uid"}),
		"v1beta1 review": post(mutate, []byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`), want{http: 400, message: "admission.k8s.io/v1 AdmissionReview only"}),
		"GET":            {url: mutate, method: http.MethodGet, want: want{http: 405, message: "take POST"}},
		"not application/json": {url: mutate, contentType: "text/plain", body: rawReview(t, "CREATE", ns, vmRaw(ns, "hostile"), nil),
			want: want{http: 415, message: "application/json"}},
		"wrong kind": post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile"), func(r map[string]any) {
			r["kind"] = map[string]any{"group": "", "version": "v1", "kind": "Pod"}
		}), want{http: 200, code: 400, message: "serves virtualmachines.vmipam.io/v1alpha1"}),
		"wrong resource": post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile"), func(r map[string]any) {
			r["resource"] = map[string]any{"group": "vmipam.io", "version": "v1alpha1", "resource": "ippools"}
		}), want{http: 200, code: 400, message: "not ippools"}),
		"a subresource": post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile"), func(r map[string]any) { r["subResource"] = "status" }),
			want{http: 200, code: 400, message: "/status"}),
		"DELETE":  post(mutate, rawReview(t, "DELETE", ns, vmRaw(ns, "hostile"), nil), want{http: 200, allowed: true}),
		"CONNECT": post(mutate, rawReview(t, "CONNECT", ns, nil, nil), want{http: 200, allowed: true}),
		"forged CREATE of {} (300 times)": {url: mutate, body: rawReview(t, "CREATE", ns, []byte(`{}`), nil), times: 300,
			want: want{http: 200, code: 400, message: "not a vmipam.io/v1alpha1 VirtualMachine"}},
		"another kind in the object": post(mutate, rawReview(t, "CREATE", ns, []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`), nil),
			want{http: 200, code: 400, message: "not a vmipam.io/v1alpha1 VirtualMachine"}),
		"object in another namespace": post(mutate, rawReview(t, "CREATE", ns, vmRaw("kube-system", "hostile"), nil),
			want{http: 200, code: 400, message: "differs from the request's"}),
		"7 MiB of [{},{},…]":                 post(mutate, rawReview(t, "CREATE", ns, huge(7<<20, "{}"), nil), want{http: 413, message: "larger than the limit"}),
		"6 MiB of [{},{},…]":                 post(mutate, rawReview(t, "CREATE", ns, huge(6<<20, "{}"), nil), want{http: 200, code: 400, message: "not a JSON object"}),
		"100,000 levels of nesting, dry run": post(mutate, rawReview(t, "CREATE", ns, deep(100_000), dry), want{http: 200, allowed: true}),
		"dry run, plain":                     post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile"), dry), want{http: 200, allowed: true}),
		"dry run, taken":                     post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "10.97.0.6"), dry), want{http: 200, code: 422, message: "allocated to " + ns + "/holder"}),
		"taken address":                      post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "10.97.0.6"), nil), want{http: 200, code: 422, message: "allocated to " + ns + "/holder"}),
		"taken, IPv4-mapped":                 post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "::ffff:10.97.0.6"), nil), want{http: 200, code: 422, message: "write it as 10.97.0.6"}),
		"free, IPv4-mapped":                  post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "::ffff:10.97.0.7"), nil), want{http: 200, code: 422, message: "write it as 10.97.0.7"}),
		"IPv4-mapped, zoned":                 post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "::ffff:10.97.0.7%eth0"), nil), want{http: 200, code: 422, message: "IPv4-mapped IPv6 form of an IPv4 address; write it as 10.97.0.7"}),
		"IPv6, zoned":                        post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "fd00:97::7%eth0"), nil), want{http: 200, code: 422, message: "write fd00:97::7"}),
		"IPv6, upper case":                   post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "FD00:97::7"), nil), want{http: 200, code: 422, message: "write it as fd00:97::7"}),
		"IPv6, zeros spelled":                post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "fd00:97:0:0::7"), nil), want{http: 200, code: 422, message: "write it as fd00:97::7"}),
		"IPv4, leading zeros":                post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "10.97.0.07"), nil), want{http: 200, code: 422, message: "not an IP address"}),
		"IPv4 with another length":           post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "10.97.0.7/32"), nil), want{http: 200, code: 422, message: "the prefix length /32 differs from the subnet 10.97.0.0/24"}),
		"IPv4 with a bad length":             post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "10.97.0.7/024"), nil), want{http: 200, code: 422, message: "not an IP address"}),
		"two IPv4 addresses":                 post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "10.97.0.7", "10.97.0.8"), nil), want{http: 200, code: 422, message: "a second IPv4 address"}),
		"three addresses":                    post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", "10.97.0.7", "fd00:97::7", "10.97.0.8"), nil), want{http: 200, code: 422, message: "must have at most 2 items"}),
		"IPv4 with a space":                  post(mutate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile", " 10.97.0.7"), nil), want{http: 200, code: 422, message: "not an IP address"}),
		"validate: wrong kind":               post(validate, rawReview(t, "CREATE", ns, vmRaw(ns, "hostile"), func(r map[string]any) { r["kind"] = map[string]any{"kind": "Secret", "version": "v1"} }), want{http: 200, code: 400, message: "validating webhook serves"}),
		"validate: a copied stamp onto a changed address": post(validate, rawReview(t, "CREATE", ns, func() []byte {
			b, _ := json.Marshal(map[string]any{"apiVersion": "vmipam.io/v1alpha1", "kind": "VirtualMachine",
				"metadata": map[string]any{"name": "x", "namespace": ns, "annotations": taken.Annotations}, "spec": map[string]any{"addresses": []string{"10.97.0.9"}}})
			return b
		}(), nil), want{http: 200, code: 422, message: "differs from the address vmipam reserved"}),
	}
	p := v.reg.Get("hostile")
	before := p.Snapshot()
	for name, tc := range rows {
		t.Run(name, func(t *testing.T) {
			for range max(tc.times, 1) {
				method := tc.method
				if method == "" {
					method = http.MethodPost
				}
				req, err := http.NewRequestWithContext(t.Context(), method, tc.url+"?timeout=5s", bytes.NewReader(tc.body))
				if err != nil {
					t.Fatal(err)
				}
				ct := tc.contentType
				if ct == "" {
					ct = "application/json"
				}
				req.Header.Set("Content-Type", ct)
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != tc.want.http {
					t.Fatalf("HTTP %d %q, want %d", resp.StatusCode, body, tc.want.http)
				}
				if resp.StatusCode != http.StatusOK {
					if !strings.Contains(string(body), tc.want.message) {
						t.Fatalf("body %q does not say %q", body, tc.want.message)
					}
					continue
				}
				var out admissionv1.AdmissionReview
				if err := json.Unmarshal(body, &out); err != nil || out.Response == nil || out.Response.UID != "hostile-1" {
					t.Fatalf("not an answer to the review: %q (%v)", body, err)
				}
				r := out.Response
				if r.Allowed != tc.want.allowed {
					t.Fatalf("allowed %t, want %t: %+v", r.Allowed, tc.want.allowed, r.Result)
				}
				if !r.Allowed && (r.Result == nil || r.Result.Code != tc.want.code || !strings.Contains(r.Result.Message, tc.want.message)) {
					t.Fatalf("denied with %+v, want code %d saying %q", r.Result, tc.want.code, tc.want.message)
				}
			}
		})
	}
	if after := p.Snapshot(); after.Pending != before.Pending || after.Allocated != before.Allocated || after.Cooldown != before.Cooldown {
		t.Fatalf("hostile requests moved the pool's counts: %+v -> %+v", before, after)
	}
}

// TestSlowBody: a caller that sends its body slowly is cut off at the read
// timeout (2s in the tests) instead of holding a connection and memory.
func TestSlowBody(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	startVMIPAM(t, clk)
	_, base := webhookClient(t)
	wo := &testEnv.WebhookInstallOptions
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(wo.LocalServingCAData)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(base, "https://"), &tls.Config{RootCAs: pool, ServerName: wo.LocalServingHost, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, _ = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{\"apiVersion\":", webhook.AssignerPath)
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	reply, _ := io.ReadAll(conn)
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the server held a slow body for %s", took)
	}
	if !strings.Contains(string(reply), "400") && len(reply) != 0 {
		t.Fatalf("reply %q, want a 400 or a closed connection", reply)
	}
}

// TestCreateBoundToFail: a create whose name is taken reserves nothing; a
// create refused after admission (here by a later validating webhook)
// returns its address when its TTL ends, without a cooldown, once a read
// of the API server shows no object was stored with it.
func TestCreateBoundToFail(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "bound-to-fail", []vmipamv1.IPRange{{CIDR: "10.61.0.0/29"}}, func(p *vmipamv1.IPPool) {
		p.Spec.PendingTTL.Duration = time.Minute
		p.Spec.Cooldown.Duration = 10 * time.Minute
	})
	p := v.reg.Get("bound-to-fail")
	ctx := t.Context()
	if err := k8sClient.Create(ctx, vm(ns, "taken", "bound-to-fail")); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "the first VM bound", func() error {
		if c := p.Snapshot(); c.Allocated != 1 || c.Pending != 0 {
			return fmt.Errorf("counts %+v", c)
		}
		return nil
	})
	// The cache may lag the create by a moment.
	harness.Eventually(t, 10*time.Second, "the name to be known taken", func() error {
		err := k8sClient.Create(ctx, vm(ns, "taken", "bound-to-fail"))
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create: %w", err)
		}
		if c := p.Snapshot(); c.Pending != 0 {
			return fmt.Errorf("a create of a taken name reserved an address: %+v", c)
		}
		return nil
	})

	installDenyWebhook(t, ns, "bound-to-fail")
	err := k8sClient.Create(ctx, vm(ns, "denied", "bound-to-fail"))
	if err == nil || !strings.Contains(err.Error(), errDenied.Error()) {
		t.Fatalf("create: %v; want the second webhook's denial", err)
	}
	var a netip.Addr
	for _, cand := range []string{"10.61.0.1", "10.61.0.2", "10.61.0.3"} {
		if st, _, _ := p.Lookup(netip.MustParseAddr(cand)); st == ipam.StatePending {
			a = netip.MustParseAddr(cand)
		}
	}
	if !a.IsValid() {
		t.Fatalf("no reservation pending after the denied create: %+v", p.Snapshot())
	}
	// Past the TTL and the allowance for clock skew, the proof runs.
	clk.Step(time.Minute + 6*time.Second)
	harness.Eventually(t, 20*time.Second, "the address to come back without a cooldown", func() error {
		if st, _, until := p.Lookup(a); st != ipam.StateFree {
			return fmt.Errorf("%s is %s until %s", a, st, until)
		}
		return nil
	})
	if got := p.Stats().Unused; got < 1 {
		t.Errorf("Stats().Unused = %d, want at least 1", got)
	}
}

// TestPendingBoundPerNamespace: creates refused after admission cannot pile
// up reservations in one namespace beyond the pool's bound; the refusal
// says why, and other namespaces are not affected.
func TestPendingBoundPerNamespace(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns, other := namespace(t), namespace(t)
	newPool(t, v, "bounded", []vmipamv1.IPRange{{CIDR: "10.62.0.0/24"}}, func(p *vmipamv1.IPPool) {
		p.Spec.MaxPendingPerNamespace = ptr.To(int32(2))
	})
	installDenyWebhook(t, ns, "bounded")
	ctx := t.Context()
	for i := range 2 {
		if err := k8sClient.Create(ctx, vm(ns, fmt.Sprint("d", i), "bounded")); err == nil || !strings.Contains(err.Error(), errDenied.Error()) {
			t.Fatalf("create %d: %v; want the second webhook's denial", i, err)
		}
	}
	err := k8sClient.Create(ctx, vm(ns, "d2", "bounded"))
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "namespace "+ns+" already has 2 reservations") {
		t.Fatalf("third create: %v; want 429 naming the namespace and the bound", err)
	}
	if err := k8sClient.Create(ctx, vm(other, "fine", "bounded")); err != nil {
		t.Fatalf("another namespace: %v", err)
	}
}

// TestAllowedNamespaces: a pool restricted to some namespaces refuses the
// others, whether they name it or it is the default.
func TestAllowedNamespaces(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns, other := namespace(t), namespace(t)
	newPool(t, v, "team-pool", []vmipamv1.IPRange{{CIDR: "10.63.0.0/28"}}, func(p *vmipamv1.IPPool) {
		p.Spec.AllowedNamespaces = &vmipamv1.NamespaceRestriction{Names: []string{ns}}
	})
	ctx := t.Context()
	if err := k8sClient.Create(ctx, vm(ns, "mine", "team-pool")); err != nil {
		t.Fatalf("allowed namespace: %v", err)
	}
	err := k8sClient.Create(ctx, vm(other, "theirs", "team-pool"))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), other+" is not one of them") {
		t.Fatalf("other namespace: %v; want Forbidden with the reason", err)
	}
	if c := v.reg.Get("team-pool").Snapshot(); c.Pending+c.Allocated != 1 {
		t.Fatalf("counts %+v, want the one allowed VM only", c)
	}
	// By label too.
	labelled := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "t-", Labels: map[string]string{"team": "b"}}}
	if err := k8sClient.Create(ctx, labelled); err != nil {
		t.Fatal(err)
	}
	newPool(t, v, "team-b", []vmipamv1.IPRange{{CIDR: "10.63.1.0/28"}}, func(p *vmipamv1.IPPool) {
		p.Spec.AllowedNamespaces = &vmipamv1.NamespaceRestriction{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "b"}}}
	})
	harness.Eventually(t, 10*time.Second, "the labelled namespace to be allowed", func() error {
		return k8sClient.Create(ctx, vm(labelled.Name, "b", "team-b"))
	})
	if err := k8sClient.Create(ctx, vm(ns, "not-b", "team-b")); !apierrors.IsForbidden(err) {
		t.Fatalf("unlabelled namespace: %v; want Forbidden", err)
	}
}

// TestPoolDeletionWaits: deleting an IPPool while VMs hold its addresses
// keeps it, says what it waits for, hands out nothing new, and lets it go
// once the last VM is gone and its cooldown has ended.
func TestPoolDeletionWaits(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	pool := newPool(t, v, "doomed", []vmipamv1.IPRange{{CIDR: "10.64.0.0/28"}})
	ctx := t.Context()
	obj := vm(ns, "holder", "doomed")
	if err := k8sClient.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "the pool's finalizer", func() error {
		p := &vmipamv1.IPPool{}
		if err := k8sClient.Get(ctx, client.ObjectKey{Name: "doomed"}, p); err != nil {
			return err
		}
		if len(p.Finalizers) != 1 || p.Finalizers[0] != vmipamv1.PoolFinalizer {
			return fmt.Errorf("finalizers %v", p.Finalizers)
		}
		return nil
	})
	if err := k8sClient.Delete(ctx, pool); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "an event naming the VM the pool waits for", func() error {
		var evs eventsv1.EventList
		if err := k8sClient.List(ctx, &evs); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == "doomed" && e.Reason == "WaitingForHolders" && strings.Contains(e.Note, ns+"/holder") {
				return nil
			}
		}
		return fmt.Errorf("no WaitingForHolders event among %d", len(evs.Items))
	})
	harness.Eventually(t, 10*time.Second, "new creates to be refused", func() error {
		err := k8sClient.Create(ctx, vm(ns, "late", "doomed"))
		if err == nil || !strings.Contains(err.Error(), `IPPool "doomed" is being deleted`) {
			return fmt.Errorf("create: %w", err)
		}
		return nil
	})
	if err := k8sClient.Delete(ctx, obj); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "the VM to go", func() error {
		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("get: %w", err)
	})
	// Its address cools down for a minute; the pool waits for that too.
	time.Sleep(time.Second)
	if err := k8sClient.Get(ctx, client.ObjectKey{Name: "doomed"}, &vmipamv1.IPPool{}); err != nil {
		t.Fatalf("the pool went while its address cooled down: %v", err)
	}
	clk.Step(2 * time.Minute)
	harness.Eventually(t, 30*time.Second, "the pool to go", func() error {
		err := k8sClient.Get(ctx, client.ObjectKey{Name: "doomed"}, &vmipamv1.IPPool{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("get: %w", err)
	})
	// Its blocks went with it, without waiting for a garbage collector
	// (envtest runs none).
	var blocks vmipamv1.IPBlockList
	if err := k8sClient.List(ctx, &blocks); err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks.Items {
		if b.Spec.Pool == "doomed" {
			t.Errorf("IPBlock %s of the deleted pool remains", b.Name)
		}
	}
}

// TestPoolTiming: pendingTTL below the API server's request timeout is
// refused with the reason, and cooldown 0s means none.
func TestPoolTiming(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ctx := t.Context()
	short := fixture.Pool("short-ttl", fixture.WithCIDRs("10.65.0.0/28"), fixture.WithPendingTTL(30*time.Second))
	if err := k8sClient.Create(ctx, short); err == nil || !strings.Contains(err.Error(), "spec.pendingTTL") || !strings.Contains(err.Error(), "request timeout") {
		t.Fatalf("pendingTTL 30s: %v; want refused naming the field and the reason", err)
	}
	ns := namespace(t)
	newPool(t, v, "no-cooldown", []vmipamv1.IPRange{{CIDR: "10.65.1.0/30"}}, func(p *vmipamv1.IPPool) {
		p.Spec.Cooldown = &metav1.Duration{}
	})
	stored := &vmipamv1.IPPool{}
	if err := k8sClient.Get(ctx, client.ObjectKey{Name: "no-cooldown"}, stored); err != nil {
		t.Fatal(err)
	}
	if stored.Spec.Cooldown == nil || stored.Spec.Cooldown.Duration != 0 {
		t.Fatalf("cooldown stored as %v, want 0s", stored.Spec.Cooldown)
	}
	first := vm(ns, "first", "no-cooldown", "10.65.1.1")
	if err := k8sClient.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := k8sClient.Delete(ctx, first); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 20*time.Second, "the address to be handed out again at once", func() error {
		return k8sClient.Create(ctx, vm(ns, "second", "no-cooldown", "10.65.1.1"))
	})
}

// TestCanonicalAddressInSchema: the CRD itself refuses a second spelling of
// an address, whoever writes it.
func TestCanonicalAddressInSchema(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	v := startVMIPAM(t, clk)
	ns := namespace(t)
	newPool(t, v, "spelled", []vmipamv1.IPRange{{CIDR: "10.66.0.0/28"}})
	ctx := t.Context()
	obj := vm(ns, "a", "spelled")
	if err := k8sClient.Create(ctx, obj); err != nil {
		t.Fatal(err)
	}
	obj.Spec.Addresses = []string{"::ffff:" + obj.Spec.Addresses[0]}
	err := k8sClient.Update(ctx, obj)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "canonical form") {
		t.Fatalf("update to the IPv4-mapped spelling: %v; want the schema's refusal", err)
	}
}
