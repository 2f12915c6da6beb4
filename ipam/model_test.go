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

// harness drives one to three Managers of one pool, each under its own
// holder, through operations, and checks the invariants against a model of
// the world after every step:
//   - no address is held twice: by two live machines, or by a live machine
//     and a reservation whose machine may still appear, whichever holder
//     handed them out;
//   - no address is handed out before its cooldown ends, across restarts,
//     crashes, takeovers and handovers;
//   - the counts each Manager keeps add up and match a recount;
//   - every live machine's address is allocated to it by the holder that
//     holds it, or claimed by a holder that died and is not taken over yet;
//   - nothing leaks: once every TTL and cooldown has passed and every dead
//     holder is taken over, every address on no live machine can be handed
//     out again by the holders together.
//
// Operations run one at a time; where a Manager waits for another holder
// (a request for addresses), the harness's Timers let the other holders
// answer before the wait returns.
type harness struct {
	// denseAt, if set, is its Managers' (see Manager.denseAt): the
	// harness's blocks hold far fewer entries than the default.
	denseAt int
	ranges  *Ranges
	usable  []netip.Addr
	clock   *fakeClock
	store   *MemoryStore
	faulty  *faultyStore
	cfg     Config
	members []*member
	seq     int
	log     []string
	reserva map[string]*reservation // by token
	live    map[string]netip.Addr   // UID -> address
	holder  map[netip.Addr]string   // address -> token of the reservation or machine holding it
	// notBefore is the earliest time an address may be handed out again.
	notBefore map[netip.Addr]time.Time
	// stale keeps lapsed-reservation records seen, to try again later.
	stale []Unstored
	// ticking: the other holders are answering a waiting one.
	ticking bool
	// exhaustedJudged counts the refusals as exhausted that
	// rightExhaustion judged.
	exhaustedJudged int
	// settledAt is the store's write count after a tick that wrote
	// nothing and failed nowhere: until the store or a member changes,
	// another tick would only repeat it (-1: unknown).
	settledAt int
}

// member is one holder of the pool.
type member struct {
	holder string
	m      *Manager
	epoch  int  // restarts so far
	alive  bool // false: crashed and not restarted, or taken over
}

type reservation struct {
	token  string
	addr   netip.Addr
	at     time.Time
	uid    string // set once the machine is stored
	member int    // the holder that handed it out
	epoch  int    // that holder's restarts before the reservation was made
	// bypassed: the machine skipped the webhook; no Manager saw its
	// token (the model's key only).
	bypassed bool
	ns       string
}

// faultyStore fails or conflicts on demand.
type faultyStore struct {
	*MemoryStore
	failPuts int
	// lostReplies: the failing writes commit first, as when the reply of a
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

// harnessTimers never waits: a Manager waiting (for other holders, or
// backing off) lets the other holders work first, as they would meanwhile.
type harnessTimers struct {
	h    *harness
	self string
}

func (t harnessTimers) NewTicker(time.Duration) (<-chan time.Time, func()) {
	return make(chan time.Time), func() {}
}

func (t harnessTimers) After(time.Duration) <-chan time.Time {
	t.h.tick(t.self)
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c
}

// tick lets every live holder but self see the blocks' requests and answer
// them.
func (h *harness) tick(self string) {
	if h.ticking {
		return
	}
	before := h.store.writes()
	if before == h.settledAt {
		return
	}
	h.ticking = true
	defer func() { h.ticking = false }()
	blocks, _ := h.store.List(context.Background())
	failed := false
	for _, mb := range h.members {
		if !mb.alive || mb.holder == self {
			continue
		}
		for _, b := range blocks {
			mb.m.Observe(b)
		}
		failed = mb.m.Rebalance(context.Background()) != nil || failed
	}
	if !failed && h.store.writes() == before {
		h.settledAt = before
	}
}

// writes counts the store's writes so far.
func (s *MemoryStore) writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seq
}

var harnessPools = [][]RangeSpec{
	{{CIDR: "10.0.0.0/28", Exclude: []string{"10.0.0.5", "10.0.0.8/30"}}},
	{{CIDR: "10.1.0.0/29"}, {CIDR: "10.2.0.0/24", First: "10.2.0.250", Last: "10.2.0.254"}},
	{{CIDR: "fd00::/124", Exclude: []string{"fd00::3"}}},
	{{CIDR: "10.3.15.240/28"}, {CIDR: "10.3.16.0/30"}}, // spans two blocks
	{{CIDR: "192.168.7.0/31"}, {CIDR: "fd00:1::/127"}},
	{{CIDR: "255.255.255.248/29"}, {CIDR: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffc/126"}}, // the top of both families
}

func newHarness(pool int, cooldown, ttl time.Duration, low, target, high, maxPending, holders int) (*harness, error) {
	r, err := ParseRanges(harnessPools[pool%len(harnessPools)])
	if err != nil {
		return nil, err
	}
	h := &harness{
		ranges: r, clock: newFakeClock(), store: NewMemoryStore(),
		reserva: map[string]*reservation{}, live: map[string]netip.Addr{},
		holder: map[netip.Addr]string{}, notBefore: map[netip.Addr]time.Time{}, settledAt: -1,
	}
	for a, ok := r.Next(netip.IPv4Unspecified()); ok; a, ok = r.After(a) {
		h.usable = append(h.usable, a)
	}
	h.faulty = &faultyStore{MemoryStore: h.store}
	h.cfg = Config{
		Pool: "p", Ranges: r, Cooldown: cooldown, PendingTTL: ttl,
		LowWatermark: low, TargetFree: target, HighWatermark: high, MaxPendingPerNamespace: maxPending,
		ArmBatch: 1 + pool%3, Store: h.faulty, Clock: h.clock,
	}
	for i := range max(holders, 1) {
		h.members = append(h.members, &member{holder: fmt.Sprintf("h%d", i)})
		if err := h.restart(i, 0); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// indexBlocks has the harness's Managers, now and after restarts, keep
// their blocks' index of entries (blockState.index) from 4 entries: the
// harness's blocks never hold the 512 it takes otherwise, so it is built
// and dropped as entries come and go. Called before the first step, while
// the Managers hold nothing.
func (h *harness) indexBlocks() {
	h.denseAt = 4
	for _, mb := range h.members {
		mb.m.denseAt = 4
	}
}

func (h *harness) logf(format string, args ...any) {
	h.log = append(h.log, fmt.Sprintf(format, args...))
}

// alive returns the indexes of the live holders.
func (h *harness) alive() []int {
	var out []int
	for i, mb := range h.members {
		if mb.alive {
			out = append(out, i)
		}
	}
	return out
}

// peers tells every live holder who is alive.
func (h *harness) peers() {
	var names []string
	for _, i := range h.alive() {
		names = append(names, h.members[i].holder)
	}
	for _, i := range h.alive() {
		h.members[i].m.SetPeers(names)
	}
}

// appear lets the reservations of member m whose machine may still appear
// appear during its crash, when their bit in stored is set: nobody binds
// them, and recovery (or a takeover) finds them.
func (h *harness) appear(m int, stored uint32) []*reservation {
	i := 0
	var out []*reservation
	for _, tok := range h.tokens() {
		r := h.reserva[tok]
		if r.uid == "" && r.member == m && h.mayAppear(r) {
			if stored&(1<<(i%32)) != 0 {
				h.seq++
				r.uid = fmt.Sprintf("uid-%d", h.seq)
				h.live[r.uid] = r.addr
				out = append(out, r)
			}
			i++
		}
	}
	return out
}

// adoptAppeared has the controllers of the live holders see machines that
// appeared while their reservation's holder was down: whoever holds the
// address now adopts it.
func (h *harness) adoptAppeared(rs []*reservation) error {
	for _, r := range rs {
		j := h.holderOf(r.addr)
		if j < 0 {
			continue // its holder is dead: the takeover adopts it
		}
		if st, o, _ := h.members[j].m.Lookup(r.addr); st == StateAllocated && o.UID == r.uid {
			continue
		}
		err := h.members[j].m.Adopt(context.Background(), r.addr, Owner{Token: r.token, UID: r.uid})
		h.logf("%s adopt appeared %s %s -> %v", h.members[j].holder, r.addr, r.uid, err)
		if err != nil && !errors.Is(err, errInjected) && !errors.Is(err, ErrStoreConflict) {
			return fmt.Errorf("adopt of appeared machine %s on %s: %w", r.uid, r.addr, err)
		}
	}
	return nil
}

// holdings lists the live machines as the cluster shows them, each address
// in some spelling.
func (h *harness) holdings() []Holding {
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
	return live
}

// restart replaces member i's Manager as a crash would (same holder), and
// recovers it. Each reservation whose machine may still appear appears
// during the crash when its bit in stored is set.
func (h *harness) restart(i int, stored uint32) error {
	mb := h.members[i]
	cfg := h.cfg
	cfg.Holder = mb.holder
	cfg.Timers = harnessTimers{h, mb.holder}
	m, err := NewManager(cfg)
	if err != nil {
		return err
	}
	if h.denseAt > 0 {
		m.denseAt = h.denseAt
	}
	mb.m, mb.alive = m, true
	mb.epoch++
	appeared := h.appear(i, stored)
	live := h.holdings()
	h.peers()
	rep, err := m.Recover(context.Background(), live)
	if err != nil {
		return fmt.Errorf("recover %s: %w", mb.holder, err)
	}
	if len(rep.Conflicts) > 0 || len(rep.OutOfRange) > 0 {
		return fmt.Errorf("recover %s reported %v, out of range %v", mb.holder, rep.Conflicts, rep.OutOfRange)
	}
	h.logf("restart %s: %d live, allocated %d, cooldown %d, free %d, elsewhere %d", mb.holder, len(live), rep.Allocated, rep.Cooldown, rep.Free, len(rep.Elsewhere))
	return h.adoptAppeared(appeared)
}

// takeover has live member j take over dead member i's claims.
func (h *harness) takeover(j, i int) error {
	rep, err := h.members[j].m.Takeover(context.Background(), h.members[i].holder, h.holdings())
	h.logf("%s takes over %s: %+v %v", h.members[j].holder, h.members[i].holder, rep, err)
	if err != nil {
		if errors.Is(err, errInjected) || errors.Is(err, ErrStoreConflict) {
			return nil
		}
		return fmt.Errorf("takeover: %w", err)
	}
	return nil
}

func (h *harness) tokens() []string {
	return slices.Sorted(maps.Keys(h.reserva))
}

// mayAppear reports whether a reservation's machine may still be stored.
func (h *harness) mayAppear(r *reservation) bool {
	return h.clock.Now().Before(r.at.Add(h.cfg.PendingTTL))
}

// settle forgets reservations whose machine can no longer appear: no
// machine ever ran with their address, so from then on it may be handed
// out again (the Managers rest it longer, for a cooldown after the lapse,
// unless a proof shows it unused; after a crash, for the longer of the two).
func (h *harness) settle() {
	for tok, r := range h.reserva {
		if r.uid == "" && !h.mayAppear(r) {
			delete(h.reserva, tok)
			delete(h.holder, r.addr)
			if nb := r.at.Add(h.cfg.PendingTTL); nb.After(h.notBefore[r.addr]) {
				h.notBefore[r.addr] = nb
			}
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

// pendingIn counts the reservations of ns member i must hold pending.
func (h *harness) pendingIn(i int, ns string) int {
	n := 0
	for _, r := range h.reserva {
		if r.ns == ns && r.member == i && r.uid == "" && !r.bypassed && r.epoch == h.members[i].epoch && h.mayAppear(r) {
			n++
		}
	}
	return n
}

// limited checks a refusal for the pending bound, or the lack of one.
func (h *harness) limited(i int, ns string, err error) error {
	n := h.pendingIn(i, ns)
	switch {
	case errors.Is(err, ErrTooManyPending) && (h.cfg.MaxPendingPerNamespace == 0 || n < h.cfg.MaxPendingPerNamespace):
		return fmt.Errorf("refused for too many pending in %s with %d pending, limit %d: %w", ns, n, h.cfg.MaxPendingPerNamespace, err)
	case err == nil && h.cfg.MaxPendingPerNamespace > 0 && n >= h.cfg.MaxPendingPerNamespace:
		return fmt.Errorf("handed out past the pending limit %d in %s (%d pending)", h.cfg.MaxPendingPerNamespace, ns, n)
	}
	return nil
}

// handedOut checks and records an address handed out to a new token.
func (h *harness) handedOut(i int, tok, ns string, a netip.Addr) error {
	if !h.ranges.Contains(a) {
		return fmt.Errorf("handed out %s outside the ranges", a)
	}
	if other, ok := h.holder[a]; ok {
		return fmt.Errorf("DUPLICATE: %s handed to %s by %s while %s holds it", a, tok, h.members[i].holder, other)
	}
	if nb := h.notBefore[a]; h.clock.Now().Before(nb) {
		return fmt.Errorf("COOLDOWN: %s handed to %s by %s at %s, before %s", a, tok, h.members[i].holder,
			h.clock.Now().Format(time.TimeOnly), nb.Format(time.TimeOnly))
	}
	h.reserva[tok] = &reservation{token: tok, addr: a, at: h.clock.Now(), member: i, epoch: h.members[i].epoch, ns: ns}
	h.holder[a] = tok
	return nil
}

// rightRefusal checks a static request of a that member i refused as in
// use or cooling down: a live holder of a must agree that it is not free.
// An address another live holder holds free is handed over, never refused
// (while no store write fails, which can leave the answer unread).
func (h *harness) rightRefusal(i int, a netip.Addr, err error, failing bool) error {
	if failing || !errors.Is(err, ErrInUse) && !errors.Is(err, ErrCoolingDown) {
		return nil
	}
	j := h.holderOf(a)
	if j < 0 {
		if !h.claimedInStore(a) {
			return fmt.Errorf("WRONG REFUSAL: %s refused %s, which no holder claims: %w", h.members[i].holder, a, err)
		}
		return nil // claimed by a holder that died: out of reach until taken over
	}
	if st, _, _ := h.members[j].m.Lookup(a); st == StateFree {
		return fmt.Errorf("WRONG REFUSAL: %s refused %s, which %s holds free: %w", h.members[i].holder, a, h.members[j].holder, err)
	}
	return nil
}

// rightExhaustion checks an allocation that member i refused as
// exhausted, having read the other holders' blocks again: every usable
// address was claimed, and no live holder held one free that the store
// showed free (skip: a store write failed, which can leave a hand-over
// unread, or the refusal came from a view read less than a second
// before).
func (h *harness) rightExhaustion(i int, err error, skip bool) error {
	if skip || !errors.Is(err, ErrExhausted) {
		return nil
	}
	// What another holder freed since its last write (a cancel, a
	// lapsed reservation) the others learn with its next flush, every
	// second: an address counts here once the store shows it free too.
	for _, a := range h.usable {
		b, _ := h.store.Get(context.Background(), BlockOf(a))
		owner, claimed := b.holderOf(blockOffset(a))
		if !claimed {
			return fmt.Errorf("WRONG EXHAUSTION: %s refused an allocation while %s is unclaimed: %w", h.members[i].holder, a, err)
		}
		j := h.holderOf(a)
		if j < 0 || j == i || h.members[j].holder != owner || has(b.InUse, owner, blockOffset(a)) {
			continue
		}
		if d, cooling := b.Cooldowns[a]; cooling && d.After(h.clock.Now()) {
			continue
		}
		if st, _, _ := h.members[j].m.Lookup(a); st == StateFree {
			return fmt.Errorf("WRONG EXHAUSTION: %s refused an allocation while %s holds %s free, as the store shows: %w", h.members[i].holder, owner, a, err)
		}
	}
	return nil
}

// holderOf returns the live member that holds a, or -1.
func (h *harness) holderOf(a netip.Addr) int {
	for _, i := range h.alive() {
		if h.members[i].m.Holds(a) {
			return i
		}
	}
	return -1
}

// tolerable are the errors a store failure, a race with another holder or
// a full pool may cause.
func tolerable(err error) bool {
	return errors.Is(err, ErrExhausted) || errors.Is(err, errInjected) || errors.Is(err, ErrStoreConflict) ||
		errors.Is(err, ErrTooManyPending) || errors.Is(err, ErrInUse) || errors.Is(err, ErrCoolingDown) ||
		errors.Is(err, ErrNoAnswer)
}

// step applies one operation chosen by op, with arg as its parameter.
func (h *harness) step(op byte, arg uint32) error {
	ctx := context.Background()
	h.settledAt = -1
	h.settle()
	alive := h.alive()
	if len(alive) == 0 {
		return h.restart(int(arg)%len(h.members), arg)
	}
	i := alive[int(arg>>20)%len(alive)]
	mb := h.members[i]
	switch op % 24 {
	case 19: // an admission refused after its reservation takes it back
		var cand []*reservation
		for _, tok := range h.tokens() {
			if r := h.reserva[tok]; r.uid == "" && !r.bypassed && h.mayAppear(r) && h.members[r.member].alive && r.epoch == h.members[r.member].epoch {
				cand = append(cand, r)
			}
		}
		if len(cand) == 0 {
			return nil
		}
		r := cand[int(arg)%len(cand)]
		a, ok := h.members[r.member].m.Cancel(r.token)
		h.logf("%s cancel %s -> %s %v", h.members[r.member].holder, r.token, a, ok)
		if !ok {
			// Taken over since, or expired: it stays the model's as it was.
			return nil
		}
		if a != r.addr {
			return fmt.Errorf("cancel of %s returned %s, but it held %s", r.token, a, r.addr)
		}
		if st, _, _ := h.members[r.member].m.Lookup(a); st == StatePending || st == StateAllocated {
			return fmt.Errorf("cancel of %s left %s %s", r.token, a, st)
		}
		// No object ever carried it: it may be handed out again at once.
		delete(h.reserva, r.token)
		delete(h.holder, a)
	case 0, 1, 2: // allocate for a new token
		h.seq++
		tok := fmt.Sprintf("t%d", h.seq)
		ns := fmt.Sprintf("ns%d", arg%2)
		failing := h.faulty.failPuts > 0
		mb.m.mu.Lock()
		refreshAfter := mb.m.refreshAfter
		mb.m.mu.Unlock()
		a, err := mb.m.Allocate(ctx, Reservation{Token: tok, Namespace: ns})
		h.logf("%s allocate %s in %s -> %s %v", mb.holder, tok, ns, a, err)
		mb.m.mu.Lock()
		// Other holders' blocks are read again at most once a second
		// before a refusal: judge only a refusal that read them.
		reread := mb.m.refreshAfter != refreshAfter
		mb.m.mu.Unlock()
		if err := h.rightExhaustion(i, err, failing || !reread); err != nil {
			return err
		}
		if errors.Is(err, ErrExhausted) && !failing && reread {
			h.exhaustedJudged++
		}
		if err := h.limited(i, ns, err); err != nil {
			return err
		}
		if err != nil {
			if tolerable(err) {
				return nil
			}
			return fmt.Errorf("allocate: unexpected error %w", err)
		}
		if err := h.handedOut(i, tok, ns, a); err != nil {
			return err
		}
	case 3: // reinvoked allocation for an existing token
		toks := h.tokens()
		if len(toks) == 0 {
			return nil
		}
		r := h.reserva[toks[int(arg)%len(toks)]]
		if r.bypassed || !h.members[r.member].alive || r.epoch != h.members[r.member].epoch || r.uid != "" {
			return nil
		}
		a, err := h.members[r.member].m.Allocate(ctx, Reservation{Token: r.token})
		h.logf("reallocate %s -> %s %v", r.token, a, err)
		if err == nil && a != r.addr {
			return fmt.Errorf("allocate not idempotent: token %s had %s, got %s", r.token, r.addr, a)
		}
	case 4: // static request, in any spelling of the address
		h.seq++
		tok := fmt.Sprintf("s%d", h.seq)
		a := h.usable[int(arg)%len(h.usable)]
		ns := fmt.Sprintf("ns%d", arg>>8%2)
		sp := spell(a, arg>>4)
		failing := h.faulty.failPuts > 0
		err := mb.m.Reserve(ctx, Reservation{Token: tok, Namespace: ns}, sp)
		h.logf("%s reserve %s %s in %s -> %v", mb.holder, tok, sp, ns, err)
		if err := h.rightRefusal(i, a, err, failing); err != nil {
			return err
		}
		if errors.Is(err, ErrTooManyPending) || err == nil {
			if err := h.limited(i, ns, err); err != nil {
				return err
			}
		}
		if err != nil {
			if tolerable(err) || errors.Is(err, ErrConflict) {
				return nil
			}
			return fmt.Errorf("reserve: unexpected error %w", err)
		}
		if err := h.handedOut(i, tok, ns, a); err != nil {
			return err
		}
	case 5, 6: // a machine is stored: its holder binds it, or adopts it
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
		r.uid = fmt.Sprintf("uid-%d", h.seq)
		h.live[r.uid] = r.addr
		return h.store1(r, arg)
	case 7, 8: // a machine is deleted by the holder of its address
		uids := slices.Sorted(maps.Keys(h.live))
		if len(uids) == 0 {
			return nil
		}
		uid := uids[int(arg)%len(uids)]
		a := h.live[uid]
		j := h.holderOf(a)
		if j < 0 {
			return nil // its holder died: the finalizer waits for a takeover
		}
		tok := h.holder[a]
		var err error
		for k := range 5 {
			if err = h.members[j].m.ReleaseDurable(ctx, spell(a, arg>>uint(2*k)), Owner{UID: uid, Token: tok}); err == nil {
				break
			}
		}
		h.logf("%s release %s %s -> %v", h.members[j].holder, a, uid, err)
		if err != nil {
			return fmt.Errorf("release: %w", err)
		}
		if st, _, _ := h.members[j].m.Lookup(a); st == StateAllocated || st == StatePending {
			return fmt.Errorf("release of %s by %s left it %s", a, h.members[j].holder, st)
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
		err := errors.Join(mb.m.Rebalance(ctx), mb.m.Flush(ctx))
		h.logf("%s rebalance+flush -> %v", mb.holder, err)
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
		h.logf("store fails %d writes (after committing them: %t)", h.faulty.failPuts, h.faulty.lostReplies)
	case 14: // crash and restart, same holder
		if arg%4 != 0 {
			return nil
		}
		h.faulty.failPuts = 0
		return h.restart(i, arg)
	case 15:
		switch arg % 3 {
		case 0:
			mb.m.Expire()
			return h.check()
		case 1:
			return h.bypass(i, arg)
		}
		if err := h.resync(i, arg); err != nil {
			return err
		}
	case 16: // a holder dies and stays dead, its claims waiting for a takeover
		if len(alive) < 2 || arg%3 != 0 {
			return nil
		}
		h.faulty.failPuts = 0
		mb.alive = false
		appeared := h.appear(i, arg)
		h.peers()
		h.logf("%s dies", mb.holder)
		if err := h.adoptAppeared(appeared); err != nil {
			return err
		}
	case 17: // a live holder takes over a dead one's claims
		for d, dead := range h.members {
			if !dead.alive && d != i {
				return h.takeover(i, d)
			}
		}
		return nil
	case 18: // the proof that a lapsed reservation was never stored
		return h.prove(i, arg)
	case 20: // a planned handover: seal, then restart or be taken over
		if arg%3 != 0 {
			return nil
		}
		h.faulty.failPuts = 0
		if err := mb.m.Seal(ctx); err != nil {
			return fmt.Errorf("seal %s: %w", mb.holder, err)
		}
		h.logf("%s seals", mb.holder)
		others := alive[:0:0]
		for _, j := range alive {
			if j != i {
				others = append(others, j)
			}
		}
		if len(others) == 0 || arg&8 != 0 {
			return h.restart(i, 0)
		}
		mb.alive = false
		h.peers()
		return h.takeover(others[int(arg>>4)%len(others)], i)
	case 21: // a holder's lease is not renewed in time: fenced
		mb.m.SetFence(func() bool { return false }, nil)
		before, _ := h.store.List(ctx)
		a, err := mb.m.Allocate(ctx, Reservation{Token: "fenced"})
		ferr := mb.m.Flush(ctx)
		after, _ := h.store.List(ctx)
		h.logf("%s fenced: allocate -> %s %v; flush -> %v", mb.holder, a, err, ferr)
		if err == nil || !errors.Is(err, ErrNotReady) {
			return fmt.Errorf("a fenced holder allocated %s (err: %w)", a, err)
		}
		if !slices.EqualFunc(before, after, func(x, y Block) bool { return x.Version == y.Version }) {
			return errors.New("a fenced holder wrote to the store")
		}
		if arg%2 == 0 || len(alive) < 2 {
			mb.m.SetFence(nil, nil) // renewed after all
			return h.check()
		}
		// Its lease lapses: another holder takes over, and it must
		// recover from scratch once it is back.
		mb.alive = false
		h.peers()
		j := alive[0]
		if j == i {
			j = alive[1]
		}
		return h.takeover(j, i)
	case 22: // a dead holder comes back under its name
		for d, dead := range h.members {
			if !dead.alive {
				h.faulty.failPuts = 0
				return h.restart(d, arg)
			}
		}
	case 23: // other holders' state as Observe delivers it
		h.tick("")
	}
	return h.check()
}

// resync runs member i's Resync with the true set of live machines: it
// must release nothing and find no conflict; it may adopt a live address
// its holder rests as an orphan, and start the rest of orphans on no live
// machine. Every other time it resyncs as a replica does from its caches:
// from a part of the live machines, and those Unseen names, read from the
// truth (unless there are orphans, which take every live machine).
func (h *harness) resync(i int, arg uint32) error {
	m := h.members[i].m
	asOf := m.Mark()
	var live, part []Holding
	for uid, a := range h.live {
		hd := Holding{Addr: spell(a, arg>>uint(len(live)%8)), Owner: Owner{UID: uid, Token: h.holder[a]}}
		live = append(live, hd)
		if arg&(1<<(8+len(live)%16)) != 0 {
			part = append(part, hd)
		}
	}
	if arg&(1<<24) != 0 {
		missing, orphans := m.Unseen(part, asOf)
		if !orphans {
			seen := map[string]bool{}
			for _, hd := range part {
				seen[hd.Owner.UID] = true
			}
			named := map[string]bool{}
			for _, tn := range missing {
				named[tn.Owner.UID] = true
			}
			for _, hd := range live {
				if !seen[hd.Owner.UID] && named[hd.Owner.UID] {
					part = append(part, hd)
				}
			}
			live = part
		}
		h.logf("%s resync from %d of %d live machines, %d unseen, orphans %t", h.members[i].holder, len(part), len(h.live), len(missing), orphans)
	}
	rep := m.Resync(live, asOf)
	h.logf("%s resync -> %+v", h.members[i].holder, rep)
	if rep.Released != 0 || len(rep.Conflicts) != 0 {
		return fmt.Errorf("resync of a consistent state changed it: %+v", rep)
	}
	return nil
}

// store1 has the cluster's controllers bind a stored machine: its holder
// binds the token if it still knows it, else whoever holds the address
// adopts it, else a live holder claims and adopts it. If nobody alive can,
// the machine waits, claimed by a dead holder, for a takeover.
func (h *harness) store1(r *reservation, arg uint32) error {
	ctx := context.Background()
	o := Owner{Token: r.token, UID: r.uid}
	mr := h.members[r.member]
	if mr.alive && mr.epoch == r.epoch {
		a, err := mr.m.Bind(o)
		h.logf("%s bind %s %s -> %s %v", mr.holder, r.token, r.uid, a, err)
		if err == nil {
			if a != r.addr {
				return fmt.Errorf("bind %s returned %s, reserved %s", r.token, a, r.addr)
			}
			return nil
		}
		if !errors.Is(err, ErrUnknownToken) {
			return fmt.Errorf("machine %s stored with %s: %w", r.uid, r.addr, err)
		}
	}
	j := h.holderOf(r.addr)
	if j < 0 {
		if h.claimedByDead(r.addr) {
			h.logf("machine %s on %s waits for a takeover", r.uid, r.addr)
			return nil
		}
		alive := h.alive()
		j = alive[int(arg)%len(alive)]
	}
	err := h.members[j].m.Adopt(ctx, spell(r.addr, arg>>3), o)
	h.logf("%s adopt %s %s -> %v", h.members[j].holder, r.addr, r.uid, err)
	if err != nil && !errors.Is(err, errInjected) && !errors.Is(err, ErrStoreConflict) {
		return fmt.Errorf("machine %s stored with %s: %w", r.uid, r.addr, err)
	}
	return nil
}

// claimedInStore reports whether the store shows a claimed by any holder.
func (h *harness) claimedInStore(a netip.Addr) bool {
	b, _ := h.store.Get(context.Background(), BlockOf(a))
	_, ok := b.holderOf(blockOffset(a))
	return ok
}

// claimedByDead reports whether the store shows a claimed by a holder that
// is not alive.
func (h *harness) claimedByDead(a netip.Addr) bool {
	b, _ := h.store.Get(context.Background(), BlockOf(a))
	owner, ok := b.holderOf(blockOffset(a))
	if !ok {
		return false
	}
	for _, mb := range h.members {
		if mb.holder == owner {
			return !mb.alive
		}
	}
	return false
}

// prove plays the caller that proves lapsed reservations unused: honestly,
// from the model's knowledge of what was stored, or too early, or with a
// stale record; a Manager must free an address without its cooldown only on
// an honest proof.
func (h *harness) prove(i int, arg uint32) error {
	m := h.members[i].m
	us := m.Unstored()
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
		if m.Unused(u, u.Deadline) {
			return fmt.Errorf("Unused(%+v) with a read at the deadline succeeded", u)
		}
	case 1: // a record from before a crash, or settled since
		u := h.stale[int(arg>>2)%len(h.stale)]
		if !slices.Contains(us, u) && m.Unused(u, now) {
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
				m.Used(u)
				continue
			}
			if !m.Unused(u, now) {
				return fmt.Errorf("Unused(%+v) of an honest proof at %s refused", u, now.Format(time.TimeOnly))
			}
			h.logf("%s unused %s %s", h.members[i].holder, u.Addr, u.Token)
			// Never given to a machine: free at once.
			h.settle()
			delete(h.notBefore, u.Addr)
		}
	}
	return h.check()
}

// bypass stores a machine that skipped the webhook with an address the
// model holds free: a holder's controller adopts it.
func (h *harness) bypass(i int, arg uint32) error {
	a := h.usable[int(arg/3)%len(h.usable)]
	if _, held := h.holder[a]; held || h.clock.Now().Before(h.notBefore[a]) || h.claimedByDead(a) {
		return nil
	}
	for _, j := range h.alive() {
		if st, _, _ := h.members[j].m.Lookup(a); st == StatePending || st == StateAllocated {
			return nil
		}
	}
	h.seq++
	uid, tok := fmt.Sprintf("uid-%d", h.seq), fmt.Sprintf("b%d", h.seq)
	j := h.holderOf(a)
	if j < 0 {
		j = i
	}
	err := h.members[j].m.Adopt(context.Background(), spell(a, arg>>5), Owner{UID: uid})
	h.logf("bypass: %s adopt %s %s -> %v", h.members[j].holder, a, uid, err)
	if err != nil {
		if errors.Is(err, errInjected) || errors.Is(err, ErrStoreConflict) || errors.Is(err, ErrInUse) || errors.Is(err, ErrCoolingDown) ||
			errors.Is(err, ErrNoAnswer) {
			return nil
		}
		return fmt.Errorf("adopt of bypassing machine %s on %s: %w", uid, a, err)
	}
	h.reserva[tok] = &reservation{token: tok, addr: a, at: h.clock.Now(), member: j, epoch: h.members[j].epoch, uid: uid, bypassed: true}
	h.holder[a] = tok
	h.live[uid] = a
	return h.check()
}

// check verifies the Managers' state against the model.
func (h *harness) check() error {
	h.settle()
	allocated := 0
	for _, i := range h.alive() {
		c := h.members[i].m.Snapshot()
		if c.Free+c.Pending+c.Allocated+c.Cooldown != c.Claimed {
			return fmt.Errorf("%s: counts do not add up: %+v", h.members[i].holder, c)
		}
		if uint64(c.Claimed) > c.Usable {
			return fmt.Errorf("%s: claimed more than usable: %+v", h.members[i].holder, c)
		}
		allocated += c.Allocated
		if err := h.checkKept(h.members[i].m); err != nil {
			return fmt.Errorf("%s: %w", h.members[i].holder, err)
		}
	}
	if allocated > len(h.live) {
		return fmt.Errorf("allocated %d, model has %d live machines", allocated, len(h.live))
	}
	for uid, a := range h.live {
		j := h.holderOf(a)
		if j < 0 {
			if !h.claimedInStore(a) {
				return fmt.Errorf("live machine %s has %s, which no holder claims", uid, a)
			}
			// Claimed by a dead holder, waiting for a takeover; or by a
			// live one whose write reporting it failed, until it reads the
			// block again.
			continue
		}
		st, o, _ := h.members[j].m.Lookup(spell(a, uint32(len(uid))))
		if st != StateAllocated || o.UID != uid {
			if r := h.reserva[h.holder[a]]; r != nil && !h.members[r.member].alive {
				continue // bound by a holder that died since; its taker adopts it
			}
			if st == StateCooldown {
				continue // taken over, resting, until its holder's controller adopts it
			}
			return fmt.Errorf("live machine %s has %s, %s says %s owned by %+v", uid, a, h.members[j].holder, st, o)
		}
	}
	return h.checkStore()
}

// checkStore verifies the store's one rule: no address claimed by two
// holders.
func (h *harness) checkStore() error {
	blocks, _ := h.store.List(context.Background())
	for _, b := range blocks {
		var seen Bitmap
		for holder, bm := range b.Claims {
			for w := range bm {
				if seen[w]&bm[w] != 0 {
					return fmt.Errorf("DUPLICATE CLAIM in block %s: holder %s claims addresses another holder claims", b.Prefix, holder)
				}
				seen[w] |= bm[w]
			}
		}
	}
	return nil
}

// checkKept recounts what the Manager keeps counted as its state changes
// (the lists, the addresses being returned, the pending reservations per
// namespace, each block's own and others' claims) and fails on any drift.
func (h *harness) checkKept(m *Manager) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := map[State]int{}
	armed := 0
	ns := map[string]int{}
	ours := map[netip.Prefix]int{}
	held := map[netip.Prefix]*Bitmap{}
	for a, e := range m.entries {
		if a != e.addr || Canonical(a) != a {
			return fmt.Errorf("entry %s keyed by %s", e.addr, a)
		}
		n[e.state]++
		if e.state == StateFree && e.armed {
			armed++
		}
		if e.state == StatePending {
			ns[e.ns]++
		}
		ours[BlockOf(a)]++
		if held[BlockOf(a)] == nil {
			held[BlockOf(a)] = new(Bitmap)
		}
		held[BlockOf(a)].Set(blockOffset(a))
	}
	switch {
	case n[StateFree] != m.readyList.n+m.free.n, armed != m.readyList.n, n[stateSurplus] != m.surplus.n, n[StatePending] != m.pending.n,
		n[StateCooldown] != m.cooldown.n, n[stateReturning] != m.returning:
		return fmt.Errorf("kept counts drifted: states %v, %d armed; lists ready %d free %d surplus %d pending %d cooldown %d returning %d",
			n, armed, m.readyList.n, m.free.n, m.surplus.n, m.pending.n, m.cooldown.n, m.returning)
	case !maps.Equal(ns, m.pendingNS):
		return fmt.Errorf("pending per namespace drifted: %v, kept %v", ns, m.pendingNS)
	}
	elsewhere := 0
	for p, b := range m.blocks {
		if b.ours != ours[p] {
			return fmt.Errorf("block %s counts %d of ours, holds %d", p, b.ours, ours[p])
		}
		if want := held[p]; want == nil && !b.held.Empty() || want != nil && *want != b.held {
			return fmt.Errorf("block %s marks offsets %v held, holds %v", p, offsets(&b.held), offsets(want))
		}
		if b.index == nil && b.ours >= m.denseAt {
			return fmt.Errorf("block %s holds %d entries without an index", p, b.ours)
		}
		// held matches the entries (above): the index must have each held
		// offset's entry, and nothing elsewhere.
		for off := 0; b.index != nil && off < BlockSize; off++ {
			var e *entry
			if b.held.Has(off) {
				e = m.entries[blockAddr(p, off)]
			}
			if b.index[off] != e {
				return fmt.Errorf("block %s's index has %v at offset %d, the Manager %v", p, b.index[off], off, e)
			}
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

// drain takes over every dead holder, lets every TTL and cooldown pass,
// then checks that every address on no live machine can be handed out
// again by the holders together, and hands them all out.
func (h *harness) drain() error {
	ctx := context.Background()
	h.settledAt = -1
	h.faulty.failPuts = 0
	alive := h.alive()
	if len(alive) == 0 {
		if err := h.restart(0, 0); err != nil {
			return err
		}
		alive = h.alive()
	}
	for d, mb := range h.members {
		for tries := 0; !mb.alive && h.deadClaims(mb.holder); tries++ {
			if tries == 5 {
				return fmt.Errorf("LEAK: the claims of dead holder %s could not be taken over", mb.holder)
			}
			if err := h.takeover(alive[0], d); err != nil {
				return err
			}
		}
	}
	// A resync with every live machine settles what the store showed in
	// use without saying for which machine.
	for _, i := range alive {
		if err := h.resync(i, 0); err != nil {
			return err
		}
	}
	h.clock.Step(2 * (h.cfg.Cooldown + h.cfg.PendingTTL))
	h.settle()
	if len(h.holder) != len(h.live) {
		return fmt.Errorf("model: %d held, %d live", len(h.holder), len(h.live))
	}
	for _, i := range alive {
		// Machines stored while their holder was dead were adopted by the
		// takeover; those their taker rests are adopted now, as the
		// controller would.
		for uid, a := range h.live {
			if h.members[i].m.Holds(a) {
				if st, o, _ := h.members[i].m.Lookup(a); st != StateAllocated || o.UID != uid {
					if err := h.members[i].m.Adopt(ctx, a, Owner{UID: uid, Token: h.holder[a]}); err != nil {
						return fmt.Errorf("drain adopt: %w", err)
					}
				}
			}
		}
		h.members[i].m.Expire()
		c := h.members[i].m.Snapshot()
		if c.Pending != 0 || c.Cooldown != 0 {
			m := h.members[i].m
			m.mu.Lock()
			var what []string
			for e := m.cooldown.head; e != nil; e = e.next {
				what = append(what, fmt.Sprintf("%s until %s (orphan %t)", e.addr, e.at.Format(time.DateTime), e.orphan))
			}
			m.mu.Unlock()
			return fmt.Errorf("LEAK: %s: after every TTL and cooldown, %d pending and %d cooling down: %v", h.members[i].holder, c.Pending, c.Cooldown, what)
		}
	}
	got := 0
	for progress, ticks := true, 0; progress || ticks < 3; {
		if !progress {
			// Everyone exhausted: let them see the store once more (a
			// grant nobody waited for), as their informers would.
			ticks++
			h.settledAt = -1
			h.tick("")
		}
		progress = false
		for _, i := range alive {
			h.settledAt = -1
			h.seq++
			tok := fmt.Sprintf("d%d", h.seq)
			a, err := h.members[i].m.Allocate(ctx, Reservation{Token: tok, Namespace: tok})
			if errors.Is(err, ErrExhausted) {
				continue
			}
			if err != nil {
				return fmt.Errorf("drain allocate: %w", err)
			}
			if err := h.handedOut(i, tok, tok, a); err != nil {
				return err
			}
			got++
			progress = true
		}
	}
	if want := len(h.usable) - len(h.live); got != want {
		return fmt.Errorf("LEAK: %d addresses on no live machine, only %d could be handed out\n%s", want, got, h.dump())
	}
	return h.check()
}

// deadClaims reports whether the store shows claims of holder.
func (h *harness) deadClaims(holder string) bool {
	blocks, _ := h.store.List(context.Background())
	for _, b := range blocks {
		if bm := b.Claims[holder]; bm != nil && !bm.Empty() {
			return true
		}
	}
	return false
}

func (h *harness) trace() string {
	start := max(0, len(h.log)-60)
	return strings.Join(h.log[start:], "\n")
}

// dump describes every holder's entries and the store, for a failure.
func (h *harness) dump() string {
	var b strings.Builder
	for _, mb := range h.members {
		fmt.Fprintf(&b, "%s (alive %t):", mb.holder, mb.alive)
		mb.m.mu.Lock()
		for _, a := range slices.SortedFunc(maps.Keys(mb.m.entries), netip.Addr.Compare) {
			e := mb.m.entries[a]
			fmt.Fprintf(&b, " %s=%s/armed=%t/orphan=%t", a, e.state, e.armed, e.orphan)
		}
		mb.m.mu.Unlock()
		b.WriteByte('\n')
	}
	blocks, _ := h.store.List(context.Background())
	for _, bl := range blocks {
		fmt.Fprintf(&b, "block %s:", bl.Prefix)
		for holder, bm := range bl.Claims {
			fmt.Fprintf(&b, " %s claims", holder)
			for off := range BlockSize {
				if bm.Has(off) {
					fmt.Fprintf(&b, " %s", blockAddr(bl.Prefix, off))
				}
			}
		}
		fmt.Fprintf(&b, " requests %v\n", bl.Requests)
	}
	return b.String()
}

// offsets lists the offsets set in bm, for a failure's message.
func offsets(bm *Bitmap) []int {
	var out []int
	if bm != nil {
		bm.Each(func(off int) { out = append(out, off) })
	}
	return out
}
