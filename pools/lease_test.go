package pools

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	vmipamscheme "github.com/vmipam/vmipam/api/scheme"
)

// TestHoldTakeover: a holder taking another over keeps its mark on the
// Lease renewed for as long as the takeover runs, so that the holder taken
// over, restarted under its name, cannot come back in the middle of it
// (it waits for the mark to lapse); a mark overwritten meanwhile stops
// the takeover; and the Lease is deleted at the end only as the taker
// last wrote it.
func TestHoldTakeover(t *testing.T) {
	tests := []struct {
		name string
		// comeBack: the holder taken over writes its Lease again
		// while the mark is held.
		comeBack bool
	}{
		{name: "held for longer than the lease duration"},
		{name: "overwritten by the holder coming back", comeBack: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			old := &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Namespace: "vmipam-system", Name: LeaseName("gone")},
				Spec: coordinationv1.LeaseSpec{
					HolderIdentity:       ptr.To("gone"),
					LeaseDurationSeconds: ptr.To(int32(1)),
					RenewTime:            &metav1.MicroTime{Time: time.Now().Add(-time.Minute)},
				},
			}
			c := fake.NewClientBuilder().WithScheme(vmipamscheme.Scheme).WithObjects(old).Build()
			opts := LeaseOptions{Namespace: "vmipam-system", Holder: "taker",
				Duration: time.Second, RenewDeadline: 700 * time.Millisecond, RetryPeriod: 50 * time.Millisecond}
			l := newLease(c, c, opts)
			var p peer
			if err := c.Get(ctx, client.ObjectKeyFromObject(old), &p.obj); err != nil {
				t.Fatal(err)
			}
			mark, err := l.claimTakeover(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			markCtx, stop := context.WithCancelCause(ctx)
			var wg sync.WaitGroup
			var last *coordinationv1.Lease
			wg.Go(func() { last = l.holdTakeover(markCtx, mark, stop) })

			// The holder taken over, restarted, tries for two lease
			// durations.
			back := newLease(c, c, LeaseOptions{Namespace: "vmipam-system", Holder: "gone",
				Duration: time.Second, RenewDeadline: 700 * time.Millisecond, RetryPeriod: 50 * time.Millisecond})
			for end := time.Now().Add(2 * time.Second); time.Now().Before(end) && markCtx.Err() == nil; time.Sleep(50 * time.Millisecond) {
				if tc.comeBack {
					var cur coordinationv1.Lease
					if err := c.Get(ctx, client.ObjectKeyFromObject(old), &cur); err != nil {
						t.Fatal(err)
					}
					cur.Spec.HolderIdentity = ptr.To("gone")
					cur.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
					if err := c.Update(ctx, &cur); err != nil && !apierrors.IsConflict(err) {
						t.Fatal(err)
					}
					continue
				}
				if err := back.tryAcquire(ctx); !errors.Is(err, errTakingOver) {
					t.Fatalf("the holder taken over, restarted while the takeover runs: %v; want errTakingOver", err)
				}
			}
			stop(nil)
			wg.Wait()
			cause := context.Cause(markCtx)
			switch {
			case tc.comeBack && errors.Is(cause, context.Canceled):
				t.Fatal("the mark was overwritten and the takeover was not stopped")
			case !tc.comeBack && !errors.Is(cause, context.Canceled):
				t.Fatalf("the takeover was stopped with the mark held: %v", cause)
			}
			err = l.finishTakeover(ctx, last)
			var cur coordinationv1.Lease
			getErr := c.Get(ctx, client.ObjectKeyFromObject(old), &cur)
			switch {
			case tc.comeBack && (err == nil || getErr != nil || ptr.Deref(cur.Spec.HolderIdentity, "") != "gone"):
				t.Errorf("the Lease of the holder that came back: delete %v, read %v, holder %q; want it kept", err, getErr, ptr.Deref(cur.Spec.HolderIdentity, ""))
			case !tc.comeBack && (err != nil || !apierrors.IsNotFound(getErr)):
				t.Errorf("the Lease taken over: delete %v, read %v; want it deleted", err, getErr)
			}
		})
	}
}

// TestLeaseLapses: a renewal that comes after the fence ran out counts a
// lapse, before the fence is valid again; the first acquisition and
// renewals in time count none.
func TestLeaseLapses(t *testing.T) {
	l := newLease(nil, nil, LeaseOptions{Namespace: "vmipam-system", Holder: "h", RenewDeadline: time.Hour})
	obj := &coordinationv1.Lease{}
	steps := []struct {
		name   string
		lapsed bool // the fence ran out before this renewal
		want   uint64
	}{
		{name: "acquired", want: 0},
		{name: "renewed in time", want: 0},
		{name: "renewed after a lapse", lapsed: true, want: 1},
		{name: "renewed in time again", want: 1},
		{name: "another lapse", lapsed: true, want: 2},
	}
	for _, st := range steps {
		if st.lapsed {
			l.fence.Store(1) // one nanosecond after start: long past
		}
		l.renewed(obj, time.Now())
		if got := l.lapses.Load(); got != st.want || !l.valid() {
			t.Fatalf("%s: %d lapses counted, valid %v; want %d, valid", st.name, got, l.valid(), st.want)
		}
	}
}
