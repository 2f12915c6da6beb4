package replicas

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/harness"
)

// storm is a set of clients creating VirtualMachines, and deleting random
// ones of their own when maxOwn > 0, with no retry: every error counts.
type storm struct {
	s       *suite
	pool    string
	prefix  string // of the VMs' names
	led     *harness.Ledger
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
	own map[int][]*harness.Record
}

// start runs clients until the returned stop is called; stop waits for
// the clients' last requests.
func (st *storm) start(clients int) (stop func()) {
	ctx, cancel := context.WithCancel(st.s.ctx)
	st.stop = cancel
	st.own = map[int][]*harness.Record{}
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
			harness.Sleep(ctx, time.Duration(rng.Int64N(int64(2*st.think))))
		}
	}
}

func (st *storm) create(name string) *harness.Record {
	rec := &harness.Record{Name: name, Sent: time.Now()}
	var mutate []func(*vmipamv1.VirtualMachine)
	if st.dual {
		mutate = append(mutate, func(vm *vmipamv1.VirtualMachine) { vm.Spec.IPFamilyPolicy = ptr.To(vmipamv1.RequireDualStack) })
	}
	vm, err := st.s.create(st.s.ctx, name, st.pool, mutate...)
	if err != nil {
		st.led.Fail("create", name, rec.Sent, err)
		return nil
	}
	rec.Resp = time.Now()
	st.led.Created(rec, vm)
	return rec
}

func (st *storm) remove(rec *harness.Record) {
	st.led.DeleteIssued(rec)
	sent := time.Now()
	rctx, cancel := context.WithTimeout(st.s.ctx, 30*time.Second)
	defer cancel()
	err := st.s.c.Delete(rctx, &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: st.s.ns, Name: rec.Name}})
	if err != nil {
		st.led.Fail("delete", rec.Name, sent, fmt.Errorf("delete %s: %w", rec.Name, err))
		return
	}
	st.led.DeleteDone()
}

// summarize keeps the first n messages and says how many more there were.
func summarize(msgs []string, n int) string {
	if len(msgs) <= n {
		return strings.Join(msgs, "\n")
	}
	return strings.Join(msgs[:n], "\n") + fmt.Sprintf("\n... and %d more", len(msgs)-n)
}

// failureLines describes failures relative to a moment.
func failureLines(fs []harness.Failure, since time.Time, n int) []string {
	var out []string
	for _, f := range fs {
		msg := f.Err.Error()
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		out = append(out, fmt.Sprintf("%s %s: sent at %+.3fs, failed at %+.3fs: %s", f.Op, f.Name,
			f.Sent.Sub(since).Seconds(), f.At.Sub(since).Seconds(), msg))
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
