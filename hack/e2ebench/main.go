// Command e2ebench is vmipam's end-to-end load generator. On a local control
// plane (envtest's kube-apiserver and etcd, the vmipam binary serving its
// webhooks over TLS, see test/harness) it creates N VirtualMachines from C
// concurrent clients four ways, in alternating rounds so that machine noise
// hits them alike (in the declared order in odd rounds, reversed in even
// ones):
//
//   - with vmipam: vmipam's mutating webhook in the path (its one call per
//     create; it validates VirtualMachines inside the API server, with CRD
//     validation rules and a ValidatingAdmissionPolicy), the address
//     allocated from an IPPool;
//   - without: in a namespace the webhooks exclude, with a static address
//     outside every pool, so vmipam neither admits nor manages them;
//   - no-op mutating webhook: like without, but through one mutating
//     webhook that e2ebench serves itself and that does nothing but allow
//     with a patch adding an annotation and a finalizer (which a controller
//     in e2ebench removes on delete): the floor of what one mutating
//     webhook call per create, and a delete through a finalizer, cost,
//     against which vmipam's own cost shows (with -noop-process the server
//     and the remover run as a process of their own, this program started
//     under the name noopwebhook);
//   - baseline: whereabouts-style IPAM, a read-modify-write of one ConfigMap
//     holding every allocation (retrying on conflict), then the create.
//
// It reports throughput, client-side create latency, the webhook's own
// server-side latency from vmipam's metrics and the CPU each process spent.
// Those rounds saturate the machine, so it then measures the webhooks
// again at a steady, lower load: -paced-n more creates with vmipam at a
// fixed rate (by default half the throughput with vmipam just measured;
// the report says how busy the machine still was), from the same C
// clients on an open-loop schedule (create i is due at t0 + i/rate; a
// client that falls behind starts late and records the lateness, it skips
// nothing). It deletes those and waits until their addresses are free
// again, then deletes every other VirtualMachine and times deletion and
// the return of every address to the free state after cooldown. Results go
// to stdout and, as a markdown table and a PNG chart, to the results
// folder.
//
// Run it through `make bench`, which sets KUBEBUILDER_ASSETS.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

type options struct {
	n, c, rounds int
	baselineN    int
	warmup       int
	poolCIDR     string
	cooldown     time.Duration
	results      string
	repo         string
	clients      string
	vmipamArgs   string
	vmipamEnv    string
	cacheCheck   bool
	apiserverGC  bool
	freeTimeout  time.Duration
	profile      time.Duration
	// noop: whether to measure the no-op mutating webhook.
	noop bool
	// noopStamp: the no-op webhook writes as much metadata as vmipam.
	noopStamp bool
	// noopService: in the scale mode, the no-op webhook sits behind a
	// stand-in for its Service, as vmipam's replicas do.
	noopService bool
	// noopProcess: the no-op server and finalizer remover run as a
	// process of their own (see -noop-process).
	noopProcess bool
	// pacedRate: the steady-rate phase's creates per second; 0: half the
	// throughput with vmipam of the saturated rounds; negative: no phase.
	pacedRate float64
	pacedN    int
	// replicas and replicasN: the replicas phase's layout and creates.
	replicas, replicasN int
	// historyN: the history phase's creates per setting; 0: no phase.
	historyN int
	// fleet: the scale mode's fleet; 0: no scale mode. scaleResync is
	// its replicas' resync interval; slots, whether they run with
	// --holder-slots (vmipam before holder slots has no such flag).
	fleet       int
	scaleResync time.Duration
	// probePeriod: the stand-in Service's readiness probes in the scale
	// mode but for the replacement and the rollout (see -probe-period).
	probePeriod time.Duration
	slots       bool
}

// noopBehindService reports whether the no-op webhook's server sits
// behind a stand-in for its Service (see -noop-service).
func (o *options) noopBehindService() bool { return o.noop && o.noopService && o.fleet > 0 }

// cpuProcs returns the processes whose CPU time the report shows: the
// no-op webhook's own process and its stand-in Service too when they run.
func (o *options) cpuProcs() []string {
	procs := slices.Clone(cpuProcs)
	if o.noop && o.noopProcess {
		procs = append(procs, noopProcessComm)
	}
	if o.noopBehindService() {
		procs = append(procs, noopProxyComm)
	}
	return procs
}

// paced reports whether the steady-rate phase runs.
func (o *options) paced() bool { return o.pacedRate >= 0 }

// enabled reports whether mode m takes part in the run at all (the
// baseline does, in the warm-up, even with -baseline-n 0).
func (o *options) enabled(m mode) bool {
	return m != modeNoop || o.noop
}

func main() {
	if filepath.Base(os.Args[0]) == noopProcessComm {
		if err := runNoopProcess(os.Args[1:]); err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", noopProcessComm, err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.IntVar(&o.n, "n", 3000, "VirtualMachines to create with vmipam, and again without it and through the no-op mutating webhook (split across the rounds).")
	flag.IntVar(&o.c, "c", 32, "Concurrent clients.")
	flag.IntVar(&o.rounds, "rounds", 3, "Alternating rounds per mode (with, without, no-op, baseline; every other round in the reverse order).")
	flag.IntVar(&o.baselineN, "baseline-n", 300, "VirtualMachines to create through the read-modify-write baseline (it is slow; throughput is per second, so a smaller N compares fairly).")
	flag.IntVar(&o.warmup, "warmup", 64, "VirtualMachines per mode created and deleted before measuring (connections, caches, the allocator's free list).")
	flag.StringVar(&o.poolCIDR, "pool-cidr", "10.64.0.0/18", "The IPPool's range; its size bounds N. The static addresses of the runs without vmipam, of the baseline and of the no-op mutating webhook come from /16s in 198.18.0.0/15 and 100.64.0.0/10, which it must not overlap.")
	flag.DurationVar(&o.cooldown, "cooldown", 10*time.Second, "The IPPool's cooldown: how long a released address rests before it is free again.")
	flag.StringVar(&o.results, "results", "results", "Folder for e2e-bench.md, e2e-bench.png and vmipam's log, relative to -repo unless absolute.")
	flag.StringVar(&o.repo, "repo", ".", "The vmipam repository (built and run as the binary under test).")
	flag.StringVar(&o.clients, "clients", "per-worker", "per-worker: each client has its own HTTP/2 connection to the API server; shared: all clients multiplex one connection.")
	flag.DurationVar(&o.freeTimeout, "free-timeout", 2*time.Minute, "How long, beyond the cooldown, to wait for every address to be free after the deletes.")
	flag.DurationVar(&o.profile, "profile", 0, "When set, CPU profiles of kube-apiserver, of vmipam and of this program (e2e-bench-e2ebench-<mode>.pprof: its clients, the no-op webhook server and finalizer remover, the stand-in Service) this long (whole seconds; in the scale mode also over the idle resync interval, into e2e-bench-{apiserver,vmipam}-idle*.pprof) are taken from the start of each mode's first round, into e2e-bench-{apiserver,vmipam}-<mode>.pprof, and from the start of each mode's deletes, into e2e-bench-{apiserver,vmipam}-delete-<mode>.pprof; the rounds and the deletes should last longer (see -n). The report then splits the API server's profiles of the first round with vmipam and through the no-op webhook by part (the admission policies, the mutating call, validation, the store, watches, its collector), per create.")
	flag.BoolVar(&o.noopStamp, "noop-stamp", false, "The no-op mutating webhook also writes two annotations and a label about as long as vmipam's stamp writes (its token and address annotations, its holder label; its own annotation stands in for vmipam's pool annotation), under keys of its own: a floor whose stored objects are as large as vmipam's, so that with / no-op leaves out what the stamp's size costs the API server and etcd (not the stamp's admission policy, which the no-op objects do not go through).")
	flag.BoolVar(&o.noopService, "noop-service", true, "In the scale mode, where vmipam's replicas sit behind this program's stand-in for their Service (a user-space proxy, where a cluster has kube-proxy forward in the kernel), the no-op webhook's server sits behind one too, so that both modes pay the same hop: hack/lbproxy, the same proxy, run as a process of its own with the no-op server as its one backend, so that its CPU is counted apart (the lbproxy row) and not in the no-op server and finalizer remover's figure. false: the no-op server is reached directly, as in the runs before this flag; the other modes never go through a stand-in.")
	flag.BoolVar(&o.noopProcess, "noop-process", false, "The no-op webhook's server and finalizer remover run as a process of their own (this program under the name "+noopProcessComm+", its CPU a row of its own and the no-op figure of the goals), as a webhook in a Pod of its own runs, instead of inside this program, where they share the busy runtime of its clients (its scheduler's wake-ups and collector) and their CPU is e2ebench's in the no-op rounds less its CPU in the rounds without vmipam. -profile profiles that process too, into e2e-bench-"+noopProcessComm+"-<mode>.pprof.")
	flag.BoolVar(&o.noop, "noop", true, "Also measure a no-op mutating webhook: creates without vmipam, through one mutating webhook that e2ebench serves and that only allows, adding an annotation and a finalizer (the floor of one webhook call per create, and of a delete through a finalizer).")
	flag.Float64Var(&o.pacedRate, "paced-rate", 0, "Creates per second with vmipam in the steady-rate phase after the saturated rounds, where the webhooks' latency is measured again at a fixed load below saturation; 0: half the throughput with vmipam just measured; negative: no such phase.")
	flag.IntVar(&o.pacedN, "paced-n", 1500, "VirtualMachines to create with vmipam in the steady-rate phase (see -paced-rate).")
	flag.IntVar(&o.replicas, "replicas", 3, "After the deletes, compare one vmipam process with this many replicas behind a stand-in for the Service, in alternating rounds; below 2: no such phase.")
	flag.IntVar(&o.replicasN, "replicas-n", 1500, "VirtualMachines to create with each layout in the replicas phase (see -replicas).")
	flag.IntVar(&o.historyN, "history-n", 1500, "After the deletes, VirtualMachines to create and delete with vmipam's address history on, and again with it off (--no-history), in alternating rounds; 0: no such phase.")
	flag.IntVar(&o.fleet, "fleet", 0, "The scale mode (make bench-scale): vmipam runs as 3 replicas, a fleet of this many VirtualMachines is created through them first, then memory per VM, an idle resync interval, a replica's replacement and a rolling restart are measured, and the rounds run with the fleet present; the deletes and the history and replicas phases do not run. 0: no scale mode. The pool must hold the fleet (-pool-cidr).")
	flag.DurationVar(&o.scaleResync, "scale-resync", time.Minute, "The scale mode's --resync-interval, and the idle window measured as one resync interval.")
	flag.DurationVar(&o.probePeriod, "probe-period", deployedProbePeriod, "In the scale mode, how often the stand-in for the Service probes each replica's readiness in the idle interval, the rounds and the steady-rate phase: by default the Deployment's readinessProbe period, as a kubelet would. The replacement and the rolling restart probe every 100 ms, so that their times are not rounded up to a period. 0: every 100 ms throughout.")
	flag.BoolVar(&o.slots, "slots", true, "In the scale mode, run the replicas with --holder-slots (false for a vmipam that predates it, with -repo).")
	flag.StringVar(&o.vmipamArgs, "vmipam-args", "", "Extra flags for the vmipam binary, space-separated (e.g. --enable-http2).")
	flag.BoolVar(&o.cacheCheck, "cache-check", true, "Leave the API server's watch-cache consistency check on (feature gate DetectCacheInconsistency, on by default since Kubernetes 1.34): every 5 to 7.5 minutes it lists every object of each resource from etcd and compares it with its cache, which at a large fleet is seconds of the API server's CPU in whichever round it lands (make bench-scale sets it false). The report counts the checks of VirtualMachines either way.")
	flag.BoolVar(&o.apiserverGC, "apiserver-gc", false, "Before each round, run the API server's garbage collector (GET /debug/pprof/heap?gc=1), so that none of its collections lands in a round: with a large fleet in its heap one costs it seconds of CPU in whichever round it falls, whatever the mode (make bench-scale sets it). What each forced collection cost the API server is reported beside its round, outside the round's figures.")
	flag.StringVar(&o.vmipamEnv, "vmipam-env", "", "Extra environment for the vmipam processes only, space-separated NAME=value (e.g. GOGC=400); the control plane and this program keep theirs.")
	flag.Parse()
	// The stand-in Service logs through controller-runtime's logger; the
	// report says what the benchmark needs.
	ctrllog.SetLogger(logr.Discard())
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "e2ebench:", err)
		os.Exit(1)
	}
}

func (o *options) validate() error {
	switch {
	case o.n < 1, o.c < 1, o.rounds < 1, o.baselineN < 0, o.warmup < 0:
		return errors.New("-n, -c and -rounds must be positive, -baseline-n and -warmup not negative")
	case o.n < o.rounds || (o.baselineN > 0 && o.baselineN < o.rounds):
		return fmt.Errorf("-n (%d) and -baseline-n (%d) must be at least -rounds (%d)", o.n, o.baselineN, o.rounds)
	case o.clients != "per-worker" && o.clients != "shared":
		return fmt.Errorf("-clients=%q: use per-worker or shared", o.clients)
	case o.historyN < 0:
		return errors.New("-history-n must not be negative")
	case o.fleet < 0:
		return errors.New("-fleet must not be negative")
	case o.fleet > 0 && o.scaleResync < 10*time.Second:
		return errors.New("-scale-resync must be at least 10s")
	case o.probePeriod < 0:
		return errors.New("-probe-period must not be negative")
	case o.cooldown <= 0:
		return errors.New("-cooldown must be positive")
	case math.IsNaN(o.pacedRate) || math.IsInf(o.pacedRate, 0):
		return fmt.Errorf("-paced-rate=%v: want a number of creates per second", o.pacedRate)
	case o.paced() && o.pacedN < 1:
		return errors.New("-paced-n must be positive unless -paced-rate is negative")
	}
	p, err := netip.ParsePrefix(o.poolCIDR)
	if err != nil || !p.Addr().Is4() || p != p.Masked() {
		return fmt.Errorf("-pool-cidr=%q: want an IPv4 network such as 10.64.0.0/18", o.poolCIDR)
	}
	// Network and broadcast addresses are not handed out. The
	// steady-rate phase's VirtualMachines live alongside the saturated
	// rounds' ones until the phase deletes them.
	usable := 1<<(32-p.Bits()) - 2
	need, what := o.n+2*o.warmup, "-n plus the warm-up"
	if o.fleet > 0 {
		// And the warm-up after the rolling restart, which stays.
		need, what = need+o.fleet+o.warmup, "-fleet, -n plus the warm-ups"
	}
	if o.paced() {
		need, what = need+o.pacedN, "-n, -paced-n and the warm-up"
	}
	if o.replicas >= 2 && o.fleet == 0 {
		// The deletes before the phase leave their addresses cooling.
		need, what = need+2*(o.replicasN+o.rounds*min(o.warmup, 64)), what+" and the replicas phase"
	}
	if o.historyN > 0 && o.fleet == 0 {
		// A round's deletes leave its addresses cooling into the next.
		need, what = need+2*((o.historyN+o.rounds-1)/o.rounds+min(o.warmup, 64)), what+" and the history phase"
	}
	if usable < need {
		return fmt.Errorf("-pool-cidr %s has %d usable addresses; %s need %d", p, usable, what, need)
	}
	for _, r := range staticRanges {
		if p.Overlaps(r) {
			return fmt.Errorf("-pool-cidr %s overlaps %s, which the runs without vmipam take static addresses from", p, r)
		}
	}
	if o.n+o.warmup > staticRange || o.baselineN+o.warmup > staticRange {
		return fmt.Errorf("at most %d VirtualMachines per mode (the static ranges are /16s)", staticRange-o.warmup)
	}
	return nil
}

func run(o options) error {
	if err := o.validate(); err != nil {
		return err
	}
	root, err := filepath.Abs(o.repo)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		return fmt.Errorf("-repo %s is not the vmipam repository: %w", root, err)
	}
	results := o.results
	if !filepath.IsAbs(results) {
		results = filepath.Join(root, results)
	}
	if err := os.MkdirAll(results, 0o755); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	b := &bench{opts: o, root: root, results: results}
	rep, err := b.run(ctx)
	if err != nil {
		return err
	}
	md := rep.markdown()
	fmt.Println(md)
	mdPath := filepath.Join(results, "e2e-bench.md")
	if err := os.WriteFile(mdPath, []byte(md), 0o644); err != nil {
		return err
	}
	pngPath := filepath.Join(results, "e2e-bench.png")
	if err := writeChart(pngPath, rep); err != nil {
		return fmt.Errorf("write chart: %w", err)
	}
	logf("wrote %s and %s", mdPath, pngPath)
	return nil
}

// logf reports progress on stderr; stdout carries only the results.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s e2ebench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}
