package pools

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
)

// publishedCounts is what this holder publishes on its Lease: its share of
// each ready pool.
func (r *Registry) publishedCounts() string {
	out := map[string]holderCounts{}
	for _, p := range r.list() {
		if !p.Ready() {
			continue
		}
		hc := holderCounts{familyCounts: countsOf(p.Snapshot())}
		if fams := p.Families(); len(fams) > 1 {
			hc.Families = map[vmipamv1.IPFamily]familyCounts{}
			for _, f := range fams {
				c, _ := p.FamilySnapshot(f)
				hc.Families[f] = countsOf(c)
			}
		}
		out[p.name] = hc
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return "{}"
	}
	return string(raw)
}

// poolCounts adds up a pool's counts over the live holders: this one's
// from its allocator, the others' as they last published them on their
// Leases (at most a retry period old). Claims are disjoint, so the sums
// count every address once.
func (r *Registry) poolCounts(p *Pool) ipam.Counts {
	return r.sumPeers(p, p.Snapshot(), func(o holderCounts) (familyCounts, bool) { return o.familyCounts, true })
}

// familyCounts is poolCounts of family f's addresses, for a pool of both
// families.
func (r *Registry) familyCounts(p *Pool, f vmipamv1.IPFamily) ipam.Counts {
	c, _ := p.FamilySnapshot(f)
	return r.sumPeers(p, c, func(o holderCounts) (familyCounts, bool) {
		fc, ok := o.Families[f]
		return fc, ok
	})
}

// sumPeers adds to c, this holder's counts, what of reads of every live
// peer's published counts of p.
func (r *Registry) sumPeers(p *Pool, c ipam.Counts, of func(holderCounts) (familyCounts, bool)) ipam.Counts {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, h := range r.peers {
		o, ok := r.peerCounts[h][p.name]
		if h == r.opts.Holder || !ok {
			continue
		}
		if fc, ok := of(o); ok {
			c = add(c, fc)
		}
	}
	return c
}

// writeStatus writes a pool's counts and conditions when they changed. Of
// the live replicas, one writes each pool's status (chosen by the pool's
// UID), with every holder's counts added up, so replicas do not overwrite
// each other's partial views.
func (r *Registry) writeStatus(ctx context.Context, p *Pool) error {
	if !p.Ready() || !r.Chosen("status/"+string(p.uid)) {
		return nil
	}
	c := r.poolCounts(p)
	p.mu.Lock()
	gen, deleting := p.generation, p.deleting
	p.mu.Unlock()
	st := vmipamv1.IPPoolStatus{
		ObservedGeneration: gen,
		Usable:             int64(min(c.Usable, 1<<63-1)),
		Allocated:          int64(c.Allocated),
		Pending:            int64(c.Pending),
		Free:               int64(c.Free),
		Cooldown:           int64(c.Cooldown),
	}
	claimable := unclaimed(c)
	now := r.clock.Now()
	// A sample of a sum that lacks a live peer's share would show a
	// change that never happened once the share arrives.
	sample := r.peersPublished(p)
	st.Trend = p.trends.note(now, "", used(c), sample)
	// A pool of both families is exhausted when either family is: a
	// dual-stack VM needs both. Its status counts each family.
	var out []string
	if fams := p.Families(); len(fams) > 1 {
		for _, f := range fams {
			fc := r.familyCounts(p, f)
			st.Families = append(st.Families, vmipamv1.FamilyStatus{Family: f, Usable: int64(min(fc.Usable, 1<<63-1)),
				Allocated: int64(fc.Allocated), Pending: int64(fc.Pending), Free: int64(fc.Free), Cooldown: int64(fc.Cooldown),
				Trend: p.trends.note(now, f, used(fc), sample)})
			if fc.Free == 0 && unclaimed(fc) == 0 {
				out = append(out, fmt.Sprintf("%s: %d allocated, %d pending, %d cooling down of %d usable", f, fc.Allocated, fc.Pending, fc.Cooldown, fc.Usable))
			}
		}
	} else if c.Free == 0 && claimable == 0 {
		out = append(out, fmt.Sprintf("%d allocated, %d pending, %d cooling down of %d usable", c.Allocated, c.Pending, c.Cooldown, c.Usable))
	}
	p.mu.Lock()
	dups := append([]string(nil), p.duplicates...)
	p.mu.Unlock()
	// Compared with the status as stored (read from the cache), not with
	// this replica's last write: another replica, or the IPPool
	// reconciler's Ready=False, may have written since.
	pool := &vmipamv1.IPPool{}
	if err := r.opts.Client.Get(ctx, client.ObjectKey{Name: p.name}, pool); err != nil {
		return client.IgnoreNotFound(err)
	}
	if pool.UID != p.uid {
		return nil
	}
	st.Conditions = append(st.Conditions, pool.Status.Conditions...)
	setCond := func(typ string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
	}
	if deleting {
		setCond(vmipamv1.ConditionReady, false, "Deleting",
			fmt.Sprintf("the pool is being deleted: it hands out no new address and waits for %d allocated, %d pending and %d cooling down", c.Allocated, c.Pending, c.Cooldown))
	} else {
		setCond(vmipamv1.ConditionReady, true, "Recovered", "the allocator has recovered and serves this pool")
	}
	if len(out) > 0 {
		setCond(vmipamv1.ConditionExhausted, true, "NoFreeAddress", strings.Join(out, "; "))
	} else {
		setCond(vmipamv1.ConditionExhausted, false, "AddressesAvailable", fmt.Sprintf("%d free or unclaimed", uint64(c.Free)+claimable))
	}
	if p.Paused() {
		setCond(vmipamv1.ConditionPaused, true, "Paused", fmt.Sprintf(
			"spec.paused is set: the pool hands out no new addresses, static requests included; the %d allocated and %d pending stay with their objects",
			c.Allocated, c.Pending))
	} else {
		setCond(vmipamv1.ConditionPaused, false, "Active", "the pool hands out addresses")
	}
	if len(dups) > 0 {
		setCond(vmipamv1.ConditionDuplicateAddress, true, "DuplicateFound", fmt.Sprintf("%d conflicts, first: %s", len(dups), dups[0]))
	} else {
		setCond(vmipamv1.ConditionDuplicateAddress, false, "NoDuplicate", "no two live objects share an address")
	}
	if statusEqual(pool.Status, st) {
		return nil
	}
	// The whole status as a merge patch, zero counts included, so the
	// printer columns never show an empty cell for 0.
	raw, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		return fmt.Errorf("encode status of IPPool %s: %w", p.name, err)
	}
	if err := r.opts.Client.Status().Patch(ctx, pool, client.RawPatch(types.MergePatchType, raw)); err != nil {
		return fmt.Errorf("patch status of IPPool %s: %w", p.name, err)
	}
	return nil
}

// unclaimed is how many of c's usable addresses no holder claims, as far
// as this holder knows: never below zero, though the claims seen in other
// holders' blocks may outnumber them while the replicas rebuild a changed
// pool at different moments.
func unclaimed(c ipam.Counts) uint64 {
	taken := uint64(c.Claimed) + uint64(c.ClaimedElsewhere)
	if taken >= c.Usable {
		return 0
	}
	return c.Usable - taken
}

// statusEqual reports whether the status a (as stored) says what b does,
// so that no write is needed: their trends may differ in their windows by
// less than trendStep (see trendClose).
func statusEqual(a, b vmipamv1.IPPoolStatus) bool {
	if a.ObservedGeneration != b.ObservedGeneration || a.Usable != b.Usable || a.Allocated != b.Allocated ||
		a.Pending != b.Pending || a.Free != b.Free || a.Cooldown != b.Cooldown || len(a.Conditions) != len(b.Conditions) ||
		!trendClose(a.Trend, b.Trend) ||
		!slices.EqualFunc(a.Families, b.Families, func(x, y vmipamv1.FamilyStatus) bool {
			tx, ty := x.Trend, y.Trend
			x.Trend, y.Trend = nil, nil
			return x == y && trendClose(tx, ty)
		}) {
		return false
	}
	for _, c := range a.Conditions {
		o := meta.FindStatusCondition(b.Conditions, c.Type)
		if o == nil || o.Status != c.Status || o.Reason != c.Reason || o.Message != c.Message {
			return false
		}
	}
	return true
}

// used is what a pool's trend follows: its allocated and pending
// addresses.
func used(c ipam.Counts) int64 { return int64(c.Allocated) + int64(c.Pending) }

// peersPublished reports whether every live peer published its counts of
// p: else the sums lack a share.
func (r *Registry) peersPublished(p *Pool) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, h := range r.peers {
		if _, ok := r.peerCounts[h][p.name]; !ok && h != r.opts.Holder {
			return false
		}
	}
	return true
}

// A pool's trend is worked out by the replica that writes its status,
// from samples of its allocated and pending addresses taken at those
// writes, at most one per trendStep and none older than trendWindow: at
// most trendSamples per pool and family, whatever the pool's size. The
// samples live in memory and carry over a rebuild of the allocator; a
// replica that starts, or becomes the pool's status writer, starts a new
// series, and its trend's window is shorter until it has watched the pool
// for trendWindow.
const (
	trendWindow  = time.Hour
	trendStep    = time.Minute
	trendSamples = int(trendWindow/trendStep) + 1
)

// trendSample is a pool's (or a family's) allocated and pending addresses
// at a moment.
type trendSample struct {
	at   time.Time
	used int64
}

// trendSeries is the samples of a pool or a family, oldest first.
type trendSeries []trendSample

// note keeps, when sample is set, used at now as a sample if the last one
// is trendStep old or more, and drops the samples older than trendWindow
// (and beyond trendSamples). It returns the trend ending now: used minus
// the oldest sample of the last trendWindow, over the time since; a zero
// window when there is no earlier sample.
func (s *trendSeries) note(now time.Time, used int64, sample bool) vmipamv1.Trend {
	cut := now.Add(-trendWindow)
	old := 0
	for old < len(*s) && (*s)[old].at.Before(cut) {
		old++
	}
	*s = append((*s)[:0], (*s)[old:]...)
	if n := len(*s); sample && (n == 0 || now.Sub((*s)[n-1].at) >= trendStep) {
		*s = append(*s, trendSample{at: now, used: used})
	}
	if extra := len(*s) - trendSamples; extra > 0 {
		*s = append((*s)[:0], (*s)[extra:]...)
	}
	for _, x := range *s {
		// A sample ahead of now (the clock went back) is no base.
		if !x.at.After(now) {
			return vmipamv1.Trend{Window: metav1.Duration{Duration: now.Sub(x.at).Round(time.Second)}, Change: used - x.used}
		}
	}
	return vmipamv1.Trend{Window: metav1.Duration{}}
}

// poolTrends are a pool's trend series: the whole pool's (family "") and
// each family's.
type poolTrends struct {
	mu     sync.Mutex
	series map[vmipamv1.IPFamily]*trendSeries
}

// note is trendSeries.note of family f's series ("" for the whole pool).
func (t *poolTrends) note(now time.Time, f vmipamv1.IPFamily, used int64, sample bool) *vmipamv1.Trend {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.series == nil {
		t.series = map[vmipamv1.IPFamily]*trendSeries{}
	}
	s := t.series[f]
	if s == nil {
		s = new(trendSeries)
		t.series[f] = s
	}
	tr := s.note(now, used, sample)
	return &tr
}

// trendClose reports whether a trend as stored, a, says what b does for
// the status's purpose: the same change, over windows less than trendStep
// apart. A window that only grew thus costs a status write at most once
// per trendStep.
func trendClose(a, b *vmipamv1.Trend) bool {
	if a == nil || b == nil {
		return a == b
	}
	d := a.Window.Duration - b.Window.Duration
	return a.Change == b.Change && d < trendStep && d > -trendStep
}
