package pools

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
)

// Pool is one IPPool's allocator, and the only way to it: the webhook and
// the controller say what they mean (allocate, reserve, check for a dry
// run, bind, adopt, release) and the allocator's rules stay behind these
// methods.
type Pool struct {
	name string
	// ranges are the pool's usable addresses, of both families; v4 and v6
	// hand out those of their family, each from its own blocks, and ms
	// holds those of them the ranges need, IPv4 first.
	ranges     *ipam.Ranges
	v4, v6     *ipam.Manager
	ms         []*ipam.Manager
	uid        types.UID
	generation int64
	spec       vmipamv1.IPPoolSpec
	selector   labels.Selector // namespaceSelector; nil when none
	allowed    *allowedNamespaces
	cancel     context.CancelFunc
	done       chan struct{}

	noteDuplicate func(pool string)

	// paused is spec.paused of the IPPool version last applied: set when
	// the allocator is built, and by Ensure when only it changed, without
	// a rebuild (see Paused).
	paused atomic.Bool
	// trends are the samples of the pool's trend (see trendSeries), shared
	// with the allocators that rebuild this one.
	trends *poolTrends

	mu         sync.Mutex
	deleting   bool
	duplicates []string // the conflicts found by the last resync, for the status
}

// Name returns the IPPool's name.
func (p *Pool) Name() string { return p.name }

// Default reports whether the pool is the default pool.
func (p *Pool) Default() bool { return p.spec.Default }

// Paused reports whether the IPPool's spec.paused stops new allocations:
// Assign refuses, while binds, releases, adoptions of addresses already
// held and resyncs go on. It is an atomic flag, read on every create.
func (p *Pool) Paused() bool { return p.paused.Load() }

// Ready reports whether the allocator has recovered and serves the pool.
func (p *Pool) Ready() bool {
	for _, m := range p.ms {
		if !m.Ready() {
			return false
		}
	}
	return true
}

// Families returns the address families the pool hands out, IPv4 first.
func (p *Pool) Families() []vmipamv1.IPFamily {
	var out []vmipamv1.IPFamily
	if p.v4 != nil {
		out = append(out, vmipamv1.IPv4)
	}
	if p.v6 != nil {
		out = append(out, vmipamv1.IPv6)
	}
	return out
}

// Serves reports whether the pool hands out addresses of family f.
func (p *Pool) Serves(f vmipamv1.IPFamily) bool { return p.family(f) != nil }

// family returns the allocator of family f, nil when the pool has none.
func (p *Pool) family(f vmipamv1.IPFamily) *ipam.Manager {
	if f == vmipamv1.IPv6 {
		return p.v6
	}
	return p.v4
}

// of returns the allocator of a's family, nil when the pool has none.
func (p *Pool) of(a netip.Addr) *ipam.Manager {
	if ipam.Canonical(a).Is4() {
		return p.v4
	}
	return p.v6
}

// FamilyOf returns the family of a.
func FamilyOf(a netip.Addr) vmipamv1.IPFamily {
	if ipam.Canonical(a).Is4() {
		return vmipamv1.IPv4
	}
	return vmipamv1.IPv6
}

// Subnet returns the subnet of the pool's range that holds a: its CIDR,
// gateway and routes, which a guest needs besides its address. An address
// the ranges no longer hand out (an update excluded it while a VM held
// it) still gets the CIDR holding it, without gateway or routes.
func (p *Pool) Subnet(a netip.Addr) (ipam.Subnet, bool) {
	if s, ok := p.ranges.Subnet(a); ok {
		return s, true
	}
	a = ipam.Canonical(a)
	for _, r := range p.spec.Ranges {
		if c, err := netip.ParsePrefix(r.CIDR); err == nil && c.Contains(a) {
			return ipam.Subnet{Prefix: c.Masked()}, true
		}
	}
	return ipam.Subnet{}, false
}

// Network returns the network identity of addrs, addresses of the pool
// (one per family): each in interface notation with its subnet's prefix
// length, and the subnets' gateways and routes; nil when none of them is
// the pool's.
func (p *Pool) Network(addrs ...netip.Addr) *vmipamv1.Network {
	var n *vmipamv1.Network
	for _, a := range addrs {
		s, ok := p.Subnet(a)
		if !ok {
			continue
		}
		if n == nil {
			n = &vmipamv1.Network{}
		}
		a = ipam.Canonical(a)
		n.Addresses = append(n.Addresses, netip.PrefixFrom(a, s.Prefix.Bits()).String())
		if s.Gateway.IsValid() {
			n.Gateways = append(n.Gateways, s.Gateway.String())
		}
		for _, r := range s.Routes {
			n.Routes = append(n.Routes, vmipamv1.Route{Destination: r.Destination.String(), Via: r.Via.String()})
		}
	}
	return n
}

// RangeSpecs turns an IPPool's ranges into the allocator's: the one
// conversion that the allocator of a pool and the IPPool validator share.
func RangeSpecs(ranges []vmipamv1.IPRange) []ipam.RangeSpec {
	specs := make([]ipam.RangeSpec, len(ranges))
	for i, r := range ranges {
		specs[i] = ipam.RangeSpec{CIDR: r.CIDR, First: r.First, Last: r.Last, Exclude: r.Exclude, Gateway: r.Gateway}
		for _, rt := range r.Routes {
			specs[i].Routes = append(specs[i].Routes, ipam.RouteSpec{Destination: rt.Destination, Via: rt.Via})
		}
	}
	return specs
}

// Ranges returns the pool's usable addresses, of both families.
func (p *Pool) Ranges() *ipam.Ranges { return p.ranges }

// observedGeneration is the IPPool generation the allocator serves.
func (p *Pool) observedGeneration() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.generation
}

// Deleting reports whether the IPPool is being deleted: it hands out no
// new address, and waits for its last holders to go.
func (p *Pool) Deleting() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.deleting
}

// AllocateFamily reserves the next free address of family f for r.
func (p *Pool) AllocateFamily(ctx context.Context, r ipam.Reservation, f vmipamv1.IPFamily) (netip.Addr, error) {
	m := p.family(f)
	if m == nil {
		return netip.Addr{}, fmt.Errorf("allocate from pool %q: %w", p.name, &NoFamilyError{Pool: p.name, Family: f})
	}
	return m.Allocate(ctx, r)
}

// NoFamilyError says that a pool has no range of an address family.
type NoFamilyError struct {
	Pool   string
	Family vmipamv1.IPFamily
}

func (e *NoFamilyError) Error() string {
	return fmt.Sprintf("pool %q has no %s range", e.Pool, e.Family)
}

// Is reports whether target is ipam.ErrOutOfRange.
func (e *NoFamilyError) Is(target error) bool { return target == ipam.ErrOutOfRange }

// Cancel takes back every reservation of token at once, without a
// cooldown: for an admission refused after it reserved them (see
// ipam.Manager.Cancel). It returns the addresses taken back.
func (p *Pool) Cancel(token string) []netip.Addr {
	var out []netip.Addr
	for _, m := range p.ms {
		if a, ok := m.Cancel(token); ok {
			out = append(out, a)
		}
	}
	return out
}

// Reserve reserves addr, a static request, for r.
func (p *Pool) Reserve(ctx context.Context, r ipam.Reservation, addr netip.Addr) error {
	m, err := p.reserver(addr)
	if err != nil {
		return err
	}
	return m.Reserve(ctx, r, addr)
}

// CanReserve says whether Reserve of addr would be refused, changing
// nothing: for a dry run.
func (p *Pool) CanReserve(addr netip.Addr) error {
	m, err := p.reserver(addr)
	if err != nil {
		return err
	}
	return m.CanReserve(addr)
}

// reserver returns the allocator that would reserve addr, or the error a
// reservation of it gets when the pool has no range of its family.
func (p *Pool) reserver(addr netip.Addr) (*ipam.Manager, error) {
	m := p.of(addr)
	if m == nil {
		return nil, fmt.Errorf("reserve %s in pool %q (usable: %s): %w", addr, p.name, p.ranges, ipam.ErrOutOfRange)
	}
	return m, nil
}

// Bind binds the reservation of o.Token of addr's family to the stored
// object o.UID, and returns the address it binds.
func (p *Pool) Bind(addr netip.Addr, o ipam.Owner) (netip.Addr, error) {
	m := p.of(addr)
	if m == nil {
		return netip.Addr{}, fmt.Errorf("bind token %s in pool %q: %w", o.Token, p.name, ipam.ErrUnknownToken)
	}
	return m.Bind(o)
}

// Adopt makes addr allocated to the live object o, whatever its state; an
// address no holder claims is claimed first. One another holder claims is
// refused: that holder adopts it.
func (p *Pool) Adopt(ctx context.Context, addr netip.Addr, o ipam.Owner) error {
	m := p.of(addr)
	if m == nil {
		return fmt.Errorf("adopt %s in pool %q: %w", addr, p.name, ipam.ErrOutOfRange)
	}
	return m.Adopt(ctx, addr, o)
}

// Held reports whether this replica holds addr: with several replicas, the
// one that holds an address looks after the object carrying it.
func (p *Pool) Held(addr netip.Addr) bool {
	m := p.of(addr)
	return m != nil && m.Holds(addr)
}

// Refresh reads addr's block from the store again: Held and HolderOf then
// answer from what the store holds now.
func (p *Pool) Refresh(ctx context.Context, addr netip.Addr) error {
	if m := p.of(addr); m != nil {
		return m.Refresh(ctx, addr)
	}
	return nil
}

// Release puts addr, held by o, into cooldown and returns once the release
// survives a crash: the object may then go.
func (p *Pool) Release(ctx context.Context, addr netip.Addr, o ipam.Owner) error {
	if m := p.of(addr); m != nil {
		return m.ReleaseDurable(ctx, addr, o)
	}
	return nil
}

// Gone starts the cooldown of addr, released for o, again from now: o's
// object is gone (its finalizer removed), and the cooldown must end a whole
// cooldown after that, however long the history's record and the removal
// took after the release. It only ever lengthens a cooldown, is kept in
// memory until the next flush (a crash rests the address anyway), and
// leaves an address that is not cooling down as it is. It returns when the
// cooldown ends, and whether addr is cooling down.
func (p *Pool) Gone(addr netip.Addr, o ipam.Owner) (time.Time, bool) {
	m := p.of(addr)
	if m == nil {
		return time.Time{}, false
	}
	if st, _, _ := m.Lookup(addr); st == ipam.StateCooldown {
		_ = m.Release(addr, ipam.Owner{UID: o.UID, Ref: o.Ref})
	}
	st, _, until := m.Lookup(addr)
	return until, st == ipam.StateCooldown
}

// Lookup reports the state of addr, its owner or its cooldown deadline.
func (p *Pool) Lookup(addr netip.Addr) (ipam.State, ipam.Owner, time.Time) {
	if m := p.of(addr); m != nil {
		return m.Lookup(addr)
	}
	return ipam.StateUnclaimed, ipam.Owner{}, time.Time{}
}

// CooldownLeft reports how long addr still cools down, and false when it
// is not cooling down here.
func (p *Pool) CooldownLeft(addr netip.Addr) (time.Duration, bool) {
	if m := p.of(addr); m != nil {
		return m.CooldownLeft(addr)
	}
	return 0, false
}

// Snapshot returns the pool's counts per state, over both families.
func (p *Pool) Snapshot() ipam.Counts {
	var c ipam.Counts
	for _, m := range p.ms {
		c = c.Add(m.Snapshot())
	}
	return c
}

// FamilySnapshot returns the counts per state of family f's addresses,
// and false when the pool has none.
func (p *Pool) FamilySnapshot(f vmipamv1.IPFamily) (ipam.Counts, bool) {
	if m := p.family(f); m != nil {
		return m.Snapshot(), true
	}
	return ipam.Counts{}, false
}

// Settles returns when the pool's last pending reservation and cooldown of
// the moment end at the latest; zero when there is none.
func (p *Pool) Settles() time.Time {
	var t time.Time
	for _, m := range p.ms {
		if s := m.Settles(); s.After(t) {
			t = s
		}
	}
	return t
}

// Stats returns the pool's allocator counters, over both families.
func (p *Pool) Stats() ipam.Stats {
	var s ipam.Stats
	for _, m := range p.ms {
		s = s.Add(m.Stats())
	}
	return s
}

// NoteConflict records a duplicate the controller found, for the status.
func (p *Pool) NoteConflict(err error) {
	if p.noteDuplicate != nil {
		p.noteDuplicate(p.name)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.duplicates = append(p.duplicates, err.Error())
}

func (p *Pool) noteConflicts(errs []error) {
	if p.noteDuplicate != nil {
		for range errs {
			p.noteDuplicate(p.name)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.duplicates = p.duplicates[:0]
	for _, e := range errs {
		p.duplicates = append(p.duplicates, e.Error())
	}
}

func (p *Pool) stop() {
	for _, m := range p.ms {
		m.Close()
	}
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
}

// allowedNamespaces is a pool's spec.allowedNamespaces, parsed.
type allowedNamespaces struct {
	names    map[string]bool
	selector labels.Selector
}

// Allows reports whether the namespace may draw from the pool.
func (p *Pool) Allows(ns *corev1.Namespace) bool {
	a := p.allowed
	if a == nil {
		return true
	}
	return a.names[ns.Name] || a.selector != nil && a.selector.Matches(labels.Set(ns.Labels))
}
