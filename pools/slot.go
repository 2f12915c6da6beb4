package pools

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// Holder slots (docs/design.md, "Holder slots"): with --holder-slots a
// replica's holder is not its pod's name but a slot, slot-0, slot-1, …,
// whose Lease it takes when it starts. A rollout hands each slot, with the
// claims and the labelled objects that go with it, to the slot's next
// incarnation, so that nothing is taken over and no object relabelled.
const (
	// SlotLabel marks the Lease of a holder slot.
	SlotLabel = "vmipam.io/slot"
	// ProcessAnnotation on a slot's Lease names the process (the pod)
	// that holds the slot: the slot's holder name says only which slot.
	ProcessAnnotation = "vmipam.io/process"
	// DrainingAnnotation on a slot's Lease says since when its process
	// is shutting down: it releases the slot once sealed, and a starting
	// process waits for that rather than open a slot of its own.
	DrainingAnnotation = "vmipam.io/draining"
	// slotPrefix starts every slot's holder name.
	slotPrefix = "slot-"
	// DefaultSlotHandoff is how long a released slot waits for its next
	// incarnation before the other replicas take its claims over.
	DefaultSlotHandoff = 30 * time.Second
	// DefaultSlotWait bounds how long a starting process waits for a
	// draining slot before it opens one of its own.
	DefaultSlotWait = 5 * time.Minute
)

// SlotName returns the holder name of slot i.
func SlotName(i int) string { return slotPrefix + strconv.Itoa(i) }

// slotIndex returns the slot number of a holder name, if it is a slot's.
func slotIndex(holder string) (int, bool) {
	s, ok := strings.CutPrefix(holder, slotPrefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || SlotName(i) != holder {
		return 0, false
	}
	return i, true
}

// isSlot reports whether obj is a slot's Lease.
func isSlot(obj *coordinationv1.Lease) bool {
	_, ok := slotIndex(strings.TrimPrefix(obj.Name, LeaseName("")))
	return ok && obj.Labels[SlotLabel] == "true"
}

// slotProcess returns the process that holds slot Lease obj, "" if none.
func slotProcess(obj *coordinationv1.Lease) string {
	return obj.Annotations[ProcessAnnotation]
}

// slotChoice is what a starting process does about the slots it listed.
type slotChoice struct {
	// holder is the slot to take; lease its Lease as listed, nil to
	// create it.
	holder string
	lease  *coordinationv1.Lease
	// wait: a slot is draining; list again later instead.
	wait bool
	// why says, for the log, why this slot.
	why string
}

// chooseSlot picks, of the holder Leases leases listed at now, the slot
// process should take: its own (a restart of the same pod's container);
// else a released one (its process shut down and sealed it: its claims
// and objects are waiting for the next incarnation); else a lapsed one
// (its process crashed, or lost the API server, past the lease duration:
// fenced, as for a takeover); else, while a slot is draining and
// waitDraining, none yet (its release comes soon: a rollout stops a pod
// and starts its replacement at once); else a new slot, the lowest number
// free. Of several, the lowest number.
func chooseSlot(leases []coordinationv1.Lease, process string, now time.Time, waitDraining bool) slotChoice {
	var released, lapsed *coordinationv1.Lease
	draining := false
	used := map[int]bool{}
	lower := func(a, b *coordinationv1.Lease) bool {
		if b == nil {
			return true
		}
		i, _ := slotIndex(strings.TrimPrefix(a.Name, LeaseName("")))
		j, _ := slotIndex(strings.TrimPrefix(b.Name, LeaseName("")))
		return i < j
	}
	for i := range leases {
		obj := &leases[i]
		holder := strings.TrimPrefix(obj.Name, LeaseName(""))
		idx, ok := slotIndex(holder)
		if !ok {
			continue
		}
		used[idx] = true
		if !isSlot(obj) {
			continue
		}
		id := ptr.Deref(obj.Spec.HolderIdentity, "")
		switch {
		case id == holder && slotProcess(obj) == process:
			return slotChoice{holder: holder, lease: obj, why: "this process held it before (a restart)"}
		case id == "":
			if lower(obj, released) {
				released = obj
			}
		case id == holder && expired(obj, now, 0):
			if lower(obj, lapsed) {
				lapsed = obj
			}
		case id == holder && obj.Annotations[DrainingAnnotation] != "":
			draining = true
		}
	}
	switch {
	case released != nil:
		return slotChoice{holder: strings.TrimPrefix(released.Name, LeaseName("")), lease: released, why: "released by its last process"}
	case lapsed != nil:
		return slotChoice{holder: strings.TrimPrefix(lapsed.Name, LeaseName("")), lease: lapsed, why: "its last process stopped renewing it"}
	case draining && waitDraining:
		return slotChoice{wait: true}
	}
	i := 0
	for used[i] {
		i++
	}
	return slotChoice{holder: SlotName(i), why: "every slot is held"}
}

// Slot is the holder slot this process took: its holder name, and its
// Lease kept renewed until the Registry takes the renewals over (the
// informer caches of a large fleet can take longer to fill than the
// lease duration).
type Slot struct {
	// Holder is the slot's holder name: the replica's Holder.
	Holder string
	l      *lease
	stop   context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// SlotOptions configure TakeSlot.
type SlotOptions struct {
	// Lease configures the slot's Lease; its Holder is ignored, its
	// Process names this process.
	Lease LeaseOptions
	// Wait bounds the wait for a draining slot; default DefaultSlotWait.
	Wait time.Duration
	// Settle is how long to look again, once, before opening a new slot,
	// for a slot whose process has just been told to stop and has not
	// said so on its Lease yet; default the lease's retry period plus a
	// second.
	Settle time.Duration
}

// TakeSlot takes a holder slot for process opts.Lease.Process with c
// (reading the API server, not a cache), and keeps its Lease renewed
// until Slot.handOff.
func TakeSlot(ctx context.Context, c client.Client, opts SlotOptions) (*Slot, error) {
	log := logf.FromContext(ctx)
	if opts.Lease.Process == "" {
		return nil, errors.New("take a holder slot: the process has no name (--holder, from $POD_NAME)")
	}
	if opts.Wait == 0 {
		opts.Wait = DefaultSlotWait
	}
	l := newLease(c, c, opts.Lease)
	if opts.Settle == 0 {
		opts.Settle = l.opts.RetryPeriod + time.Second
	}
	start := time.Now() //nolint:forbidigo // leases are real time
	var logged time.Time
	settled := false
	for failures := 0; ; {
		var list coordinationv1.LeaseList
		if err := c.List(ctx, &list, client.InNamespace(l.opts.Namespace), client.MatchingLabels{HolderLeaseLabel: "true"}); err != nil {
			return nil, fmt.Errorf("take a holder slot: list the holder Leases in namespace %s: %w", l.opts.Namespace, err)
		}
		now := time.Now() //nolint:forbidigo // leases are real time
		ch := chooseSlot(list.Items, l.opts.Process, now, now.Sub(start) < opts.Wait)
		if !ch.wait && ch.lease == nil && !settled {
			// Nothing to take over yet: a pod stopped by the same
			// rollout may not have said so on its Lease yet.
			settled = true
			if err := sleep(ctx, opts.Settle); err != nil {
				return nil, err
			}
			continue
		}
		if ch.wait {
			if now.Sub(logged) >= 30*time.Second {
				logged = now
				log.Info("Waiting for a draining holder slot to be released", "process", l.opts.Process)
			}
			// The replacement is not ready until it has the slot: look
			// often, so that it takes it soon after the release.
			if err := sleep(ctx, min(l.opts.RetryPeriod, releasePoll)); err != nil {
				return nil, err
			}
			continue
		}
		s, err := takeSlot(ctx, l, ch)
		switch {
		case err == nil:
			log.Info("Took a holder slot", "holder", s.Holder, "process", l.opts.Process, "why", ch.why)
			return s, nil
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			// Another process (or a takeover) took it first.
			continue
		case failures >= 30:
			return nil, err
		}
		failures++
		log.Error(err, "Taking a holder slot", "holder", ch.holder, "process", l.opts.Process)
		if err := sleep(ctx, l.opts.RetryPeriod); err != nil {
			return nil, err
		}
	}
}

// releasePoll is how often a process waiting for a draining slot's
// release lists the slot Leases: a list of a few Leases, for the seconds
// of a drain.
const releasePoll = 250 * time.Millisecond

// takeSlot writes the chosen slot's Lease as this process's and starts
// renewing it.
func takeSlot(ctx context.Context, l *lease, ch slotChoice) (*Slot, error) {
	l.opts.Holder = ch.holder
	sent := time.Now() //nolint:forbidigo // leases are real time
	obj := ch.lease
	var err error
	if obj == nil {
		obj = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.opts.Namespace, Name: LeaseName(ch.holder)}}
		l.fill(obj, sent, true)
		err = l.c.Create(ctx, obj)
	} else {
		obj = obj.DeepCopy()
		// Its last process's counts are not this one's.
		delete(obj.Annotations, countsAnnotation)
		l.fill(obj, sent, true)
		// Compare-and-swap on the resourceVersion listed: of two
		// processes, or a process and a takeover, one wins.
		err = l.c.Update(ctx, obj)
	}
	if err != nil {
		return nil, fmt.Errorf("take holder slot %s: %w", ch.holder, err)
	}
	l.renewed(obj, sent)
	kctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s := &Slot{Holder: ch.holder, l: l, stop: stop, done: make(chan struct{})}
	go s.keep(kctx)
	return s, nil
}

// keep renews the slot's Lease every retry period until stopped.
func (s *Slot) keep(ctx context.Context) {
	defer close(s.done)
	tick := time.NewTicker(s.l.opts.RetryPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := s.l.renew(ctx); err != nil && ctx.Err() == nil {
			logf.FromContext(ctx).Error(err, "Renewing the holder slot's Lease before the replica starts", "holder", s.Holder)
			if errors.Is(err, errLost) {
				return
			}
		}
	}
}

// handOff stops the renewals; the Registry's lease renews from then on.
func (s *Slot) handOff() {
	if s == nil {
		return
	}
	s.once.Do(func() {
		s.stop()
		<-s.done
	})
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
