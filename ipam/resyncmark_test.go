package ipam

import (
	"context"
	"testing"
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
