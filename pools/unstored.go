package pools

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
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
// found keeps the cooldown. See docs/design.md, "Reservations that were
// never stored".
func (r *Registry) proveUnused(ctx context.Context, p *Pool) error {
	if !p.m.Ready() {
		return nil
	}
	now := r.clock.Now()
	byNS := map[string][]ipam.Unstored{}
	for _, u := range p.m.Unstored() {
		if u.Deadline.Add(clockSkew).Before(now) {
			byNS[u.Namespace] = append(byNS[u.Namespace], u)
		}
	}
	for ns, us := range byNS {
		readAt := r.clock.Now().Add(-clockSkew)
		tokens, addrs, err := r.stampsIn(ctx, ns)
		if err != nil {
			return fmt.Errorf("read %s in namespace %s to settle lapsed reservations of pool %s: %w", r.opts.Target.GVK.Kind, ns, p.name, err)
		}
		returned := 0
		for _, u := range us {
			if tokens[u.Token] || addrs[u.Addr] {
				p.m.Used(u)
			} else if p.m.Unused(u, readAt) {
				returned++
			}
		}
		if returned > 0 {
			logf.FromContext(ctx).V(1).Info("Returned addresses of reservations never stored", "pool", p.name, "namespace", ns, "count", returned)
		}
	}
	return nil
}

// stampsIn reads, from the API server, the tokens and addresses on every
// object of the target kind in namespace ns.
func (r *Registry) stampsIn(ctx context.Context, ns string) (map[string]bool, map[netip.Addr]bool, error) {
	tokens, addrs := map[string]bool{}, map[netip.Addr]bool{}
	err := r.eachObject(ctx, ns, func(obj *unstructured.Unstructured) {
		if t := obj.GetAnnotations()[vmipamv1.TokenAnnotation]; t != "" {
			tokens[t] = true
		}
		if as, err := r.opts.Target.Addresses(obj); err == nil {
			for _, s := range as {
				if a, err := netip.ParseAddr(s); err == nil {
					addrs[ipam.Canonical(a)] = true
				}
			}
		}
	})
	return tokens, addrs, err
}
