package ipam

import (
	"errors"
	"testing"
	"time"
)

func TestEndEarly(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup makes the address's state, stepping the clock as it goes.
		setup        func(t *testing.T, m *Manager, clk *fakeClock) (string, error)
		skip         bool
		wantErr      error
		wantWas      State
		wantNow      State
		wantCooldown bool
	}{
		{name: "a young pending reservation may still be stored", setup: pending(10 * time.Second), wantErr: ErrTooSoon, wantWas: StatePending, wantNow: StatePending},
		{name: "a pending reservation past the in-flight bound cools down", setup: pending(InFlight), wantWas: StatePending, wantNow: StateCooldown, wantCooldown: true},
		{name: "skip-cooldown frees a pending reservation", setup: pending(InFlight + time.Second), skip: true, wantWas: StatePending, wantNow: StateFree},
		{name: "a cooldown ends only when asked to skip it", setup: cooling(2 * InFlight), wantErr: ErrNothingToEnd, wantWas: StateCooldown, wantNow: StateCooldown},
		{name: "a cooldown begun less than the in-flight bound ago is kept", setup: cooling(InFlight / 2), skip: true, wantErr: ErrTooSoon, wantWas: StateCooldown, wantNow: StateCooldown},
		{name: "skip-cooldown ends an old cooldown", setup: cooling(2 * InFlight), skip: true, wantWas: StateCooldown, wantNow: StateFree},
		{name: "an allocated address is the caller's", setup: allocated, skip: true, wantErr: ErrNothingToEnd, wantWas: StateAllocated, wantNow: StateAllocated},
		{name: "an unclaimed address has nothing to end", setup: func(*testing.T, *Manager, *fakeClock) (string, error) { return "10.0.0.250", nil },
			skip: true, wantErr: ErrNothingToEnd, wantWas: StateUnclaimed, wantNow: StateUnclaimed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, clk, _ := newTestManager(t, testPool{cidr: "10.0.0.0/24", cooldown: time.Hour, pendingTT: 10 * time.Minute})
			a, err := tc.setup(t, m, clk)
			if err != nil {
				t.Fatal(err)
			}
			end, err := m.EndEarly(addr(a), tc.skip)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("EndEarly(%s) error %v, want %v", a, err, tc.wantErr)
			}
			if end.Was != tc.wantWas {
				t.Errorf("was %s, want %s", end.Was, tc.wantWas)
			}
			st, _, at := m.Lookup(addr(a))
			if st != tc.wantNow {
				t.Errorf("now %s, want %s", st, tc.wantNow)
			}
			if tc.wantCooldown && !at.Equal(clk.Now().Add(time.Hour)) {
				t.Errorf("cools down until %s, want a whole cooldown from now (%s)", at, clk.Now().Add(time.Hour))
			}
			if err := m.Flush(t.Context()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// pending reserves an address age ago.
func pending(age time.Duration) func(*testing.T, *Manager, *fakeClock) (string, error) {
	return func(t *testing.T, m *Manager, clk *fakeClock) (string, error) {
		a, err := m.Allocate(t.Context(), Reservation{Token: "tok", Ref: "ns/vm"})
		clk.Step(age)
		return a.String(), err
	}
}

// cooling releases an address age ago.
func cooling(age time.Duration) func(*testing.T, *Manager, *fakeClock) (string, error) {
	return func(t *testing.T, m *Manager, clk *fakeClock) (string, error) {
		a, err := allocated(t, m, clk)
		if err != nil {
			return "", err
		}
		if err := m.Release(addr(a), Owner{UID: "uid"}); err != nil {
			return "", err
		}
		clk.Step(age)
		return a, nil
	}
}

func allocated(t *testing.T, m *Manager, _ *fakeClock) (string, error) {
	a, err := m.Allocate(t.Context(), Reservation{Token: "tok", Ref: "ns/vm"})
	if err != nil {
		return "", err
	}
	_, err = m.Bind(Owner{Token: "tok", UID: "uid"})
	return a.String(), err
}
