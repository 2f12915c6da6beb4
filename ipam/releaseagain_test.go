package ipam

import (
	"context"
	"testing"
	"time"
)

// slowPutStore moves the clock on at each Put by the next of steps: a
// store that takes that long to answer.
type slowPutStore struct {
	*MemoryStore
	clk   *fakeClock
	steps []time.Duration
}

func (s *slowPutStore) Put(ctx context.Context, b Block) (string, error) {
	if len(s.steps) > 0 {
		s.clk.Step(s.steps[0])
		s.steps = s.steps[1:]
	}
	return s.MemoryStore.Put(ctx, b)
}

// TestReleaseDurableAfterSlowFlush: a release that needs a flush (the
// address was adopted since the last write) and whose flush is slow starts
// its cooldown again once it is durable.
func TestReleaseDurableAfterSlowFlush(t *testing.T) {
	const cooldown = time.Minute
	clk := newFakeClock()
	st := &slowPutStore{MemoryStore: NewMemoryStore(), clk: clk}
	m := newRecovered(t, st, clk, cooldown)
	if _, err := m.claim(t.Context(), 10); err != nil {
		t.Fatal(err)
	}
	if m.free.head == nil {
		t.Fatal("no unarmed free address after a claim of 10")
	}
	a := m.free.head.addr
	if err := m.Adopt(t.Context(), a, Owner{UID: "uid"}); err != nil {
		t.Fatal(err)
	}
	if m.Durable(a) {
		t.Fatalf("%s adopted from the unarmed free list is durable without a write", a)
	}
	// The flush that makes the release durable takes 3s; later ones are
	// quick.
	st.steps = []time.Duration{3 * time.Second}
	if err := m.ReleaseDurable(t.Context(), a, Owner{UID: "uid"}); err != nil {
		t.Fatal(err)
	}
	done := clk.Now()
	if _, _, until := m.Lookup(a); until.Before(done.Add(cooldown - releaseSlack)) {
		t.Errorf("cooldown ends %s, less than %s after the release returned at %s",
			until.Format(time.TimeOnly), cooldown-releaseSlack, done.Format(time.TimeOnly))
	}
	b, _ := st.Get(t.Context(), BlockOf(a))
	if d := b.Cooldowns[a]; d.Before(done.Add(cooldown - releaseSlack - time.Second)) {
		t.Errorf("the store shows the cooldown ending %s, less than %s after the release returned at %s",
			d.Format(time.TimeOnly), cooldown-releaseSlack-time.Second, done.Format(time.TimeOnly))
	}
}

// TestReleaseAgainRestartsCooldown: the cooldown must end a whole cooldown
// after the machine can go, which is when its finalizer is removed, not
// when its release began. A release for a machine of an address already
// cooling down (its finalizer removal failed, or its replica sealed or died
// before it) starts the cooldown again; a release by token alone does not.
func TestReleaseAgainRestartsCooldown(t *testing.T) {
	const cooldown = time.Minute
	a := addr("10.0.0.1")
	for _, tt := range []struct {
		name string
		// again releases a once more, 10s after its first release was
		// flushed.
		again     func(t *testing.T, m *Manager) error
		restarted bool
	}{
		{"same machine", func(t *testing.T, m *Manager) error { return m.Release(a, Owner{UID: "uid"}) }, true},
		// Taken over or recovered, a cooldown no longer knows whose
		// release began it: any machine still carrying the address
		// lengthens it.
		{"another machine", func(t *testing.T, m *Manager) error { return m.Release(a, Owner{UID: "other"}) }, true},
		{"a token only", func(t *testing.T, m *Manager) error { return m.Release(a, Owner{Token: "tok"}) }, false},
		{"durably", func(t *testing.T, m *Manager) error {
			return m.ReleaseDurable(t.Context(), a, Owner{UID: "uid"})
		}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			st := &slowPutStore{MemoryStore: NewMemoryStore(), clk: clk}
			m := newRecovered(t, st, clk, cooldown)
			if err := m.Reserve(t.Context(), Reservation{Token: "tok"}, a); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Bind(Owner{Token: "tok", UID: "uid"}); err != nil {
				t.Fatal(err)
			}
			if err := m.Release(a, Owner{UID: "uid", Token: "tok"}); err != nil {
				t.Fatal(err)
			}
			if err := m.Flush(t.Context()); err != nil {
				t.Fatal(err)
			}
			_, _, first := m.Lookup(a)
			clk.Step(10 * time.Second)
			if err := tt.again(t, m); err != nil {
				t.Fatal(err)
			}
			done := clk.Now()
			state, _, until := m.Lookup(a)
			if state != StateCooldown {
				t.Fatalf("%s is %v, want cooling down", a, state)
			}
			if !tt.restarted {
				if !until.Equal(first) {
					t.Errorf("cooldown ends %s, want %s as before", until.Format(time.TimeOnly), first.Format(time.TimeOnly))
				}
				return
			}
			if until.Before(done.Add(cooldown)) {
				t.Errorf("cooldown ends %s, less than %s after the release again at %s",
					until.Format(time.TimeOnly), cooldown, done.Format(time.TimeOnly))
			}
			b, _ := st.Get(t.Context(), BlockOf(a))
			if d := b.Cooldowns[a]; tt.name == "durably" && d.Before(done.Add(cooldown-time.Second)) {
				t.Errorf("the store shows the cooldown ending %s, before %s after the release again at %s",
					d.Format(time.TimeOnly), cooldown, done.Format(time.TimeOnly))
			}
		})
	}
}

// TestReleaseOfLapsedReservationKeepsCooldown: a reservation lapses
// unstored; its machine turns up after all, and is deleted while the
// address cools down. That release lengthens the cooldown and settles the
// lapsed record, so no later proof that the reservation was never stored
// frees the address early.
func TestReleaseOfLapsedReservationKeepsCooldown(t *testing.T) {
	clk := newFakeClock()
	m := newRecovered(t, NewMemoryStore(), clk, time.Minute)
	a := addr("10.0.0.1")
	if err := m.Reserve(t.Context(), Reservation{Token: "tok"}, a); err != nil {
		t.Fatal(err)
	}
	clk.Step(31 * time.Second) // past the pending TTL
	m.Expire()
	lapsed := m.Unstored()
	if len(lapsed) != 1 || lapsed[0].Addr != a {
		t.Fatalf("lapsed reservations %v, want one of %s", lapsed, a)
	}
	if err := m.Release(a, Owner{UID: "uid", Token: "tok"}); err != nil {
		t.Fatal(err)
	}
	if m.Unused(lapsed[0], clk.Now().Add(time.Second)) {
		t.Errorf("%s was freed as never stored after its machine was released", a)
	}
	if st, _, until := m.Lookup(a); st != StateCooldown || until.Before(clk.Now().Add(time.Minute)) {
		t.Errorf("%s is %v until %s, want cooling down a whole cooldown from the release", a, st, until.Format(time.TimeOnly))
	}
}
