package replicas

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/harness"
	"github.com/vmipam/vmipam/webhook"
)

// TestFencingPausedReplica pauses one of three replicas with SIGSTOP for
// longer than the lease duration plus the clock-skew slack, while clients
// create and delete VirtualMachines through the proxy, until the others
// have taken its claims over and deleted its Lease. Then it is resumed
// with SIGCONT and sent admission requests for VM creates directly, on its
// own webhook port over TLS, from the first milliseconds on: it must not
// hand out an address (its fence has expired: it answers not ready), or,
// once it has recovered, only an address that it claims and no live VM
// holds. Afterwards creates through the proxy go on and no two live VMs
// may share an address.
func TestFencingPausedReplica(t *testing.T) {
	s := newSuite(t)
	s.startReplicas(3)
	const (
		pool     = "fence"
		cooldown = 5 * time.Second
		// watch is how long the resumed replica is watched and sent
		// reviews.
		watch = 8 * time.Second
	)
	prefix, usable := s.createPool(poolSpec{name: pool, cidr: "10.80.0.0/21", cooldown: cooldown, pendingTTL: time.Minute})
	all := s.rs.Live()
	victim := all[2]
	wc := s.webhookClient(t)
	mutate := "https://127.0.0.1:" + strconv.Itoa(victim.WebhookPort) + webhook.AssignerPath
	// The client reaches the replica: a dry run reserves nothing.
	if ans, err := s.review(wc, mutate, pool, "warmup", true); err != nil || !ans.allowed {
		t.Fatalf("a dry-run review sent to %s directly: %+v, %v", victim.Holder, ans, err)
	}

	led := harness.NewLedger(cooldown, 1, harness.Prefixes{prefix})
	st := &storm{s: s, pool: pool, prefix: "fence", led: led, maxOwn: 16, deleteP: 0.3, think: 20 * time.Millisecond}
	stopStorm := st.start(8)
	harness.Sleep(s.ctx, 2*time.Second)

	pid := victim.Pid()
	s.mark("SIGSTOP %s (pid %d)", victim.Holder, pid)
	paused := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %s: %v", victim.Holder, err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	seen := s.waitLeaseGone(victim.Holder, leaseDuration+clockSkew+30*time.Second)
	gone := seen.gone
	if !seen.ok {
		t.Fatalf("the Lease of the paused holder %s is still there %s after SIGSTOP: nobody took its claims over", victim.Holder, time.Since(paused).Round(time.Second))
	}
	harness.Sleep(s.ctx, time.Until(paused.Add(leaseDuration+clockSkew+3*time.Second)))
	harness.Sleep(s.ctx, time.Until(gone.Add(time.Second)))
	bs, err := s.blocks(s.ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if where := bs.names(victim.Holder); bs.claims[victim.Holder] > 0 {
		t.Errorf("the IPBlocks still name the paused holder %s after its Lease was deleted: %s", victim.Holder, strings.Join(where, ", "))
	}

	// Resume it and talk to it directly at once.
	s.mark("SIGCONT %s", victim.Holder)
	resume()
	contAt := time.Now()
	var answers []directAnswer
	// readiness is the resumed replica's /readyz over time, as runs.
	var readiness []string
	lastReady, readySince := "", time.Duration(0)
	noteReady := func(now time.Duration, state string) {
		if state != lastReady {
			if lastReady != "" {
				readiness = append(readiness, fmt.Sprintf("  %+7.3fs to %+7.3fs  %s", readySince.Seconds(), now.Seconds(), lastReady))
			}
			lastReady, readySince = state, now
		}
	}
	var handedOut []string
	for i := 0; time.Since(contAt) < watch; i++ {
		ans, err := s.review(wc, mutate, pool, fmt.Sprintf("direct-%04d", i), false)
		at := time.Since(contAt)
		answers = append(answers, directAnswer{at: at, answer: ans, err: err})
		if err == nil && ans.allowed {
			handedOut = append(handedOut, s.checkHandedOut(pool, prefix, victim.Holder, ans.addr, at)...)
		}
		if code, _, err := s.cl.Get("http://127.0.0.1:" + strconv.Itoa(victim.ProbePort) + "/readyz"); err == nil && code == http.StatusOK {
			noteReady(time.Since(contAt), "ready")
		} else {
			noteReady(time.Since(contAt), "not ready")
		}
		if at < 3*time.Second {
			harness.Sleep(s.ctx, 50*time.Millisecond)
		} else {
			harness.Sleep(s.ctx, 250*time.Millisecond)
		}
	}
	noteReady(time.Since(contAt), "")
	stopStorm()
	var lease coordinationv1.Lease
	leaseErr := s.c.Get(s.ctx, client.ObjectKey{Namespace: harness.Namespace, Name: pools.LeaseName(victim.Holder)}, &lease)
	leaseNow := fmt.Sprintf("absent (%v)", leaseErr)
	if leaseErr == nil {
		leaseNow = fmt.Sprintf("present again: holder %q, renewed %s, transitions %d, created %s",
			ptr.Deref(lease.Spec.HolderIdentity, ""), lease.Spec.RenewTime.Format(stamp), ptr.Deref(lease.Spec.LeaseTransitions, 0), lease.CreationTimestamp.Format(time.RFC3339))
	}

	// Summarize the answers: runs of the same outcome.
	var runs []string
	allowed := 0
	for i := 0; i < len(answers); {
		j := i
		for j < len(answers) && answers[j].outcome() == answers[i].outcome() {
			j++
		}
		runs = append(runs, fmt.Sprintf("  %+7.3fs to %+7.3fs  %4d × %s", answers[i].at.Seconds(), answers[j-1].at.Seconds(), j-i, answers[i].outcome()))
		i = j
	}
	for _, a := range answers {
		if a.err == nil && a.allowed {
			allowed++
		}
	}
	creates, deletes, _ := led.Counts()
	failedCreates := led.Failures("create")
	t.Logf("TestFencingPausedReplica figures (pool %s, %d usable):\n"+
		"  paused                         %s (SIGSTOP to SIGCONT)\n"+
		"  its Lease gone after           %s from SIGSTOP (lease duration %s + slack %s): %s\n"+
		"  first direct answer after      %.3fs from SIGCONT\n"+
		"  direct reviews                 %d, %d allowed (handed out an address)\n"+
		"  its Lease after the watch      %s\n"+
		"  storm through the proxy        %d creates ok, %d failed, %d deletes ok\n"+
		"  the direct answers, by outcome (from SIGCONT):\n%s\n"+
		"  its /readyz (from SIGCONT):\n%s",
		prefix, usable, contAt.Sub(paused).Round(10*time.Millisecond), gone.Sub(paused).Round(10*time.Millisecond), leaseDuration, clockSkew, seen.describe(paused),
		answers[0].at.Seconds(), len(answers), allowed, leaseNow, creates, len(failedCreates), deletes, strings.Join(runs, "\n"), strings.Join(readiness, "\n"))
	if len(failedCreates) > 0 {
		t.Logf("failed creates through the proxy, from SIGSTOP (the API server's connections to the paused replica hang until the webhook's 5s timeout):\n%s",
			strings.Join(failureLines(failedCreates, paused, 8), "\n"))
	}
	seen.checkNotEarly(t, victim.Holder)
	for _, h := range handedOut {
		t.Errorf("%s", h)
	}
	// A Lease acquired anew counts a transition; one an Update recreated
	// carries none.
	if leaseErr == nil && ptr.Deref(lease.Spec.HolderIdentity, "") == victim.Holder && lease.CreationTimestamp.After(paused) &&
		ptr.Deref(lease.Spec.LeaseTransitions, 0) == 0 {
		t.Errorf("LEASE RECREATED: the resumed %s renewed the Lease it was taken over under: deleted by %s at the end of the takeover, it is %s. "+
			"With no transition counted, the writer was the renewal (an Update with the old resourceVersion, which creates a missing Lease), "+
			"not an acquisition: the holder does not learn that it was taken over, and serves its stale free list until a block write fails",
			victim.Holder, seen.taker, leaseNow)
	}
	if lastReadyState(readiness) != "ready" {
		logged := s.logs.since(victim.Index, "SIGCONT "+victim.Holder, 25)
		if len(logged) <= 1 {
			logged = append(logged, "(nothing but failed readiness checks)")
		}
		t.Errorf("NOT RECOVERED: %s, taken over while paused, was not ready at the end of the %s after SIGCONT; its log after SIGCONT:\n%s",
			victim.Holder, watch, strings.Join(logged, "\n"))
	}

	// Afterwards, through the proxy: creates go on, nothing is shared.
	for i := range 100 {
		name := fmt.Sprintf("after-%03d", i)
		err := harness.Poll(s.ctx, 200*time.Millisecond, 20*time.Second, func() error {
			rec := &harness.Record{Name: name, Sent: time.Now()}
			vm, err := s.create(s.ctx, name, pool)
			if err != nil {
				return err
			}
			rec.Resp = time.Now()
			led.Created(rec, vm)
			return nil
		})
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Errorf("create %s after the pause: %v", name, err)
		}
	}
	for _, p := range led.Problems() {
		t.Errorf("%s", p)
	}
	live := s.checkLive("after the pause", pool, prefix)
	for _, a := range answers {
		if a.err == nil && a.allowed && a.addr.IsValid() {
			if holder, ok := live.byAddr[a.addr]; ok {
				t.Errorf("DUPLICATE IN WAITING: %s, handed out by the resumed %s at %+.3fs, is now on the live VM %s", a.addr, victim.Holder, a.at.Seconds(), holder)
			}
		}
	}
	s.checkAlive("by the end of the test", all...)
	s.checkRenewals("while the paused holder was taken over", all[0], all[1])
}

// lastReadyState returns the state of the last run of readiness.
func lastReadyState(runs []string) string {
	if len(runs) == 0 {
		return ""
	}
	f := strings.Fields(runs[len(runs)-1])
	return strings.Join(f[3:], " ")
}

// answer is the mutating webhook's answer to one review.
type answer struct {
	allowed bool
	addr    netip.Addr
	code    int32
	message string
}

func (a answer) outcome() string {
	if a.allowed {
		return "allowed"
	}
	msg := a.message
	if len(msg) > 140 {
		msg = msg[:140] + "..."
	}
	return fmt.Sprintf("denied %d: %s", a.code, msg)
}

// directAnswer is an answer of the resumed replica, or the error that
// replaced it, at a time from SIGCONT.
type directAnswer struct {
	at time.Duration
	answer
	err error
}

func (a directAnswer) outcome() string {
	if a.err != nil {
		msg := a.err.Error()
		if len(msg) > 140 {
			msg = msg[:140] + "..."
		}
		return "error: " + msg
	}
	return a.answer.outcome()
}

// webhookClient returns a client that reaches a replica's webhook server
// as the API server does, over TLS, trusting the CA vmipam injected into
// its webhook configurations; one connection per request.
func (s *suite) webhookClient(t *testing.T) *http.Client {
	t.Helper()
	var mwc admissionregv1.MutatingWebhookConfiguration
	if err := s.c.Get(s.ctx, client.ObjectKey{Name: "vmipam-mutating"}, &mwc); err != nil || len(mwc.Webhooks) == 0 {
		t.Fatalf("read the mutating webhook configuration: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(mwc.Webhooks[0].ClientConfig.CABundle) {
		t.Fatal("the injected caBundle does not parse")
	}
	return &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}
}

// review posts an AdmissionReview for the CREATE of a VirtualMachine name,
// drawing from pool,
// to url and returns the answer, with the address its patch stamps.
func (s *suite) review(hc *http.Client, url, pool, name string, dryRun bool) (answer, error) {
	raw, err := json.Marshal(&vmipamv1.VirtualMachine{
		TypeMeta:   metav1.TypeMeta{APIVersion: vmipamv1.GroupVersion.String(), Kind: "VirtualMachine"},
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: name},
		Spec:       vmipamv1.VirtualMachineSpec{IPPool: pool},
	})
	if err != nil {
		return answer{}, fmt.Errorf("encode the VM: %w", err)
	}
	body, err := json.Marshal(&admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("fencing-" + name),
			Kind:      metav1.GroupVersionKind{Group: vmipamv1.GroupVersion.Group, Version: vmipamv1.GroupVersion.Version, Kind: "VirtualMachine"},
			Resource:  metav1.GroupVersionResource{Group: vmipamv1.GroupVersion.Group, Version: vmipamv1.GroupVersion.Version, Resource: "virtualmachines"},
			Name:      name,
			Namespace: s.ns,
			Operation: admissionv1.Create,
			UserInfo:  authenticationv1.UserInfo{Username: "fencing-test"},
			Object:    runtime.RawExtension{Raw: raw},
			DryRun:    &dryRun,
		},
	})
	if err != nil {
		return answer{}, fmt.Errorf("encode the review: %w", err)
	}
	req, err := http.NewRequestWithContext(s.ctx, http.MethodPost, url+"?timeout=5s", bytes.NewReader(body))
	if err != nil {
		return answer{}, fmt.Errorf("build the request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return answer{}, fmt.Errorf("post the review: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, fmt.Errorf("read the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return answer{code: int32(resp.StatusCode), message: strings.TrimSpace(string(b))}, nil
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &out); err != nil || out.Response == nil {
		return answer{}, fmt.Errorf("decode the answer %q: %w", b, errors.Join(err, errors.New("no response")))
	}
	a := answer{allowed: out.Response.Allowed}
	if r := out.Response.Result; r != nil {
		a.code, a.message = r.Code, r.Message
	}
	if a.allowed && len(out.Response.Patch) > 0 {
		p, err := jsonpatch.DecodePatch(out.Response.Patch)
		if err != nil {
			return a, fmt.Errorf("decode the patch: %w", err)
		}
		patched, err := p.Apply(raw)
		if err != nil {
			return a, fmt.Errorf("apply the patch: %w", err)
		}
		var vm vmipamv1.VirtualMachine
		if err := json.Unmarshal(patched, &vm); err != nil {
			return a, fmt.Errorf("decode the patched VM: %w", err)
		}
		if len(vm.Spec.Addresses) == 1 {
			a.addr, _ = netip.ParseAddr(vm.Spec.Addresses[0])
		}
	}
	return a, nil
}

// checkHandedOut checks an address the resumed replica handed out at
// admission: it must be one it claims (it recovered and claimed anew),
// and no live VM may hold it.
func (s *suite) checkHandedOut(pool string, prefix netip.Prefix, holder string, a netip.Addr, at time.Duration) []string {
	if !a.IsValid() {
		return []string{fmt.Sprintf("the resumed %s allowed a create at %+.3fs without stamping an address", holder, at.Seconds())}
	}
	var out []string
	bs, err := s.blocks(s.ctx, pool)
	if err != nil {
		return []string{err.Error()}
	}
	if h, ok := bs.claimedBy[a]; !ok || h != holder {
		out = append(out, fmt.Sprintf("FENCING BROKEN: the resumed %s handed out %s at %+.3fs after SIGCONT, an address the IPBlocks show claimed by %q, not by it",
			holder, a, at.Seconds(), h))
	}
	live, err := s.live(s.ctx, pool, prefix)
	if err != nil {
		return append(out, err.Error())
	}
	if vm, ok := live.byAddr[a]; ok {
		out = append(out, fmt.Sprintf("FENCING BROKEN: the resumed %s handed out %s at %+.3fs after SIGCONT, the address of the live VM %s", holder, a, at.Seconds(), vm))
	}
	return out
}
