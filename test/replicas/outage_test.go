package replicas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/vmipam/vmipam/test/harness"
)

// TestAPIServerOutage stops the kube-apiserver under three replicas (etcd
// keeps running) and, 30s after its last answer, starts it again on the
// same address and certificates. No replica may exit, during the outage or after it;
// creates must succeed again within 5s of the API server answering; every
// replica must be ready again; and nobody may take over a replica that
// merely could not renew its Lease during the outage.
func TestAPIServerOutage(t *testing.T) {
	s := newSuite(t)
	s.startReplicas(3)
	const (
		pool      = "outage"
		outage    = 30 * time.Second
		recoverBy = 5 * time.Second
	)
	prefix, _ := s.createPool(poolSpec{name: pool, cidr: "10.70.0.0/22", cooldown: 5 * time.Second, pendingTTL: time.Minute})
	for i := range 10 {
		if _, err := s.create(s.ctx, fmt.Sprintf("before-%02d", i), pool); err != nil {
			t.Fatalf("before the outage: %v", err)
		}
	}
	reps := s.rs.Live()
	var exitMu sync.Mutex
	exits := map[string]time.Time{}
	for _, rep := range reps {
		go func() {
			select {
			case <-rep.Done():
				exitMu.Lock()
				exits[rep.Holder] = time.Now()
				exitMu.Unlock()
			case <-s.ctx.Done():
			}
		}()
	}

	// The API server's availability, polled every 50ms by a client of
	// its own, each request in its own goroutine with a 1s timeout.
	av, err := newAvailability(s)
	if err != nil {
		t.Fatal(err)
	}
	avCtx, stopAv := context.WithCancel(s.ctx)
	var avDone sync.WaitGroup
	avDone.Go(func() { av.run(avCtx) })
	defer func() {
		stopAv()
		avDone.Wait()
	}()
	av.waitOK(t)

	api := s.cl.Env.ControlPlane.GetAPIServer()
	addr, ca := api.HostPort(), bytes.Clone(api.CA)
	keep := filepath.Join(t.TempDir(), "apiserver-certs")
	if err := harness.CopyDir(api.CertDir, keep); err != nil {
		t.Fatalf("keep the API server's certificates: %v", err)
	}
	s.mark("stopping the API server")
	stopCalled := time.Now()
	// Stop sends SIGTERM and, after 20s, SIGKILL and an error: either way
	// the process is gone. The outage counts from the API server's last
	// answer, which comes soon after the SIGTERM.
	stopErr := api.Stop()
	stopped := time.Now()
	s.mark("API server stopped")
	lastAnswer := av.lastOKBefore(stopped)
	harness.Sleep(s.ctx, time.Until(lastAnswer.Add(outage)))

	// Creates from now on, one every 100ms, each in its own goroutine: the
	// first success says when vmipam serves again.
	var probeMu sync.Mutex
	var firstOK time.Time
	var probeErrs []string
	probeCtx, stopProbes := context.WithCancel(s.ctx)
	var probes sync.WaitGroup
	probes.Go(func() {
		for i := 0; harness.Sleep(probeCtx, 100*time.Millisecond); i++ {
			probes.Go(func() {
				_, err := s.create(s.ctx, fmt.Sprintf("probe-%04d", i), pool)
				at := time.Now()
				probeMu.Lock()
				defer probeMu.Unlock()
				if err == nil && (firstOK.IsZero() || at.Before(firstOK)) {
					firstOK = at
				}
				if err != nil {
					probeErrs = append(probeErrs, fmt.Sprintf("at %s: %v", at.Format(stamp), err))
				}
			})
		}
	})
	api.CertDir = keep
	startCalled := time.Now()
	for range 10 {
		// The port may take a moment to be released.
		if err = api.Start(); err == nil {
			break
		}
		harness.Sleep(s.ctx, time.Second)
	}
	if err != nil {
		stopProbes()
		probes.Wait()
		t.Fatalf("start the API server again: %v", errors.Join(err, stopErr))
	}
	started := time.Now()
	s.mark("API server started")
	if got := api.HostPort(); got != addr {
		t.Fatalf("the API server came back on %s, not %s", got, addr)
	}
	if !bytes.Equal(api.CA, ca) {
		t.Fatal("the API server came back with another serving CA")
	}
	harness.Eventually(t, time.Minute, "the API server to answer", func() error {
		if av.firstOKAfter(startCalled).IsZero() {
			return errors.New("not yet")
		}
		return nil
	})
	answered := av.firstOKAfter(startCalled)
	harness.Eventually(t, 30*time.Second, "a create to succeed", func() error {
		probeMu.Lock()
		defer probeMu.Unlock()
		if firstOK.IsZero() {
			return errors.New("none yet")
		}
		return nil
	})
	stopProbes()
	probes.Wait()

	readyAfter := map[string]string{}
	harness.Eventually(t, 30*time.Second, "every replica to be ready again", func() error {
		var notReady []string
		for _, rep := range reps {
			if _, ok := readyAfter[rep.Holder]; ok {
				continue
			}
			code, body, err := s.cl.Get("http://127.0.0.1:" + strconv.Itoa(rep.ProbePort) + "/readyz")
			if err == nil && code == http.StatusOK {
				readyAfter[rep.Holder] = time.Since(answered).Round(10 * time.Millisecond).String()
				continue
			}
			notReady = append(notReady, fmt.Sprintf("%s: %d %s %v", rep.Holder, code, strings.TrimSpace(body), err))
		}
		if len(notReady) > 0 {
			return errors.New(strings.Join(notReady, "; "))
		}
		return nil
	})
	// After the outage every replica renews its Lease again; none may be
	// taken over for want of a renewal during it. Creates go on meanwhile.
	failed := 0
	for i := 0; time.Since(answered) < leaseDuration+2*time.Second; i++ {
		if _, err := s.create(s.ctx, fmt.Sprintf("after-%03d", i), pool); err != nil {
			failed++
			t.Errorf("create after the outage: %v", err)
		}
		harness.Sleep(s.ctx, 100*time.Millisecond)
	}

	probeMu.Lock()
	createAfter := firstOK.Sub(answered)
	t.Logf("TestAPIServerOutage figures:\n"+
		"  API server stop took           %s (%v)\n"+
		"  API server unavailable         %s (last answer to first answer); start called %s after the last answer, took %s\n"+
		"  API server answering after     %s from the start call\n"+
		"  first create ok after          %s from the API server answering\n"+
		"  probe creates failed           %d (while the API server or vmipam was away)\n"+
		"  replicas ready again after     %v from the API server answering\n"+
		"  creates failed afterwards      %d",
		stopped.Sub(stopCalled).Round(10*time.Millisecond), stopErr, answered.Sub(lastAnswer).Round(10*time.Millisecond),
		startCalled.Sub(lastAnswer).Round(10*time.Millisecond), started.Sub(startCalled).Round(10*time.Millisecond), answered.Sub(startCalled).Round(10*time.Millisecond),
		createAfter.Round(10*time.Millisecond), len(probeErrs), readyAfter, failed)
	probeMu.Unlock()
	switch {
	case createAfter > 15*time.Second:
		t.Errorf("SLOW RECOVERY: the first create succeeded %s after the API server answered again; want at most %s", createAfter.Round(10*time.Millisecond), recoverBy)
	case createAfter > recoverBy:
		t.Errorf("SLOW RECOVERY: the first create succeeded %s after the API server answered again, between %s and 15s; want at most %s",
			createAfter.Round(10*time.Millisecond), recoverBy, recoverBy)
	}
	exitMu.Lock()
	for h, at := range exits {
		t.Errorf("REPLICA EXITED: %s exited at %s (%+.1fs from the API server's stop)", h, at.Format(stamp), at.Sub(stopped).Seconds())
	}
	exitMu.Unlock()
	for _, rep := range reps {
		if gone, err := s.leaseGone(s.ctx, rep.Holder); err != nil || gone {
			t.Errorf("the Lease of %s is gone after the outage (%v): it was taken over although it lived", rep.Holder, err)
		}
		for _, other := range reps {
			taking := harness.Grep(s.logs.get(rep.Index).String(), 5, `"msg":"Taking over a holder that left"`)
			for _, line := range taking {
				if strings.Contains(line, `"holder":"`+other.Holder+`"`) {
					t.Errorf("%s took the live holder %s over after the outage:\n%s", rep.Holder, other.Holder, line)
				}
			}
		}
	}
	s.checkLive("after the outage", pool, prefix)
	s.checkLabels("after the outage", pool, prefix)
}

// availability polls the API server every 50ms, each time on a new
// connection, and keeps the time of every successful answer.
type availability struct {
	hc  *http.Client
	url string
	mu  sync.Mutex
	ok  []time.Time
}

// newAvailability builds the poller's client from the administrator's
// configuration, without keep-alives: a broken connection cannot delay
// the first answer of the API server once it is back.
func newAvailability(s *suite) (*availability, error) {
	cfg := rest.CopyConfig(s.cl.Config)
	tlsCfg, err := rest.TLSConfigFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("availability client: %w", err)
	}
	rt, err := rest.HTTPWrappersForConfig(cfg, &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true})
	if err != nil {
		return nil, fmt.Errorf("availability client: %w", err)
	}
	return &availability{hc: &http.Client{Transport: rt, Timeout: time.Second},
		url: strings.TrimSuffix(cfg.Host, "/") + "/apis/vmipam.io/v1alpha1/ippools?limit=1"}, nil
}

func (a *availability) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for harness.Sleep(ctx, 50*time.Millisecond) {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url, nil)
			if err != nil {
				return
			}
			resp, err := a.hc.Do(req)
			if err != nil {
				return
			}
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				a.mu.Lock()
				a.ok = append(a.ok, time.Now())
				a.mu.Unlock()
			}
		})
	}
}

// waitOK waits for a first answer.
func (a *availability) waitOK(t *testing.T) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, "the availability poller's first answer", func() error {
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(a.ok) == 0 {
			return errors.New("none yet")
		}
		return nil
	})
}

// lastOKBefore returns the last answer before t.
func (a *availability) lastOKBefore(t time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var last time.Time
	for _, at := range a.ok {
		if at.Before(t) && at.After(last) {
			last = at
		}
	}
	return last
}

// firstOKAfter returns the first answer after t, zero if none yet.
func (a *availability) firstOKAfter(t time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var first time.Time
	for _, at := range a.ok {
		if at.After(t) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first
}
