package ipam

import (
	"context"
	"errors"
	"fmt"
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
