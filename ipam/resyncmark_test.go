package ipam

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// TestResyncLeavesEntriesNewerThanItsMark: an entry that this Manager
// comes to hold after a resync's mark (a takeover's address on a live
// machine, an orphan a read finds) is newer than the resync's list of live
// machines, whose silence about it says nothing. A resync from a
// replica's caches, which hold only the machines labelled for it, read
// its misses before a takeover of a dead replica's claims landed, and then
// released the addresses of that replica's live VMs into cooldown
// ("Vanished"); the next resync that saw them adopted them again, while
// their addresses had been cooling down, to be handed out once it ended.
func TestResyncLeavesEntriesNewerThanItsMark(t *testing.T) {
	ctx := context.Background()
	p := BlockOf(addr("10.0.0.0"))
	a := addr("10.0.0.10")
	owner := Owner{UID: "vm-uid", Token: "vm-token", Ref: "ns/vm"}
	for _, tt := range []struct {
		name string
		// come makes m hold a, in use on owner's machine, after the mark.
		come func(t *testing.T, m *Manager, st *MemoryStore)
		// want is a's state once the second resync, whose list is newer
		// than its coming, does not show it: released, or settled (an
		// orphan rests as after a crash).
		want State
	}{
		{"takeover", func(t *testing.T, m *Manager, st *MemoryStore) {
			if _, err := m.Takeover(ctx, "gone", []Holding{{Addr: a, Owner: owner}}); err != nil {
				t.Fatal(err)
			}
		}, StateCooldown},
		{"orphan", func(t *testing.T, m *Manager, st *MemoryStore) {
			// The store shows m's holder claiming a, in use, with no
			// entry for it: as after a claim whose answer was lost.
			b, err := st.Get(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			b.Claims = map[string]*Bitmap{"h1": new(Bitmap)}
			b.InUse = map[string]*Bitmap{"h1": new(Bitmap)}
			b.Claims["h1"].Set(blockOffset(a))
			b.InUse["h1"].Set(blockOffset(a))
			if _, err := st.Put(ctx, b); err != nil {
				t.Fatal(err)
			}
			if err := m.load(ctx, p); err != nil {
				t.Fatal(err)
			}
			if e := m.entries[a]; e == nil || !e.orphan {
				t.Fatalf("%s is no orphan after the read", a)
			}
		}, StateCooldown},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			st := NewMemoryStore()
			gone := Block{Prefix: p, Exact: true, Claims: map[string]*Bitmap{"gone": new(Bitmap)}, InUse: map[string]*Bitmap{"gone": new(Bitmap)}}
			if tt.name == "takeover" {
				gone.Claims["gone"].Set(blockOffset(a))
				gone.InUse["gone"].Set(blockOffset(a))
			}
			if _, err := st.Put(ctx, gone); err != nil {
				t.Fatal(err)
			}
			m := newSharingManager(t, st, clk, "h1")
			asOf := m.Mark()
			tt.come(t, m, st)
			before, _, _ := m.Lookup(a)
			// A list taken after the mark and before a came: it does
			// not show a's machine.
			rep := m.Resync(nil, asOf)
			if s, _, _ := m.Lookup(a); s != before || rep.Released != 0 || rep.Settled != 0 || len(rep.Vanished) != 0 {
				t.Errorf("a resync whose mark is older than %s's coming took it from %s to %s (%+v); want it left alone", a, before, s, rep)
			}
			// The next resync's list is newer: a's machine is gone.
			m.Resync(nil, m.Mark())
			if s, _, _ := m.Lookup(a); s != tt.want {
				t.Errorf("%s after a resync newer than its coming whose list lacks its machine: %s; want %s", a, s, tt.want)
			}
		})
	}
}

// TestAdoptingIsWhatResyncAdopts: Adopting names the holdings that a
// Resync as of the same mark adopts (or finds in conflict), in each state
// an address can be in, since a resync from a replica's caches reads those
// again from the API server before it acts on them.
func TestAdoptingIsWhatResyncAdopts(t *testing.T) {
	const uid, other = "vm-uid", "other-uid"
	for _, tt := range []struct {
		name string
		// state puts the Manager's first address in a state, and returns
		// it; markFirst takes the mark before that.
		state     func(t *testing.T, m *Manager, clk *fakeClock) netip.Addr
		markFirst bool
		going     bool
		want      bool
	}{
		{name: "pending, its machine stored", want: true, state: func(t *testing.T, m *Manager, _ *fakeClock) netip.Addr {
			return mustAllocate(t, m, "tok")
		}},
		{name: "allocated to the machine", state: func(t *testing.T, m *Manager, _ *fakeClock) netip.Addr {
			return bound(t, m, uid)
		}},
		{name: "allocated to another machine", want: true, state: func(t *testing.T, m *Manager, _ *fakeClock) netip.Addr {
			return bound(t, m, other)
		}},
		{name: "cooling down, its machine going", going: true, state: released},
		{name: "cooling down, its machine not going", want: true, state: released},
		{name: "free, its machine going", going: true, want: true, state: func(t *testing.T, m *Manager, clk *fakeClock) netip.Addr {
			a := released(t, m, clk)
			clk.Step(2 * time.Minute)
			if st, _, _ := m.Lookup(a); st != StateFree {
				t.Fatalf("%s is %s after its cooldown, want free", a, st)
			}
			return a
		}},
		{name: "changed after the mark", markFirst: true, state: func(t *testing.T, m *Manager, _ *fakeClock) netip.Addr {
			return mustAllocate(t, m, "tok")
		}},
		{name: "not held", state: func(*testing.T, *Manager, *fakeClock) netip.Addr { return addr("10.0.0.200") }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, clk, _ := newTestManager(t, testPool{cidr: "10.0.0.0/24"})
			var asOf uint64
			if tt.markFirst {
				asOf = m.Mark()
			}
			a := tt.state(t, m, clk)
			if !tt.markFirst {
				asOf = m.Mark()
			}
			h := Holding{Addr: a, Owner: Owner{UID: uid, Token: "tok", Ref: "ns/vm"}, Going: tt.going}
			got := m.Adopting([]Holding{h}, asOf)
			if (len(got) == 1) != tt.want {
				t.Errorf("Adopting = %v, want %s named: %t", got, a, tt.want)
			}
			rep := m.Resync([]Holding{h}, asOf)
			if adopted := rep.Adopted+len(rep.Conflicts) == 1; adopted != tt.want {
				t.Errorf("Resync adopted %s: %t (%+v), want %t", a, adopted, rep, tt.want)
			}
			if rep.Adopted == 1 && (len(rep.Adoptions) != 1 || rep.Adoptions[0].Addr != a || rep.Adoptions[0].Owner.UID != uid) {
				t.Errorf("Resync's Adoptions = %+v, want %s for %s", rep.Adoptions, a, uid)
			}
		})
	}
}

// bound allocates an address and binds it to uid.
func bound(t *testing.T, m *Manager, uid string) netip.Addr {
	t.Helper()
	a := mustAllocate(t, m, "tok-"+uid)
	if _, err := m.Bind(Owner{Token: "tok-" + uid, UID: uid}); err != nil {
		t.Fatal(err)
	}
	return a
}

// released allocates an address to vm-uid and releases it into cooldown.
func released(t *testing.T, m *Manager, _ *fakeClock) netip.Addr {
	t.Helper()
	a := bound(t, m, "vm-uid")
	if err := m.Release(a, Owner{Token: "tok-vm-uid", UID: "vm-uid"}); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestResyncReportAddBoundsAdoptions: the reports of several allocators
// together count every adoption and list no more than maxAdoptions.
func TestResyncReportAddBoundsAdoptions(t *testing.T) {
	some := func(n int) ResyncReport {
		r := ResyncReport{Adopted: n}
		for i := range min(n, maxAdoptions) {
			r.Adoptions = append(r.Adoptions, Tenure{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})})
		}
		return r
	}
	for _, tt := range []struct{ a, b, wantListed int }{
		{0, 0, 0}, {3, 4, 7}, {8, 8, maxAdoptions}, {maxAdoptions, 1, maxAdoptions}, {0, 50, maxAdoptions},
	} {
		got := some(tt.a).Add(some(tt.b))
		if got.Adopted != tt.a+tt.b || len(got.Adoptions) != tt.wantListed {
			t.Errorf("%d adoptions and %d: Adopted %d with %d listed, want %d with %d", tt.a, tt.b, got.Adopted, len(got.Adoptions), tt.a+tt.b, tt.wantListed)
		}
	}
}
