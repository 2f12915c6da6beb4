package ipam

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// slowReadStore answers a read with what the store held when the read
// arrived, but only once the test lets it go: a read overtaken by writes,
// as a Get or List to the API server can be by the Manager's own writes
// through another goroutine.
type slowReadStore struct {
	*MemoryStore
	mu sync.Mutex
	// holds are for the next reads, one each, in order.
	holds []readHold
	// lostReplies fails that many committed Puts.
	lostReplies int
}

// readHold holds a read until hold is closed; read is closed once the read
// has taken its snapshot.
type readHold struct{ hold, read chan struct{} }

// holdNext makes the next read not yet held wait until the returned
// release is called, and returns a channel closed once that read has taken
// its snapshot.
func (s *slowReadStore) holdNext() (read <-chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := readHold{hold: make(chan struct{}), read: make(chan struct{})}
	s.holds = append(s.holds, h)
	return h.read, sync.OnceFunc(func() { close(h.hold) })
}

func (s *slowReadStore) take() (hold, read chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.holds) == 0 {
		return nil, nil
	}
	h := s.holds[0]
	s.holds = s.holds[1:]
	return h.hold, h.read
}

func (s *slowReadStore) Put(ctx context.Context, b Block) (string, error) {
	s.mu.Lock()
	lost := s.lostReplies > 0
	if lost {
		s.lostReplies--
	}
	s.mu.Unlock()
	v, err := s.MemoryStore.Put(ctx, b)
	if err == nil && lost {
		return "", errors.New("injected: the reply was lost after the commit")
	}
	return v, err
}

func (s *slowReadStore) Get(ctx context.Context, p netip.Prefix) (Block, error) {
	hold, read := s.take()
	b, err := s.MemoryStore.Get(ctx, p)
	if hold != nil {
		close(read)
		<-hold
	}
	return b, err
}

func (s *slowReadStore) List(ctx context.Context) ([]Block, error) {
	hold, read := s.take()
	bs, err := s.MemoryStore.List(ctx)
	if hold != nil {
		close(read)
		<-hold
	}
	return bs, err
}

// TestReadOvertakenByWrites: a read that this Manager's own writes
// overtook shows an older block than the Manager holds. Taking it for the
// store's state made the Manager see another holder on an address handed
// to it since, and stop serving as if its claims had been taken over
// (ErrClaimLost); with several replicas sharing a block under load, that
// failed every create on the replica for seconds at a time.
func TestReadOvertakenByWrites(t *testing.T) {
	ctx := context.Background()
	p := netip.MustParsePrefix("10.0.0.0/20")
	x := addr("10.0.0.9")
	for _, tt := range []struct {
		name string
		// read starts the read that is overtaken, on m, and returns once
		// it is done.
		read func(m *Manager) error
	}{
		{"get", func(m *Manager) error { return m.load(ctx, p) }},
		{"takeover list", func(m *Manager) error {
			_, err := m.Takeover(ctx, "gone", nil)
			return err
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			st := &slowReadStore{MemoryStore: NewMemoryStore()}
			// h2 claims x, and a holder that left claims another address,
			// for the takeover to find.
			h2 := newSharingManager(t, st, clk, "h2")
			if err := h2.claimAddr(ctx, x); err != nil {
				t.Fatal(err)
			}
			b, _ := st.MemoryStore.Get(ctx, p)
			b.Claims["gone"] = new(Bitmap)
			b.Claims["gone"].Set(blockOffset(addr("10.0.0.200")))
			if _, err := st.MemoryStore.Put(ctx, b); err != nil {
				t.Fatal(err)
			}
			h1 := newSharingManager(t, st, clk, "h1")

			// The read takes its snapshot (h2 claims x) and is held.
			read, release := st.holdNext()
			defer release()
			done := make(chan error, 1)
			go func() { done <- tt.read(h1) }()
			<-read
			// Meanwhile h2 gives x back and h1 claims it.
			if err := h2.giveBack(ctx, pickAddr(h2, x)); err != nil {
				t.Fatal(err)
			}
			if err := h1.load(ctx, p); err != nil {
				t.Fatal(err)
			}
			if err := h1.claimAddr(ctx, x); err != nil {
				t.Fatalf("h1 claims %s: %v", x, err)
			}
			if st, _, _ := h1.Lookup(x); st != StateFree {
				t.Fatalf("%s is %v on h1 after its claim, want free", x, st)
			}
			release()
			if err := <-done; err != nil {
				t.Fatalf("the overtaken read: %v", err)
			}
			// h1 goes on writing the block, and serving.
			y := addr("10.0.0.10")
			if err := h1.claimAddr(ctx, y); err != nil {
				if errors.Is(err, ErrClaimLost) {
					t.Fatalf("h1 took an overtaken read for a takeover of its claims: %v", err)
				}
				t.Fatalf("h1 claims %s: %v", y, err)
			}
			if err := h1.Reserve(ctx, Reservation{Token: "tok"}, x); err != nil {
				t.Fatalf("reserve %s on h1: %v", x, err)
			}
			got, _ := st.MemoryStore.Get(ctx, p)
			for _, a := range []netip.Addr{x, y} {
				if h, _ := got.holderOf(blockOffset(a)); h != "h1" {
					t.Errorf("the store shows %s held by %q, want h1", a, h)
				}
			}
		})
	}
}

// TestReadBeforeLostReply: a read that started before a give-back whose
// reply was lost shows the address as still this holder's. The give-back
// did land, and another holder claimed the address since. Applied after
// the failed give-back (which leaves it to the store to say whether the
// address is still this holder's) and before the read that follows it,
// the stale read made the address this holder's again, and the next write
// took the other holder's claim for a takeover.
func TestReadBeforeLostReply(t *testing.T) {
	ctx := context.Background()
	p := netip.MustParsePrefix("10.0.0.0/20")
	x, y := addr("10.0.0.9"), addr("10.0.0.10")
	clk := newFakeClock()
	st := &slowReadStore{MemoryStore: NewMemoryStore()}
	h1, h2 := newSharingManager(t, st, clk, "h1"), newSharingManager(t, st, clk, "h2")
	// x to give back, and another so that the block stays.
	for _, a := range []netip.Addr{x, addr("10.0.0.20")} {
		if err := h1.claimAddr(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	// The stale read takes its snapshot (x is h1's) and is held.
	staleRead, releaseStale := st.holdNext()
	defer releaseStale()
	staleDone := make(chan error, 1)
	go func() { staleDone <- h1.load(ctx, p) }()
	<-staleRead
	// The give-back lands, its reply is lost, and the read that follows
	// it is held too.
	st.mu.Lock()
	st.lostReplies = 1
	st.mu.Unlock()
	reread, releaseReread := st.holdNext()
	defer releaseReread()
	gaveBack := make(chan error, 1)
	go func() { gaveBack <- h1.giveBack(ctx, pickAddr(h1, x)) }()
	<-reread
	// The stale read lands first, then the read after the give-back.
	releaseStale()
	if err := <-staleDone; err != nil {
		t.Fatal(err)
	}
	releaseReread()
	if err := <-gaveBack; err == nil {
		t.Fatal("a give-back whose reply was lost succeeded")
	}
	if err := h2.load(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := h2.claimAddr(ctx, x); err != nil {
		t.Fatalf("h2 claims %s: %v", x, err)
	}
	if st, _, _ := h1.Lookup(x); st != StateUnclaimed {
		t.Errorf("%s is %v on h1, which gave it back; h2 claims it", x, st)
	}
	if err := h1.claimAddr(ctx, y); err != nil {
		t.Fatalf("h1 claims %s: %v", y, err)
	}
}

// newSharingManager is a recovered Manager of pool p over st under holder,
// with h1, h2 and gone as the live holders.
func newSharingManager(t *testing.T, st Store, clk *fakeClock, holder string) *Manager {
	t.Helper()
	return newPeerManager(t, Config{
		Pool: "p", Holder: holder, Ranges: mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24"}),
		Cooldown: time.Minute, PendingTTL: 30 * time.Second,
		LowWatermark: 1, TargetFree: 2, HighWatermark: 200,
		Store: st, Clock: clk,
	}, "h1", "h2", "gone")
}

// pickAddr picks a, free on m, for a give-back.
func pickAddr(m *Manager, a netip.Addr) func() []*entry {
	return func() []*entry {
		e := m.entries[a]
		m.listOf(e).remove(e)
		return []*entry{e}
	}
}

// TestRefreshOvertakenReadsAgain: a read of a block this Manager holds
// nothing of, overtaken (here by the forgetting of another block), is not
// applied; the Manager must then read again, not leave the block unread.
// The controller refreshes a block before deciding that nobody claims a
// VM's address, and removed the finalizer of a VM another replica held,
// whose address then stayed allocated to a VM that was gone.
func TestRefreshOvertakenReadsAgain(t *testing.T) {
	ctx := context.Background()
	x := addr("10.0.0.9")
	clk := newFakeClock()
	st := &slowReadStore{MemoryStore: NewMemoryStore()}
	h1 := newSharingManager(t, st, clk, "h1")
	h2 := newSharingManager(t, st, clk, "h2")
	if err := h2.claimAddr(ctx, x); err != nil {
		t.Fatal(err)
	}
	read, release := st.holdNext()
	defer release()
	done := make(chan error, 1)
	go func() { done <- h1.Refresh(ctx, x) }()
	<-read
	h1.mu.Lock()
	h1.forgotAt = h1.nextSeqLocked()
	h1.mu.Unlock()
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if h, ok := h1.HolderOf(x); !ok || h != "h2" {
		t.Errorf("after the refresh h1 sees %s held by %q (claimed %v), want h2", x, h, ok)
	}
}
