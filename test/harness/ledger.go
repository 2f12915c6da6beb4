package harness

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// This file is the load suites' toolkit (test/chaos, test/replicas): a
// Ledger of the VirtualMachines their clients create and delete, a Tracker
// of when each one was seen gone, Fill to fill a pool, and CopyDir. The
// ledger and the tracker judge vmipam from what the API server told the
// clients and the watch, never from vmipam's memory.

// Stamp is the time format of the suites' messages.
const Stamp = "15:04:05.000"

// Record is what a client knows of one VirtualMachine it created. The
// client sets Name, Sent and Resp (and ViaGet) before it hands the record
// to Ledger.Created; the ledger sets the rest.
type Record struct {
	Name string
	UID  types.UID
	// Addrs are the VM's addresses, one per family, in the order of the
	// VM's spec; none when they were not what the pool hands out.
	Addrs []netip.Addr
	// Sent is when the (first) create went out, Resp when its successful
	// answer (or the Get that found the object after an ambiguous failure)
	// came back: the address was handed out in between.
	Sent, Resp time.Time
	// Created is metadata.creationTimestamp: the API server's clock, whole
	// seconds.
	Created time.Time
	// ViaGet: the create's answer was lost (timeout, API server gone) and
	// a Get found the object.
	ViaGet bool
	// DeleteIssued is taken just before the (first) delete request: it
	// precedes the deletionTimestamp, hence the release.
	DeleteIssued time.Time
}

// Failure is a request that returned an error to its client.
type Failure struct {
	Op, Name string
	Sent, At time.Time
	Err      error
}

// Kinds of problem a Ledger finds as the records arrive.
const (
	// Duplicate: an address handed to a new VM while its previous holder
	// was never deleted.
	Duplicate = "DUPLICATE"
	// EarlyReuse: an address handed out again before the previous
	// holder's delete was even issued plus the cooldown (exact: the
	// address was handed out before the answer, and released after the
	// delete was issued).
	EarlyReuse = "EARLY REUSE"
	// NoAddress: a VM created without one address of each family.
	NoAddress = "NO ADDRESS"
	// BadAddress: a VM created with an address the pool does not hand
	// out, or two of one family.
	BadAddress = "BAD ADDRESS"
)

type problem struct{ kind, msg string }

// Ledger records every create and delete of a load and checks each new
// holder of an address against the previous one as it arrives (Duplicate,
// EarlyReuse), and each VM's addresses against the pool (NoAddress,
// BadAddress). Its methods are safe for concurrent use.
type Ledger struct {
	cooldown time.Duration
	families int
	space    Space

	mu       sync.Mutex
	byName   map[string]*Record
	history  map[netip.Addr][]*Record
	creates  int
	deletes  int
	reuses   int
	failed   []Failure
	problems []problem
}

// NewLedger returns a ledger for a pool that hands out the addresses of
// space, families of them (one per family) to each VM, with a cooldown.
func NewLedger(cooldown time.Duration, families int, space Space) *Ledger {
	return &Ledger{cooldown: cooldown, families: families, space: space,
		byName: map[string]*Record{}, history: map[netip.Addr][]*Record{}}
}

// Cooldown is the pool's cooldown the ledger judges reuses by.
func (l *Ledger) Cooldown() time.Duration { return l.cooldown }

// Created records a successful create of vm and checks each of its
// addresses' previous holder.
func (l *Ledger) Created(rec *Record, vm *vmipamv1.VirtualMachine) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec.UID = vm.UID
	rec.Created = vm.CreationTimestamp.Time
	l.creates++
	l.byName[rec.Name] = rec
	if len(vm.Spec.Addresses) != l.families {
		l.problems = append(l.problems, problem{NoAddress, fmt.Sprintf("%s was created with addresses %v, want one of each of the %d families of %s",
			rec.Name, vm.Spec.Addresses, l.families, l.space)})
		return
	}
	addrs, err := Addresses(vm, l.families, l.space)
	if err != nil {
		l.problems = append(l.problems, problem{BadAddress, fmt.Sprintf("%s was created with %v", rec.Name, err)})
		return
	}
	rec.Addrs = addrs
	for _, a := range addrs {
		l.check(rec, a)
	}
}

// check records rec as the newest holder of a, checking the previous one.
func (l *Ledger) check(rec *Record, a netip.Addr) {
	h := l.history[a]
	if len(h) > 0 {
		l.reuses++
		prev := h[len(h)-1]
		switch {
		case prev.DeleteIssued.IsZero():
			l.problems = append(l.problems, problem{Duplicate, fmt.Sprintf(
				"%s handed to %s (uid %s, created %s, answer at %s) while %s (uid %s, created %s, answer at %s) holds it and was never deleted",
				a, rec.Name, rec.UID, rec.Created.Format(time.RFC3339), rec.Resp.Format(Stamp),
				prev.Name, prev.UID, prev.Created.Format(time.RFC3339), prev.Resp.Format(Stamp))})
		case rec.Resp.Before(prev.DeleteIssued.Add(l.cooldown)):
			l.problems = append(l.problems, problem{EarlyReuse, fmt.Sprintf(
				"%s handed to %s (answer at %s) only %s after the delete of its previous holder %s was issued (at %s); cooldown %s",
				a, rec.Name, rec.Resp.Format(Stamp), rec.Resp.Sub(prev.DeleteIssued).Round(time.Millisecond), prev.Name,
				prev.DeleteIssued.Format(Stamp), l.cooldown)})
		}
	}
	l.history[a] = append(h, rec)
}

// DeleteIssued notes that rec's delete is about to be sent.
func (l *Ledger) DeleteIssued(rec *Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec.DeleteIssued = time.Now()
}

// DeleteIssuedFor notes that the delete of the VM name, if the ledger
// knows it and no delete of it was issued yet, is about to be sent.
func (l *Ledger) DeleteIssuedFor(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec := l.byName[name]; rec != nil && rec.DeleteIssued.IsZero() {
		rec.DeleteIssued = time.Now()
	}
}

// DeleteDone counts a delete the API server accepted.
func (l *Ledger) DeleteDone() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deletes++
}

// Fail records a request of op ("create", "delete") on the VM name, sent
// at sent, that returned err.
func (l *Ledger) Fail(op, name string, sent time.Time, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failed = append(l.failed, Failure{Op: op, Name: name, Sent: sent, At: time.Now(), Err: err})
}

// Failures returns the failed requests of op, in the order they failed.
func (l *Ledger) Failures(op string) []Failure {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Failure
	for _, f := range l.failed {
		if f.Op == op {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Counts returns the successful creates and deletes, and how many times
// an address was handed out again.
func (l *Ledger) Counts() (creates, deletes, reuses int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.creates, l.deletes, l.reuses
}

// Records returns a copy of the record of every VM created, by name.
func (l *Ledger) Records() map[string]Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]Record, len(l.byName))
	for name, rec := range l.byName {
		out[name] = *rec
	}
	return out
}

// Problems returns the problems found as the records arrived, in that
// order, each as "KIND: message"; with kinds, only those of these kinds,
// without the prefix.
func (l *Ledger) Problems(kinds ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []string{}
	for _, p := range l.problems {
		switch {
		case len(kinds) == 0:
			out = append(out, p.kind+": "+p.msg)
		case slices.Contains(kinds, p.kind):
			out = append(out, p.msg)
		}
	}
	return out
}

// LateReuse checks each reuse against the observed end of the previous
// holder's deletion: a new holder's creationTimestamp (whole seconds) must
// not be earlier than the previous holder's disappearance, as goneAt
// (e.g. Tracker.ExactGoneAt) tells it, plus the cooldown, less 2s (1s for
// the truncation, 1s for the watch's latency and the moment between the
// release and the removal of the finalizer). It returns the violations
// and how many pairs it checked and could not check (no disappearance
// known).
func (l *Ledger) LateReuse(goneAt func(name string) (time.Time, bool)) (violations []string, checked, unchecked int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for a, h := range l.history {
		for i := 1; i < len(h); i++ {
			prev, next := h[i-1], h[i]
			at, ok := goneAt(prev.Name)
			if !ok {
				unchecked++
				continue
			}
			checked++
			if next.Created.Before(at.Add(l.cooldown - 2*time.Second)) {
				violations = append(violations, fmt.Sprintf(
					"%s given to %s (creationTimestamp %s) %s after its previous holder %s was seen gone (at %s, %s after its delete was issued); cooldown %s",
					a, next.Name, next.Created.Format(time.RFC3339), next.Created.Sub(at).Round(time.Millisecond), prev.Name, at.Format(Stamp),
					at.Sub(prev.DeleteIssued).Round(time.Millisecond), l.cooldown))
			}
		}
	}
	sort.Strings(violations)
	return violations, checked, unchecked
}

// Gone is when a VirtualMachine was seen to disappear. Exact is true when
// a live watch delivered its DELETED event; false when the watch was
// broken at that moment (e.g. an API server restart) and the
// disappearance was only noticed by the list that followed, so At is an
// upper bound.
type Gone struct {
	At    time.Time
	Exact bool
	// Deleted is the VM's metadata.deletionTimestamp, as the watch last
	// showed it; zero when it never showed one.
	Deleted time.Time
}

// Tracker watches a namespace and notes when each VirtualMachine
// disappears, i.e. when its deletion completed: vmipam released its
// address and removed the finalizer. Its methods are safe for concurrent
// use.
type Tracker struct {
	c  client.WithWatch
	ns string

	mu      sync.Mutex
	present map[string]bool
	gone    map[string]Gone
	// deleted is each VM's deletionTimestamp, as a watch event showed it.
	deleted  map[string]time.Time
	relists  int
	restarts int
}

// NewTracker returns a tracker of the VirtualMachines of ns; Run runs it.
func NewTracker(c client.WithWatch, ns string) *Tracker {
	return &Tracker{c: c, ns: ns, present: map[string]bool{}, gone: map[string]Gone{}, deleted: map[string]time.Time{}}
}

// Run lists and watches until ctx ends, listing again whenever the watch
// breaks.
func (t *Tracker) Run(ctx context.Context) {
	for ctx.Err() == nil {
		rv, err := t.relist(ctx)
		if err != nil {
			Sleep(ctx, 200*time.Millisecond)
			continue
		}
		t.watch(ctx, rv)
		t.mu.Lock()
		t.restarts++
		t.mu.Unlock()
	}
}

func (t *Tracker) relist(ctx context.Context) (string, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var l vmipamv1.VirtualMachineList
	if err := t.c.List(lctx, &l, client.InNamespace(t.ns)); err != nil {
		return "", fmt.Errorf("list VirtualMachines of %s: %w", t.ns, err)
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.relists++
	seen := make(map[string]bool, len(l.Items))
	for _, vm := range l.Items {
		seen[vm.Name] = true
	}
	for name := range t.present {
		if !seen[name] {
			t.gone[name] = Gone{At: now, Deleted: t.deleted[name]}
			delete(t.present, name)
		}
	}
	for name := range seen {
		t.present[name] = true
	}
	return l.ResourceVersion, nil
}

func (t *Tracker) watch(ctx context.Context, rv string) {
	w, err := t.c.Watch(ctx, &vmipamv1.VirtualMachineList{}, client.InNamespace(t.ns),
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
	if err != nil {
		Sleep(ctx, 200*time.Millisecond)
		return
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			vm, isVM := ev.Object.(*vmipamv1.VirtualMachine)
			switch {
			case ev.Type == watch.Error || !isVM:
				return
			case ev.Type == watch.Deleted:
				t.mu.Lock()
				t.noteDeleted(vm)
				t.gone[vm.Name] = Gone{At: time.Now(), Exact: true, Deleted: t.deleted[vm.Name]}
				delete(t.present, vm.Name)
				t.mu.Unlock()
			case ev.Type == watch.Added || ev.Type == watch.Modified:
				t.mu.Lock()
				t.noteDeleted(vm)
				t.present[vm.Name] = true
				t.mu.Unlock()
			}
		}
	}
}

// noteDeleted keeps vm's deletionTimestamp, if it has one. t.mu is held.
func (t *Tracker) noteDeleted(vm *vmipamv1.VirtualMachine) {
	if d := vm.DeletionTimestamp; d != nil {
		t.deleted[vm.Name] = d.Time
	}
}

// GoneAt returns when name was seen to disappear.
func (t *Tracker) GoneAt(name string) (Gone, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	g, ok := t.gone[name]
	return g, ok
}

// ExactGoneAt returns when name was seen to disappear, if a live watch saw
// it (Gone.Exact).
func (t *Tracker) ExactGoneAt(name string) (time.Time, bool) {
	g, ok := t.GoneAt(name)
	return g.At, ok && g.Exact
}

// Stats returns how many disappearances the tracker saw, and how many
// times its watch broke and it listed again.
func (t *Tracker) Stats() (gone, restarts int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.gone), t.restarts
}

// FillOptions say how Fill fills a pool.
type FillOptions struct {
	// Want is how many VMs must get an address.
	Want int
	// Prefix names the VMs: <Prefix>-0000 on, and <Prefix>-one-too-many.
	Prefix string
	// Create creates the VM name in the pool and returns it as the API
	// server answered.
	Create func(ctx context.Context, name string) (*vmipamv1.VirtualMachine, error)
	// Exhausted reports whether err is vmipam's refusal of an exhausted
	// pool.
	Exhausted func(err error) bool
	// Ledger, if set, records every VM created.
	Ledger *Ledger
}

// FillResult is what filling a pool found.
type FillResult struct {
	Want, Got int
	Took      time.Duration
	// Errs are refusals other than exhaustion; LastErr the last refusal.
	Errs    []string
	LastErr error
	// ExtraErr is the answer to one create more than Want: nil is a
	// problem of its own, reported as an error.
	ExtraErr error
}

// Fill creates o.Want VMs, 16 at a time (VMs created and bound while a
// resync lists the cluster are what exposes a resync that releases live
// VMs' addresses), each of which must get an address: an exhausted
// refusal is retried three times 1.5s apart (the address may be in
// another replica's free list, on its way over, or the refusal raced a
// free-list refill), other refusals once a second up to five times. Once
// one VM gives up, the others stop too. Then one more create must be
// refused as exhausted.
func Fill(ctx context.Context, o FillOptions) FillResult {
	r := FillResult{Want: o.Want}
	began := time.Now()
	var mu sync.Mutex
	next, stop := 0, false
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				mu.Lock()
				if next >= o.Want || stop {
					mu.Unlock()
					return
				}
				i := next
				next++
				mu.Unlock()
				name := fmt.Sprintf("%s-%04d", o.Prefix, i)
				exhausted, other := 0, 0
				for {
					rec := &Record{Name: name, Sent: time.Now()}
					vm, err := o.Create(ctx, name)
					if err == nil {
						rec.Resp = time.Now()
						if o.Ledger != nil {
							o.Ledger.Created(rec, vm)
						}
						mu.Lock()
						r.Got++
						mu.Unlock()
						break
					}
					isExhausted := o.Exhausted(err)
					mu.Lock()
					r.LastErr = err
					if isExhausted {
						exhausted++
					} else {
						other++
						r.Errs = append(r.Errs, err.Error())
					}
					if exhausted > 3 || other > 5 || ctx.Err() != nil {
						// Leaked, or worse: the others stop too.
						stop = true
						mu.Unlock()
						return
					}
					mu.Unlock()
					if isExhausted {
						Sleep(ctx, 1500*time.Millisecond)
					} else {
						Sleep(ctx, time.Second)
					}
				}
			}
		})
	}
	wg.Wait()
	r.Took = time.Since(began)
	extra := o.Prefix + "-one-too-many"
	if vm, err := o.Create(ctx, extra); err != nil {
		r.ExtraErr = err
	} else {
		r.ExtraErr = fmt.Errorf("%s was created in a full pool, with %v", extra, vm.Spec.Addresses)
	}
	return r
}

// Sleep waits d or until ctx ends; false when ctx ended. It paces load
// and waits out deadlines; to wait for a condition, Poll.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// CopyDir copies the regular files of from into to, e.g. an API server's
// certificates, to start it again on them.
func CopyDir(from, to string) error {
	if err := os.MkdirAll(to, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", to, err)
	}
	entries, err := os.ReadDir(from)
	if err != nil {
		return fmt.Errorf("read %s: %w", from, err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			return fmt.Errorf("read %s: %w", e.Name(), err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", e.Name(), err)
		}
	}
	return nil
}
