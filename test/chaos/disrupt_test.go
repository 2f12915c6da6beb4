package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/harness"
)

// vmipamFlags: a short resync so the forced paths (adopting a VM whose
// reservation the restart lost, releasing the address of a VM gone while
// vmipam was down) run often.
var vmipamFlags = []string{"--resync-interval=5s"}

// supervisor owns the vmipam process: the chaos kills and restarts it, and
// the supervisor restarts it when it exits on its own (for instance when
// it loses its leader election lease while the API server is away).
type supervisor struct {
	cl     *harness.Cluster
	logs   *logBuffer
	phases *phases
	probe  *http.Client

	// mu is held while the process is being killed or started; pmu
	// guards restarts and gone, read by the scanner meanwhile.
	mu        sync.Mutex
	pmu       sync.Mutex
	p         *harness.Process
	startedAt int // log offset of the current process's first line
	lastReady time.Time

	// Figures, under mu.
	starts, kills, selfExits int
	exitReasons              []string
	readyAfter               []time.Duration // from kill or exit to ready again
	startFailures            []string
	// restarts: from each process's end (kill, or exit noticed) to its
	// successor's readiness; an open end while it is being replaced.
	restarts []period
	// gone is when the process being replaced ended; zero when running.
	gone time.Time
}

// restartPeriods returns the periods around restarts so far; one still
// under way ends now.
func (s *supervisor) restartPeriods() []period {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	out := slices.Clone(s.restarts)
	if !s.gone.IsZero() {
		out = append(out, period{from: s.gone, to: time.Now()})
	}
	return out
}

func (s *supervisor) ended(at time.Time) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	s.gone = at
}

func (s *supervisor) replaced() {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if !s.gone.IsZero() {
		s.restarts = append(s.restarts, period{from: s.gone, to: time.Now()})
		s.gone = time.Time{}
	}
}

func newSupervisor(cl *harness.Cluster, logs *logBuffer, ph *phases) *supervisor {
	return &supervisor{cl: cl, logs: logs, phases: ph, probe: &http.Client{Timeout: 2 * time.Second}}
}

// start starts vmipam and waits for it to be ready, retrying for up to
// three minutes (it cannot become ready while the API server is away).
// Call with mu held.
func (s *supervisor) start(ctx context.Context) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		s.startedAt = s.logs.mark("starting vmipam #%d", s.starts+1)
		p, err := s.cl.StartVMIPAM(ctx, s.logs, vmipamFlags...)
		if err == nil {
			s.p = p
			s.starts++
			s.lastReady = time.Now()
			s.replaced()
			s.logs.mark("vmipam #%d ready", s.starts)
			return nil
		}
		s.startFailures = append(s.startFailures, err.Error())
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("start vmipam: %w", err)
		}
		sleep(ctx, time.Second)
	}
}

// healthy reports whether vmipam answers /healthz, and whether a failure
// was a refused connection (the process is gone) rather than a slow answer.
func (s *supervisor) healthy() (ok, refused bool) {
	resp, err := s.probe.Get("http://127.0.0.1:" + strconv.Itoa(s.cl.ProbePort) + "/healthz")
	if err != nil {
		return false, errors.Is(err, syscall.ECONNREFUSED)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK, false
}

// kill SIGKILLs vmipam, leaves it dead for down, and starts it again. It
// waits for a healthy process first, so that it never kills one that has
// already gone (the supervisor restarts those).
func (s *supervisor) kill(ctx context.Context, down time.Duration) error {
	for {
		s.mu.Lock()
		if ok, _ := s.healthy(); ok {
			break
		}
		s.mu.Unlock()
		if !sleep(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
	defer s.mu.Unlock()
	s.phases.vmipamDown.Store(true)
	defer s.phases.vmipamDown.Store(false)
	t0 := time.Now()
	s.logs.mark("SIGKILL vmipam #%d", s.starts)
	s.ended(t0)
	s.p.Kill()
	s.kills++
	sleep(ctx, down)
	if err := s.start(ctx); err != nil {
		return err
	}
	s.readyAfter = append(s.readyAfter, time.Since(t0))
	return nil
}

// watch restarts vmipam whenever it stops answering with refused
// connections for two seconds although nobody killed it, until ctx ends.
func (s *supervisor) watch(ctx context.Context) error {
	refusedFor := 0
	for sleep(ctx, 250*time.Millisecond) {
		if !s.mu.TryLock() {
			refusedFor = 0
			continue
		}
		ok, refused := s.healthy()
		switch {
		case ok || !refused:
			refusedFor = 0
			s.mu.Unlock()
			continue
		case refusedFor < 8:
			refusedFor++
			s.mu.Unlock()
			continue
		}
		refusedFor = 0
		t0 := time.Now()
		// It stopped answering two seconds ago, maybe more.
		s.ended(t0.Add(-3 * time.Second))
		s.phases.vmipamDown.Store(true)
		// Reap it; a no-op if it has exited, as expected.
		s.p.Kill()
		s.selfExits++
		out := s.logs.since(s.startedAt)
		why := grep(out, 3, "leader election lost", "vmipam stopped", `"level":"error"`, "panic")
		s.exitReasons = append(s.exitReasons, fmt.Sprintf("vmipam #%d exited on its own at %s; last error lines:\n%s",
			s.starts, t0.Format(stamp), strings.Join(why, "\n")))
		s.logs.mark("vmipam #%d found gone; restarting", s.starts)
		err := s.start(ctx)
		s.phases.vmipamDown.Store(false)
		if err == nil {
			s.readyAfter = append(s.readyAfter, time.Since(t0))
		}
		s.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

// stop kills the process for good.
func (s *supervisor) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		s.p.Kill()
		s.p = nil
	}
}

// apiRestart stops the kube-apiserver and starts it again on the same
// address with the same serving certificate. envtest's APIServer.Stop
// deletes the certificate directory it generated and Start would generate
// a new serving CA, which no existing client (vmipam's kubeconfig, the
// test's clients) trusts; so the directory is copied first and pinned.
// Only etcd keeps running.
func apiRestart(ctx context.Context, cl *harness.Cluster, keep string, ph *phases) (apiRestartResult, error) {
	var r apiRestartResult
	api := cl.Env.ControlPlane.GetAPIServer()
	addr := api.HostPort()
	ca := bytes.Clone(api.CA)
	if err := copyDir(api.CertDir, keep); err != nil {
		return r, fmt.Errorf("keep the API server's certificates: %w", err)
	}
	ph.apiDown.Store(true)
	defer ph.apiDown.Store(false)
	t0 := time.Now()
	// Stop sends SIGTERM and, after 20s, SIGKILL and an error: either way
	// the process is gone, which is all a restart needs.
	r.stopErr = api.Stop()
	r.stopped = time.Since(t0)
	api.CertDir = keep
	var err error
	for range 10 {
		// The port may take a moment to be released.
		if err = api.Start(); err == nil {
			break
		}
		sleep(ctx, time.Second)
	}
	if err != nil {
		return r, errors.Join(fmt.Errorf("start the API server again: %w", err), r.stopErr)
	}
	if got := api.HostPort(); got != addr {
		return r, fmt.Errorf("the API server came back on %s, not %s", got, addr)
	}
	if !bytes.Equal(api.CA, ca) {
		return r, errors.New("the API server came back with another serving CA")
	}
	// Clients reconnect on their own; wait until the test's does.
	for {
		err := cl.Client.Get(ctx, client.ObjectKey{Name: "chaos"}, &vmipamv1.IPPool{})
		if err == nil {
			r.downtime = time.Since(t0)
			return r, nil
		}
		if time.Since(t0) > time.Minute {
			return r, fmt.Errorf("API server back but unusable: %w", err)
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return r, ctx.Err()
		}
	}
}

// apiRestartResult: how long the API server took to stop (SIGTERM, then
// SIGKILL after 20s) and to serve again.
type apiRestartResult struct {
	stopped, downtime time.Duration
	stopErr           error
}

func copyDir(from, to string) error {
	if err := os.MkdirAll(to, 0o700); err != nil {
		return err
	}
	entries, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}
