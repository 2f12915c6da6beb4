package pools

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	vmipamscheme "github.com/vmipam/vmipam/api/scheme"
	"github.com/vmipam/vmipam/kinds"
)

// slotLease is a slot's Lease as listed: held by identity id for process
// proc, renewed ago before now with a lease of 15s.
func slotLease(holder, id, proc string, ago time.Duration, now time.Time, annotations ...string) coordinationv1.Lease {
	obj := coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "vmipam-system", Name: LeaseName(holder),
			Labels:      map[string]string{HolderLeaseLabel: "true", SlotLabel: "true"},
			Annotations: map[string]string{ProcessAnnotation: proc},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(id),
			LeaseDurationSeconds: ptr.To(int32(15)),
			RenewTime:            &metav1.MicroTime{Time: now.Add(-ago)},
		},
	}
	for i := 0; i+1 < len(annotations); i += 2 {
		obj.Annotations[annotations[i]] = annotations[i+1]
	}
	return obj
}

func TestChooseSlot(t *testing.T) {
	now := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	draining := []string{DrainingAnnotation, now.Format(time.RFC3339)}
	podName := func(holder, id, proc string, ago time.Duration) coordinationv1.Lease {
		obj := slotLease(holder, id, proc, ago, now)
		delete(obj.Labels, SlotLabel) // a holder named after its pod
		return obj
	}
	tests := []struct {
		name   string
		leases []coordinationv1.Lease
		wait   bool
		want   slotChoice
	}{
		{name: "none: slot-0, created", want: slotChoice{holder: "slot-0"}},
		{
			name: "its own, after a restart of its container, before any released one",
			leases: []coordinationv1.Lease{
				slotLease("slot-0", "", "old", time.Second, now),
				slotLease("slot-1", "slot-1", "me", time.Second, now),
			},
			want: slotChoice{holder: "slot-1"},
		},
		{
			name: "the lowest released one, before a lapsed one",
			leases: []coordinationv1.Lease{
				slotLease("slot-0", "slot-0", "crashed", time.Minute, now),
				slotLease("slot-3", "", "gone", time.Second, now),
				slotLease("slot-2", "", "gone", time.Second, now),
				slotLease("slot-1", "slot-1", "live", time.Second, now),
			},
			want: slotChoice{holder: "slot-2"},
		},
		{
			name: "a lapsed one, not a live one",
			leases: []coordinationv1.Lease{
				slotLease("slot-0", "slot-0", "live", time.Second, now),
				slotLease("slot-1", "slot-1", "crashed", 16*time.Second, now),
			},
			want: slotChoice{holder: "slot-1"},
		},
		{
			name: "a draining one is waited for",
			leases: []coordinationv1.Lease{
				slotLease("slot-0", "slot-0", "live", time.Second, now),
				slotLease("slot-1", "slot-1", "stopping", time.Second, now, draining...),
			},
			wait: true,
			want: slotChoice{wait: true},
		},
		{
			name: "a draining one waited for long enough: a new slot",
			leases: []coordinationv1.Lease{
				slotLease("slot-0", "slot-0", "live", time.Second, now),
				slotLease("slot-1", "slot-1", "stopping", time.Second, now, draining...),
			},
			want: slotChoice{holder: "slot-2"},
		},
		{
			name: "one being taken over is neither taken nor reused: the lowest free number",
			leases: []coordinationv1.Lease{
				slotLease("slot-0", TakeoverPrefix+"slot-1", "gone", time.Second, now),
				slotLease("slot-1", "slot-1", "live", time.Second, now),
				slotLease("slot-3", "slot-3", "live", time.Second, now),
			},
			want: slotChoice{holder: "slot-2"},
		},
		{
			name: "holders named after pods are left alone",
			leases: []coordinationv1.Lease{
				podName("vmipam-abc", "", "", time.Minute),
				podName("slot-0", "", "", time.Minute), // not labelled a slot: its number is not reused
			},
			want: slotChoice{holder: "slot-1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := chooseSlot(tc.leases, "me", now, tc.wait)
			if got.holder != tc.want.holder || got.wait != tc.want.wait {
				t.Fatalf("chooseSlot = holder %q wait %v (%s); want holder %q wait %v", got.holder, got.wait, got.why, tc.want.holder, tc.want.wait)
			}
			if got.holder != "" && (got.lease == nil) != (got.why == "every slot is held") {
				t.Errorf("chooseSlot(%s): lease %v for %q", got.holder, got.lease != nil, got.why)
			}
		})
	}
}

// TestTakeSlot: a slot taken is written for this process (a
// compare-and-swap on the Lease as listed), renewed until the Registry
// takes over, and its Lease as the Registry acquires it is this
// process's; a process whose slot another live process took refuses to
// acquire it.
func TestTakeSlot(t *testing.T) {
	ctx := t.Context()
	now := time.Now()
	released := slotLease("slot-0", "", "old", time.Second, now, countsAnnotation, `{"p":{"a":3}}`)
	c := fake.NewClientBuilder().WithScheme(vmipamscheme.Scheme).WithObjects(&released).Build()
	opts := LeaseOptions{Namespace: "vmipam-system", Process: "new",
		Duration: time.Second, RenewDeadline: 700 * time.Millisecond, RetryPeriod: 50 * time.Millisecond}
	s, err := TakeSlot(ctx, c, SlotOptions{Lease: opts, Settle: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if s.Holder != "slot-0" {
		t.Fatalf("took %s; want the released slot-0", s.Holder)
	}
	var got coordinationv1.Lease
	key := client.ObjectKey{Namespace: "vmipam-system", Name: LeaseName("slot-0")}
	if err := c.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(got.Spec.HolderIdentity, "") != "slot-0" || got.Annotations[ProcessAnnotation] != "new" || got.Annotations[countsAnnotation] != "" {
		t.Fatalf("slot Lease after the take: identity %q, annotations %v; want slot-0, process new, no counts of the old process",
			ptr.Deref(got.Spec.HolderIdentity, ""), got.Annotations)
	}
	// Renewed while waiting for the Registry, past the lease duration.
	time.Sleep(1500 * time.Millisecond)
	if err := c.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	if expired(&got, time.Now(), 0) {
		t.Fatalf("the slot's Lease lapsed before the Registry took it over: renewed %s", got.Spec.RenewTime)
	}
	s.handOff()

	// The Registry's lease acquires it as this process's.
	opts.Holder = s.Holder
	l := newLease(c, c, opts)
	if err := l.tryAcquire(ctx); err != nil {
		t.Fatalf("acquire the slot taken: %v", err)
	}
	if err := l.renew(ctx); err != nil {
		t.Fatalf("renew: %v", err)
	}

	// Another process took the slot (this one had stopped renewing for
	// longer than the duration): renewal says lost, acquiring refuses.
	if err := c.Get(ctx, key, &got); err != nil {
		t.Fatal(err)
	}
	got.Annotations[ProcessAnnotation] = "thief"
	got.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if err := c.Update(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if err := l.renew(ctx); !errors.Is(err, errLost) {
		t.Fatalf("renew after another process took the slot: %v; want errLost", err)
	}
	if err := l.tryAcquire(ctx); !errors.Is(err, ErrSlotTaken) {
		t.Fatalf("acquire after another process took the slot: %v; want ErrSlotTaken", err)
	}
}

// TestSlotHandoff: the other replicas take a released slot's claims over
// only once its next incarnation had its handoff time to take it; a
// holder named after its pod is taken over at once, as before.
func TestSlotHandoff(t *testing.T) {
	now := time.Now()
	tests := []struct {
		name        string
		lease       coordinationv1.Lease
		wantLeaving bool
	}{
		{name: "slot released a second ago", lease: slotLease("slot-1", "", "old", time.Second, now)},
		{name: "slot released past the handoff", lease: slotLease("slot-1", "", "old", DefaultSlotHandoff+time.Second, now), wantLeaving: true},
		{name: "slot lapsed", lease: slotLease("slot-1", "slot-1", "old", time.Minute, now), wantLeaving: true},
		{name: "pod-named holder released a second ago", lease: func() coordinationv1.Lease {
			l := slotLease("vmipam-x", "", "", time.Second, now)
			delete(l.Labels, SlotLabel)
			return l
		}(), wantLeaving: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(vmipamscheme.Scheme).WithObjects(&tc.lease).Build()
			l := newLease(c, c, LeaseOptions{Namespace: "vmipam-system", Holder: "slot-0", Process: "me"})
			peers, err := l.peers(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(peers) != 1 || peers[0].leaving != tc.wantLeaving {
				t.Fatalf("peers = %+v; want one, leaving %v", peers, tc.wantLeaving)
			}
		})
	}
}

// TestDrainingSaidAtOnce: a slot's process that starts to drain says so
// on its Lease at once, not at its next renewal (a retry period of a
// minute here), so that its replacement, looking meanwhile, waits for the
// release rather than settle first.
func TestDrainingSaidAtOnce(t *testing.T) {
	ctx := t.Context()
	c := fake.NewClientBuilder().WithScheme(vmipamscheme.Scheme).Build()
	var draining atomic.Bool
	opts := LeaseOptions{Namespace: "vmipam-system", Process: "p1", Draining: draining.Load,
		Duration: 3 * time.Minute, RenewDeadline: 2 * time.Minute, RetryPeriod: time.Minute}
	s, err := TakeSlot(ctx, c, SlotOptions{Lease: opts, Settle: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	opts.Holder = s.Holder
	reg := NewRegistry(Options{Client: c, APIReader: c, Kinds: kinds.Default(), Holder: s.Holder, Lease: opts, Slot: s,
		RunInterval: time.Hour, ResyncInterval: time.Hour, StatusInterval: time.Hour, ProveInterval: time.Hour})
	regCtx, stop := context.WithCancel(ctx)
	var done sync.WaitGroup
	done.Go(func() { _ = reg.Start(regCtx) })
	t.Cleanup(func() { stop(); done.Wait() })
	select {
	case <-reg.leased:
	case <-time.After(10 * time.Second):
		t.Fatal("the registry did not hold its slot's Lease")
	}

	draining.Store(true)
	key := client.ObjectKey{Namespace: "vmipam-system", Name: LeaseName(s.Holder)}
	var got coordinationv1.Lease
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := c.Get(ctx, key, &got); err != nil {
			t.Fatal(err)
		}
		if got.Annotations[DrainingAnnotation] != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slot's Lease does not say its process drains 10s after it began (retry period %s): annotations %v", opts.RetryPeriod, got.Annotations)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
