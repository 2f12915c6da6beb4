package ipam

import (
	"fmt"
	"net/netip"
	"time"
)

// State is the state of an address in a Manager.
type State uint8

// The states of an address. An address moves
// unclaimed -> free -> pending -> allocated -> cooldown -> free, with
// shortcuts described in docs/design.md.
const (
	// StateUnclaimed: not claimed by this Manager.
	StateUnclaimed State = iota
	// StateFree: claimed by this Manager and ready to hand out.
	StateFree
	// StatePending: handed out for a reservation token, not yet bound to a
	// virtual machine the cluster has stored.
	StatePending
	// StateAllocated: bound to a virtual machine's UID.
	StateAllocated
	// StateCooldown: released; not handed out before its deadline.
	StateCooldown
	// stateReturning: being given back to the store, or handed over to
	// another holder, by a write in flight.
	stateReturning
	// stateSurplus: out of cooldown while the free list is full, waiting
	// to be given back to the store; free to hand out until then.
	stateSurplus
)

var stateNames = [...]string{"unclaimed", "free", "pending", "allocated", "cooldown", "returning", "surplus"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", s)
}

// Owner identifies who holds an address: the reservation token stamped at
// admission (the object has no UID and perhaps no name yet), and the
// virtual machine's UID once the cluster has stored it.
type Owner struct {
	Token string
	UID   string
	// Ref names the holder in messages, such as "team-a/db-1"; optional.
	Ref string
}

// Reservation describes who asks for an address at admission.
type Reservation struct {
	// Token is fresh for every admission; it keys the reservation until
	// the machine is stored and bound.
	Token string
	// Namespace is where the machine will be stored: pending reservations
	// are bounded per namespace, and the proof that a lapsed reservation
	// was never stored (see Unused) looks there.
	Namespace string
	// Ref names the machine in messages: namespace/name, or the
	// generateName prefix when the name is not known yet.
	Ref string
}

// entry is one address this Manager has claimed.
type entry struct {
	addr  netip.Addr
	state State
	owner Owner
	// at is when a pending reservation was made, or when a cooldown ends.
	at time.Time
	// ns is a pending reservation's namespace.
	ns string
	// armed: a free address that the store, as last written, shows armed,
	// so that it may be handed out; arming: a write in flight arms it.
	armed, arming bool
	// orphan: found claimed by this holder in the store, in use or armed
	// there, without knowing which machine holds it: it cools down until
	// a resync with the live machines settles it (see materializeLocked).
	orphan bool
	// changed is the Manager's sequence number at the entry's last change
	// of owner or state, so Resync can tell changes newer than its list.
	changed    uint64
	prev, next *entry
}

// blockState is the Manager's view of one persisted block.
type blockState struct {
	persisted Block
	loaded    bool
	// returning: a write that gives addresses back, or hands them over, is
	// in flight; once it lands the store may no longer claim what
	// persisted shows claimed.
	returning bool
	// gen counts local changes that the persisted block does not reflect;
	// written is the gen of the last successful write.
	gen, written uint64
	// ours counts this Manager's entries in the block, and held has their
	// offsets: a write builds the block from them without looking up
	// every offset in the Manager's map of entries. elsewhere counts the
	// addresses other holders claim in persisted; othersFree, those of
	// them persisted shows neither in use nor cooling down.
	ours, elsewhere, othersFree int
	held                        Bitmap
	// index has this Manager's entries in the block by offset, once it
	// holds denseAt of them, until it holds fewer than half that: a write
	// of a full block then reads its entries from here, not with a lookup
	// each in the Manager's map of all its entries, which at a replica's
	// 33,000 entries misses the CPU's caches.
	index *[BlockSize]*entry
	// requested: another holder may ask for addresses here; the next
	// rebalance reads the block and answers.
	requested bool
	// served is the version whose requests the last answer read: a read
	// of it again marks nothing requested, or every holder with
	// addresses here read the block again and again, one read each,
	// while a request nobody could meet stood. unmet: a count there was
	// not met, with unmetFree addresses free here (-1: allocations
	// here were asking); it is answered again once more are free.
	// markedFor is the version whose requests last marked the block.
	served, markedFor string
	unmet             bool
	unmetFree         int
	// bound is the Manager's I/O sequence number that persisted is known
	// to be at least as new as: a read's start, a write's completion.
	// issued is the sequence number of the last write sent (see
	// overtakenLocked).
	bound, issued uint64
	// moved: the store showed (Observe) a version of the block other than
	// persisted's since it was read or written, most likely another
	// holder's write. A claim reads the block first, rather than lose a
	// compare-and-swap.
	moved bool
}

func (b *blockState) dirty() bool { return b.gen != b.written }

// denseAt is the number of a block's entries from which blockState.index
// keeps them: its 32 KiB cost at most 128 bytes an entry while it is kept.
// Manager.denseAt is this but in the property tests, whose blocks hold
// far fewer.
const denseAt = 512

// unheld returns the offsets of bm that have no entry of this Manager's.
func (b *blockState) unheld(bm *Bitmap) Bitmap {
	out := *bm
	for w := range out {
		out[w] &^= b.held[w]
	}
	return out
}

// listOf returns the list a free entry is in.
func (m *Manager) listOf(e *entry) *list {
	if e.armed {
		return &m.readyList
	}
	return &m.free
}

// touch records a change of e's owner or state, which settles any lapsed
// reservation of its address.
func (m *Manager) touch(e *entry) {
	m.seq++
	e.changed = m.seq
	e.orphan = false
	if len(m.unstored) > 0 {
		delete(m.unstored, e.addr)
	}
}

// blockFor returns the state of addr's block, creating it (not loaded).
func (m *Manager) blockFor(addr netip.Addr) *blockState {
	p := BlockOf(addr)
	b := m.blocks[p]
	if b == nil {
		b = &blockState{persisted: Block{Prefix: p}}
		m.blocks[p] = b
	}
	return b
}

// addEntry creates the entry of a newly held address, in state st and in
// no list.
//
// The entry counts as changed now (see entry.changed): a Resync whose list
// was taken before it came (a takeover's, a read's orphan) must not take
// the list's silence about it for its machine's absence.
func (m *Manager) addEntry(addr netip.Addr, st State) *entry {
	e := &entry{addr: addr, state: st}
	m.putEntryLocked(e)
	return e
}

// putEntryLocked records e, made elsewhere, as an entry of this Manager's,
// changed now.
func (m *Manager) putEntryLocked(e *entry) {
	m.touch(e)
	m.entries[e.addr] = e
	m.added++
	b := m.blockFor(e.addr)
	b.ours++
	off := blockOffset(e.addr)
	b.held.Set(off)
	switch {
	case b.index != nil:
		b.index[off] = e
	case b.ours >= m.denseAt:
		b.index = new([BlockSize]*entry)
		p := BlockOf(e.addr)
		b.held.Each(func(off int) { b.index[off] = m.entries[blockAddr(p, off)] })
	}
	delete(m.unhanded, e.addr)
}

// removeEntry forgets an address this Manager no longer holds.
func (m *Manager) removeEntry(e *entry) {
	delete(m.entries, e.addr)
	// It may be claimable again: a cached scan that found nothing is stale.
	m.noClaimableUntil = time.Time{}
	if b := m.blocks[BlockOf(e.addr)]; b != nil {
		b.ours--
		off := blockOffset(e.addr)
		b.held.Clear(off)
		if b.index != nil {
			b.index[off] = nil
			if b.ours < m.denseAt/2 {
				b.index = nil
			}
		}
	}
	if len(m.unstored) > 0 {
		delete(m.unstored, e.addr)
	}
}

// markDirty records that addr's block must be written again.
func (m *Manager) markDirty(addr netip.Addr) {
	m.blockFor(addr).gen++
}
