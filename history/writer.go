package history

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// +kubebuilder:rbac:groups=vmipam.io,resources=iphistories,verbs=get;list;create;update;delete

// Defaults of a Writer.
const (
	// DefaultKeep is how many records of each address are kept.
	DefaultKeep = 16
	// DefaultRetention is how long a record is kept.
	DefaultRetention = 90 * 24 * time.Hour
	// SegmentRecords is how many records a segment holds: some 13 KiB of
	// JSON, so that an append rewrites little.
	SegmentRecords = 64
	// maxAttempts bounds the retries of one chunk's append on conflicts
	// with other replicas appending to it.
	maxAttempts = 8
	// parallelChunks bounds the chunks one batch writes at once.
	parallelChunks = 8
)

// Writer appends records to the history. Record waits until its records
// are stored; the records of the calls made while a write is on its way
// go together in the next, one write per chunk (see doc.go). It is safe
// for concurrent use.
type Writer struct {
	c client.Client
	r client.Reader
	// Keep and Retention bound what is kept of each address; zero takes
	// DefaultKeep and DefaultRetention.
	Keep      int
	Retention time.Duration
	Clock     clock.PassiveClock

	mu sync.Mutex
	// queue is what the next write takes; busy is set while a goroutine
	// writes. Each queued batch says to its callers when it is stored.
	queue *batch
	busy  bool
	// newest is, by chunk, its newest segment as last read or written.
	newest map[netip.Prefix]*vmipamv1.IPHistory
}

// batch is the records of one write and the error it ended with, told
// through done.
type batch struct {
	recs []vmipamv1.AddressRecord
	done chan struct{}
	err  error
}

// NewWriter returns a Writer that writes with c and reads segments with
// r, which must read from the API server (not a cache).
func NewWriter(c client.Client, r client.Reader) *Writer {
	return &Writer{c: c, r: r, newest: map[netip.Prefix]*vmipamv1.IPHistory{}}
}

// Record stores recs and returns once they are, or the write failed. A
// record written twice (a retried release) is read once (see Sort).
func (w *Writer) Record(ctx context.Context, recs ...vmipamv1.AddressRecord) error {
	if len(recs) == 0 {
		return nil
	}
	w.mu.Lock()
	if w.queue == nil {
		w.queue = &batch{done: make(chan struct{})}
	}
	b := w.queue
	b.recs = append(b.recs, recs...)
	if !w.busy {
		w.busy = true
		go w.drain()
	}
	w.mu.Unlock()
	select {
	case <-b.done:
		return b.err
	case <-ctx.Done():
		return fmt.Errorf("record the history of %s: %w", recs[0].Address, ctx.Err())
	}
}

// drain writes the queued batches, one after the other, until none is
// left.
func (w *Writer) drain() {
	for {
		w.mu.Lock()
		b := w.queue
		w.queue = nil
		if b == nil {
			w.busy = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		// Not the callers' contexts: a write half done for one whose
		// context ended is finished for the others.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		b.err = w.write(ctx, b.recs)
		cancel()
		close(b.done)
	}
}

// write appends recs, by chunk.
func (w *Writer) write(ctx context.Context, recs []vmipamv1.AddressRecord) error {
	by := map[netip.Prefix][]vmipamv1.AddressRecord{}
	for _, rec := range recs {
		a, err := netip.ParseAddr(rec.Address)
		if err != nil {
			return fmt.Errorf("record the history of %q: not an address: %w", rec.Address, err)
		}
		by[ChunkOf(a)] = append(by[ChunkOf(a)], rec)
	}
	// The chunks in parallel, a few at a time: each is its own object,
	// and a release waits for its chunk's write before its finalizer
	// comes off, so a batch over many chunks written one by one would
	// hold every delete in it for the sum of their round trips.
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, parallelChunks)
	)
	for chunk, recs := range by {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := w.appendTo(ctx, chunk, recs); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.SortFunc(errs, func(a, b error) int { return cmp.Compare(a.Error(), b.Error()) })
	return errors.Join(errs...)
}

// appendTo appends recs to chunk's newest segment, starting new ones as
// it fills, and prunes the chunk's older segments when it started one.
func (w *Writer) appendTo(ctx context.Context, chunk netip.Prefix, recs []vmipamv1.AddressRecord) error {
	for attempt := 0; ; attempt++ {
		seg, err := w.newestOf(ctx, chunk)
		if err != nil {
			return err
		}
		left := w.fresh(seg, recs)
		if len(left) == 0 {
			return nil
		}
		started, err := w.put(ctx, chunk, seg, left)
		switch {
		case err == nil:
			if started {
				// Pruning is housekeeping: the records are stored.
				_ = w.prune(ctx, chunk)
			}
			return nil
		case (apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err)) && attempt < maxAttempts:
			// Another replica appended, started a segment or pruned:
			// read the chunk again.
			w.forget(chunk)
		default:
			w.forget(chunk)
			return fmt.Errorf("record the history of %s: %w", chunk, err)
		}
	}
}

// fresh returns the records of recs that seg does not hold yet.
func (w *Writer) fresh(seg *vmipamv1.IPHistory, recs []vmipamv1.AddressRecord) []vmipamv1.AddressRecord {
	if seg == nil {
		return recs
	}
	have := map[key]bool{}
	for _, r := range seg.Spec.Records {
		have[keyOf(r)] = true
	}
	var out []vmipamv1.AddressRecord
	for _, r := range recs {
		if k := keyOf(r); !have[k] {
			have[k] = true
			out = append(out, r)
		}
	}
	return out
}

// put writes recs into seg (nil: the chunk has none), filling it and
// creating the segments after it as needed. It reports whether it
// started a segment.
func (w *Writer) put(ctx context.Context, chunk netip.Prefix, seg *vmipamv1.IPHistory, recs []vmipamv1.AddressRecord) (bool, error) {
	started := false
	for len(recs) > 0 {
		if seg != nil && len(seg.Spec.Records) < SegmentRecords {
			n := min(SegmentRecords-len(seg.Spec.Records), len(recs))
			next := seg.DeepCopy()
			next.Spec.Records = append(next.Spec.Records, recs[:n]...)
			if err := w.c.Update(ctx, next); err != nil {
				return started, err
			}
			w.remember(chunk, next)
			seg, recs = next, recs[n:]
			continue
		}
		seq := int64(0)
		if seg != nil {
			seq = seg.Spec.Sequence + 1
		}
		n := min(SegmentRecords, len(recs))
		next := &vmipamv1.IPHistory{
			ObjectMeta: metav1.ObjectMeta{
				Name:   SegmentName(chunk, seq),
				Labels: map[string]string{vmipamv1.ChunkLabel: ChunkLabelValue(chunk)},
			},
			Spec: vmipamv1.IPHistorySpec{Pool: recs[0].Pool, Chunk: chunk.String(), Sequence: seq, Records: slices.Clone(recs[:n])},
		}
		if err := w.c.Create(ctx, next); err != nil {
			return started, err
		}
		started = true
		w.remember(chunk, next)
		seg, recs = next, recs[n:]
	}
	return started, nil
}

func (w *Writer) remember(chunk netip.Prefix, seg *vmipamv1.IPHistory) {
	w.mu.Lock()
	w.newest[chunk] = seg
	w.mu.Unlock()
}

func (w *Writer) forget(chunk netip.Prefix) {
	w.mu.Lock()
	delete(w.newest, chunk)
	w.mu.Unlock()
}

// newestOf returns chunk's newest segment, nil when it has none, read
// from the API server unless this Writer wrote or read it last.
func (w *Writer) newestOf(ctx context.Context, chunk netip.Prefix) (*vmipamv1.IPHistory, error) {
	w.mu.Lock()
	seg := w.newest[chunk]
	w.mu.Unlock()
	if seg != nil {
		return seg, nil
	}
	segs, err := Segments(ctx, w.r, chunk)
	if err != nil {
		return nil, err
	}
	if len(segs) == 0 {
		return nil, nil
	}
	seg = &segs[len(segs)-1]
	w.remember(chunk, seg)
	return seg, nil
}

// prune drops from chunk's segments before the newest the records past
// the newest Keep of their address or older than Retention: a segment
// left with none is deleted, one that lost at least half is rewritten
// with the rest. A segment so keeps at least half its records, and a
// chunk at most about 2*Keep*256/SegmentRecords segments.
func (w *Writer) prune(ctx context.Context, chunk netip.Prefix) error {
	segs, err := Segments(ctx, w.r, chunk)
	if err != nil || len(segs) < 2 {
		return err
	}
	keep, retention := cmp.Or(w.Keep, DefaultKeep), cmp.Or(w.Retention, DefaultRetention)
	clk := w.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	cutoff := clk.Now().Add(-retention)
	kept := Prune(segs, keep, cutoff)
	var errs []error
	for i := range segs[:len(segs)-1] {
		seg := &segs[i]
		recs := kept[seg.Name]
		switch {
		case len(recs) == 0:
			errs = append(errs, client.IgnoreNotFound(w.c.Delete(ctx, seg, client.Preconditions{ResourceVersion: &seg.ResourceVersion})))
		case 2*len(recs) <= len(seg.Spec.Records):
			next := seg.DeepCopy()
			next.Spec.Records = recs
			errs = append(errs, client.IgnoreNotFound(w.c.Update(ctx, next)))
		}
	}
	return errors.Join(errs...)
}

// Prune returns, by segment name, the records of segs (oldest segment
// first) to keep: each address's newest keep records that ended after
// cutoff, in their order.
func Prune(segs []vmipamv1.IPHistory, keep int, cutoff time.Time) map[string][]vmipamv1.AddressRecord {
	type at struct{ seg, i int }
	by := map[string][]at{}
	for s := range segs {
		for i, r := range segs[s].Spec.Records {
			by[r.Address] = append(by[r.Address], at{s, i})
		}
	}
	keepAt := map[at]bool{}
	for _, ats := range by {
		// Newest first, by when they ended; the later written first among
		// equals.
		slices.SortStableFunc(ats, func(a, b at) int {
			ra, rb := segs[a.seg].Spec.Records[a.i], segs[b.seg].Spec.Records[b.i]
			if c := rb.To.Compare(ra.To.Time); c != 0 {
				return c
			}
			return cmp.Or(cmp.Compare(b.seg, a.seg), cmp.Compare(b.i, a.i))
		})
		n := 0
		for _, x := range ats {
			if n == keep || !segs[x.seg].Spec.Records[x.i].To.After(cutoff) {
				break
			}
			keepAt[x] = true
			n++
		}
	}
	out := map[string][]vmipamv1.AddressRecord{}
	for s := range segs {
		for i, r := range segs[s].Spec.Records {
			if keepAt[at{s, i}] {
				out[segs[s].Name] = append(out[segs[s].Name], r)
			}
		}
	}
	return out
}
