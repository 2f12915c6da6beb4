package ipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// harness drives a Manager through operations and checks the invariants
// against a model of the world after every step:
//   - no address is held twice: by two live machines, or by a live machine
//     and a reservation whose machine may still appear;
//   - no address is handed out before its cooldown ends, across restarts;
//   - the counts add up and match the model;
//   - nothing leaks: once every TTL and cooldown has passed, every address
//     on no live machine can be handed out again.
type harness struct {
	ranges  *Ranges
	usable  []netip.Addr
	clock   *fakeClock
	store   *MemoryStore
	faulty  *faultyStore
	cfg     Config
	m       *Manager
	seq     int
	epoch   int // restarts so far
	log     []string
	reserva map[string]*reservation // by token
	live    map[string]netip.Addr   // UID -> address
	holder  map[netip.Addr]string   // address -> token of the reservation or machine holding it
	// notBefore is the earliest time an address may be handed out again.
	notBefore map[netip.Addr]time.Time
	// stale keeps lapsed-reservation records seen, to try again later.
	stale []Unstored
}

type reservation struct {
	token string
	addr  netip.Addr
	at    time.Time
	uid   string // set once the machine is stored
	epoch int    // restarts before the reservation was made
	// bypassed: the machine skipped the webhook; the Manager never saw
	// its token (the model's key only).
	bypassed bool
	// ns and admission are the reservation's; sealed once it may no
	// longer be re-entered.
	ns, admission string
	sealed        bool
}

// faultyStore fails or conflicts on demand.
type faultyStore struct {
	*MemoryStore
	failPuts int
	// lostReplies: the failing Puts commit first, as when the reply of a
	// write that landed is lost (a timeout).
	lostReplies bool
}

var errInjected = errors.New("injected store failure")

func (s *faultyStore) Delete(ctx context.Context, p netip.Prefix, version string) error {
	if s.failPuts > 0 {
		s.failPuts--
		if s.lostReplies {
			if err := s.MemoryStore.Delete(ctx, p, version); err != nil {
				return err
			}
		}
		return errInjected
	}
	return s.MemoryStore.Delete(ctx, p, version)
}

func (s *faultyStore) Put(ctx context.Context, b Block) (string, error) {
	if s.failPuts > 0 {
		s.failPuts--
		if s.lostReplies {
			if _, err := s.MemoryStore.Put(ctx, b); err != nil {
				return "", err
			}
		}
		return "", errInjected
	}
	return s.MemoryStore.Put(ctx, b)
}

var harnessPools = [][]RangeSpec{
	{{CIDR: "10.0.0.0/28", Exclude: []string{"10.0.0.5", "10.0.0.8/30"}}},
	{{CIDR: "10.1.0.0/29"}, {CIDR: "10.2.0.0/24", First: "10.2.0.250", Last: "10.2.0.254"}},
	{{CIDR: "fd00::/124", Exclude: []string{"fd00::3"}}},
	{{CIDR: "10.3.15.240/28"}, {CIDR: "10.3.16.0/30"}}, // spans two blocks
	{{CIDR: "192.168.7.0/31"}, {CIDR: "fd00:1::/127"}},
	{{CIDR: "255.255.255.248/29"}, {CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffc/126"}}, // the top of both families
}

func newHarness(pool int, cooldown, ttl time.Duration, low, target, high, maxPending int) (*harness, error) {
	r, err := ParseRanges(harnessPools[pool%len(harnessPools)])
	if err != nil {
		return nil, err
	}
	h := &harness{
		ranges: r, clock: newFakeClock(), store: NewMemoryStore(),
		reserva: map[string]*reservation{}, live: map[string]netip.Addr{},
		holder: map[netip.Addr]string{}, notBefore: map[netip.Addr]time.Time{},
	}
	for a, ok := r.Next(netip.IPv4Unspecified()); ok; a, ok = r.Next(a.Next()) {
		h.usable = append(h.usable, a)
	}
	h.faulty = &faultyStore{MemoryStore: h.store}
	h.cfg = Config{
		Pool: "p", Holder: "h", Ranges: r, Cooldown: cooldown, PendingTTL: ttl,
		LowWatermark: low, TargetFree: target, HighWatermark: high, MaxPendingPerNamespace: maxPending,
		Store: h.faulty, Clock: h.clock,
	}
	return h, h.restart(0)
}

func (h *harness) logf(format string, args ...any) {
	h.log = append(h.log, fmt.Sprintf(format, args...))
}

// restart replaces the Manager as a crash would, and recovers it. Each
// reservation whose machine may still appear appears during the crash when
// its bit in stored is set.
func (h *harness) restart(stored uint32) error {
	m, err := NewManager(h.cfg)
	if err != nil {
		return err
	}
	h.m = m
	h.epoch++
	i := 0
	for _, tok := range h.tokens() {
		r := h.reserva[tok]
		if r.uid == "" && h.mayAppear(r) {
			if stored&(1<<(i%32)) != 0 {
				h.seq++
				r.uid = fmt.Sprintf("uid-%d", h.seq)
				h.live[r.uid] = r.addr
			}
			i++
		}
	}
	var live []Holding
	for _, tok := range h.tokens() {
		if r := h.reserva[tok]; r.uid != "" {
			o := Owner{Token: r.token, UID: r.uid}
			if r.bypassed {
				o.Token = ""
			}
			live = append(live, Holding{Addr: spell(r.addr, uint32(len(live))), Owner: o})
		}
	}
	rep, err := h.m.Recover(context.Background(), live)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	if len(rep.Conflicts) > 0 || len(rep.OutOfRange) > 0 {
		return fmt.Errorf("recover reported %v, out of range %v", rep.Conflicts, rep.OutOfRange)
	}
	h.logf("restart: %d live, report %+v", len(live), rep)
	return nil
}

func (h *harness) tokens() []string {
	return slices.Sorted(mapsKeys(h.reserva))
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// mayAppear reports whether a reservation's machine may still be stored.
func (h *harness) mayAppear(r *reservation) bool {
	return h.clock.Now().Before(r.at.Add(h.cfg.PendingTTL))
}

// settle forgets reservations whose machine can no longer appear: from
// then on their address may be reused after the cooldown.
func (h *harness) settle() {
	for tok, r := range h.reserva {
		if r.uid == "" && !h.mayAppear(r) {
			delete(h.reserva, tok)
			delete(h.holder, r.addr)
			h.notBefore[r.addr] = r.at.Add(h.cfg.PendingTTL + h.cfg.Cooldown)
		}
	}
}

// spell writes a in one of its spellings: as it is, IPv4-mapped, or with
// a zone. The Manager must treat every one as the same address.
func spell(a netip.Addr, k uint32) netip.Addr {
	switch k % 4 {
	case 1:
		if a.Is4() {
			return netip.AddrFrom16(a.As16())
		}
		return a.WithZone("eth0")
	case 2:
		if a.Is4() {
			return netip.AddrFrom16(a.As16()).WithZone("1")
		}
		return a.WithZone("2")
	}
	return a
}

// pendingIn counts the reservations of ns the Manager must hold pending.
func (h *harness) pendingIn(ns string) int {
	n := 0
	for _, r := range h.reserva {
		if r.ns == ns && r.uid == "" && !r.bypassed && r.epoch == h.epoch && h.mayAppear(r) {
			n++
		}
	}
	return n
}

// limited checks a refusal for the pending bound, or the lack of one.
func (h *harness) limited(ns string, err error) error {
	n := h.pendingIn(ns)
	switch {
	case errors.Is(err, ErrTooManyPending) && (h.cfg.MaxPendingPerNamespace == 0 || n < h.cfg.MaxPendingPerNamespace):
		return fmt.Errorf("refused for too many pending in %s with %d pending, limit %d: %w", ns, n, h.cfg.MaxPendingPerNamespace, err)
	case err == nil && h.cfg.MaxPendingPerNamespace > 0 && n >= h.cfg.MaxPendingPerNamespace:
		return fmt.Errorf("handed out past the pending limit %d in %s (%d pending)", h.cfg.MaxPendingPerNamespace, ns, n)
	}
	return nil
}

// handedOut checks and records an address handed out to a new token.
func (h *harness) handedOut(tok string, a netip.Addr) error {
	if !h.ranges.Contains(a) {
		return fmt.Errorf("handed out %s outside the ranges", a)
	}
	if other, ok := h.holder[a]; ok {
		return fmt.Errorf("DUPLICATE: %s handed to %s while %s holds it", a, tok, other)
	}
	if nb := h.notBefore[a]; h.clock.Now().Before(nb) {
		return fmt.Errorf("COOLDOWN: %s handed to %s at %s, before %s", a, tok, h.clock.Now().Format(time.TimeOnly), nb.Format(time.TimeOnly))
	}
	h.reserva[tok] = &reservation{token: tok, addr: a, at: h.clock.Now(), epoch: h.epoch}
	h.holder[a] = tok
	return nil
}

// step applies one operation chosen by op, with arg as its parameter.
func (h *harness) step(op byte, arg uint32) error {
	ctx := context.Background()
	h.settle()
	switch op % 20 {
	case 0, 1, 2, 19: // allocate for a new token
		h.seq++
		tok := fmt.Sprintf("t%d", h.seq)
		ns := fmt.Sprintf("ns%d", arg%2)
		a, err := h.m.Allocate(ctx, Reservation{Token: tok, Namespace: ns, Admission: "adm-" + tok})
		h.logf("allocate %s in %s -> %s %v", tok, ns, a, err)
		if err := h.limited(ns, err); err != nil {
			return err
		}
		if err != nil {
			if errors.Is(err, ErrExhausted) || errors.Is(err, errInjected) || errors.Is(err, ErrStoreConflict) || errors.Is(err, ErrTooManyPending) {
				return nil
			}
			return fmt.Errorf("allocate: unexpected error %w", err)
		}
		if err := h.handedOut(tok, a); err != nil {
			return err
		}
		h.reserva[tok].ns, h.reserva[tok].admission = ns, "adm-"+tok
	case 3: // reinvoked allocation for an existing token
		toks := h.tokens()
		if len(toks) == 0 {
			return nil
		}
		r := h.reserva[toks[int(arg)%len(toks)]]
		if r.bypassed {
			return nil
		}
		if r.uid == "" && r.epoch != h.epoch {
			// A crash forgot the pending reservation (it rests in
			// cooldown); the webhook never re-asks for it.
			return nil
		}
		a, err := h.m.Allocate(ctx, Reservation{Token: r.token})
		h.logf("reallocate %s -> %s %v", r.token, a, err)
		if err == nil && a != r.addr {
			return fmt.Errorf("allocate not idempotent: token %s had %s, got %s", r.token, r.addr, a)
		}
		if err != nil && h.m.Ready() && r.uid != "" {
			// A bound token is never forgotten while its machine lives.
			return fmt.Errorf("reallocate of bound token %s: %w", r.token, err)
		}
		return nil
	case 4: // static request, in any spelling of the address
		h.seq++
		tok := fmt.Sprintf("s%d", h.seq)
		a := h.usable[int(arg)%len(h.usable)]
		ns := fmt.Sprintf("ns%d", arg>>8%2)
		sp := spell(a, arg>>4)
		err := h.m.Reserve(ctx, Reservation{Token: tok, Namespace: ns, Admission: "adm-" + tok}, sp)
		h.logf("reserve %s %s in %s -> %v", tok, sp, ns, err)
		if errors.Is(err, ErrTooManyPending) || err == nil {
			if err := h.limited(ns, err); err != nil {
				return err
			}
		}
		if err != nil {
			if errors.Is(err, ErrInUse) || errors.Is(err, ErrCoolingDown) || errors.Is(err, errInjected) || errors.Is(err, ErrStoreConflict) || errors.Is(err, ErrTooManyPending) {
				return nil
			}
			return fmt.Errorf("reserve: unexpected error %w", err)
		}
		if err := h.handedOut(tok, a); err != nil {
			return err
		}
		h.reserva[tok].ns, h.reserva[tok].admission = ns, "adm-"+tok
	case 5, 6: // a machine is stored: bind its token, or adopt after a restart
		var cand []*reservation
		for _, tok := range h.tokens() {
			if r := h.reserva[tok]; r.uid == "" && h.mayAppear(r) {
				cand = append(cand, r)
			}
		}
		if len(cand) == 0 {
			return nil
		}
		r := cand[int(arg)%len(cand)]
		h.seq++
		uid := fmt.Sprintf("uid-%d", h.seq)
		a, err := h.m.Bind(Owner{Token: r.token, UID: uid})
		h.logf("bind %s %s -> %s %v", r.token, uid, a, err)
		if errors.Is(err, ErrUnknownToken) {
			err = h.m.Adopt(spell(r.addr, arg>>3), Owner{Token: r.token, UID: uid})
			a = r.addr
			h.logf("adopt %s %s -> %v", r.addr, uid, err)
		}
		if err != nil {
			return fmt.Errorf("machine %s stored with %s: %w", uid, r.addr, err)
		}
		if a != r.addr {
			return fmt.Errorf("bind %s returned %s, reserved %s", r.token, a, r.addr)
		}
		r.uid = uid
		h.live[uid] = r.addr
	case 7, 8: // a machine is deleted
		uids := slices.Sorted(mapsKeys(h.live))
		if len(uids) == 0 {
			return nil
		}
		uid := uids[int(arg)%len(uids)]
		a := h.live[uid]
		tok := h.holder[a]
		// As the garbage collector does before the machine may go: a
		// release that is crash-safe when it returns. A failure is
		// retried (the finalizer stays), and the faulty store fails at
		// most three writes in a row.
		var err error
		for i := range 5 {
			if err = h.m.ReleaseDurable(ctx, spell(a, arg>>uint(2*i)), Owner{UID: uid, Token: tok}); err == nil {
				break
			}
		}
		h.logf("release %s %s -> %v", a, uid, err)
		if err != nil {
			return fmt.Errorf("release: %w", err)
		}
		if err := h.m.Release(a, Owner{UID: uid, Token: tok}); err != nil {
			return fmt.Errorf("release is not idempotent: %w", err)
		}
		delete(h.live, uid)
		delete(h.reserva, tok)
		delete(h.holder, a)
		h.notBefore[a] = h.clock.Now().Add(h.cfg.Cooldown)
	case 9, 10: // time passes
		d := time.Duration(arg%uint32(2*(h.cfg.Cooldown+h.cfg.PendingTTL)/time.Second+1)) * time.Second / 4
		h.clock.Step(d)
		h.logf("clock +%s", d)
	case 11: // background work
		err := errors.Join(h.m.Rebalance(ctx), h.m.Flush(ctx))
		h.logf("rebalance+flush -> %v", err)
		if err != nil && !errors.Is(err, errInjected) && !errors.Is(err, ErrStoreConflict) {
			return fmt.Errorf("rebalance/flush: %w", err)
		}
	case 12: // another writer bumps a block under us
		bl, _ := h.store.List(ctx)
		if len(bl) > 0 {
			h.store.Touch(bl[int(arg)%len(bl)].Prefix)
			h.logf("touch %s", bl[int(arg)%len(bl)].Prefix)
		}
	case 13: // the store fails for a while
		h.faulty.failPuts = int(arg % 4)
		h.faulty.lostReplies = arg&4 != 0
		h.logf("store fails %d puts (after committing them: %t)", h.faulty.failPuts, h.faulty.lostReplies)
	case 14: // crash and restart
		if arg%4 != 0 {
			return nil
		}
		h.faulty.failPuts = 0
		return h.restart(arg)
	case 15:
		switch arg % 3 {
		case 0:
			h.m.Expire()
			return h.check()
		case 1:
			return h.bypass(arg)
		}
		// A full resync against the true set of live machines must
		// find nothing to fix.
		asOf := h.m.Mark()
		var live []Holding
		for uid, a := range h.live {
			live = append(live, Holding{Addr: spell(a, arg>>uint(len(live)%8)), Owner: Owner{UID: uid, Token: h.holder[a]}})
		}
		if rep := h.m.Resync(live, asOf); rep.Released != 0 || rep.Adopted != 0 || len(rep.Conflicts) != 0 {
			return fmt.Errorf("resync of a consistent state changed it: %+v", rep)
		}
	case 16: // the webhook is invoked again within an admission, or a token was copied
		return h.reenter(arg)
	case 17: // the validating webhook ends an admission
		toks := h.tokens()
		if len(toks) == 0 {
			return nil
		}
		r := h.reserva[toks[int(arg)%len(toks)]]
		h.m.Seal(r.token)
		h.logf("seal %s", r.token)
		r.sealed = true
	case 18: // the proof that a lapsed reservation was never stored
		return h.prove(arg)
	}
	return h.check()
}

// reenter asks the Manager to trust a token as this admission's own. It
// must agree exactly when the reservation is pending in this Manager, made
// by the same admission for the same address, and not sealed; then it is
// sealed.
func (h *harness) reenter(arg uint32) error {
	toks := h.tokens()
	if len(toks) == 0 {
		return nil
	}
	r := h.reserva[toks[int(arg)%len(toks)]]
	adm, a := r.admission, r.addr
	switch arg >> 8 % 4 {
	case 1:
		adm = "another admission"
	case 2:
		a = h.usable[int(arg>>12)%len(h.usable)]
	}
	want := adm != "" && adm == r.admission && a == r.addr && r.uid == "" && !r.bypassed && r.epoch == h.epoch && h.mayAppear(r) && !r.sealed
	got := h.m.Reenter(r.token, adm, spell(a, arg>>16))
	h.logf("reenter %s %s %s -> %t", r.token, adm, a, got)
	if got != want {
		return fmt.Errorf("Reenter(%s, %q, %s) = %t, want %t (reservation %+v)", r.token, adm, a, got, want, *r)
	}
	if got {
		r.sealed = true
	}
	return h.check()
}

// prove plays the caller that proves lapsed reservations unused: honestly,
// from the model's knowledge of what was stored, or too early, or with a
// stale record; the Manager must free an address without its cooldown only
// on an honest proof.
func (h *harness) prove(arg uint32) error {
	us := h.m.Unstored()
	h.stale = append(h.stale, us...)
	if len(h.stale) > 64 {
		h.stale = h.stale[len(h.stale)-64:]
	}
	if len(us) == 0 {
		return nil
	}
	now := h.clock.Now()
	switch arg % 3 {
	case 0: // too early: a read that began at the deadline proves nothing
		u := us[int(arg>>2)%len(us)]
		if h.m.Unused(u, u.Deadline) {
			return fmt.Errorf("Unused(%+v) with a read at the deadline succeeded", u)
		}
	case 1: // a record from before a crash, or settled since
		u := h.stale[int(arg>>2)%len(h.stale)]
		live := false
		for _, v := range us {
			live = live || v == u
		}
		if !live && h.m.Unused(u, now) {
			return fmt.Errorf("Unused of a stale record %+v succeeded", u)
		}
	default:
		for _, u := range us {
			if now.Before(u.Deadline) {
				return fmt.Errorf("Unstored lists %+v before its deadline (now %s)", u, now.Format(time.TimeOnly))
			}
			if !now.After(u.Deadline) {
				continue
			}
			if r := h.reserva[u.Token]; r != nil && (r.uid != "" || h.mayAppear(r)) {
				return fmt.Errorf("Unstored lists %+v, whose machine was stored or may still be", u)
			}
			stored := false
			for _, a := range h.live {
				stored = stored || a == u.Addr
			}
			if stored {
				h.m.Used(u)
				h.logf("used %s %s", u.Addr, u.Token)
				continue
			}
			if !h.m.Unused(u, now) {
				return fmt.Errorf("Unused(%+v) of an honest proof at %s refused", u, now.Format(time.TimeOnly))
			}
			h.logf("unused %s %s", u.Addr, u.Token)
			// Never given to a machine: free at once.
			h.settle()
			delete(h.notBefore, u.Addr)
		}
	}
	return h.check()
}

// bypass stores a machine that skipped the webhook with an address the
// model holds free: the garbage collector adopts it. The Manager may never
// have claimed it, so until the next flush the store does not know it.
func (h *harness) bypass(arg uint32) error {
	a := h.usable[int(arg/3)%len(h.usable)]
	if _, held := h.holder[a]; held || h.clock.Now().Before(h.notBefore[a]) {
		return nil
	}
	if st, _, _ := h.m.Lookup(a); st == StatePending || st == StateAllocated {
		return nil
	}
	h.seq++
	uid, tok := fmt.Sprintf("uid-%d", h.seq), fmt.Sprintf("b%d", h.seq)
	err := h.m.Adopt(spell(a, arg>>5), Owner{UID: uid})
	h.logf("bypass: adopt %s %s -> %v", a, uid, err)
	if err != nil {
		return fmt.Errorf("adopt of bypassing machine %s on %s: %w", uid, a, err)
	}
	h.reserva[tok] = &reservation{token: tok, addr: a, at: h.clock.Now(), epoch: h.epoch, uid: uid, bypassed: true}
	h.holder[a] = tok
	h.live[uid] = a
	return h.check()
}

// check verifies the Manager's state against the model.
func (h *harness) check() error {
	h.settle()
	c := h.m.Snapshot()
	if c.Free+c.Pending+c.Allocated+c.Cooldown != c.Claimed {
		return fmt.Errorf("counts do not add up: %+v", c)
	}
	if uint64(c.Claimed) > c.Usable {
		return fmt.Errorf("claimed more than usable: %+v", c)
	}
	if c.Allocated != len(h.live) {
		return fmt.Errorf("allocated %d, model has %d live machines: %+v", c.Allocated, len(h.live), c)
	}
	for uid, a := range h.live {
		st, o, _ := h.m.Lookup(spell(a, uint32(len(uid))))
		if st != StateAllocated || o.UID != uid {
			return fmt.Errorf("live machine %s has %s, manager says %s owned by %+v", uid, a, st, o)
		}
	}
	return h.checkKept()
}

// checkKept recounts what the Manager keeps counted as its state changes
// (the lists, the addresses being returned, the pending reservations per
// namespace, each block's own and others' claims) and fails on any drift.
func (h *harness) checkKept() error {
	m := h.m
	m.mu.Lock()
	defer m.mu.Unlock()
	n := map[State]int{}
	ns := map[string]int{}
	ours := map[netip.Prefix]int{}
	for a, e := range m.entries {
		if a != e.addr || Canonical(a) != a {
			return fmt.Errorf("entry %s keyed by %s", e.addr, a)
		}
		n[e.state]++
		if e.state == StatePending {
			ns[e.ns]++
		}
		ours[BlockOf(a)]++
	}
	switch {
	case n[StateFree] != m.free.n, n[stateSurplus] != m.surplus.n, n[StatePending] != m.pending.n,
		n[StateCooldown] != m.cooldown.n, n[stateReturning] != m.returning:
		return fmt.Errorf("kept counts drifted: states %v; lists free %d surplus %d pending %d cooldown %d returning %d",
			n, m.free.n, m.surplus.n, m.pending.n, m.cooldown.n, m.returning)
	case !maps.Equal(ns, m.pendingNS):
		return fmt.Errorf("pending per namespace drifted: %v, kept %v", ns, m.pendingNS)
	}
	elsewhere := 0
	for p, b := range m.blocks {
		if b.ours != ours[p] {
			return fmt.Errorf("block %s counts %d of ours, holds %d", p, b.ours, ours[p])
		}
		delete(ours, p)
		others := 0
		for hd, bm := range b.persisted.Claims {
			if hd != m.cfg.Holder {
				for _, w := range bm {
					others += bits.OnesCount64(w)
				}
			}
		}
		if others != b.elsewhere {
			return fmt.Errorf("block %s counts %d claimed elsewhere, holds %d", p, b.elsewhere, others)
		}
		elsewhere += others
	}
	if len(ours) > 0 || elsewhere != m.elsewhere {
		return fmt.Errorf("entries in blocks the Manager forgot (%v), or claimed elsewhere drifted (%d, kept %d)", ours, elsewhere, m.elsewhere)
	}
	return nil
}

// drain lets every TTL and cooldown pass, then checks that every address on
// no live machine can be handed out again, and hands them all out.
func (h *harness) drain() error {
	ctx := context.Background()
	h.faulty.failPuts = 0
	h.clock.Step(2 * (h.cfg.Cooldown + h.cfg.PendingTTL))
	h.settle()
	if len(h.holder) != len(h.live) {
		return fmt.Errorf("model: %d held, %d live", len(h.holder), len(h.live))
	}
	h.m.Expire()
	c := h.m.Snapshot()
	if c.Pending != 0 || c.Cooldown != 0 {
		return fmt.Errorf("LEAK: after every TTL and cooldown, %d pending and %d cooling down", c.Pending, c.Cooldown)
	}
	got := 0
	for {
		h.seq++
		tok := fmt.Sprintf("d%d", h.seq)
		a, err := h.m.Allocate(ctx, Reservation{Token: tok, Namespace: tok})
		if errors.Is(err, ErrExhausted) {
			break
		}
		if err != nil {
			return fmt.Errorf("drain allocate: %w", err)
		}
		if err := h.handedOut(tok, a); err != nil {
			return err
		}
		got++
	}
	if want := len(h.usable) - len(h.live); got != want {
		return fmt.Errorf("LEAK: %d addresses on no live machine, only %d could be handed out", want, got)
	}
	return h.check()
}

func (h *harness) trace() string {
	start := max(0, len(h.log)-60)
	return strings.Join(h.log[start:], "\n")
}
