package replicas

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// vmRecord is what a client knows of one VirtualMachine it created.
type vmRecord struct {
	name string
	uid  types.UID
	addr netip.Addr
	// sent is when the create went out, resp when its successful answer
	// came back: the address was handed out in between.
	sent, resp time.Time
	// created is metadata.creationTimestamp (the API server's clock, whole
	// seconds).
	created time.Time
	// deleteIssued is taken just before the delete request: it precedes
	// the deletionTimestamp, hence the release.
	deleteIssued time.Time
}

// failure is a request that returned an error to its client.
type failure struct {
	op, name string
	sent, at time.Time
	err      error
}

// ledger records every create and delete of a test and checks each new
// holder of an address against the previous one as it arrives: a
// duplicate when the previous holder was never deleted, a reuse inside the
// cooldown when the answer came back before the previous holder's delete
// was even issued plus the cooldown (exact: the address was handed out
// before the answer, and released after the delete was issued).
type ledger struct {
	cooldown time.Duration
	// prefixes are the pool's, one per family: a VM must carry one
	// address of each.
	prefixes []netip.Prefix

	mu         sync.Mutex
	history    map[netip.Addr][]*vmRecord
	byName     map[string]*vmRecord
	creates    int
	deletes    int
	reuses     int
	failed     []failure
	violations []string
}

func newLedger(cooldown time.Duration, prefixes ...netip.Prefix) *ledger {
	return &ledger{cooldown: cooldown, prefixes: prefixes, history: map[netip.Addr][]*vmRecord{}, byName: map[string]*vmRecord{}}
}

// created records a successful create and checks the address's previous
// holder.
func (l *ledger) created(rec *vmRecord, vm *vmipamv1.VirtualMachine) {
	rec.uid = vm.UID
	rec.created = vm.CreationTimestamp.Time
	l.mu.Lock()
	defer l.mu.Unlock()
	l.creates++
	l.byName[rec.name] = rec
	if len(vm.Spec.Addresses) != len(l.prefixes) {
		l.violations = append(l.violations, fmt.Sprintf("NO ADDRESS: %s was created with addresses %v, want one in each of %v", rec.name, vm.Spec.Addresses, l.prefixes))
		return
	}
	var addrs []netip.Addr
	for _, p := range l.prefixes {
		i := slices.IndexFunc(vm.Spec.Addresses, func(s string) bool { a, err := netip.ParseAddr(s); return err == nil && p.Contains(a) })
		if i < 0 {
			l.violations = append(l.violations, fmt.Sprintf("BAD ADDRESS: %s was created with %v, none of them an address of %s", rec.name, vm.Spec.Addresses, p))
			return
		}
		addrs = append(addrs, netip.MustParseAddr(vm.Spec.Addresses[i]))
	}
	rec.addr = addrs[0]
	for _, a := range addrs {
		l.check(rec, a)
	}
}

// check records rec as the newest holder of a, checking the previous one.
func (l *ledger) check(rec *vmRecord, a netip.Addr) {
	h := l.history[a]
	if len(h) > 0 {
		l.reuses++
		prev := h[len(h)-1]
		switch {
		case prev.deleteIssued.IsZero():
			l.violations = append(l.violations, fmt.Sprintf(
				"DUPLICATE: %s handed to %s (answer at %s) while %s (created %s) holds it and was never deleted",
				a, rec.name, rec.resp.Format(stamp), prev.name, prev.resp.Format(stamp)))
		case rec.resp.Before(prev.deleteIssued.Add(l.cooldown)):
			l.violations = append(l.violations, fmt.Sprintf(
				"EARLY REUSE: %s handed to %s (answer at %s) %s after the delete of its previous holder %s was issued (at %s); cooldown %s",
				a, rec.name, rec.resp.Format(stamp), rec.resp.Sub(prev.deleteIssued).Round(time.Millisecond), prev.name,
				prev.deleteIssued.Format(stamp), l.cooldown))
		}
	}
	l.history[a] = append(h, rec)
}

// deleteIssued notes that rec's delete is about to be sent.
func (l *ledger) deleteIssued(rec *vmRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec.deleteIssued = time.Now()
}

// deleteIssuedFor notes that the delete of the VM name, if the ledger
// knows it, is about to be sent.
func (l *ledger) deleteIssuedFor(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec := l.byName[name]; rec != nil && rec.deleteIssued.IsZero() {
		rec.deleteIssued = time.Now()
	}
}

// deleteDone counts a delete the API server accepted.
func (l *ledger) deleteDone() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deletes++
}

// fail records a request that returned an error.
func (l *ledger) fail(op, name string, sent time.Time, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failed = append(l.failed, failure{op: op, name: name, sent: sent, at: time.Now(), err: err})
}

// failures returns the failed requests of op, in the order they failed.
func (l *ledger) failures(op string) []failure {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []failure
	for _, f := range l.failed {
		if f.op == op {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// counts returns the successful creates and deletes and the reuses.
func (l *ledger) counts() (creates, deletes, reuses int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.creates, l.deletes, l.reuses
}

// problems returns the violations found as the records arrived.
func (l *ledger) problems() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.violations)
}

// lateReuse checks each reuse against the observed end of the previous
// holder's deletion: a new holder's creationTimestamp (whole seconds) must
// not be earlier than the previous holder's disappearance, as a watch saw
// it, plus the cooldown, less 2s (1s for the truncation, 1s for the
// watch's latency and the moment between the release and the removal of
// the finalizer). It returns the violations and how many pairs it checked
// and could not check (no disappearance seen yet).
func (l *ledger) lateReuse(goneAt func(name string) (time.Time, bool)) (violations []string, checked, unchecked int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for a, h := range l.history {
		for i := 1; i < len(h); i++ {
			prev, next := h[i-1], h[i]
			at, ok := goneAt(prev.name)
			if !ok {
				unchecked++
				continue
			}
			checked++
			if next.created.Before(at.Add(l.cooldown - 2*time.Second)) {
				violations = append(violations, fmt.Sprintf(
					"REUSE INSIDE THE COOLDOWN: %s given to %s (creationTimestamp %s) %s after its previous holder %s was seen gone (at %s, %s after its delete was issued); cooldown %s",
					a, next.name, next.created.Format(time.RFC3339), next.created.Sub(at).Round(time.Millisecond), prev.name, at.Format(stamp),
					at.Sub(prev.deleteIssued).Round(time.Millisecond), l.cooldown))
			}
		}
	}
	sort.Strings(violations)
	return violations, checked, unchecked
}

// storm is a set of clients creating VirtualMachines, and deleting random
// ones of their own when maxOwn > 0, with no retry: every error counts.
type storm struct {
	s       *suite
	pool    string
	prefix  string // of the VMs' names
	led     *ledger
	maxOwn  int     // live VMs a client keeps at most; 0 deletes nothing
	deleteP float64 // chance that an operation is a delete
	think   time.Duration
	// dual: each VM asks for an address of both families
	// (RequireDualStack).
	dual bool

	wg   sync.WaitGroup
	stop context.CancelFunc
	// mu guards own, every client's live VMs.
	mu  sync.Mutex
	own map[int][]*vmRecord
}

// start runs clients until the returned stop is called; stop waits for
// the clients' last requests.
func (st *storm) start(clients int) (stop func()) {
	ctx, cancel := context.WithCancel(st.s.ctx)
	st.stop = cancel
	st.own = map[int][]*vmRecord{}
	for i := range clients {
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(i)+1)) //nolint:gosec // test randomness
		st.wg.Go(func() { st.client(ctx, i, rng) })
	}
	return func() {
		cancel()
		st.wg.Wait()
	}
}

// client runs one client until ctx ends. Its requests are bounded by the
// test's context, not ctx, so that stopping the storm does not cut one in
// flight.
func (st *storm) client(ctx context.Context, id int, rng *rand.Rand) {
	for i := 0; ctx.Err() == nil; i++ {
		st.mu.Lock()
		own := st.own[id]
		st.mu.Unlock()
		if st.maxOwn > 0 && len(own) > 0 && (len(own) >= st.maxOwn || rng.Float64() < st.deleteP) {
			k := rng.IntN(len(own))
			rec := own[k]
			st.mu.Lock()
			own[k] = own[len(own)-1]
			st.own[id] = own[:len(own)-1]
			st.mu.Unlock()
			st.remove(rec)
		} else if rec := st.create(fmt.Sprintf("%s-%02d-%05d", st.prefix, id, i)); rec != nil {
			st.mu.Lock()
			st.own[id] = append(st.own[id], rec)
			st.mu.Unlock()
		}
		if st.think > 0 {
			sleep(ctx, time.Duration(rng.Int64N(int64(2*st.think))))
		}
	}
}

func (st *storm) create(name string) *vmRecord {
	rec := &vmRecord{name: name, sent: time.Now()}
	var mutate []func(*vmipamv1.VirtualMachine)
	if st.dual {
		mutate = append(mutate, func(vm *vmipamv1.VirtualMachine) { vm.Spec.IPFamilyPolicy = ptr.To(vmipamv1.RequireDualStack) })
	}
	vm, err := st.s.create(st.s.ctx, name, st.pool, mutate...)
	if err != nil {
		st.led.fail("create", name, rec.sent, err)
		return nil
	}
	rec.resp = time.Now()
	st.led.created(rec, vm)
	return rec
}

func (st *storm) remove(rec *vmRecord) {
	st.led.deleteIssued(rec)
	sent := time.Now()
	rctx, cancel := context.WithTimeout(st.s.ctx, 30*time.Second)
	defer cancel()
	err := st.s.c.Delete(rctx, &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: st.s.ns, Name: rec.name}})
	if err != nil {
		st.led.fail("delete", rec.name, sent, fmt.Errorf("delete %s: %w", rec.name, err))
		return
	}
	st.led.deleteDone()
}

// tracker watches the namespace and notes when each VirtualMachine
// disappears, i.e. when its deletion completed: vmipam released its
// address and removed the finalizer.
type tracker struct {
	c  client.WithWatch
	ns string

	mu   sync.Mutex
	gone map[string]time.Time
}

func newTracker(c client.WithWatch, ns string) *tracker {
	return &tracker{c: c, ns: ns, gone: map[string]time.Time{}}
}

// run watches until ctx ends, from a fresh list whenever the watch breaks
// (a disappearance during a break is not recorded: its time is unknown).
func (tr *tracker) run(ctx context.Context) {
	for ctx.Err() == nil {
		var l vmipamv1.VirtualMachineList
		if err := tr.c.List(ctx, &l, client.InNamespace(tr.ns)); err != nil {
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		tr.watch(ctx, l.ResourceVersion)
	}
}

func (tr *tracker) watch(ctx context.Context, rv string) {
	w, err := tr.c.Watch(ctx, &vmipamv1.VirtualMachineList{}, client.InNamespace(tr.ns),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
	if err != nil {
		sleep(ctx, 200*time.Millisecond)
		return
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok || ev.Type == watch.Error {
				return
			}
			if vm, isVM := ev.Object.(*vmipamv1.VirtualMachine); isVM && ev.Type == watch.Deleted {
				tr.mu.Lock()
				tr.gone[vm.Name] = time.Now()
				tr.mu.Unlock()
			}
		}
	}
}

// goneAt returns when name was seen to disappear.
func (tr *tracker) goneAt(name string) (time.Time, bool) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	at, ok := tr.gone[name]
	return at, ok
}

// summarize keeps the first n messages and says how many more there were.
func summarize(msgs []string, n int) string {
	if len(msgs) <= n {
		return strings.Join(msgs, "\n")
	}
	return strings.Join(msgs[:n], "\n") + fmt.Sprintf("\n... and %d more", len(msgs)-n)
}

// failureLines describes failures relative to a moment.
func failureLines(fs []failure, since time.Time, n int) []string {
	var out []string
	for _, f := range fs {
		msg := f.err.Error()
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		out = append(out, fmt.Sprintf("%s %s: sent at %+.3fs, failed at %+.3fs: %s", f.op, f.name,
			f.sent.Sub(since).Seconds(), f.at.Sub(since).Seconds(), msg))
	}
	if len(out) > n {
		out = append(out[:n], fmt.Sprintf("... and %d more", len(out)-n))
	}
	return out
}

// isExhausted reports whether err is vmipam's refusal of an exhausted pool.
func isExhausted(err error) bool {
	return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "is exhausted")
}
