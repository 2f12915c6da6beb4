package history

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	vmipamv1 "github.com/vmipam/vmipam/api/v1alpha1"
)

// Read returns the records of addr, newest first (see Sort), from the
// segments of its chunk as the API server has them.
func Read(ctx context.Context, r client.Reader, addr netip.Addr) ([]vmipamv1.AddressRecord, error) {
	segs, err := Segments(ctx, r, ChunkOf(addr))
	if err != nil {
		return nil, err
	}
	want := addr.Unmap().String()
	var out []vmipamv1.AddressRecord
	for _, s := range segs {
		for _, rec := range s.Spec.Records {
			if rec.Address == want {
				out = append(out, rec)
			}
		}
	}
	return Sort(out), nil
}

// Segments lists the segments of chunk, oldest first.
func Segments(ctx context.Context, r client.Reader, chunk netip.Prefix) ([]vmipamv1.IPHistory, error) {
	var list vmipamv1.IPHistoryList
	if err := r.List(ctx, &list, client.MatchingLabels{vmipamv1.ChunkLabel: ChunkLabelValue(chunk)}); err != nil {
		return nil, fmt.Errorf("list the history of %s: %w", chunk, err)
	}
	segs := list.Items
	slices.SortFunc(segs, func(a, b vmipamv1.IPHistory) int { return cmp.Compare(a.Spec.Sequence, b.Spec.Sequence) })
	return segs, nil
}

// Sort orders records newest first, by when they ended, and drops the
// repeats a retried write may leave (the same tenure or release twice).
func Sort(recs []vmipamv1.AddressRecord) []vmipamv1.AddressRecord {
	slices.SortStableFunc(recs, func(a, b vmipamv1.AddressRecord) int {
		if c := b.To.Compare(a.To.Time); c != 0 {
			return c
		}
		return cmp.Compare(a.Address, b.Address)
	})
	seen := map[key]bool{}
	return slices.DeleteFunc(recs, func(r vmipamv1.AddressRecord) bool {
		k := keyOf(r)
		if seen[k] {
			return true
		}
		seen[k] = true
		return false
	})
}

// key tells records apart: an object's tenure of an address is recorded
// once, whenever its release is retried; an operator's release by the
// IPRelease's time.
type key struct {
	addr, uid, ended string
	to               time.Time
}

func keyOf(r vmipamv1.AddressRecord) key {
	k := key{addr: r.Address, uid: r.UID, ended: r.Ended}
	if r.UID == "" || r.ReleasedBy != "" {
		k.to = r.To.Time
	}
	return k
}

// HeldAt reports whether rec covers t: from its start (or the beginning,
// when unknown) to its end.
func HeldAt(rec vmipamv1.AddressRecord, t time.Time) bool {
	if rec.Ended != vmipamv1.EndedAllocated && rec.Ended != vmipamv1.EndedVanished {
		return false
	}
	return (rec.From == nil || !t.Before(rec.From.Time)) && t.Before(rec.To.Time)
}
