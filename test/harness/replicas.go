package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/vmipam/vmipam/pools"
	"github.com/vmipam/vmipam/test/lbproxy"
)

// Replicas is several vmipam processes serving the webhook behind one
// address, the stand-in for a Deployment's pods behind their Service: a
// round-robin TCP proxy (test/lbproxy) on the Cluster's WebhookPort,
// where the webhook configurations point, forwards each connection of the
// API server to a replica whose /readyz passes. It balances connections,
// not requests, and notices readiness within about 100 ms, much sooner than
// kube-proxy would; see test/lbproxy for how else it differs.
//
// The replicas share the Cluster's kubeconfig, namespace and self-managed
// certificate. Its methods are safe for concurrent use.
type Replicas struct {
	// Proxy is the stand-in Service; its Status has each backend's
	// readiness and connection counts.
	Proxy *lbproxy.Proxy

	c       *Cluster
	logsFor func(i int) io.Writer
	extra   []string

	mu      sync.Mutex
	started int          // Index of the next replica
	all     []*Replica   // those that became ready
	used    map[int]bool // ports handed out, never reused while Replicas runs
}

// Replica is one vmipam process of Replicas: Kill and Stop are its
// Process's.
type Replica struct {
	*Process
	// Index is the replica's place in the order processes were started,
	// from 0: logsFor was called with it, and the default holder is
	// vmipam-<Index>.
	Index int
	// Holder is the name of its claims in the pools: its --holder, or,
	// with --holder-slots, the slot it took.
	Holder string
	// Name is its --holder: with --holder-slots the process's name on
	// its slot's Lease (a pod's name), else Holder.
	Name string
	// WebhookPort, MetricsPort, ProbePort and PprofPort (net/http/pprof,
	// for heap and CPU profiles) are its own ports on 127.0.0.1.
	WebhookPort, MetricsPort, ProbePort, PprofPort int

	r *Replicas
	// removed is its backend's last status once it left the proxy.
	removed *lbproxy.BackendStatus
}

// StartReplicas starts the proxy on the Cluster's WebhookPort and n vmipam
// replicas at once, as a Deployment's rollout does, with holders vmipam-0
// to vmipam-<n-1>, each logging to logsFor(i) (nil or a nil writer
// discards; writers shared between replicas must be safe for concurrent
// use) and run with vmipam's flags for the harness plus extra. It returns
// once every replica is ready and in rotation. The proxy logs through
// controller-runtime's logger (SetTestLogger).
func (c *Cluster) StartReplicas(ctx context.Context, n int, logsFor func(i int) io.Writer, extra ...string) (*Replicas, error) {
	if n < 1 {
		return nil, fmt.Errorf("start %d replicas: want at least one", n)
	}
	p, err := lbproxy.Listen(net.JoinHostPort("127.0.0.1", strconv.Itoa(c.WebhookPort)),
		lbproxy.Options{Log: logf.Log.WithName("lbproxy")})
	if err != nil {
		return nil, fmt.Errorf("start the proxy: %w", err)
	}
	r := &Replicas{Proxy: p, c: c, logsFor: logsFor, extra: slices.Clone(extra),
		used: map[int]bool{c.WebhookPort: true, c.MetricsPort: true, c.ProbePort: true}}
	g, gctx := errgroup.WithContext(ctx)
	for range n {
		g.Go(func() error {
			_, err := r.Start(gctx, "")
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, errors.Join(err, r.Stop(10*time.Second))
	}
	return r, nil
}

// Start starts one more replica on ports of its own with holder (""
// gives vmipam-<Index>), puts it in rotation at once, as a new pod's
// endpoint is listed before it is ready, and returns once it is ready and
// the proxy has seen it so. A holder another live replica has is allowed:
// what vmipam makes of two processes claiming under one name is for the
// caller to find out.
func (r *Replicas) Start(ctx context.Context, holder string) (*Replica, error) {
	pt, err := r.ports()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	rep := &Replica{Index: r.started, Holder: holder, WebhookPort: pt.webhook, MetricsPort: pt.metrics, ProbePort: pt.probe, PprofPort: pt.pprof, r: r}
	r.started++
	r.mu.Unlock()
	if rep.Holder == "" {
		rep.Holder = "vmipam-" + strconv.Itoa(rep.Index)
	}
	rep.Name = rep.Holder
	logs := io.Discard
	if r.logsFor != nil {
		if w := r.logsFor(rep.Index); w != nil {
			logs = w
		}
	}
	if err := r.Proxy.Add(rep.backend()); err != nil {
		return nil, err
	}
	rep.Process, err = r.c.startVMIPAM(ctx, pt, rep.Name, logs, r.extra)
	if err == nil && r.Slots() {
		rep.Holder, err = r.c.SlotOf(ctx, rep.Name)
	}
	if err == nil {
		err = r.waitInRotation(ctx, rep)
	}
	if err != nil {
		if rep.Process != nil {
			rep.Kill()
		}
		_, _ = r.Proxy.Remove(rep.Addr())
		return nil, fmt.Errorf("replica %d (%s): %w", rep.Index, rep.Holder, err)
	}
	r.mu.Lock()
	r.all = append(r.all, rep)
	r.mu.Unlock()
	return rep, nil
}

// Slots reports whether the replicas run with --holder-slots.
func (r *Replicas) Slots() bool { return slices.Contains(r.extra, "--holder-slots") }

// SlotOf returns the holder slot process holds, as its Lease says.
func (c *Cluster) SlotOf(ctx context.Context, process string) (string, error) {
	var list coordinationv1.LeaseList
	if err := c.Client.List(ctx, &list, client.InNamespace(Namespace), client.MatchingLabels{pools.SlotLabel: "true"}); err != nil {
		return "", fmt.Errorf("list the slot Leases: %w", err)
	}
	for _, l := range list.Items {
		if l.Annotations[pools.ProcessAnnotation] == process && ptr.Deref(l.Spec.HolderIdentity, "") != "" {
			return ptr.Deref(l.Spec.HolderIdentity, ""), nil
		}
	}
	return "", fmt.Errorf("no slot Lease names process %s", process)
}

// waitInRotation waits for the proxy's next probe of a ready replica.
func (r *Replicas) waitInRotation(ctx context.Context, rep *Replica) error {
	var s lbproxy.BackendStatus
	var ok bool
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		s, ok = r.Proxy.Backend(rep.Addr())
		return ok && s.Ready, nil
	})
	switch {
	case err == nil:
		return nil
	case !ok:
		return errors.New("not a backend of the proxy")
	default:
		return fmt.Errorf("ready, but not for the proxy: %s: %w", s.ProbeError, err)
	}
}

// Add puts rep back in rotation (it receives connections once the proxy
// sees it ready); it fails if rep is in rotation already.
func (r *Replicas) Add(rep *Replica) error {
	if err := r.Proxy.Add(rep.backend()); err != nil {
		return err
	}
	r.mu.Lock()
	rep.removed = nil
	r.mu.Unlock()
	return nil
}

// Remove takes rep out of rotation, as the endpoints controller does with a
// terminating pod; the connections it has stay open until one side closes
// them. It returns the proxy's last status of it, and false if it was not
// in rotation.
func (r *Replicas) Remove(rep *Replica) (lbproxy.BackendStatus, bool) {
	s, ok := r.Proxy.Remove(rep.Addr())
	if ok {
		r.mu.Lock()
		rep.removed = &s
		r.mu.Unlock()
	}
	return s, ok
}

// Replace replaces old as a rollout does. With a holder other than old's
// (a Deployment's new pod), the replacement starts first on ports of its
// own, and old leaves rotation and gets SIGTERM (stopTimeout, then SIGKILL)
// only once the replacement is in rotation. With old's holder (a
// StatefulSet's pod), old leaves and stops first, so that two live
// processes never claim under one name. With --holder-slots (a Deployment
// rolled with maxSurge 0), old leaves and gets SIGTERM, and the
// replacement starts at once, as the Deployment creates it; it takes
// old's slot once old released it. old may have exited already.
func (r *Replicas) Replace(ctx context.Context, old *Replica, holder string, stopTimeout time.Duration) (*Replica, error) {
	retire := func() error {
		_, _ = r.Remove(old)
		if old.exited() {
			return nil
		}
		if err := old.Stop(stopTimeout); err != nil {
			return fmt.Errorf("stop replica %d (%s): %w", old.Index, old.Holder, err)
		}
		return nil
	}
	if holder == old.Holder {
		if err := retire(); err != nil {
			return nil, err
		}
		return r.Start(ctx, holder)
	}
	if r.Slots() {
		_, _ = r.Remove(old)
		stopped := make(chan error, 1)
		go func() {
			if old.exited() {
				stopped <- nil
				return
			}
			stopped <- old.Stop(stopTimeout)
		}()
		rep, err := r.Start(ctx, holder)
		if serr := <-stopped; serr != nil {
			err = errors.Join(err, fmt.Errorf("stop replica %d (%s): %w", old.Index, old.Holder, serr))
		}
		return rep, err
	}
	rep, err := r.Start(ctx, holder)
	if err != nil {
		return nil, err
	}
	return rep, retire()
}

// RollingRestart replaces every live replica in rotation, one after the
// other in Index order, as `kubectl rollout restart` does: with fresh
// holder names (a Deployment) unless sameHolder (a StatefulSet); see
// Replace. It returns the replacements.
func (r *Replicas) RollingRestart(ctx context.Context, sameHolder bool, stopTimeout time.Duration) ([]*Replica, error) {
	var out []*Replica
	for _, old := range r.InRotation() {
		if old.exited() {
			continue
		}
		holder := ""
		if sameHolder {
			holder = old.Holder
		}
		rep, err := r.Replace(ctx, old, holder, stopTimeout)
		if err != nil {
			return out, err
		}
		out = append(out, rep)
	}
	return out, nil
}

// All returns every replica that became ready, in Index order, exited
// ones too.
func (r *Replicas) All() []*Replica {
	r.mu.Lock()
	out := slices.Clone(r.all)
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b *Replica) int { return a.Index - b.Index })
	return out
}

// Live returns the replicas whose process has not exited, in Index order.
func (r *Replicas) Live() []*Replica {
	return slices.DeleteFunc(r.All(), func(rep *Replica) bool { return rep.exited() })
}

// InRotation returns the replicas the proxy has as backends (ready or
// not), in Index order.
func (r *Replicas) InRotation() []*Replica {
	return slices.DeleteFunc(r.All(), func(rep *Replica) bool {
		_, ok := r.Proxy.Backend(rep.Addr())
		return !ok
	})
}

// Stop stops every live replica at once with SIGTERM (timeout, then
// SIGKILL) and then the proxy.
func (r *Replicas) Stop(timeout time.Duration) error {
	var g errgroup.Group
	for _, rep := range r.Live() {
		g.Go(func() error {
			if err := rep.Stop(timeout); err != nil {
				return fmt.Errorf("stop replica %d (%s): %w", rep.Index, rep.Holder, err)
			}
			return nil
		})
	}
	err := g.Wait()
	return errors.Join(err, r.Proxy.Close())
}

// ports picks four free ports no replica has had.
func (r *Replicas) ports() (ports, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var got []int
	for tries := 0; len(got) < 4; tries++ {
		if tries == 100 {
			return ports{}, errors.New("find free ports: the kernel keeps handing out ports already used")
		}
		p, err := FreePort()
		if err != nil {
			return ports{}, err
		}
		if !r.used[p] {
			r.used[p] = true
			got = append(got, p)
		}
	}
	return ports{webhook: got[0], metrics: got[1], probe: got[2], pprof: got[3]}, nil
}

// Addr is the replica's webhook address, its backend in the proxy.
func (rep *Replica) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(rep.WebhookPort))
}

func (rep *Replica) backend() lbproxy.Backend {
	return lbproxy.Backend{Name: rep.Holder, Addr: rep.Addr(),
		ReadyURL: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(rep.ProbePort)) + "/readyz"}
}

// Metrics returns the replica's /metrics text.
func (rep *Replica) Metrics() (string, error) {
	_, body, err := rep.r.c.Get("http://127.0.0.1:" + strconv.Itoa(rep.MetricsPort) + "/metrics")
	return body, err
}

// Connections is how many connections the proxy has forwarded to the
// replica since it was last put in rotation (up to its removal, once
// removed).
func (rep *Replica) Connections() int64 {
	if s, ok := rep.r.Proxy.Backend(rep.Addr()); ok {
		return s.Connections
	}
	rep.r.mu.Lock()
	defer rep.r.mu.Unlock()
	if rep.removed != nil {
		return rep.removed.Connections
	}
	return 0
}

func (rep *Replica) exited() bool {
	select {
	case <-rep.Done():
		return true
	default:
		return false
	}
}
