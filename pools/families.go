package pools

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"time"

	"github.com/vmipam/vmipam/ipam"
)

// A pool with ranges of both families runs one allocator per family, each
// over its family's ranges and blocks (familyStore), under the same holder.
// What concerns one address goes to its family's allocator; what concerns
// the pool goes to each, and their reports add up.

// familyStore is a pool's store as the allocator of one family sees it:
// only the blocks of that family. A block never mixes families, and an
// allocator drops claims outside its ranges when it recovers, so the two
// must not see each other's blocks.
type familyStore struct {
	ipam.Store
	is4 bool
}

// List implements ipam.Store.
func (s familyStore) List(ctx context.Context) ([]ipam.Block, error) {
	all, err := s.Store.List(ctx)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, b := range all {
		if b.Prefix.Addr().Is4() == s.is4 {
			out = append(out, b)
		}
	}
	return out, nil
}

// byFamily splits holdings into those of IPv4 and of IPv6 addresses. When
// they are all of one family, that one is hs itself, not a copy: a resync
// splits a replica's share of the fleet three times.
func byFamily(hs []ipam.Holding) (v4, v6 []ipam.Holding) {
	n4 := 0
	for _, h := range hs {
		if ipam.Canonical(h.Addr).Is4() {
			n4++
		}
	}
	switch n4 {
	case len(hs):
		return hs, nil
	case 0:
		return nil, hs
	}
	v4, v6 = make([]ipam.Holding, 0, n4), make([]ipam.Holding, 0, len(hs)-n4)
	for _, h := range hs {
		if ipam.Canonical(h.Addr).Is4() {
			v4 = append(v4, h)
		} else {
			v6 = append(v6, h)
		}
	}
	return v4, v6
}

// each calls fn with each family's allocator and the holdings of its
// family among hs; the holdings of a family the pool lacks are returned.
func (p *Pool) each(hs []ipam.Holding, fn func(m *ipam.Manager, hs []ipam.Holding)) (lacking []ipam.Holding) {
	v4, v6 := byFamily(hs)
	for _, f := range []struct {
		m  *ipam.Manager
		hs []ipam.Holding
	}{{p.v4, v4}, {p.v6, v6}} {
		if f.m == nil {
			lacking = append(lacking, f.hs...)
			continue
		}
		fn(f.m, f.hs)
	}
	return lacking
}

// eachMarked is each with the mark of each family's allocator, from the
// marks mark returned.
func (p *Pool) eachMarked(hs []ipam.Holding, marks []uint64, fn func(m *ipam.Manager, hs []ipam.Holding, asOf uint64)) {
	p.each(hs, func(m *ipam.Manager, hs []ipam.Holding) {
		i := 0
		if m == p.v6 && p.v4 != nil {
			i = 1
		}
		fn(m, hs, marks[i])
	})
}

// recover rebuilds each family's allocator from the store and the live
// holdings.
func (p *Pool) recover(ctx context.Context, live []ipam.Holding) (ipam.RecoveryReport, error) {
	return p.recoverWith(ctx, live, (*ipam.Manager).Recover)
}

// recoverCovered is recover from the holdings this replica's caches hold
// (see ipam.Manager.RecoverCovered). Its error wraps ipam.ErrUncovered
// when a family's allocator could not recover from them; one that did
// recovers again in recover.
func (p *Pool) recoverCovered(ctx context.Context, live []ipam.Holding) (ipam.RecoveryReport, error) {
	return p.recoverWith(ctx, live, (*ipam.Manager).RecoverCovered)
}

func (p *Pool) recoverWith(ctx context.Context, live []ipam.Holding, recover func(*ipam.Manager, context.Context, []ipam.Holding) (ipam.RecoveryReport, error)) (ipam.RecoveryReport, error) {
	var rep ipam.RecoveryReport
	var errs []error
	lacking := p.each(live, func(m *ipam.Manager, hs []ipam.Holding) {
		r, err := recover(m, ctx, hs)
		errs = append(errs, err)
		rep = rep.Add(r)
	})
	rep.OutOfRange = append(rep.OutOfRange, lacking...)
	return rep, errors.Join(errs...)
}

// takeover moves the claims of holder from, which left, to this one.
func (p *Pool) takeover(ctx context.Context, from string, live []ipam.Holding) (ipam.TakeoverReport, error) {
	var rep ipam.TakeoverReport
	var errs []error
	p.each(live, func(m *ipam.Manager, hs []ipam.Holding) {
		r, err := m.Takeover(ctx, from, hs)
		errs = append(errs, err)
		rep = rep.Add(r)
	})
	return rep, errors.Join(errs...)
}

// mark returns each family allocator's point in its history (see
// ipam.Manager.Mark), for resync.
func (p *Pool) mark() []uint64 {
	out := make([]uint64, len(p.ms))
	for i, m := range p.ms {
		out[i] = m.Mark()
	}
	return out
}

// resync reconciles each family's allocator with the live holdings, as of
// the marks mark returned before they were listed.
func (p *Pool) resync(live []ipam.Holding, marks []uint64) ipam.ResyncReport {
	var rep ipam.ResyncReport
	p.eachMarked(live, marks, func(m *ipam.Manager, hs []ipam.Holding, asOf uint64) {
		rep = rep.Add(m.Resync(hs, asOf))
	})
	return rep
}

// unseen is ipam.Manager.Unseen for each family, with the marks mark
// returned.
func (p *Pool) unseen(live []ipam.Holding, marks []uint64) (missing []ipam.Tenure, orphans bool) {
	p.eachMarked(live, marks, func(m *ipam.Manager, hs []ipam.Holding, asOf uint64) {
		miss, o := m.Unseen(hs, asOf)
		missing, orphans = append(missing, miss...), orphans || o
	})
	return missing, orphans
}

// adopting is ipam.Manager.Adopting for each family, with the marks mark
// returned.
func (p *Pool) adopting(live []ipam.Holding, marks []uint64) []ipam.Holding {
	var out []ipam.Holding
	p.eachMarked(live, marks, func(m *ipam.Manager, hs []ipam.Holding, asOf uint64) {
		out = append(out, m.Adopting(hs, asOf)...)
	})
	return out
}

// flush writes what each family's allocator has not written yet.
func (p *Pool) flush(ctx context.Context) error {
	var errs []error
	for _, m := range p.ms {
		errs = append(errs, m.Flush(ctx))
	}
	return errors.Join(errs...)
}

// lost reports whether another holder took over the claims of one of
// the families' allocators (see ipam.Manager.Lost).
func (p *Pool) lost() bool {
	for _, m := range p.ms {
		if m.Lost() {
			return true
		}
	}
	return false
}

// seal writes each family's exact state with nothing armed.
func (p *Pool) seal(ctx context.Context) error {
	var errs []error
	for _, m := range p.ms {
		errs = append(errs, m.Seal(ctx))
	}
	return errors.Join(errs...)
}

// run runs each family's allocator's background work until ctx ends.
func (p *Pool) run(ctx context.Context, interval time.Duration, onError func(error)) {
	var wg sync.WaitGroup
	for _, m := range p.ms {
		wg.Go(func() { m.Run(ctx, interval, onError) })
	}
	wg.Wait()
}

// setFence and setPeers set each family's allocator's (see ipam.Manager).
func (p *Pool) setFence(valid func() bool, lapses func() uint64) {
	for _, m := range p.ms {
		m.SetFence(valid, lapses)
	}
}

func (p *Pool) setPeers(holders []string) {
	for _, m := range p.ms {
		m.SetPeers(holders)
	}
}

// observe shows b, a block of the pool as the store holds it now, to its
// family's allocator.
func (p *Pool) observe(b ipam.Block) {
	if m := p.of(b.Prefix.Addr()); m != nil {
		m.Observe(b)
	}
}

// unstored returns the lapsed reservations of every family (see
// ipam.Manager.Unstored).
func (p *Pool) unstored() []ipam.Unstored {
	var out []ipam.Unstored
	for _, m := range p.ms {
		out = append(out, m.Unstored()...)
	}
	return out
}

// used and unused settle a lapsed reservation (see ipam.Manager).
func (p *Pool) used(u ipam.Unstored) {
	if m := p.of(u.Addr); m != nil {
		m.Used(u)
	}
}

func (p *Pool) unused(u ipam.Unstored, readAt time.Time) bool {
	m := p.of(u.Addr)
	return m != nil && m.Unused(u, readAt)
}

// HolderOf returns the holder that claims a in the pool, as far as this
// replica knows, and whether one does.
func (p *Pool) HolderOf(a netip.Addr) (string, bool) {
	if m := p.of(a); m != nil {
		return m.HolderOf(a)
	}
	return "", false
}

// SeenHolderOf returns the other holder that claims a in the last version
// of its block the watch showed: a hint that the machine is another
// replica's, never a reason to change anything (see ipam.Manager).
func (p *Pool) SeenHolderOf(a netip.Addr) (string, bool) {
	if m := p.of(a); m != nil {
		return m.SeenHolderOf(a)
	}
	return "", false
}
