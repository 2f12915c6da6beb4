package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/harness"
)

// vmipamFlags: a short resync so the forced paths (adopting a VM whose
// reservation the restart lost, releasing the address of a VM gone while
// vmipam was down) run often; with several replicas, a short holder lease
// so that a killed replica's claims are taken over within the run, and a
// short drain for the rolling restarts.
// CHAOS_VMIPAM_FLAGS adds flags (space-separated; --zap-log-level=debug
// logs every bind and release).
var vmipamFlags = append([]string{"--resync-interval=5s", "--lease-duration=10s", "--lease-renew-deadline=7s", "--lease-retry-period=2s", "--shutdown-drain=2s"},
	strings.Fields(os.Getenv("CHAOS_VMIPAM_FLAGS"))...)

// supervisor owns the vmipam processes: the chaos kills and restarts them,
// and the supervisor restarts one that exits on its own. With one replica
// it is a single process on the Cluster's ports; with several, replicas
// behind the stand-in for the Service (harness.Replicas): a kill takes one
// of them, and its replacement comes back under the same holder (a
// container restarted in its pod) or a new one (a pod replaced), in turn.
type supervisor struct {
	cl       *harness.Cluster
	logs     *harness.LogBuffer
	phases   *phases
	probe    *http.Client
	replicas int
	rng      *rand.Rand

	// rs and running: the replicas, and those the supervisor means to be
	// up (a replica not in running that exits was killed on purpose).
	rs      *harness.Replicas
	running []*harness.Replica

	// mu is held while the process is being killed or started; pmu
	// guards restarts and gone, read by the scanner meanwhile.
	mu        sync.Mutex
	pmu       sync.Mutex
	p         *harness.Process
	startedAt int // log offset of the current process's first line
	lastReady time.Time

	// Figures, under mu.
	starts, kills, selfExits, rolls int
	// takeovers: holders replaced under a new name, whose claims another
	// replica must take over.
	takeovers     int
	exitReasons   []string
	readyAfter    []time.Duration // from kill or exit to ready again
	startFailures []string
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

func newSupervisor(cl *harness.Cluster, logs *harness.LogBuffer, ph *phases, replicas int, rng *rand.Rand) *supervisor {
	return &supervisor{cl: cl, logs: logs, phases: ph, probe: &http.Client{Timeout: 2 * time.Second}, replicas: replicas, rng: rng}
}

// start starts vmipam and waits for it to be ready, retrying for up to
// three minutes (it cannot become ready while the API server is away).
// Call with mu held.
func (s *supervisor) start(ctx context.Context) error {
	deadline := time.Now().Add(3 * time.Minute)
	if s.replicas > 1 && s.rs == nil {
		s.startedAt = mark(s.logs, "starting %d vmipam replicas", s.replicas)
		rs, err := s.cl.StartReplicas(ctx, s.replicas, func(i int) io.Writer { return harness.Tagged(s.logs, i) }, vmipamFlags...)
		if err != nil {
			return fmt.Errorf("start %d replicas: %w", s.replicas, err)
		}
		s.rs, s.running = rs, rs.All()
		s.starts += s.replicas
		s.lastReady = time.Now()
		mark(s.logs, "%d replicas ready", s.replicas)
		return nil
	}
	for {
		s.startedAt = mark(s.logs, "starting vmipam #%d", s.starts+1)
		p, err := s.cl.StartVMIPAM(ctx, s.logs, vmipamFlags...)
		if err == nil {
			s.p = p
			s.starts++
			s.lastReady = time.Now()
			s.replaced()
			mark(s.logs, "vmipam #%d ready", s.starts)
			return nil
		}
		s.startFailures = append(s.startFailures, err.Error())
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("start vmipam: %w", err)
		}
		harness.Sleep(ctx, time.Second)
	}
}

// healthy reports whether vmipam answers /healthz, and whether a failure
// was a refused connection (the process is gone) rather than a slow answer.
func (s *supervisor) healthy() (ok, refused bool) {
	if s.rs != nil {
		for _, rep := range s.running {
			select {
			case <-rep.Done():
				return false, true
			default:
			}
		}
		return len(s.running) == s.replicas, false
	}
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
		if !harness.Sleep(ctx, 500*time.Millisecond) {
			return ctx.Err()
		}
	}
	defer s.mu.Unlock()
	s.phases.vmipamDown.Store(true)
	defer s.phases.vmipamDown.Store(false)
	t0 := time.Now()
	if s.rs != nil {
		return s.killReplica(ctx, t0, down)
	}
	mark(s.logs, "SIGKILL vmipam #%d", s.starts)
	s.ended(t0)
	s.p.Kill()
	s.kills++
	harness.Sleep(ctx, down)
	if err := s.start(ctx); err != nil {
		return err
	}
	s.readyAfter = append(s.readyAfter, time.Since(t0))
	return nil
}

// killReplica SIGKILLs one replica, leaves it dead for down, and starts
// its replacement: under the same holder every other time (a container
// restarted in its pod), else under a new one (a pod replaced), whose
// predecessor's claims another replica takes over once its Lease lapses.
// Call with mu held.
func (s *supervisor) killReplica(ctx context.Context, t0 time.Time, down time.Duration) error {
	i := s.rng.IntN(len(s.running))
	victim := s.running[i]
	s.running = slices.Delete(s.running, i, i+1)
	mark(s.logs, "SIGKILL replica %s (pid %d)", victim.Holder, victim.Pid())
	s.ended(t0)
	victim.Kill()
	s.rs.Remove(victim)
	s.kills++
	harness.Sleep(ctx, down)
	holder := victim.Holder
	if s.kills%2 == 0 {
		holder = "" // a new pod: a new holder
		s.takeovers++
	}
	return s.replaceReplica(ctx, victim, holder, t0)
}

// replaceReplica starts a replica in place of gone, which ended at t0,
// under holder ("" for a new one), retrying for up to three minutes (none
// becomes ready while the API server is away). Call with mu held.
func (s *supervisor) replaceReplica(ctx context.Context, gone *harness.Replica, holder string, t0 time.Time) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		rep, err := s.rs.Start(ctx, holder)
		if err == nil {
			s.running = append(s.running, rep)
			s.starts++
			s.lastReady = time.Now()
			s.replaced()
			s.readyAfter = append(s.readyAfter, time.Since(t0))
			mark(s.logs, "replica %s ready in place of %s", rep.Holder, gone.Holder)
			return nil
		}
		s.startFailures = append(s.startFailures, err.Error())
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("start a replica in place of %s: %w", gone.Holder, err)
		}
		harness.Sleep(ctx, time.Second)
	}
}

// roll replaces every replica, one at a time, as a Deployment's rollout
// does: each replacement (a new holder) is ready before its predecessor
// gets SIGTERM, drains, seals and releases its Lease. With one replica it
// does nothing: that process's restart is a kill.
func (s *supervisor) roll(ctx context.Context) error {
	if s.rs == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	mark(s.logs, "rolling restart of %d replicas", len(s.running))
	fresh, err := s.rs.RollingRestart(ctx, false, 30*time.Second)
	if err != nil {
		return fmt.Errorf("rolling restart: %w", err)
	}
	s.running = fresh
	s.starts += len(fresh)
	s.rolls++
	s.lastReady = time.Now()
	mark(s.logs, "rolling restart done: %d new replicas", len(fresh))
	return nil
}

// holders returns the holders of the processes running now: the one
// process's "vmipam", or every running replica's.
func (s *supervisor) holders() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rs == nil {
		return []string{"vmipam"}
	}
	out := make([]string, 0, len(s.running))
	for _, rep := range s.running {
		out = append(out, rep.Holder)
	}
	return out
}

// waitTakeovers waits until every holder Lease belongs to a running
// replica: the holders replaced under new names were taken over, and
// their claims rested where they had to. It returns when that was seen.
func (s *supervisor) waitTakeovers(ctx context.Context, c client.Client) (time.Time, error) {
	if s.rs == nil {
		return time.Time{}, nil
	}
	s.mu.Lock()
	want := map[string]bool{}
	for _, rep := range s.running {
		want[pools.LeaseName(rep.Holder)] = true
	}
	s.mu.Unlock()
	err := harness.Poll(ctx, 250*time.Millisecond, 2*time.Minute, func() error {
		var l coordinationv1.LeaseList
		if err := c.List(ctx, &l, client.InNamespace(harness.Namespace), client.MatchingLabels{pools.HolderLeaseLabel: "true"}); err != nil {
			return err
		}
		for _, lease := range l.Items {
			if !want[lease.Name] {
				return fmt.Errorf("lease %s of a replica gone is not taken over yet", lease.Name)
			}
		}
		return nil
	})
	return time.Now(), err
}

// watch restarts vmipam whenever it stops answering with refused
// connections for two seconds although nobody killed it, until ctx ends.
func (s *supervisor) watch(ctx context.Context) error {
	if s.replicas > 1 {
		return s.watchReplicas(ctx)
	}
	refusedFor := 0
	for harness.Sleep(ctx, 250*time.Millisecond) {
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
		out := s.logs.Since(s.startedAt)
		why := harness.Grep(out, 3, "leader election lost", "vmipam stopped", `"level":"error"`, "panic")
		s.exitReasons = append(s.exitReasons, fmt.Sprintf("vmipam #%d exited on its own at %s; last error lines:\n%s",
			s.starts, t0.Format(stamp), strings.Join(why, "\n")))
		mark(s.logs, "vmipam #%d found gone; restarting", s.starts)
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

// watchReplicas restarts, under its holder, a replica that exited though
// nobody stopped it, until ctx ends.
func (s *supervisor) watchReplicas(ctx context.Context) error {
	for harness.Sleep(ctx, 250*time.Millisecond) {
		if !s.mu.TryLock() {
			continue
		}
		var gone *harness.Replica
		for i, rep := range s.running {
			select {
			case <-rep.Done():
				gone = rep
				s.running = slices.Delete(s.running, i, i+1)
			default:
			}
			if gone != nil {
				break
			}
		}
		if gone == nil {
			s.mu.Unlock()
			continue
		}
		t0 := time.Now()
		s.ended(t0)
		s.selfExits++
		s.rs.Remove(gone)
		why := harness.Grep(s.logs.Since(s.startedAt), 3, "vmipam stopped", `"level":"error"`, "panic")
		s.exitReasons = append(s.exitReasons, fmt.Sprintf("replica %s exited on its own at %s; last error lines:\n%s",
			gone.Holder, t0.Format(stamp), strings.Join(why, "\n")))
		mark(s.logs, "replica %s found gone; restarting", gone.Holder)
		err := s.replaceReplica(ctx, gone, gone.Holder, t0)
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
	if s.rs != nil {
		for _, rep := range s.rs.Live() {
			rep.Kill()
		}
		_ = s.rs.Proxy.Close()
		s.rs, s.running = nil, nil
	}
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
	if err := harness.CopyDir(api.CertDir, keep); err != nil {
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
		harness.Sleep(ctx, time.Second)
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
		if !harness.Sleep(ctx, 100*time.Millisecond) {
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
