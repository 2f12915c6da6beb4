package audit

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/pools"
)

// snapshot is what a check read of the cluster: plain values, so that
// decide needs no client.
type snapshot struct {
	// listed is when the objects were listed, before anything else was
	// read (the client's clock); now is when the Leases were read, after
	// the blocks.
	listed, now time.Time
	grace       time.Duration
	// namespace is vmipam's.
	namespace string
	// objects are those of the configured kinds, live and terminating.
	objects []object
	// marked are objects of kinds no replica serves that carry vmipam's
	// holder label.
	marked []object
	pools  map[string]pool
	blocks []block
	// orphans are IPBlockShares whose IPBlock does not exist.
	orphans []share
	// leases are the holder Leases, by holder.
	leases map[string]pools.HolderLease
	// ipblocks counts the IPBlocks read.
	ipblocks int
}

// object is one object, as the check needs it.
type object struct {
	// kind is "Kind.group" (or "Kind" for the core group); resource is
	// "resource.group", as kubectl takes it.
	kind, resource  string
	namespace, name string
	uid             string
	created         time.Time
	deleting        bool
	// inScope: its kind's condition selects it.
	inScope bool
	// addrs are its addresses, canonical.
	addrs []netip.Addr
	// label is its holder label's value; labelled says it has one.
	label     string
	labelled  bool
	finalizer bool
	// finalizers are all its finalizers (for marked objects).
	finalizers []string
}

// ref names o as findings do: "Kind namespace/name".
func (o object) ref() string {
	if o.namespace == "" {
		return o.kind + " " + o.name
	}
	return o.kind + " " + o.namespace + "/" + o.name
}

// kubectlRef names o as kubectl's arguments: "resource name -n namespace".
func (o object) kubectlRef() string {
	if o.namespace == "" {
		return o.resource + " " + o.name
	}
	return o.resource + " " + o.name + " -n " + o.namespace
}

// pool is an IPPool.
type pool struct {
	name string
	// ranges are its usable addresses; nil when they do not parse.
	ranges     *ipam.Ranges
	pendingTTL time.Duration
	// specWritten is the last write of its spec or metadata (not of its
	// status).
	specWritten time.Time
}

// block is an IPBlock merged with its holders' IPBlockShares, as vmipam
// reads it (kubestore).
type block struct {
	pool, name string
	b          ipam.Block
	// written is the IPBlock's last write.
	written time.Time
	// holders says, for each holder claiming addresses in it, when its
	// part was last written and whether its in-use marks are its own.
	holders map[string]part
}

// part is one holder's part of a block.
type part struct {
	// written is the last write of the holder's IPBlockShare, or of the
	// IPBlock for a holder without one.
	written time.Time
	// exact: the in-use marks say what the holder had in use at that
	// write (its share was read, or it keeps them in an IPBlock of the
	// exact format), rather than every address it claims.
	exact bool
}

// share is an IPBlockShare.
type share struct {
	pool, name, prefix, holder string
	written                    time.Time
}

// leaseOf returns holder's Lease, and false when it has none.
func (s *snapshot) leaseOf(holder string) (pools.HolderLease, bool) {
	l, ok := s.leases[holder]
	return l, ok
}

// settle is how long after a holder's Lease lapsed its claims may still be
// there without a finding: a live replica marks a lapsed Lease within a
// retry period and moves the claims in a few writes, so three lease
// durations are plenty, plus the grace for clock skew.
func (s *snapshot) settle(d time.Duration) time.Duration {
	if d <= 0 {
		d = pools.DefaultLeaseDuration
	}
	return 3*d + s.grace
}

// decide returns the findings that s shows. It is pure: every time it
// compares comes from s.
func decide(s *snapshot) []Finding {
	var out []Finding
	out = append(out, duplicates(s)...)
	out = append(out, noAddress(s)...)
	claims := claimIndex(s)
	out = append(out, leaks(s)...)
	out = append(out, deadHolders(s)...)
	out = append(out, mislabelled(s, claims)...)
	out = append(out, unconfigured(s)...)
	out = append(out, unknownBlocks(s)...)
	sortFindings(out)
	return out
}

// duplicates: two live objects carrying one address.
//
// Why no false positive: terminating objects are left out (a deleted
// object keeps its address until its release, and the address may be
// handed out again only after its cooldown). The objects of one kind are
// one list at one resourceVersion; objects of two kinds come from two
// lists, between which one could have gone and its address come back to
// another (a pool with no cooldown): the confirmation reads both again, and
// an address never changes on an object (vmipam's admission policy), so
// the two still carrying it then held it together.
func duplicates(s *snapshot) []Finding {
	by := map[netip.Addr][]object{}
	for _, o := range s.objects {
		if o.deleting {
			continue
		}
		for _, a := range o.addrs {
			by[a] = append(by[a], o)
		}
	}
	var out []Finding
	for a, os := range by {
		if len(os) < 2 {
			continue
		}
		slices.SortFunc(os, func(x, y object) int { return x.created.Compare(y.created) })
		refs := make([]string, len(os))
		for i, o := range os {
			refs[i] = o.ref()
		}
		for _, o := range os[1:] {
			out = append(out, Finding{
				Type: TypeDuplicateAddress, Pool: poolOf(s, a), Address: a.String(), Object: o.ref(),
				Message: fmt.Sprintf("address %s is carried by %d live objects: %s; %s was created last",
					a, len(os), strings.Join(refs, ", "), o.ref()),
				Fix: fmt.Sprintf("one of them bypassed vmipam's webhook. Delete and re-create the later one without an address (`kubectl delete %s`), "+
					"so that vmipam gives it one of its own; %s keeps %s", o.kubectlRef(), os[0].ref(), a),
			})
		}
	}
	return out
}

// noAddress: a live object in scope without an address.
//
// Why no false positive: objects created through the webhook carry their
// address from their first write; one that bypassed it gets one from the
// garbage collector within seconds of its creation, so only objects older
// than the grace count (creation time by the API server's clock, against
// the client's: the grace absorbs the skew).
func noAddress(s *snapshot) []Finding {
	var out []Finding
	for _, o := range s.objects {
		if o.deleting || !o.inScope || len(o.addrs) > 0 || s.listed.Sub(o.created) < s.grace {
			continue
		}
		out = append(out, Finding{
			Type: TypeNoAddress, Object: o.ref(),
			Message: fmt.Sprintf("%s has no address: it was created while vmipam's webhook was bypassed or down, or vmipam could not give it one", o.ref()),
			Fix: fmt.Sprintf("vmipam's garbage collector assigns one when a pool allows it (a pool selected for its namespace, with free addresses); "+
				"see why it did not in its events: `kubectl describe %s`", o.kubectlRef()),
		})
	}
	return out
}

// carried returns the addresses any object carries, live or terminating.
func carried(s *snapshot) map[netip.Addr]bool {
	m := map[netip.Addr]bool{}
	for _, o := range s.objects {
		for _, a := range o.addrs {
			m[a] = true
		}
	}
	return m
}

// leaks: addresses the persisted state shows in use that no object
// carries, for longer than the pool's pending TTL plus the grace.
//
// Which addresses: a holder's in-use marks, read from its IPBlockShare (or
// an IPBlock of the exact format), are its addresses that were pending or
// allocated when it last wrote them; cooldowns are released addresses,
// armed ones were free. A holder whose marks are not exact (its share
// missing, an IPBlock of an older format) reads as if every claim were in
// use, and is left out.
//
// How long: a mark can only have been set at or before the last write of
// the object that holds it, and that write's time is in the object's
// metadata.managedFields: the API server's managed fields updater
// (k8s.io/apimachinery/pkg/util/managedfields/internal/managedfieldsupdater.go)
// sets the time of the writing manager's entry to now on every Update
// that changes a field and on every Apply; a write that changes nothing
// leaves it, and changes nothing either. Its time is in whole seconds,
// truncated, so a second is added (see lastWrite).
//
// Why no false positive: the objects were listed first. An address
// handed out at admission is armed, not in use, until the write after its
// reservation, and its object is stored within the API server's request
// timeout of the admission, which the pending TTL (at least 60s) covers.
// So an object carrying an address marked in use at a write older than
// TTL + grace when the objects were listed was stored before that list and
// is in it. An object deleted properly has its release made durable
// before its finalizer goes (controller.AddressGC.release, through
// ipam.Manager.ReleaseDurable): either its holder wrote a cooldown, and
// the mark is gone, or its holder's persisted marks still show it in use,
// which a crash rests, and its holder writes the cooldown at its next
// flush, a later write. A terminating object still carries its address.
// The confirmation reads the objects and blocks again.
func leaks(s *snapshot) []Finding {
	held := carried(s)
	var out []Finding
	for _, bl := range s.blocks {
		p, ok := s.pools[bl.pool]
		if !ok {
			continue
		}
		for h, bm := range bl.b.InUse {
			pt := bl.holders[h]
			if !pt.exact || s.listed.Sub(pt.written) <= p.pendingTTL+s.grace {
				continue
			}
			for off := range ipam.BlockSize {
				if !bm.Has(off) {
					continue
				}
				a := addrAt(bl.b.Prefix, off)
				if held[a] {
					continue
				}
				if _, cooling := bl.b.Cooldowns[a]; cooling {
					continue
				}
				l, hasLease := s.leaseOf(h)
				why := "vmipam rests such an address (max of pending TTL and cooldown) when it recovers the pool or takes the holder over, and releases it at its next resync"
				if !hasLease || !l.Live(s.now) {
					why = "its holder is not running: a live replica takes its claims over and rests the address"
				}
				out = append(out, Finding{
					Type: TypeLeak, Pool: bl.pool, Address: a.String(), Holder: h,
					Message: fmt.Sprintf("address %s of pool %s is in use in the state of holder %s (IPBlock %s, last written %s ago) but no object carries it, for longer than the pending TTL %s plus %s",
						a, bl.pool, h, bl.name, s.listed.Sub(pt.written).Round(time.Second), p.pendingTTL, s.grace),
					Fix: fmt.Sprintf("%s; `kubectl vmipam release %s` ends it now", why, a),
				})
			}
		}
	}
	return out
}

// deadHolders: claims of a holder whose Lease is gone or lapsed, for
// longer than settle, while no takeover is running.
//
// Why no false positive: a live replica renews its Lease every retry
// period, and a replica writes its Lease before it claims. A lapsed
// holder is taken over by a live replica, which marks its Lease (a
// takeover in progress is left alone), moves the claims and then deletes
// the Lease; blocks are read before the Leases, so a Lease deleted after
// its claims moved may be read gone while the blocks show the claims: the
// confirmation reads the blocks again. A missing Lease gives no time, so
// the blocks' last writes must be older than settle too.
func deadHolders(s *snapshot) []Finding {
	type seen struct {
		claims, blocks int
		written        time.Time
	}
	by := map[[2]string]*seen{}
	for _, bl := range s.blocks {
		for h, bm := range bl.b.Claims {
			n := bm.Count()
			if n == 0 {
				continue
			}
			k := [2]string{bl.pool, h}
			if by[k] == nil {
				by[k] = &seen{}
			}
			by[k].claims += n
			by[k].blocks++
			w := bl.written
			if pt, ok := bl.holders[h]; ok && pt.written.After(w) {
				w = pt.written
			}
			if w.After(by[k].written) {
				by[k].written = w
			}
		}
	}
	var out []Finding
	for k, c := range by {
		poolName, h := k[0], k[1]
		l, ok := s.leaseOf(h)
		var state string
		switch {
		case !ok:
			if s.now.Sub(c.written) <= s.settle(0) {
				continue
			}
			state = "has no Lease"
		case l.Live(s.now), takenOver(l, s.now):
			continue
		default:
			lapsed := l.Renewed.Add(l.Duration)
			if s.now.Sub(lapsed) <= s.settle(l.Duration) {
				continue
			}
			state = fmt.Sprintf("has a Lease that lapsed %s ago", s.now.Sub(lapsed).Round(time.Second))
			if l.Identity != l.Holder && l.Identity != "" {
				state += fmt.Sprintf(" (last written by %s)", l.Identity)
			}
		}
		out = append(out, Finding{
			Type: TypeDeadHolderClaims, Pool: poolName, Holder: h,
			Message: fmt.Sprintf("holder %s %s, and still claims %d addresses in %d blocks of pool %s: no replica hands them out or releases them",
				h, state, c.claims, c.blocks, poolName),
			Fix: fmt.Sprintf("start a vmipam replica (see `kubectl -n %s get pods`): a live replica takes the claims over within the lease duration", s.namespace),
		})
	}
	return out
}

// claimIndex maps each claimed address to its holder.
func claimIndex(s *snapshot) map[netip.Addr]claim {
	m := map[netip.Addr]claim{}
	for i := range s.blocks {
		bl := &s.blocks[i]
		for h, bm := range bl.b.Claims {
			for off := range ipam.BlockSize {
				if bm.Has(off) {
					m[addrAt(bl.b.Prefix, off)] = claim{holder: h, block: bl}
				}
			}
		}
	}
	return m
}

// claim is who claims an address, in which block.
type claim struct {
	holder string
	block  *block
}

// mislabelled: live objects whose holder label does not name the holder whose
// claim covers their (first) address.
//
// Why no false positive: a takeover moves the claims first and relabels
// the objects afterwards, so while either holder's Lease is lapsed or
// marked for takeover the label may lag: skipped. A Lease deleted at the
// end of a takeover precedes the relabel by seconds: a label naming a
// holder with no Lease counts only once the block's last write (the move
// of the claim) is older than settle. Static requests hand an address
// between holders only while it is free or armed, before its object
// exists, and the object is labelled by its new holder. Objects younger
// than the grace are left alone too (adopted and labelled by the garbage
// collector within seconds of a create that bypassed the webhook). The confirmation reads the object, its
// block and the Leases again.
func mislabelled(s *snapshot, claims map[netip.Addr]claim) []Finding {
	byLabel := map[string]string{}
	for h := range s.leases {
		byLabel[pools.HolderLabelValue(h)] = h
	}
	var out []Finding
	for _, o := range s.objects {
		if o.deleting || len(o.addrs) == 0 || s.listed.Sub(o.created) <= s.grace {
			continue
		}
		c, ok := claims[o.addrs[0]]
		if !ok {
			continue
		}
		want := pools.HolderLabelValue(c.holder)
		if o.labelled && o.label == want {
			continue
		}
		if l, ok := s.leaseOf(c.holder); !ok || !l.Live(s.now) {
			continue
		}
		if o.labelled {
			if h, ok := byLabel[o.label]; ok {
				if l := s.leases[h]; !l.Live(s.now) {
					continue
				}
			} else if s.now.Sub(c.block.written) <= s.settle(0) {
				continue
			}
		}
		got := "no holder label"
		if o.labelled {
			got = fmt.Sprintf("holder label %s=%s", vmipamv1.HolderLabel, o.label)
		}
		out = append(out, Finding{
			Type: TypeHolderLabelMismatch, Pool: c.block.pool, Address: o.addrs[0].String(), Object: o.ref(), Holder: c.holder,
			Message: fmt.Sprintf("%s carries %s, but its address %s is claimed by holder %s: no replica's watch delivers it, and its deletion waits for the next resync",
				o.ref(), got, o.addrs[0], c.holder),
			Fix: fmt.Sprintf("vmipam's resync puts the label back; or label it now: `kubectl label --overwrite %s %s=%s`",
				o.kubectlRef(), vmipamv1.HolderLabel, want),
		})
	}
	return out
}

// unconfigured: objects of a kind no replica serves that carry vmipam's
// holder label (so, with it, its finalizer): nothing releases their
// addresses, and their deletion waits on a finalizer no replica removes.
//
// Why no false positive: the kinds are the union of what every holder
// Lease publishes, so a kind served by one replica of a rollout counts
// as served.
func unconfigured(s *snapshot) []Finding {
	var out []Finding
	for _, o := range s.marked {
		marks := fmt.Sprintf("the label %s", vmipamv1.HolderLabel)
		if o.finalizer {
			marks += fmt.Sprintf(" and the finalizer %s", vmipamv1.Finalizer)
		}
		out = append(out, Finding{
			Type: TypeUnconfiguredKind, Object: o.ref(),
			Message: fmt.Sprintf("%s carries %s, but no vmipam replica serves its kind %s: nothing releases its address, and its deletion waits for the finalizer", o.ref(), marks, o.kind),
			Fix: fmt.Sprintf("add the kind back to vmipam's kinds configuration (deploy/kinds); or, once the object no longer needs its address, remove vmipam's marks: "+
				"`kubectl patch %s --type=merge -p '%s'`", o.kubectlRef(), unmarkPatch(o)),
		})
	}
	return out
}

// unknownBlocks: IPBlocks naming no IPPool, claims outside the pool's
// ranges, IPBlockShares without their IPBlock.
//
// Why no false positive: an IPBlock is created only once its pool exists,
// and goes with it (it is owned by the IPPool: the garbage collector
// deletes it after the pool), so it counts once its last write is older
// than the grace. A pool whose ranges changed is rebuilt by every live
// replica, which drops its claims outside the new ranges when it recovers
// it and writes the block: claims outside count once the pool's spec was
// written settle ago. A holder writes its share before creating the
// IPBlock, and deletes shares after the IPBlock: a share without IPBlock
// counts once its last write is older than settle.
func unknownBlocks(s *snapshot) []Finding {
	var out []Finding
	for _, bl := range s.blocks {
		p, ok := s.pools[bl.pool]
		if !ok {
			if s.listed.Sub(bl.written) <= s.grace {
				continue
			}
			out = append(out, Finding{
				Type: TypeUnknownBlock, Pool: bl.pool, Object: "IPBlock " + bl.name,
				Message: fmt.Sprintf("IPBlock %s (block %s) names pool %s, which does not exist", bl.name, bl.b.Prefix, bl.pool),
				Fix: fmt.Sprintf("IPBlocks are owned by their IPPool and deleted with it by the garbage collector; one left over (its owner reference removed, or restored from a backup) holds nothing vmipam reads: "+
					"`kubectl delete ipblocks.vmipam.io %s` and the IPBlockShares labelled %s=%s", bl.name, vmipamv1.BlockLabel, kubestore.BlockLabelValue(bl.pool, bl.b.Prefix)),
			})
			continue
		}
		if p.ranges == nil || s.listed.Sub(p.specWritten) <= s.settle(0) {
			continue
		}
		outside := 0
		for _, bm := range bl.b.Claims {
			for off := range ipam.BlockSize {
				if bm.Has(off) && !p.ranges.Contains(addrAt(bl.b.Prefix, off)) {
					outside++
				}
			}
		}
		if outside == 0 {
			continue
		}
		out = append(out, Finding{
			Type: TypeUnknownBlock, Pool: bl.pool, Object: "IPBlock " + bl.name,
			Message: fmt.Sprintf("IPBlock %s claims %d addresses outside the ranges of pool %s (%s): the pool was shrunk", bl.name, outside, bl.pool, p.ranges),
			Fix: "each replica drops its claims outside a pool's ranges when it recovers the pool (it does when the pool's spec changes, and at start) and deletes a block left with no claims, cooldowns or requests; " +
				"claims that stay belong to a holder that has not recovered the pool since: restart the replicas. " +
				"Objects still carrying such addresses keep them, unmanaged: move them to a pool that covers them",
		})
	}
	for _, sh := range s.orphans {
		if s.listed.Sub(sh.written) <= s.settle(0) {
			continue
		}
		out = append(out, Finding{
			Type: TypeUnknownBlock, Pool: sh.pool, Holder: sh.holder, Object: "IPBlockShare " + sh.name,
			Message: fmt.Sprintf("IPBlockShare %s (holder %s, block %s of pool %s) has no IPBlock: no reader reads it", sh.name, sh.holder, sh.prefix, sh.pool),
			Fix:     fmt.Sprintf("left behind by a failed delete; it is owned by its IPPool and goes with it, or now: `kubectl delete ipblockshares.vmipam.io %s`", sh.name),
		})
	}
	return out
}

// poolOf names the pool of a's block, "" when no block holds it.
func poolOf(s *snapshot, a netip.Addr) string {
	p := ipam.BlockOf(a)
	for _, bl := range s.blocks {
		if bl.b.Prefix == p {
			return bl.pool
		}
	}
	for _, p := range s.pools {
		if p.ranges != nil && p.ranges.Contains(a) {
			return p.name
		}
	}
	return ""
}

// addrAt is the address at offset off of block p.
func addrAt(p netip.Prefix, off int) netip.Addr {
	b := p.Addr().AsSlice()
	v := off
	for i := len(b) - 1; i >= 0 && v > 0; i-- {
		v += int(b[i])
		b[i] = byte(v)
		v >>= 8
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// unmarkPatch is the merge patch that removes vmipam's holder label and
// finalizer from o, keeping its other finalizers.
func unmarkPatch(o object) string {
	keep := []string{}
	for _, f := range o.finalizers {
		if f != vmipamv1.Finalizer {
			keep = append(keep, f)
		}
	}
	raw, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"labels": map[string]any{vmipamv1.HolderLabel: nil}, "finalizers": keep,
	}})
	return string(raw)
}

// takenOver reports whether a live replica is taking l's holder over at
// now.
func takenOver(l pools.HolderLease, now time.Time) bool {
	_, ok := l.TakenOverBy(now)
	return ok
}
