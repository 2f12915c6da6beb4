package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// vmRecord is what a client knows of one VirtualMachine it created.
type vmRecord struct {
	name string
	uid  types.UID
	// sent is when the first create attempt went out, resp when the
	// successful response (or the Get that found the object after an
	// ambiguous failure) came back: the address was handed out in between.
	sent, resp time.Time
	// created is metadata.creationTimestamp: the API server's clock,
	// truncated to the second.
	created time.Time
	// viaGet: the create's response was lost (timeout, API server gone)
	// and a Get found the object.
	viaGet bool
	// deleteIssued is taken just before the first delete request, so it
	// precedes the deletionTimestamp and hence the release.
	deleteIssued time.Time
	deleted      bool
}

// ledger records every create and delete, and checks each new holder of an
// address against the previous one as it arrives.
type ledger struct {
	cooldown time.Duration
	space    space

	mu      sync.Mutex
	byName  map[string]*vmRecord
	history map[netip.Addr][]*vmRecord
	creates int
	deletes int
	reuses  int
	// dupAtCreate: an address handed to a new VM while its previous
	// holder was never deleted. earlyReuse: handed out before the
	// previous holder's delete was even issued plus the cooldown.
	dupAtCreate, earlyReuse, badAddr []string
}

func newLedger(cooldown time.Duration, sp space) *ledger {
	return &ledger{cooldown: cooldown, space: sp, byName: map[string]*vmRecord{}, history: map[netip.Addr][]*vmRecord{}}
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
	addrs, err := l.space.addresses(vm)
	if err != nil {
		l.badAddr = append(l.badAddr, fmt.Sprintf("%s was created with %v", rec.name, err))
		return
	}
	for _, a := range addrs {
		l.createdWith(rec, a)
	}
}

// createdWith checks the previous holder of a, given to rec.
func (l *ledger) createdWith(rec *vmRecord, a netip.Addr) {
	h := l.history[a]
	if len(h) > 0 {
		l.reuses++
		prev := h[len(h)-1]
		switch {
		case prev.deleteIssued.IsZero():
			l.dupAtCreate = append(l.dupAtCreate, fmt.Sprintf(
				"%s handed to %s (uid %s, created %s, response at %s) while %s (uid %s, created %s) holds it and was never deleted",
				a, rec.name, rec.uid, rec.created.Format(time.RFC3339), rec.resp.Format(stamp), prev.name, prev.uid, prev.created.Format(time.RFC3339)))
		case rec.resp.Before(prev.deleteIssued.Add(l.cooldown)):
			l.earlyReuse = append(l.earlyReuse, fmt.Sprintf(
				"%s handed to %s (response at %s) only %s after the delete of its previous holder %s was issued (at %s); cooldown %s",
				a, rec.name, rec.resp.Format(stamp), rec.resp.Sub(prev.deleteIssued).Round(time.Millisecond), prev.name,
				prev.deleteIssued.Format(stamp), l.cooldown))
		}
	}
	l.history[a] = append(h, rec)
}

func (l *ledger) deleteIssued(rec *vmRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec.deleteIssued = time.Now()
}

func (l *ledger) deleteDone(rec *vmRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec.deleted = true
	l.deletes++
}

// lateReuse checks the rule against the observed end of deletions: a new
// holder's creationTimestamp must not be earlier than the previous holder's
// observed disappearance plus the cooldown, less 2s: 1s because the
// timestamp is truncated to the second, 1s for the watch's latency and the
// moment between vmipam's release and its removal of the finalizer. Only
// disappearances a live watch delivered count; returns the violations and
// how many pairs could not be checked for want of an exact time.
func (l *ledger) lateReuse(tr *tracker) (violations []string, checked, unchecked int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for a, h := range l.history {
		for i := 1; i < len(h); i++ {
			prev, next := h[i-1], h[i]
			g, ok := tr.goneAt(prev.name)
			if !ok || !g.exact {
				unchecked++
				continue
			}
			checked++
			if next.created.Before(g.at.Add(l.cooldown - 2*time.Second)) {
				violations = append(violations, fmt.Sprintf(
					"%s given to %s (creationTimestamp %s) %s after its previous holder %s was seen gone (at %s); cooldown %s",
					a, next.name, next.created.Format(time.RFC3339), next.created.Sub(g.at).Round(time.Millisecond),
					prev.name, g.at.Format(stamp), l.cooldown))
			}
		}
	}
	sort.Strings(violations)
	return violations, checked, unchecked
}

const stamp = "15:04:05.000"

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
	ledger   *ledger
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
	var own []*vmRecord
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
			sleep(ctx, time.Duration(rng.Int64N(int64(2*ld.think))))
		}
	}
}

// create creates the VM name, retrying every failure with a backoff while
// ctx lives. It returns nil if the VM could not be created before ctx
// ended. Names are fixed, so a retry after a lost response finds the
// object instead of creating a second one.
func (ld *load) create(ctx context.Context, name string) *vmRecord {
	rec := &vmRecord{name: name, sent: time.Now()}
	backoff := 50 * time.Millisecond
	wasAmbiguous := false
	for attempt := 0; ; attempt++ {
		phase := ld.phases.now()
		vm := ld.newVM(name)
		rctx, cancel := context.WithTimeout(ld.base, 20*time.Second)
		err := ld.c.Create(rctx, vm)
		cancel()
		if err == nil {
			rec.resp = time.Now()
			ld.ledger.created(rec, vm)
			return rec
		}
		if apierrors.IsAlreadyExists(err) && attempt > 0 {
			// An earlier attempt went through after all.
			if got := ld.get(name); got != nil {
				rec.resp, rec.viaGet = time.Now(), true
				ld.ledger.created(rec, got)
				return rec
			}
		}
		reason := classify(err)
		if phase == phaseSteady {
			phase = ld.phases.now()
		}
		ld.refused.note("create", reason, phase, err)
		wasAmbiguous = wasAmbiguous || ambiguous(reason)
		if !sleep(ctx, backoff+rand.N(backoff)) { //nolint:gosec // jitter
			if wasAmbiguous {
				if got := ld.get(name); got != nil {
					rec.resp, rec.viaGet = time.Now(), true
					ld.ledger.created(rec, got)
					return rec
				}
			}
			return nil
		}
		backoff = min(2*backoff, time.Second)
	}
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
		sleep(ld.base, 200*time.Millisecond)
	}
	return nil
}

// remove deletes rec's VM, retrying until the API server accepts the
// deletion (deletion itself completes asynchronously, through vmipam's
// finalizer).
func (ld *load) remove(rec *vmRecord) {
	ld.ledger.deleteIssued(rec)
	backoff := 50 * time.Millisecond
	for ld.base.Err() == nil {
		phase := ld.phases.now()
		rctx, cancel := context.WithTimeout(ld.base, 20*time.Second)
		err := ld.c.Delete(rctx, &vmipamv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ld.ns, Name: rec.name}})
		cancel()
		if err == nil || apierrors.IsNotFound(err) {
			ld.ledger.deleteDone(rec)
			return
		}
		if phase == phaseSteady {
			phase = ld.phases.now()
		}
		ld.refused.note("delete", classify(err), phase, err)
		sleep(ld.base, backoff)
		backoff = min(2*backoff, time.Second)
	}
}
