package kubestore_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
	"github.com/vmipam/vmipam/kubestore"
	"github.com/vmipam/vmipam/test/harness"
)

// bits describes a holder's bitmap in a block, for messages.
func bits(m map[string]*ipam.Bitmap, h string) string {
	bm := m[h]
	if bm == nil {
		return "[]"
	}
	var offs []string
	for off := range ipam.BlockSize {
		if bm.Has(off) {
			offs = append(offs, fmt.Sprint(off))
		}
	}
	return "[" + strings.Join(offs, " ") + "]"
}

// TestShares: what a holder has in use or armed in a block, and its
// cooldowns there, go to its own IPBlockShare; the IPBlock keeps the
// claims, with every claimed address in use for readers of older versions.
// A write of the share alone does not compete with the block's other
// holders; a block that an older version wrote (its list of shares
// dropped) reads every claimed address of theirs as in use; a holder that
// no longer claims anything in the block loses its share, and a deleted
// block takes its shares along.
func TestShares(t *testing.T) {
	harness.NeedControlPlane(t)
	ctx := t.Context()
	pool := newPool(t, "shares")
	a, b := holderStore(pool, "replica-a"), holderStore(pool, "replica-b")
	reader := newStore(pool)
	p := netip.MustParsePrefix("10.9.0.0/20")
	until := time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC)
	blk := ipam.Block{Prefix: p, Exact: true,
		Claims:    map[string]*ipam.Bitmap{"replica-a": bitmap(1, 2, 3, 4)},
		InUse:     map[string]*ipam.Bitmap{"replica-a": bitmap(1)},
		Armed:     map[string]*ipam.Bitmap{"replica-a": bitmap(2)},
		Cooldowns: map[netip.Addr]time.Time{at(p, 3): until},
	}
	v1 := mustPut(t, a, blk)
	check := func(when string, want ipam.Block) {
		t.Helper()
		want.Version = "" // a write of a share alone keeps it
		got, err := reader.Get(ctx, p)
		if err != nil {
			t.Fatalf("%s: Get = %v", when, err)
		}
		for _, h := range []string{"replica-a", "replica-b"} {
			for _, f := range []struct {
				name      string
				got, want map[string]*ipam.Bitmap
			}{{"claims", got.Claims, want.Claims}, {"in use", got.InUse, want.InUse}, {"armed", got.Armed, want.Armed}} {
				if g, w := bits(f.got, h), bits(f.want, h); g != w {
					t.Errorf("%s: %s of %s read as %s, want %s", when, f.name, h, g, w)
				}
			}
		}
		if d := diffBlock(got, want); d != "" {
			t.Errorf("%s: %s", when, d)
		}
	}
	check("after the first write", blk)
	var obj v1alpha1.IPBlock
	if err := k8s.Get(ctx, client.ObjectKey{Name: kubestore.BlockName(pool.Name, p)}, &obj); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(obj.Spec.Shares, []string{"replica-a"}) || obj.Spec.Armed != nil || obj.Spec.Cooldowns != "" {
		t.Errorf("IPBlock spec %+v: want shares [replica-a], nothing armed and no cooldowns", obj.Spec)
	}
	var sh v1alpha1.IPBlockShare
	if err := k8s.Get(ctx, client.ObjectKey{Name: kubestore.ShareName(pool.Name, p, "replica-a")}, &sh); err != nil {
		t.Fatalf("the share of replica-a: %v", err)
	}
	if sh.Spec.Holder != "replica-a" || sh.Labels[v1alpha1.BlockLabel] != kubestore.BlockLabelValue(pool.Name, p) || len(sh.OwnerReferences) != 1 {
		t.Errorf("share %+v: want replica-a's, labelled with its block, owned by the pool", sh.ObjectMeta)
	}

	// Another holder claims in the block: the IPBlock moves on.
	fromB := blk.Clone()
	fromB.Version = v1
	fromB.Claims["replica-b"] = bitmap(10, 11)
	fromB.Armed["replica-b"] = bitmap(10)
	mustPut(t, b, fromB)
	// replica-a, at the version before, hands out its armed address and
	// arms another: its share alone is written, with no conflict.
	mine := blk.Clone()
	mine.Version = v1
	mine.InUse["replica-a"] = bitmap(1, 2)
	mine.Armed["replica-a"] = bitmap(4)
	if ver, err := a.Put(ctx, mine); err != nil || ver != v1 {
		t.Fatalf("a write of replica-a's share alone at the version before replica-b's = %q, %v; want %q and no error", ver, err, v1)
	}
	want := fromB.Clone()
	want.InUse["replica-a"] = bitmap(1, 2)
	want.Armed["replica-a"] = bitmap(4)
	check("after both wrote", want)
	// A change of its claims at that version is a conflict.
	claim := mine.Clone()
	claim.Claims["replica-a"].Set(5)
	if _, err := a.Put(ctx, claim); !errors.Is(err, ipam.ErrStoreConflict) {
		t.Fatalf("a claim at a stale version = %v; want a conflict", err)
	}

	// A replica of an older version writes the block: the list of shares
	// is gone, and every claimed address reads as in use.
	if err := k8s.Get(ctx, client.ObjectKey{Name: kubestore.BlockName(pool.Name, p)}, &obj); err != nil {
		t.Fatal(err)
	}
	obj.Spec.Shares = nil
	if err := k8s.Update(ctx, &obj); err != nil {
		t.Fatal(err)
	}
	old := want.Clone()
	old.InUse = map[string]*ipam.Bitmap{"replica-a": bitmap(1, 2, 3, 4), "replica-b": bitmap(10, 11)}
	old.Armed = map[string]*ipam.Bitmap{}
	old.Cooldowns = map[netip.Addr]time.Time{}
	check("after an older version wrote the block", old)

	// replica-b takes replica-a's claims over (as from a holder that
	// left): replica-a's share goes.
	cur, err := b.Get(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	taken := cur.Clone()
	taken.Claims = map[string]*ipam.Bitmap{"replica-b": bitmap(1, 2, 3, 4, 10, 11)}
	taken.InUse = map[string]*ipam.Bitmap{"replica-b": bitmap(1, 2, 3, 4)}
	taken.Armed = map[string]*ipam.Bitmap{}
	taken.Version = mustPut(t, b, taken)
	check("after the takeover", taken)
	if err := k8s.Get(ctx, client.ObjectKey{Name: kubestore.ShareName(pool.Name, p, "replica-a")}, &sh); !apierrors.IsNotFound(err) {
		t.Errorf("the share of a holder taken over: %v; want it deleted", err)
	}
	// The holder taken over, still writing its share, finds it gone.
	late := mine.Clone()
	late.Armed["replica-a"] = bitmap(4, 1)
	if _, err := a.Put(ctx, late); !errors.Is(err, ipam.ErrStoreConflict) {
		t.Errorf("a write of the share of a holder taken over = %v; want a conflict", err)
	}

	// The block goes, its shares with it.
	if err := b.Delete(ctx, p, taken.Version); err != nil {
		t.Fatal(err)
	}
	var left v1alpha1.IPBlockShareList
	if err := k8s.List(ctx, &left, client.MatchingLabels{v1alpha1.PoolLabel: pool.Name}); err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 0 {
		t.Errorf("%d IPBlockShares left after their block was deleted", len(left.Items))
	}
}
