package ipam

import (
	"context"
	"net/netip"
	"time"
)

// arm writes the next batch of unarmed free addresses as armed, from the
// block of the first of them, so that they may be handed out.
func (m *Manager) arm(ctx context.Context) error {
	m.io.Lock()
	defer m.io.Unlock()
	m.mu.Lock()
	// Concurrent callers each found the ready list short; the first one
	// refilled it. Arm only up to the batch, so that a crash rests no more.
	batch := m.armBatchLocked(m.clock.Now())
	want := batch - m.readyList.n
	var p netip.Prefix
	var picked []*entry
	for _, l := range []*list{&m.free, &m.surplus} {
		for e, seen := l.head, 0; e != nil && len(picked) < want && seen < 8*batch; e, seen = e.next, seen+1 {
			if !p.IsValid() {
				p = BlockOf(e.addr)
			}
			if BlockOf(e.addr) == p && !e.arming {
				picked = append(picked, e)
			}
		}
	}
	m.mu.Unlock()
	if len(picked) == 0 {
		return nil
	}
	return m.armPicked(ctx, p, picked)
}

// armEntries arms the one free address a, for Reserve.
func (m *Manager) armEntries(ctx context.Context, a netip.Addr) error {
	m.io.Lock()
	defer m.io.Unlock()
	m.mu.Lock()
	e := m.entries[a]
	m.mu.Unlock()
	if e == nil {
		return nil
	}
	return m.armPicked(ctx, BlockOf(a), []*entry{e})
}

// armPicked writes the picked entries of block p armed and, on success,
// moves those still free to the ready list. The caller holds io.
func (m *Manager) armPicked(ctx context.Context, p netip.Prefix, picked []*entry) error {
	m.mu.Lock()
	for _, e := range picked {
		e.arming = true
	}
	m.mu.Unlock()
	err := m.retry(ctx, func() error { return m.writeBlock(ctx, p, writePlan{}) })
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range picked {
		if !e.arming {
			continue // handed out or changed meanwhile
		}
		e.arming = false
		if err != nil || e.armed || m.entries[e.addr] != e {
			continue
		}
		switch e.state {
		case StateFree:
			m.free.remove(e)
		case stateSurplus:
			m.surplus.remove(e)
		default:
			continue
		}
		e.state, e.armed = StateFree, true
		m.readyList.pushBack(e)
	}
	return err
}

// countAllocationLocked counts an allocation at now for the arm batch.
func (m *Manager) countAllocationLocked(now time.Time) {
	m.rollRateLocked(now)
	m.rateCount++
}

// rollRateLocked starts a new second of counting once the current one is
// over; a gap of more than a second leaves no rate behind.
func (m *Manager) rollRateLocked(now time.Time) {
	switch el := now.Sub(m.rateStart); {
	case el < time.Second && el >= 0:
		return
	case el < 2*time.Second && el >= 0:
		m.lastRate = m.rateCount
	default:
		m.lastRate = 0
	}
	m.rateStart, m.rateCount = now, 0
}

// rateWindow is the shortest span the current second's allocations are
// extrapolated from: a burst's first hundred milliseconds say its rate
// well enough, its first few allocations do not.
const rateWindow = 100 * time.Millisecond

// rateLocked is the rate of allocations, per second: that of the last
// full second, or the current second's so far when more, extrapolated to
// a whole second once rateWindow has passed (and as if it had before),
// so that a burst out of idle is met by batches and claims of its size
// within a tenth of a second, not a second later, after its first
// allocations emptied the ready list.
func (m *Manager) rateLocked(now time.Time) int {
	m.rollRateLocked(now)
	el := max(now.Sub(m.rateStart), rateWindow)
	return max(m.lastRate, int(int64(m.rateCount)*int64(time.Second)/int64(el)))
}

// armBatchLocked is how many free addresses to keep armed: cfg.ArmBatch,
// or a second's allocations at the current rate (rateLocked) when that is
// more, up to armMax. A crash rests no more than that: about a second's
// allocations beyond the configured batch at most. In exchange, a fast
// stream of allocations arms (writes its block) about twice a second, not
// every ArmBatch/2 allocations.
func (m *Manager) armBatchLocked(now time.Time) int {
	return min(max(m.cfg.ArmBatch, m.rateLocked(now)), m.armMax)
}
