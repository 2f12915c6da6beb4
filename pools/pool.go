package pools

import (
	"context"
	"net/netip"
	"sync"
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
	name       string
	m          *ipam.Manager
	uid        types.UID
	generation int64
	spec       vmipamv1.IPPoolSpec
	selector   labels.Selector // namespaceSelector; nil when none
	allowed    *allowedNamespaces
	cancel     context.CancelFunc
	done       chan struct{}

	noteDuplicate func(pool string)

	mu         sync.Mutex
	deleting   bool
	duplicates []string // the conflicts found by the last resync, for the status
}

// Name returns the IPPool's name.
func (p *Pool) Name() string { return p.name }

// Default reports whether the pool is the default pool.
func (p *Pool) Default() bool { return p.spec.Default }

// Ready reports whether the allocator has recovered and serves the pool.
func (p *Pool) Ready() bool { return p.m.Ready() }

// Subnet returns the subnet of the pool's range that holds a: its CIDR,
// gateway and routes, which a guest needs besides its address. An address
// the ranges no longer hand out (an update excluded it while a VM held
// it) still gets the CIDR holding it, without gateway or routes.
func (p *Pool) Subnet(a netip.Addr) (ipam.Subnet, bool) {
	if s, ok := p.m.Ranges().Subnet(a); ok {
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

// Network returns the network identity of a, an address of the pool: a
// in interface notation with its subnet's prefix length, and the subnet's
// gateway and routes; nil when a is not the pool's.
func (p *Pool) Network(a netip.Addr) *vmipamv1.Network {
	s, ok := p.Subnet(a)
	if !ok {
		return nil
	}
	a = ipam.Canonical(a)
	n := &vmipamv1.Network{Addresses: []string{netip.PrefixFrom(a, s.Prefix.Bits()).String()}}
	if s.Gateway.IsValid() {
		n.Gateways = []string{s.Gateway.String()}
	}
	for _, r := range s.Routes {
		n.Routes = append(n.Routes, vmipamv1.Route{Destination: r.Destination.String(), Via: r.Via.String()})
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

// Ranges returns the pool's usable addresses.
func (p *Pool) Ranges() *ipam.Ranges { return p.m.Ranges() }

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

// Allocate reserves the next free address for r.
func (p *Pool) Allocate(ctx context.Context, r ipam.Reservation) (netip.Addr, error) {
	return p.m.Allocate(ctx, r)
}

// Reserve reserves addr, a static request, for r.
func (p *Pool) Reserve(ctx context.Context, r ipam.Reservation, addr netip.Addr) error {
	return p.m.Reserve(ctx, r, addr)
}

// CanReserve says whether Reserve of addr would be refused, changing
// nothing: for a dry run.
func (p *Pool) CanReserve(addr netip.Addr) error { return p.m.CanReserve(addr) }

// Holding says how the pool holds addr for an object with the given token
// and UID.
type Holding int

const (
	// Held means pending for the token, or allocated to the UID.
	Held Holding = iota
	// Lapsed means nobody holds it; the object's reservation expired or was
	// lost in a restart.
	Lapsed
	// HeldElsewhere means another object holds it, or it is not the pool's.
	HeldElsewhere
)

// Holds says whether the pool holds addr for the object with token and
// uid.
func (p *Pool) Holds(addr netip.Addr, token, uid string) Holding {
	if !p.m.Ranges().Contains(addr) {
		return HeldElsewhere
	}
	st, o, _ := p.m.Lookup(addr)
	switch {
	case st == ipam.StatePending && token != "" && o.Token == token,
		st == ipam.StateAllocated && uid != "" && o.UID == uid:
		return Held
	case st == ipam.StatePending || st == ipam.StateAllocated:
		return HeldElsewhere
	}
	if other, ok := p.m.Reserved(token); ok && other != ipam.Canonical(addr) {
		// The token's reservation is for another address: the object's
		// address was changed after vmipam stamped it.
		return HeldElsewhere
	}
	return Lapsed
}

// Bind binds the reservation of o.Token to the stored object o.UID.
func (p *Pool) Bind(o ipam.Owner) (netip.Addr, error) { return p.m.Bind(o) }

// Adopt makes addr allocated to the live object o, whatever its state; an
// address no holder claims is claimed first. One another holder claims is
// refused: that holder adopts it.
func (p *Pool) Adopt(ctx context.Context, addr netip.Addr, o ipam.Owner) error {
	return p.m.Adopt(ctx, addr, o)
}

// Held reports whether this replica holds addr: with several replicas, the
// one that holds an address looks after the object carrying it.
func (p *Pool) Held(addr netip.Addr) bool { return p.m.Holds(addr) }

// Refresh reads addr's block from the store again: Held and HolderOf then
// answer from what the store holds now.
func (p *Pool) Refresh(ctx context.Context, addr netip.Addr) error { return p.m.Refresh(ctx, addr) }

// Release puts addr, held by o, into cooldown and returns once the release
// survives a crash: the object may then go.
func (p *Pool) Release(ctx context.Context, addr netip.Addr, o ipam.Owner) error {
	return p.m.ReleaseDurable(ctx, addr, o)
}

// Lookup reports the state of addr, its owner or its cooldown deadline.
func (p *Pool) Lookup(addr netip.Addr) (ipam.State, ipam.Owner, time.Time) {
	return p.m.Lookup(addr)
}

// Snapshot returns the pool's counts per state.
func (p *Pool) Snapshot() ipam.Counts { return p.m.Snapshot() }

// Settles returns when the pool's last pending reservation and cooldown of
// the moment end at the latest; zero when there is none.
func (p *Pool) Settles() time.Time { return p.m.Settles() }

// Stats returns the pool's allocator counters.
func (p *Pool) Stats() ipam.Stats { return p.m.Stats() }

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
	p.m.Close()
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
