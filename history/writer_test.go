package history

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/vmipam/vmipam/api/scheme"
	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

var t0 = time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)

func tenure(addr string, i int) vmipamv1.AddressRecord {
	from := metav1.NewTime(t0.Add(time.Duration(i) * time.Minute))
	return vmipamv1.AddressRecord{
		Address: addr, Pool: "p", Kind: "VirtualMachine.vmipam.io", Namespace: "ns", Name: fmt.Sprintf("vm-%d", i),
		UID: fmt.Sprintf("uid-%d", i), From: &from, To: metav1.NewTime(from.Add(30 * time.Second)), Ended: vmipamv1.EndedAllocated,
	}
}

// newWriter returns a Writer on a fake API server (a narrow unit test:
// the envtest suites write through a real one) and counts its writes.
func newWriter(t *testing.T) (*Writer, client.Client, *atomic.Int64) {
	t.Helper()
	var writes atomic.Int64
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			writes.Add(1)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			writes.Add(1)
			return c.Update(ctx, obj, opts...)
		},
	}).Build()
	w := NewWriter(c, c)
	w.Clock = fixedClock{t0.Add(time.Hour)}
	return w, c, &writes
}

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time                  { return c.t }
func (c fixedClock) Since(t time.Time) time.Duration { return c.t.Sub(t) }

func TestWriterRecordsAndReads(t *testing.T) {
	ctx := context.Background()
	w, c, _ := newWriter(t)
	recs := []vmipamv1.AddressRecord{tenure("10.0.0.5", 1), tenure("10.0.1.5", 2), tenure("10.0.0.5", 3), tenure("fd00::5", 4)}
	if err := w.Record(ctx, recs...); err != nil {
		t.Fatal(err)
	}
	// A retried release records the same tenure again.
	if err := w.Record(ctx, tenure("10.0.0.5", 3)); err != nil {
		t.Fatal(err)
	}
	got, err := Read(ctx, c, netip.MustParseAddr("10.0.0.5"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].UID != "uid-3" || got[1].UID != "uid-1" {
		t.Fatalf("history of 10.0.0.5 = %+v, want uid-3 then uid-1", got)
	}
	var list vmipamv1.IPHistoryList
	if err := c.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	names := map[string]int{}
	for _, s := range list.Items {
		names[s.Name] = len(s.Spec.Records)
	}
	want := map[string]int{"10-0-0-0-24.0": 2, "10-0-1-0-24.0": 1, "fd00---120.0": 1}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Fatalf("segments %v, want %v", names, want)
	}
}

func TestWriterRollsOverAndPrunes(t *testing.T) {
	ctx := context.Background()
	w, c, _ := newWriter(t)
	w.Keep = 3
	// 200 tenures of 4 addresses of one chunk: 50 each.
	for i := range 200 {
		if err := w.Record(ctx, tenure(fmt.Sprintf("10.0.0.%d", i%4), i)); err != nil {
			t.Fatal(err)
		}
	}
	segs, err := Segments(ctx, c, netip.MustParsePrefix("10.0.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, s := range segs {
		total += len(s.Spec.Records)
	}
	// The newest segment is never pruned; the others keep at most 3 per
	// address.
	newest := len(segs[len(segs)-1].Spec.Records)
	if total-newest > 4*3 {
		t.Errorf("%d records outside the newest segment, want at most 12 (3 per address)", total-newest)
	}
	if seq := segs[len(segs)-1].Spec.Sequence; seq != 3 {
		t.Errorf("newest segment %d, want 3 (200 records in segments of %d)", seq, SegmentRecords)
	}
	for a := range 4 {
		got, err := Read(ctx, c, netip.MustParseAddr(fmt.Sprintf("10.0.0.%d", a)))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) < 3 || got[0].UID != fmt.Sprintf("uid-%d", 196+a) {
			t.Errorf("10.0.0.%d: %d records, newest %q; want at least 3, newest uid-%d", a, len(got), got[0].UID, 196+a)
		}
	}
}

func TestWriterBatches(t *testing.T) {
	ctx := context.Background()
	w, c, writes := newWriter(t)
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() {
			if err := w.Record(ctx, tenure("10.0.0.9", i)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, err := Read(ctx, c, netip.MustParseAddr("10.0.0.9"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 60 {
		t.Fatalf("%d records, want 60", len(got))
	}
	t.Logf("60 concurrent records took %d writes", writes.Load())
}

func TestPrune(t *testing.T) {
	seg := func(name string, recs ...vmipamv1.AddressRecord) vmipamv1.IPHistory {
		return vmipamv1.IPHistory{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: vmipamv1.IPHistorySpec{Records: recs}}
	}
	old := tenure("10.0.0.1", 0)
	old.To = metav1.NewTime(t0.Add(-100 * 24 * time.Hour))
	for _, tc := range []struct {
		name   string
		segs   []vmipamv1.IPHistory
		keep   int
		cutoff time.Time
		want   map[string]int
	}{
		{"keeps the newest per address", []vmipamv1.IPHistory{seg("a", tenure("10.0.0.1", 1), tenure("10.0.0.2", 2)), seg("b", tenure("10.0.0.1", 3))}, 1, t0.Add(-time.Hour),
			map[string]int{"a": 1, "b": 1}},
		{"drops past the retention", []vmipamv1.IPHistory{seg("a", old, tenure("10.0.0.1", 1))}, 16, t0.Add(-90 * 24 * time.Hour),
			map[string]int{"a": 1}},
		{"keeps all within both bounds", []vmipamv1.IPHistory{seg("a", tenure("10.0.0.1", 1), tenure("10.0.0.1", 2))}, 2, t0.Add(-time.Hour),
			map[string]int{"a": 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Prune(tc.segs, tc.keep, tc.cutoff)
			n := map[string]int{}
			for k, v := range got {
				n[k] = len(v)
			}
			if fmt.Sprint(n) != fmt.Sprint(tc.want) {
				t.Fatalf("Prune kept %v, want %v", n, tc.want)
			}
		})
	}
}

// TestWriterManyChunks: one batch over more chunks than it writes at once
// stores every chunk's records, and a chunk whose writes fail fails the
// batch naming that chunk alone, the others' records stored all the same.
func TestWriterManyChunks(t *testing.T) {
	ctx := context.Background()
	var inFlight, most atomic.Int64
	failing := SegmentName(netip.MustParsePrefix("10.0.7.0/24"), 0)
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(5 * time.Millisecond) // a round trip, so that the writes overlap
			if obj.GetName() == failing {
				return apierrors.NewInternalError(errors.New("etcd is sad"))
			}
			return c.Create(ctx, obj, opts...)
		},
	}).Build()
	w := NewWriter(c, c)
	w.Clock = fixedClock{t0.Add(time.Hour)}
	var recs []vmipamv1.AddressRecord
	for i := range 3 * parallelChunks {
		recs = append(recs, tenure(fmt.Sprintf("10.0.%d.1", i), i))
	}
	err := w.Record(ctx, recs...)
	if err == nil || !strings.Contains(err.Error(), "10.0.7.0/24") || strings.Contains(err.Error(), "10.0.8.0/24") {
		t.Fatalf("Record = %v, want the error of chunk 10.0.7.0/24 alone", err)
	}
	for i := range 3 * parallelChunks {
		got, err := Read(ctx, c, netip.MustParseAddr(fmt.Sprintf("10.0.%d.1", i)))
		if err != nil {
			t.Fatal(err)
		}
		if want := 1 - b2i(i == 7); len(got) != want {
			t.Errorf("10.0.%d.1: %d records, want %d", i, len(got), want)
		}
	}
	if m := most.Load(); m < 2 || m > parallelChunks {
		t.Errorf("at most %d chunk writes at once, want 2 to %d", m, parallelChunks)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
