package ipam

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// watchStore is a MemoryStore that shows every version it writes to every
// Manager watching it, after the write returns and in the order written,
// as the IPBlock informer does in vmipam.
type watchStore struct {
	*MemoryStore
	mu       sync.Mutex
	watchers []*Manager
	events   chan Block
	done     chan struct{}
}

func newWatchStore() *watchStore {
	s := &watchStore{MemoryStore: NewMemoryStore(), events: make(chan Block, 4096), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for b := range s.events {
			s.mu.Lock()
			ws := s.watchers
			s.mu.Unlock()
			for _, m := range ws {
				m.Observe(b)
			}
		}
	}()
	return s
}

func (s *watchStore) watch(m *Manager) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchers = append(s.watchers, m)
}

func (s *watchStore) close() { close(s.events); <-s.done }

func (s *watchStore) Put(ctx context.Context, b Block) (string, error) {
	// The lock keeps the events in the order of the versions.
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.MemoryStore.Put(ctx, b)
	if err == nil {
		nb := b.Clone()
		nb.Version = v
		s.events <- nb
	}
	return v, err
}

func (s *watchStore) Delete(ctx context.Context, p netip.Prefix, version string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.MemoryStore.Delete(ctx, p, version)
	if err == nil {
		s.events <- Block{Prefix: p}
	}
	return err
}

// livePeers starts n Managers of one pool over st, each under its own
// holder, knowing each other as live, recovered, and running their
// background work on the real clock until the test ends.
func livePeers(t *testing.T, st *watchStore, ranges *Ranges, n int) []*Manager {
	t.Helper()
	return startPeers(t, st, ranges, n, n)
}

// startPeers is livePeers with only the first running of the n Managers
// running their background work; the others act only when called.
func startPeers(t *testing.T, st *watchStore, ranges *Ranges, n, running int) []*Manager {
	t.Helper()
	holders := make([]string, n)
	for i := range holders {
		holders[i] = fmt.Sprintf("h%d", i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait(); st.close() })
	ms := make([]*Manager, n)
	for i, h := range holders {
		m, err := NewManager(Config{Pool: "p", Holder: h, Ranges: ranges, Store: st, Cooldown: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		m.SetPeers(holders)
		if _, err := m.Recover(ctx, nil); err != nil {
			t.Fatal(err)
		}
		st.watch(m)
		ms[i] = m
		if i < running {
			wg.Go(func() { m.Run(ctx, 200*time.Millisecond, nil) })
		}
	}
	return ms
}

// TestStaticHandover: a static request for an address that another live
// holder holds free, armed or not, is granted by a hand-over, never refused
// as in use. Each request goes to a holder that does not claim the
// address, as the Service sends an admission to any replica.
func TestStaticHandover(t *testing.T) {
	ranges := mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24"})
	st := newWatchStore()
	ms := livePeers(t, st, ranges, 3)
	// Let each claim and arm its free list.
	for i, m := range ms {
		if _, err := m.Allocate(t.Context(), Reservation{Token: fmt.Sprint("warm-", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var waits []time.Duration
	for round := range 30 {
		// An address some holder holds free.
		var a netip.Addr
		var owner int
		for i, m := range ms {
			m.mu.Lock()
			for e := m.readyList.head; e != nil && !a.IsValid(); e = e.next {
				a, owner = e.addr, i
			}
			if !a.IsValid() {
				for e := m.free.head; e != nil && !a.IsValid(); e = e.next {
					a, owner = e.addr, i
				}
			}
			m.mu.Unlock()
			if a.IsValid() && round%len(ms) <= i {
				break
			}
		}
		if !a.IsValid() {
			t.Fatalf("round %d: no holder holds a free address", round)
		}
		asker := ms[(owner+1+round%2)%len(ms)]
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		start := time.Now()
		err := asker.Reserve(ctx, Reservation{Token: fmt.Sprint("static-", round)}, a)
		cancel()
		waits = append(waits, time.Since(start))
		if err != nil {
			t.Fatalf("round %d: %s asks for %s, free at %s: %v", round, asker.Holder(), a, ms[owner].Holder(), err)
		}
		if s, _, _ := asker.Lookup(a); s != StatePending {
			t.Fatalf("round %d: %s is %v on %s after its reservation, want pending", round, a, s, asker.Holder())
		}
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	t.Logf("hand-overs: %d, p50 %v, p99 %v, max %v", len(waits), waits[len(waits)/2], waits[len(waits)*99/100], waits[len(waits)-1])
}

// TestHandoverToNewHolder: a holder that the others' last list of live
// holders does not name yet (it started since) gets its static request
// answered once a list names it, not dropped as a dead holder's; a holder
// that a list taken after its request still leaves out is gone, and its
// request is dropped.
func TestHandoverToNewHolder(t *testing.T) {
	ranges := mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24"})
	st := newWatchStore()
	ms := livePeers(t, st, ranges, 2)
	owner, asker := ms[0], ms[1]
	if _, err := owner.Allocate(t.Context(), Reservation{Token: "warm"}); err != nil {
		t.Fatal(err)
	}
	owner.mu.Lock()
	a := owner.readyList.head.addr
	owner.mu.Unlock()
	// The owner's last list predates the asker.
	owner.SetPeers([]string{owner.Holder()})
	listed := make(chan struct{})
	go func() {
		time.Sleep(300 * time.Millisecond)
		owner.SetPeers([]string{owner.Holder(), asker.Holder()})
		close(listed)
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := asker.Reserve(ctx, Reservation{Token: "static"}, a); err != nil {
		t.Fatalf("%s asks for %s, free at %s, whose list names it only later: %v", asker.Holder(), a, owner.Holder(), err)
	}
	select {
	case <-listed:
	default:
		t.Fatalf("%s was handed over before the owner's list named the asker", a)
	}

	// A request of a holder that no list names, seen before a list that
	// leaves it out, is dropped with the owner's next write.
	p := BlockOf(a)
	b, err := st.Get(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	var r Request
	r.Count = 3
	b.Requests = map[string]Request{"gone": r}
	if _, err := st.Put(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	harnessEventually(t, func() bool {
		owner.SetPeers([]string{owner.Holder(), asker.Holder()})
		if err := owner.Flush(t.Context()); err != nil {
			return false
		}
		_, _ = owner.Allocate(t.Context(), Reservation{Token: fmt.Sprint("more-", time.Now().UnixNano())})
		owner.Kick()
		got, _ := st.Get(t.Context(), p)
		_, asks := got.Requests["gone"]
		return !asks
	})
}

// harnessEventually polls cond every 20ms for up to 5s.
func harnessEventually(t *testing.T, cond func() bool) {
	t.Helper()
	for range 250 {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("condition not met in 5s")
}

// TestStaticRefusedByHolder: a static request for an address that another
// live holder has pending, allocated or cooling down is refused with what
// that holder says of it: the object that holds it, or the end of its
// cooldown; and the refusal does not stay in the block.
func TestStaticRefusedByHolder(t *testing.T) {
	ranges := mustRanges(t, RangeSpec{CIDR: "10.0.0.0/24"})
	st := newWatchStore()
	ms := livePeers(t, st, ranges, 2)
	owner, asker := ms[0], ms[1]
	ctx := t.Context()
	pending, err := owner.Allocate(ctx, Reservation{Token: "p", Ref: "team-a/db-1"})
	if err != nil {
		t.Fatal(err)
	}
	allocated, err := owner.Allocate(ctx, Reservation{Token: "a", Ref: "team-a/db-2"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Bind(Owner{Token: "a", UID: "uid-2", Ref: "team-a/db-2"}); err != nil {
		t.Fatal(err)
	}
	cooling, err := owner.Allocate(ctx, Reservation{Token: "c", Ref: "team-a/db-3"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.Bind(Owner{Token: "c", UID: "uid-3"}); err != nil {
		t.Fatal(err)
	}
	if err := owner.ReleaseDurable(ctx, cooling, Owner{Token: "c", UID: "uid-3"}); err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		a      netip.Addr
		reason error
		says   string
	}{
		"pending":   {pending, ErrInUse, "reserved for team-a/db-1, being created (vmipam replica h0 holds it)"},
		"allocated": {allocated, ErrInUse, "allocated to team-a/db-2 (vmipam replica h0 holds it)"},
		"cooling":   {cooling, ErrCoolingDown, "cools down until"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			err := asker.Reserve(ctx, Reservation{Token: "static-" + name}, tc.a)
			if !errors.Is(err, tc.reason) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Reserve(%s) = %v; want %v saying %q", tc.a, err, tc.reason, tc.says)
			}
			b, _ := st.Get(ctx, BlockOf(tc.a))
			if r, ok := b.Requests[asker.Holder()]; ok && (r.Asks() || len(r.Refused) > 0) {
				t.Errorf("the block keeps the request %+v after the refusal was read", r)
			}
		})
	}
}
