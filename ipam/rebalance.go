package ipam

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Rebalance brings the free list back between the watermarks: below the
// low watermark it claims up to the target; with few armed addresses left
// it arms a batch; it answers other holders' requests, gives back the
// surplus, and above the high watermark returns addresses down to the
// target. Each call makes at most one such write (plus re-reads on
// conflict); Run calls it again while work is left.
func (m *Manager) Rebalance(ctx context.Context) error {
	m.mu.Lock()
	if m.servingLocked(m.clock.Now()) != nil {
		m.mu.Unlock()
		return nil
	}
	m.advance(m.clock.Now())
	low, target, high := m.marksLocked()
	batch := m.armBatchLocked(m.clock.Now())
	n, ready, unarmed, surplus := m.freeLocked(), m.readyList.n, m.free.n+m.surplus.n, m.surplus.n
	requested := m.requestedLocked()
	m.mu.Unlock()
	var err error
	switch {
	case len(requested) > 0:
		// Every block asked in, not one a round: a request nothing can
		// meet stays in its block, and picking one block a round could
		// pick it again and again while another block's request waited.
		m.stats.rebalances.Add(1)
		for _, p := range requested {
			err = errors.Join(err, m.serveRequests(ctx, p))
		}
		m.Kick()
	case n < low && m.claimable() > 0:
		m.stats.rebalances.Add(1)
		var avail int
		avail, err = m.claim(ctx, target)
		if err == nil && avail > n && avail < low {
			// The block ran out before the target: go on in the next.
			m.Kick()
		}
	case ready < (batch+1)/2 && unarmed > 0:
		m.stats.rebalances.Add(1)
		err = m.arm(ctx)
		m.Kick()
	case surplus > 0 && m.surplusDue(high-target):
		m.stats.rebalances.Add(1)
		err = m.giveBack(ctx, m.pickSurplusLocked)
		m.Kick()
	case n > high:
		m.stats.rebalances.Add(1)
		err = m.giveBack(ctx, func() []*entry { return m.pickFreeTailLocked(n - target) })
	default:
		return nil
	}
	if err != nil {
		m.stats.rebalanceFailures.Add(1)
		return fmt.Errorf("rebalance pool %q: %w", m.cfg.Pool, err)
	}
	return nil
}

// marksLocked returns the watermarks in force: the configured ones, or,
// with several live holders, smaller ones, so that their free lists
// together hold at most half the pool and no holder strands a small pool's
// addresses out of the others' reach.
func (m *Manager) marksLocked() (low, target, high int) {
	low, target, high = m.cfg.LowWatermark, m.cfg.TargetFree, m.cfg.HighWatermark
	// A stream of allocations claims about four seconds of it at a time,
	// up to the high watermark, and claims again while half a second of
	// it is left: each claim writes a block that other holders may be
	// writing too, and one that comes too late makes allocations wait.
	if rate := m.rateLocked(m.clock.Now()); rate > 0 {
		target = max(target, min(4*rate, high))
		low = max(low, min(rate/2, target/2))
	}
	if n := len(m.peers); n > 1 {
		share := int(min(m.cfg.Ranges.Size()/uint64(2*n), uint64(target)))
		if share < target {
			target = max(share, 1)
			low = min(low, target/2)
			high = max(target, min(high, 2*target))
		}
	}
	return low, target, high
}

// freeLocked is how many addresses the Manager holds free, ready or not.
func (m *Manager) freeLocked() int { return m.readyList.n + m.free.n }

// targets returns the watermarks in force.
func (m *Manager) targets() (low, target, high int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.marksLocked()
}

// Kick asks Run to rebalance soon; it never blocks.
func (m *Manager) Kick() {
	select {
	case m.kickC <- struct{}{}:
	default:
	}
}

// Run rebalances the free list, arms addresses and answers other holders'
// requests whenever an allocation crosses a watermark (a kick) and every
// interval, and flushes dirty blocks every interval, until ctx ends. Errors are counted
// and retried on the next round; onError, if set, hears of each.
func (m *Manager) Run(ctx context.Context, interval time.Duration, onError func(error)) {
	tick, stop := m.cfg.Timers.NewTicker(interval)
	defer stop()
	var backoff time.Duration
	for {
		// A kick rebalances; only the tick flushes: what a flush writes
		// (cooldowns, adoptions, the end of lapsed reservations) is safe
		// from a crash already, or flushed by whoever needs it at once
		// (ReleaseDurable, Seal). Flushing on every kick made a write of
		// nearly every allocation while the ready list ran low, and with
		// several holders on one block, writes are what collide.
		flush := false
		select {
		case <-ctx.Done():
			return
		case <-m.kickC:
		case <-tick:
			flush = true
		}
		if !m.Ready() {
			continue
		}
		m.Expire()
		err := m.Rebalance(ctx)
		if flush {
			err = errors.Join(err, m.Flush(ctx))
		}
		if err == nil {
			backoff = 0
			continue
		}
		if onError != nil && ctx.Err() == nil {
			onError(err)
		}
		// A failing store must not turn kicks into a hot loop.
		backoff = min(max(2*backoff, 50*time.Millisecond), interval)
		select {
		case <-ctx.Done():
			return
		case <-m.cfg.Timers.After(backoff):
		}
	}
}
