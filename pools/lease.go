package pools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
)

// Lease timing defaults: a holder renews every DefaultRetryPeriod, stops
// serving DefaultRenewDeadline after the last renewal it sent, and may be
// taken over DefaultLeaseDuration (plus the clock skew allowance) after it.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// HolderLeaseLabel marks the Leases of vmipam's holders.
const HolderLeaseLabel = "vmipam.io/holder-lease"

// holderLabel on a holder Lease names its holder.
const holderLabel = "vmipam.io/holder"

// KindsAnnotation on a holder Lease carries the kinds its holder gives
// addresses to, as JSON of []kinds.Kind, written with every renewal, so
// that tools reading the cluster (kubectl vmipam) know where each kind
// keeps its address without vmipam's configuration file.
const KindsAnnotation = "vmipam.io/kinds"

// countsAnnotation on a holder Lease carries the holder's counts per pool
// (JSON of map[pool]holderCounts), written with every renewal, so that the
// replica writing a pool's status can add up every holder's share.
const countsAnnotation = "vmipam.io/counts"

// holderCounts is one holder's share of a pool, as published on its Lease,
// and, for a pool of both families, its share of each.
type holderCounts struct {
	familyCounts
	Families map[vmipamv1.IPFamily]familyCounts `json:"ff,omitempty"`
}

// familyCounts is one holder's share of a pool, or of one of its families.
type familyCounts struct {
	Allocated int `json:"a"`
	Pending   int `json:"p"`
	Free      int `json:"f"`
	Cooldown  int `json:"c"`
}

func countsOf(c ipam.Counts) familyCounts {
	return familyCounts{Allocated: c.Allocated, Pending: c.Pending, Free: c.Free, Cooldown: c.Cooldown}
}

// add adds o's counts to c's.
func add(c ipam.Counts, o familyCounts) ipam.Counts {
	c.Allocated += o.Allocated
	c.Pending += o.Pending
	c.Free += o.Free
	c.Cooldown += o.Cooldown
	return c
}

// TakeoverPrefix starts the identity a holder writes on another's Lease
// while it takes that holder's claims over: "takeover:<taker>".
const TakeoverPrefix = "takeover:"

// LeaseOptions configure the holder Lease.
type LeaseOptions struct {
	// Namespace holds the Leases; Holder is this replica's holder.
	Namespace, Holder string
	// Duration, RenewDeadline and RetryPeriod default to the constants
	// above; RenewDeadline must be shorter than Duration.
	Duration, RenewDeadline, RetryPeriod time.Duration
	// Process, when set, names the process holding Holder, a holder slot
	// (see TakeSlot): the Lease is this process's only while it names it.
	Process string
	// Handoff is how long the other replicas leave a released slot to its
	// next incarnation before they take its claims over; default
	// DefaultSlotHandoff.
	Handoff time.Duration
	// Draining, when set, reports that the process is shutting down; a
	// slot's Lease then says so (DrainingAnnotation).
	Draining func() bool
}

// LeaseName returns the name of holder's Lease.
func LeaseName(holder string) string { return "vmipam-holder-" + holder }

// lease keeps this replica's holder Lease: it acquires it, renews it every
// retry period, and says, through valid, whether the last renewal is recent
// enough that no other holder may take this one's claims over yet (see
// docs/design.md, "Fencing"). It reads time from the real clock, whatever
// clock the allocators use: leases are compared across processes.
type lease struct {
	c    client.Client
	r    client.Reader
	opts LeaseOptions
	// counts, when set, returns what to publish in countsAnnotation.
	counts func() string
	// kinds is what to publish in KindsAnnotation.
	kinds string

	// fence is the monotonic deadline, in nanoseconds since start, until
	// which this holder may serve; 0 when it holds no lease.
	fence atomic.Int64
	start time.Time
	// lapses counts the renewals that came after the fence had run out,
	// counted before the fence is valid again (see ipam.Manager.SetFence).
	lapses atomic.Uint64

	mu sync.Mutex
	// version is the resourceVersion of the last write of the Lease.
	version string
	// since is when the current run of timely renewals began; zero while
	// not held, or after a renewal came too late.
	since time.Time
	// waiting is why the last attempt to acquire the Lease failed.
	waiting error
	// drainingSince is when Draining first said so.
	drainingSince time.Time
}

func newLease(c client.Client, r client.Reader, opts LeaseOptions) *lease {
	if opts.Duration == 0 {
		opts.Duration = DefaultLeaseDuration
	}
	if opts.RenewDeadline == 0 {
		opts.RenewDeadline = DefaultRenewDeadline
	}
	if opts.RetryPeriod == 0 {
		opts.RetryPeriod = DefaultRetryPeriod
	}
	if opts.Handoff == 0 {
		opts.Handoff = DefaultSlotHandoff
	}
	return &lease{c: c, r: r, opts: opts, start: time.Now()} //nolint:forbidigo // leases are real time
}

// valid reports whether this holder may serve: it holds its Lease and the
// last renewal was sent less than the renew deadline ago.
func (l *lease) valid() bool {
	f := l.fence.Load()
	return f != 0 && time.Since(l.start) < time.Duration(f) //nolint:forbidigo // monotonic, as the fence
}

// lapsed reports how long ago the fence of a Lease this holder held ran
// out, zero while it is valid or was never held.
func (l *lease) lapsed() time.Duration {
	f := l.fence.Load()
	if f == 0 {
		return 0
	}
	return max(time.Since(l.start)-time.Duration(f), 0) //nolint:forbidigo // monotonic, as the fence
}

// heldFor reports how long this holder has renewed its Lease in time
// without a gap.
func (l *lease) heldFor() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.since.IsZero() || !l.valid() {
		return 0
	}
	return time.Since(l.since) //nolint:forbidigo // leases are real time
}

// errTakingOver: another holder is taking this one's claims over; the
// Lease is this holder's again once it is done.
var errTakingOver = errors.New("taken over")

// waitingFor says why the Lease is not held yet, if an attempt failed.
func (l *lease) waitingFor() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}

// errLost: another process wrote this holder's Lease: its claims are
// being, or were, taken over.
var errLost = errors.New("the holder's lease was taken over")

// ErrSlotTaken says another live process holds this process's holder slot
// (this one stopped renewing it for longer than the lease duration): the
// process must start over and take a slot anew.
var ErrSlotTaken = errors.New("another process holds this holder slot")

// ours reports whether obj, this holder's Lease, names this holder and,
// for a slot, this process.
func (l *lease) ours(obj *coordinationv1.Lease) bool {
	return ptr.Deref(obj.Spec.HolderIdentity, "") == l.opts.Holder && (l.opts.Process == "" || slotProcess(obj) == l.opts.Process)
}

// labels are the labels of this holder's Lease.
func (l *lease) labels() map[string]string {
	m := map[string]string{HolderLeaseLabel: "true", holderLabel: labelValue(l.opts.Holder)}
	if l.opts.Process != "" {
		m[SlotLabel] = "true"
	}
	return m
}

// acquire takes this holder's Lease: created if missing, taken at once if
// it names this holder (a restart: a holder name is used by one process at
// a time; a slot's Lease must name this process too) or was released, and
// waited for while another holder is taking this one's claims over. A
// slot another live process holds is ErrSlotTaken, at once.
func (l *lease) acquire(ctx context.Context) error {
	log := logf.FromContext(ctx)
	for tries := 0; ; tries++ {
		err := l.tryAcquire(ctx)
		l.mu.Lock()
		l.waiting = err
		l.mu.Unlock()
		if err == nil || errors.Is(err, ErrSlotTaken) {
			return err
		}
		// A takeover in progress is routine; anything else (a missing
		// namespace, a denied write) is said once and then every minute.
		if errors.Is(err, errTakingOver) || tries%30 != 0 {
			log.V(1).Info("Waiting for the holder lease", "holder", l.opts.Holder, "reason", err.Error())
		} else {
			log.Error(err, "Waiting for the holder lease", "holder", l.opts.Holder)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(l.opts.RetryPeriod):
		}
	}
}

func (l *lease) tryAcquire(ctx context.Context) error {
	key := client.ObjectKey{Namespace: l.opts.Namespace, Name: LeaseName(l.opts.Holder)}
	sent := time.Now() //nolint:forbidigo // leases are real time
	obj := &coordinationv1.Lease{}
	err := l.r.Get(ctx, key, obj)
	switch {
	case apierrors.IsNotFound(err):
		obj = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		l.fill(obj, sent, true)
		if err := l.c.Create(ctx, obj); err != nil {
			return fmt.Errorf("create lease %s: %w", key.Name, err)
		}
	case err != nil:
		return fmt.Errorf("read lease %s: %w", key.Name, err)
	default:
		id := ptr.Deref(obj.Spec.HolderIdentity, "")
		if strings.HasPrefix(id, TakeoverPrefix) && !expired(obj, sent, 0) {
			return fmt.Errorf("%w: holder %s is taking this holder's claims over", errTakingOver, strings.TrimPrefix(id, TakeoverPrefix))
		}
		if l.opts.Process != "" && id == l.opts.Holder && !l.ours(obj) && !expired(obj, sent, 0) {
			return fmt.Errorf("%w: lease %s names process %s", ErrSlotTaken, key.Name, slotProcess(obj))
		}
		l.fill(obj, sent, id != l.opts.Holder)
		if err := l.c.Update(ctx, obj); err != nil {
			return fmt.Errorf("take lease %s: %w", key.Name, err)
		}
	}
	l.renewed(obj, sent)
	return nil
}

// fill writes this holder into obj, renewed at sent, with its labels,
// counts, kinds and, for a slot, process.
func (l *lease) fill(obj *coordinationv1.Lease, sent time.Time, transition bool) {
	if obj.Labels == nil {
		obj.Labels = map[string]string{}
	}
	for k, v := range l.labels() {
		obj.Labels[k] = v
	}
	if l.opts.Process != "" {
		if obj.Annotations == nil {
			obj.Annotations = map[string]string{}
		}
		obj.Annotations[ProcessAnnotation] = l.opts.Process
		if d := l.draining(sent); !d.IsZero() {
			obj.Annotations[DrainingAnnotation] = d.UTC().Format(time.RFC3339)
		} else {
			delete(obj.Annotations, DrainingAnnotation)
		}
	}
	if l.counts != nil {
		if obj.Annotations == nil {
			obj.Annotations = map[string]string{}
		}
		obj.Annotations[countsAnnotation] = l.counts()
	}
	if l.kinds != "" {
		if obj.Annotations == nil {
			obj.Annotations = map[string]string{}
		}
		obj.Annotations[KindsAnnotation] = l.kinds
	}
	obj.Spec.HolderIdentity = ptr.To(l.opts.Holder)
	obj.Spec.LeaseDurationSeconds = ptr.To(int32(l.opts.Duration / time.Second))
	obj.Spec.RenewTime = &metav1.MicroTime{Time: sent}
	if transition {
		obj.Spec.AcquireTime = &metav1.MicroTime{Time: sent}
		obj.Spec.LeaseTransitions = ptr.To(ptr.Deref(obj.Spec.LeaseTransitions, 0) + 1)
	}
}

// draining returns since when the process has been shutting down, zero
// while it is not.
func (l *lease) draining(now time.Time) time.Time {
	if l.opts.Draining == nil || !l.opts.Draining() {
		return time.Time{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.drainingSince.IsZero() {
		l.drainingSince = now
	}
	return l.drainingSince
}

// renewed records a successful write of the Lease, sent at sent.
func (l *lease) renewed(obj *coordinationv1.Lease, sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	gap := !l.valid()
	if gap && l.fence.Load() != 0 {
		l.lapses.Add(1)
	}
	if gap || l.since.IsZero() {
		l.since = sent
	}
	l.version = obj.ResourceVersion
	// The fence runs from when the renewal was sent, not when it was
	// answered: whatever the delay, the Lease says renewed no later.
	l.fence.Store(int64(sent.Sub(l.start) + l.opts.RenewDeadline))
}

// renew writes the Lease again. It returns errLost when another process
// wrote it meanwhile and it no longer names this holder.
func (l *lease) renew(ctx context.Context) error {
	key := client.ObjectKey{Namespace: l.opts.Namespace, Name: LeaseName(l.opts.Holder)}
	sent := time.Now() //nolint:forbidigo // leases are real time
	l.mu.Lock()
	version := l.version
	l.mu.Unlock()
	obj := &coordinationv1.Lease{}
	obj.Namespace, obj.Name, obj.ResourceVersion = key.Namespace, key.Name, version
	l.fill(obj, sent, false)
	// A merge patch with the resourceVersion, not an Update: an Update of
	// a Lease that is gone creates it again (Leases allow create on
	// update), and a holder paused while it was taken over and its Lease
	// deleted would renew its way back into serving claims it no longer
	// has. A patch of a missing object fails.
	raw, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": version, "labels": obj.Labels, "annotations": obj.Annotations,
	}, "spec": obj.Spec})
	if err != nil {
		return fmt.Errorf("encode lease %s: %w", key.Name, err)
	}
	err = l.c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, raw))
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		// Our last write may have landed with its reply lost; or someone
		// took the Lease over, or took it over and deleted it. Read it to
		// tell which.
		cur := &coordinationv1.Lease{}
		if gerr := l.r.Get(ctx, key, cur); apierrors.IsNotFound(gerr) {
			l.lose()
			return errLost
		} else if gerr != nil {
			return errors.Join(err, gerr)
		}
		if !l.ours(cur) {
			l.lose()
			return errLost
		}
		l.mu.Lock()
		l.version = cur.ResourceVersion
		l.mu.Unlock()
		return l.renew(ctx)
	}
	if err != nil {
		return fmt.Errorf("renew lease %s: %w", key.Name, err)
	}
	l.renewed(obj, sent)
	return nil
}

// lose forgets the Lease: this holder serves nothing until it acquires it
// again and recovers.
func (l *lease) lose() {
	l.fence.Store(0)
	l.mu.Lock()
	l.since = time.Time{}
	l.mu.Unlock()
}

// release gives the Lease up after a planned shutdown sealed the pools:
// another holder may take the claims over at once.
func (l *lease) release(ctx context.Context) error {
	l.lose()
	l.mu.Lock()
	version := l.version
	l.mu.Unlock()
	obj := &coordinationv1.Lease{}
	obj.Namespace, obj.Name, obj.ResourceVersion = l.opts.Namespace, LeaseName(l.opts.Holder), version
	l.fill(obj, time.Now(), false) //nolint:forbidigo // leases are real time
	obj.Spec.HolderIdentity = ptr.To("")
	if err := l.c.Update(ctx, obj); err != nil {
		return fmt.Errorf("release lease %s: %w", obj.Name, err)
	}
	return nil
}

// peer is another holder's Lease, as read.
type peer struct {
	holder string
	obj    coordinationv1.Lease
	// live: renewed by its holder within the lease duration; leaving: it
	// released its Lease, or let it lapse, or the holder taking it over
	// died: its claims may be taken over now.
	live, leaving bool
	// counts is what a live holder last published of its pools.
	counts map[string]holderCounts
}

// peers lists the holder Leases of the namespace.
func (l *lease) peers(ctx context.Context) ([]peer, error) {
	var list coordinationv1.LeaseList
	if err := l.r.List(ctx, &list, client.InNamespace(l.opts.Namespace), client.MatchingLabels{HolderLeaseLabel: "true"}); err != nil {
		return nil, fmt.Errorf("list holder leases: %w", err)
	}
	now := time.Now() //nolint:forbidigo // leases are real time
	var out []peer
	for _, obj := range list.Items {
		holder := strings.TrimPrefix(obj.Name, "vmipam-holder-")
		id := ptr.Deref(obj.Spec.HolderIdentity, "")
		p := peer{holder: holder, obj: obj}
		switch {
		case holder == l.opts.Holder:
			p.live = l.valid()
		case id == holder:
			// No slack beyond the duration: the fence already keeps
			// duration - renew deadline (5s by default) between the
			// holder's last handout and this moment, for clock skew
			// between nodes (docs/design.md, "Fencing").
			p.live = !expired(&obj, now, 0)
			p.leaving = !p.live
			if p.live {
				// Best effort: a holder of another version may publish
				// nothing, or something else.
				_ = json.Unmarshal([]byte(obj.Annotations[countsAnnotation]), &p.counts)
			}
		case id == "" && isSlot(&obj):
			// A released slot waits for its next incarnation (a
			// rollout's new pod) for a while: taken over, its objects
			// would all be relabelled.
			p.leaving = obj.Spec.RenewTime == nil || now.After(obj.Spec.RenewTime.Add(l.opts.Handoff))
		case id == "":
			p.leaving = true
		case strings.HasPrefix(id, TakeoverPrefix):
			// The holder taking it over renews the mark as it goes; one
			// that died leaves it to lapse.
			p.leaving = expired(&obj, now, 0)
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].holder < out[j].holder })
	return out, nil
}

// claimTakeover writes this holder's takeover mark on a leaving holder's
// Lease, compare-and-swap: only one holder takes another over. The mark
// is held as the lease itself is (see holdTakeover).
func (l *lease) claimTakeover(ctx context.Context, p peer) (*coordinationv1.Lease, error) {
	obj := p.obj.DeepCopy()
	obj.Spec.HolderIdentity = ptr.To(TakeoverPrefix + l.opts.Holder)
	obj.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()} //nolint:forbidigo // leases are real time
	if err := l.c.Update(ctx, obj); err != nil {
		return nil, fmt.Errorf("mark lease %s taken over: %w", obj.Name, err)
	}
	return obj, nil
}

// holdTakeover renews the takeover mark obj every retry period until ctx
// ends, so that neither the holder taken over (restarted under its old
// name, it waits for the mark to lapse) nor another taker starts while
// this one still writes the holder's blocks. When a renewal is refused
// (another process wrote the Lease) or none has landed for the renew
// deadline, it calls lost, which must stop the takeover's writes: the
// mark lapses the lease duration after its last renewal, and the renew
// deadline is shorter, as for a holder's own Lease.
//
// It returns the mark as last written.
func (l *lease) holdTakeover(ctx context.Context, obj *coordinationv1.Lease, lost func(error)) *coordinationv1.Lease {
	last := obj.Spec.RenewTime.Time
	tick := time.NewTicker(l.opts.RetryPeriod)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return obj
		case <-tick.C:
		}
		sent := time.Now() //nolint:forbidigo // leases are real time
		next := obj.DeepCopy()
		next.Spec.RenewTime = &metav1.MicroTime{Time: sent}
		callCtx, cancel := context.WithTimeout(ctx, l.opts.RetryPeriod)
		err := l.c.Update(callCtx, next)
		cancel()
		switch {
		case err == nil:
			obj, last = next, sent
		case ctx.Err() != nil:
			return obj
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			lost(fmt.Errorf("the takeover mark on lease %s was overwritten: %w", obj.Name, err))
			return obj
		case time.Since(last) > l.opts.RenewDeadline: //nolint:forbidigo // leases are real time
			lost(fmt.Errorf("the takeover mark on lease %s was last renewed %s ago: %w", obj.Name, time.Since(last).Round(time.Millisecond), err)) //nolint:forbidigo // leases are real time
			return obj
		}
	}
}

// finishTakeover deletes mark, the Lease of a holder whose claims were
// all taken over, as this holder last wrote it: a Lease written since (the
// holder came back after the mark lapsed) stays.
func (l *lease) finishTakeover(ctx context.Context, mark *coordinationv1.Lease) error {
	rv := mark.ResourceVersion
	if err := l.c.Delete(ctx, mark, client.Preconditions{ResourceVersion: &rv}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("delete lease %s: %w", mark.Name, err)
	}
	return nil
}

// expired reports whether obj's renewal is older than its duration plus
// slack at now.
func expired(obj *coordinationv1.Lease, now time.Time, slack time.Duration) bool {
	if obj.Spec.RenewTime == nil {
		return true
	}
	d := time.Duration(ptr.Deref(obj.Spec.LeaseDurationSeconds, int32(DefaultLeaseDuration/time.Second))) * time.Second
	return now.After(obj.Spec.RenewTime.Add(d + slack))
}

// labelValue fits a holder name into a label value.
func labelValue(holder string) string {
	if len(holder) > 63 {
		return holder[:63]
	}
	return holder
}
