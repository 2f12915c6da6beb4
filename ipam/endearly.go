package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// InFlight bounds how long after its admission a create may still be
// stored: the API server's default request timeout. A pending reservation
// younger than that, or a cooldown that may be the rest of one, is not
// ended early: the object may still appear with the address.
const InFlight = 60 * time.Second

// ErrTooSoon is returned when an early end was asked of an address whose
// create may still be in flight.
var ErrTooSoon = errors.New("too soon to end it early")

// ErrNothingToEnd is returned when an early end was asked of an address
// that is neither pending nor cooling down here.
var ErrNothingToEnd = errors.New("nothing to end")

// Ended says what EndEarly did: the state the address was in and its
// owner then, and when its new cooldown ends (zero once free).
type Ended struct {
	Was   State
	Owner Owner
	Until time.Time
}

// EndEarly ends addr's pending reservation or cooldown before its time,
// for an operator (kubectl vmipam release). A pending reservation goes
// into its cooldown, or is freed at once with skipCooldown; a cooldown
// ends only with skipCooldown. Either is refused with ErrTooSoon while the
// create that reserved the address may still be stored (see InFlight): a
// reservation made less than InFlight ago, or a cooldown begun less than
// InFlight ago (its start read as its deadline less the pool's cooldown,
// the latest it can be: the rest after a crash starts earlier). The
// change reaches the store with the next batch; a crash before that rests
// the address as after any crash, which is safe. An address allocated to
// an object is not this method's: the caller, which can tell whether the
// object still exists, releases it.
func (m *Manager) EndEarly(addr netip.Addr, skipCooldown bool) (Ended, error) {
	return m.endEarly(Canonical(addr), skipCooldown)
}

func (m *Manager) endEarly(addr netip.Addr, skipCooldown bool) (Ended, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	if err := m.servingLocked(now); err != nil {
		return Ended{}, fmt.Errorf("end %s early in pool %q: %w", addr, m.cfg.Pool, err)
	}
	m.advance(now)
	e := m.entries[addr]
	if e == nil || (e.state != StatePending && e.state != StateCooldown) {
		st := StateUnclaimed
		if e != nil {
			st = e.state
			if st == stateReturning || st == stateSurplus {
				st = StateFree
			}
		}
		return Ended{Was: st}, fmt.Errorf("%s in pool %q is %s: %w", addr, m.cfg.Pool, st, ErrNothingToEnd)
	}
	end := Ended{Was: e.state, Owner: e.owner}
	switch e.state {
	case StatePending:
		if since := e.at.Add(InFlight); now.Before(since) {
			return end, fmt.Errorf("%s in pool %q was reserved at %s for %s, whose create may still be stored until %s; try again then: %w",
				addr, m.cfg.Pool, e.at.UTC().Format(time.RFC3339), e.owner.Ref, since.UTC().Format(time.RFC3339), ErrTooSoon)
		}
		m.toCooldown(e, now)
		delete(m.unstored, addr)
		if !skipCooldown {
			end.Until = e.at
			return end, nil
		}
	case StateCooldown:
		if !skipCooldown {
			end.Until = e.at
			return end, fmt.Errorf("%s in pool %q cools down until %s: %w", addr, m.cfg.Pool, e.at.UTC().Format(time.RFC3339), ErrNothingToEnd)
		}
		if since := e.at.Add(-m.cfg.Cooldown).Add(InFlight); now.Before(since) {
			return end, fmt.Errorf("%s in pool %q went into its cooldown less than %s ago, and a create in flight at a crash may still be stored with it; try again after %s: %w",
				addr, m.cfg.Pool, InFlight, since.UTC().Format(time.RFC3339), ErrTooSoon)
		}
	}
	// Freed: as when its cooldown ends.
	m.cooldown.remove(e)
	m.touch(e)
	e.orphan = false
	e.at = time.Time{}
	if m.rest(e) {
		m.Kick()
	}
	m.markDirty(addr)
	return end, nil
}
