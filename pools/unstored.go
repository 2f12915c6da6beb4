package pools

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/vmipam/vmipam/ipam"
)

// clockSkew is how far vmipam's clock may be behind the API server's: a
// proof read counts as made after a reservation's deadline only once this
// much more has passed.
const clockSkew = 5 * time.Second

// proveUnused settles the pool's lapsed reservations. A reservation whose
// object never appeared (a create refused after admission: by schema
// validation, a later webhook, quota, an existing name) would otherwise
// keep its address through the whole cooldown. After its deadline, the
// create that used it has been stored or has failed, since the pending TTL
// is at least the API server's request timeout; so a read of the API server
// itself (not the cache, which may lag) that begins after the deadline and
// finds no object in the namespace with the token or the address proves
// that no machine ever had it: the address may go back at once. An object
// found keeps the cooldown; one found with the token and the address was
// stored and never bound (its holder label was changed before the bind, so
// no replica's watch showed it), and is bound to the address here. See
// docs/design.md, "Reservations that were never stored".
func (r *Registry) proveUnused(ctx context.Context, p *Pool) error {
	if !p.Ready() {
		return nil
	}
	now := r.clock.Now()
	byNS := map[string][]ipam.Unstored{}
	for _, u := range p.unstored() {
		if u.Deadline.Add(clockSkew).Before(now) {
			byNS[u.Namespace] = append(byNS[u.Namespace], u)
		}
	}
	for ns, us := range byNS {
		readAt := r.clock.Now().Add(-clockSkew)
		tokens, addrs, err := r.stampsIn(ctx, ns)
		if err != nil {
			return fmt.Errorf("read %s in namespace %s to settle lapsed reservations of pool %s: %w", "objects", ns, p.name, err)
		}
		returned := 0
		var bound []labelled
		for _, u := range us {
			o, stored := tokens[u.Token]
			if stored && slices.Contains(o.addrs, u.Addr) {
				// Stored, and never bound: no replica's watch showed it,
				// because its holder label was changed before the bind.
				// It holds the address: bind it here, or the address would
				// come free at the end of its cooldown while it is in use.
				owner := ipam.Owner{Token: u.Token, UID: string(o.uid), Ref: Ref(o.key.Namespace, o.key.Name)}
				if err := p.Adopt(ctx, u.Addr, owner); err == nil {
					bound = append(bound, labelled{gvk: o.gvk, key: o.key, uid: o.uid, addr: u.Addr})
				}
			}
			if stored || addrs[u.Addr] {
				p.used(u)
			} else if p.unused(u, readAt) {
				returned++
			}
		}
		r.relabel(ctx, p, bound)
		if returned > 0 {
			logf.FromContext(ctx).V(1).Info("Returned addresses of reservations never stored", "pool", p.name, "namespace", ns, "count", returned)
		}
	}
	return nil
}

// stamped is an object with vmipam's token, and the addresses it holds.
type stamped struct {
	labelled
	addrs []netip.Addr
}

// stampsIn reads, from the API server, the tokens on every live object of
// the target kind in namespace ns, with the object and its addresses, and
// every address on any of them.
func (r *Registry) stampsIn(ctx context.Context, ns string) (map[string]stamped, map[netip.Addr]bool, error) {
	tokens, addrs := map[string]stamped{}, map[netip.Addr]bool{}
	err := r.eachObject(ctx, ns, func(o *Object) {
		for _, s := range o.Addresses {
			if a, err := netip.ParseAddr(s); err == nil {
				addrs[ipam.Canonical(a)] = true
			}
		}
		if o.Token == "" {
			return
		}
		st := stamped{labelled: labelled{gvk: o.GVK, key: client.ObjectKey{Namespace: o.Namespace, Name: o.Name}, uid: o.UID}}
		eachHeld(o, func(_ *Object, h ipam.Holding) { st.addrs = append(st.addrs, h.Addr) })
		tokens[o.Token] = st
	})
	return tokens, addrs, err
}
