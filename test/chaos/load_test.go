package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/test/harness"
)

const stamp = harness.Stamp

// Refusal categories, from the error the client saw.
const (
	reasonWebhookDown     = "webhook unreachable (connection refused)"
	reasonWebhookReset    = "webhook connection reset (vmipam killed mid-request)"
	reasonWebhookTimeout  = "webhook timeout"
	reasonWebhookTLS      = "webhook TLS error (no serving certificate yet)"
	reasonWebhookOther    = "webhook call failed (other)"
	reasonRecovering      = "vmipam recovering (503)"
	reasonStoreDown       = "vmipam could not persist a claim (500)"
	reasonReservationLost = "reservation lost (503)"
	reasonExhausted       = "pool exhausted (403)"
	reasonAPIDown         = "API server unavailable"
	reasonAPITimeout      = "API server timeout"
	reasonClientTimeout   = "client timeout"
	reasonInvalid         = "invalid (422)"
	reasonOther           = "other"
)

// classify names the category of a failed request.
func classify(err error) string {
	msg := err.Error()
	has := func(words ...string) bool {
		for _, w := range words {
			if strings.Contains(msg, w) {
				return true
			}
		}
		return false
	}
	switch {
	case has("no longer holds the reservation"):
		return reasonReservationLost
	case has("is recovering its state", "still recovering its pools"):
		return reasonRecovering
	case has("is exhausted"), has("address left"):
		return reasonExhausted
	case has("denied the request") && has("write block", "IPBlock"):
		return reasonStoreDown
	case has("failed calling webhook") && has("connection refused"):
		return reasonWebhookDown
	case has("failed calling webhook") && has("tls:", "x509"):
		return reasonWebhookTLS
	case has("failed calling webhook") && has("connection reset", "EOF", "broken pipe"):
		return reasonWebhookReset
	// Not "timeout": the webhook URL itself carries ?timeout=5s.
	case has("failed calling webhook") && has("deadline exceeded", "Client.Timeout", "i/o timeout", "context canceled"):
		return reasonWebhookTimeout
	case has("failed calling webhook"):
		return reasonWebhookOther
	case apierrors.IsInvalid(err):
		return reasonInvalid
	case has("connection refused", "connection reset", "EOF", "http2: client connection lost", "apiserver is shutting down",
		"the server is currently unable to handle the request", "server closed", "broken pipe"):
		return reasonAPIDown
	case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return reasonAPITimeout
	case errors.Is(err, context.DeadlineExceeded), has("context deadline exceeded", "Client.Timeout"):
		return reasonClientTimeout
	}
	return reasonOther
}

// ambiguous reports whether the request may have taken effect even though
// it failed: its response was lost.
func ambiguous(reason string) bool {
	switch reason {
	case reasonAPIDown, reasonAPITimeout, reasonClientTimeout, reasonOther:
		return true
	}
	return false
}

// refusals counts failed requests by operation, category and phase, and
// keeps a few sample messages per category.
type refusals struct {
	mu      sync.Mutex
	counts  map[[3]string]int
	samples map[string][]string
}

func newRefusals() *refusals {
	return &refusals{counts: map[[3]string]int{}, samples: map[string][]string{}}
}

func (r *refusals) note(op, reason, phase string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[[3]string{op, reason, phase}]++
	msg := err.Error()
	if len(msg) > 400 {
		msg = msg[:400] + "..."
	}
	for _, s := range r.samples[reason] {
		if s == msg {
			return
		}
	}
	if len(r.samples[reason]) < 3 {
		r.samples[reason] = append(r.samples[reason], msg)
	}
}

func (r *refusals) total(op, reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for k, v := range r.counts {
		if k[0] == op && (reason == "" || k[1] == reason) {
			n += v
		}
	}
	return n
}

// Phases a failed request is attributed to.
const (
	phaseSteady  = "steady"
	phaseVMIPAM  = "vmipam down or restarting"
	phaseAPIDown = "API server restarting"
)

// phases says what is being disrupted right now.
type phases struct {
	vmipamDown, apiDown atomic.Bool
}

func (p *phases) now() string {
	switch {
	case p.apiDown.Load():
		return phaseAPIDown
	case p.vmipamDown.Load():
		return phaseVMIPAM
	}
	return phaseSteady
}

// load is the clients' shared state.
type load struct {
	c        client.Client
	ns, pool string
	maxOwn   int
	deleteP  float64
	think    time.Duration
	ledger   *harness.Ledger
	refused  *refusals
	phases   *phases
	// base bounds single requests: requests are not cut by the end of the
	// load, so that a create in flight is not left ambiguous.
	base context.Context
	// dual: every VM asks for an address of each family (RequireDualStack).
	dual bool
}

// newVM is the VirtualMachine a client creates.
func (ld *load) newVM(name string) *vmipamv1.VirtualMachine {
	vm := &vmipamv1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ld.ns, Name: name},
		Spec:       vmipamv1.VirtualMachineSpec{IPPool: ld.pool, Image: "chaos", CPUs: 1},
	}
	if ld.dual {
		vm.Spec.IPFamilyPolicy = ptr.To(vmipamv1.RequireDualStack)
	}
	return vm
}

// client runs one client until ctx ends: it creates VMs and deletes random
// ones of its own, keeping at most maxOwn.
func (ld *load) client(ctx context.Context, id int, rng *rand.Rand) {
	var own []*harness.Record
	for i := 0; ctx.Err() == nil; i++ {
		if len(own) > 0 && (len(own) >= ld.maxOwn || rng.Float64() < ld.deleteP) {
			k := rng.IntN(len(own))
			ld.remove(own[k])
			own[k] = own[len(own)-1]
			own = own[:len(own)-1]
		} else if rec := ld.create(ctx, fmt.Sprintf("vm-%02d-%05d", id, i)); rec != nil {
			own = append(own, rec)
		}
		if ld.think > 0 {
			harness.Sleep(ctx, time.Duration(rng.Int64N(int64(2*ld.think))))
		}
	}
}

// create creates the VM name, retrying every failure with a backoff while
// ctx lives. It returns nil if the VM could not be created before ctx
// ended. Names are fixed, so a retry after a lost response finds the
// object instead of creating a second one.
func (ld *load) create(ctx context.Context, name string) *harness.Record {
	rec := &harness.Record{Name: name, Sent: time.Now()}
	backoff := 50 * time.Millisecond
	wasAmbiguous := false
	for attempt := 0; ; attempt++ {
		phase := ld.phases.now()
		vm := ld.newVM(name)
		rctx, cancel := context.WithTimeout(ld.base, 20*time.Second)
		err := ld.c.Create(rctx, vm)
		cancel()
		if err == nil {
			rec.Resp = time.Now()
			ld.ledger.Created(rec, vm)
			return rec
		}
		if apierrors.IsAlreadyExists(err) && attempt > 0 {
			// An earlier attempt went through after all.
			if got := ld.get(name); got != nil {
				rec.Resp, rec.ViaGet = time.Now(), true
				ld.ledger.Created(rec, got)
				return rec
			}
		}
		reason := classify(err)
		if phase == phaseSteady {
			phase = ld.phases.now()
		}
		ld.refused.note("create", reason, phase, err)
		wasAmbiguous = wasAmbiguous || ambiguous(reason)
		if !harness.Sleep(ctx, backoff+rand.N(backoff)) { //nolint:gosec // jitter
			if wasAmbiguous {
				if got := ld.get(name); got != nil {
					rec.Resp, rec.ViaGet = time.Now(), true
					ld.ledger.Created(rec, got)
					return rec
				}
			}
			return nil
		}
		backoff = min(2*backoff, time.Second)
	}
}

// createOnce creates the VM name once, as the clients do, and returns it
// as the API server answered: for filling the pool.
func (ld *load) createOnce(ctx context.Context, name string) (*vmipamv1.VirtualMachine, error) {
	vm := ld.newVM(name)
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return vm, ld.c.Create(rctx, vm)
}

// get reads a VM, retrying for a while; nil if it does not exist.
func (ld *load) get(name string) *vmipamv1.VirtualMachine {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) && ld.base.Err() == nil {
		vm := &vmipamv1.VirtualMachine{}
		rctx, cancel := context.WithTimeout(ld.base, 10*time.Second)
		err := ld.c.Get(rctx, client.ObjectKey{Namespace: ld.ns, Name: name}, vm)
		cancel()
		switch {
		case err == nil:
			return vm
		case apierrors.IsNotFound(err):
			return nil
		}
		harness.Sleep(ld.base, 200*time.Millisecond)
	}
	return nil
}

// remove deletes rec's VM, retrying until the API server accepts the
// deletion (deletion itself completes asynchronously, through vmipam's
// finalizer).
func (ld *load) remove(rec *harness.Record) {
	ld.ledger.DeleteIssued(rec)
	backoff := 50 * time.Millisecond
	for ld.base.Err() == nil {
		phase := ld.phases.now()
		rctx, cancel := context.WithTimeout(ld.base, 20*time.Second)
		err := ld.c.Delete(rctx, &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ld.ns, Name: rec.Name}})
		cancel()
		if err == nil || apierrors.IsNotFound(err) {
			ld.ledger.DeleteDone()
			return
		}
		if phase == phaseSteady {
			phase = ld.phases.now()
		}
		ld.refused.note("delete", classify(err), phase, err)
		harness.Sleep(ld.base, backoff)
		backoff = min(2*backoff, time.Second)
	}
}
