package kubestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
)

// A block's holders write one IPBlock, compare-and-swap: with several
// replicas on a block, each one's arming and flushing made the others'
// writes fail and read the block again. So each holder keeps its own part
// of the block (what it has in use or armed, and its cooldowns) in an
// IPBlockShare that only it writes, and the IPBlock keeps only what
// several holders change: the claims, the requests and the hand-overs.
//
// The IPBlock lists such holders in spec.shares and, for each, sets
// spec.inUse to every address it claims, so that a replica of a version
// before shares read all of them as possibly in use (a takeover by it rests
// them all) and never hands one out twice. Such a replica drops the list
// when it writes the block: the holders' addresses are then read that way
// by everyone until each writes the block again.
//
// Readers merge: for a holder the IPBlock lists, in use and armed are its
// share's, within its claims; cooldowns, its share's for the addresses it
// claims. A listed holder whose share is missing keeps the IPBlock's view
// (every claimed address possibly in use).
//
// A holder writes its share before the IPBlock, and readers read the
// IPBlock before the shares: a claim is never read without the share that
// says which of the claimed addresses its holder may have handed out, and
// a share that got ahead of a write that failed, or of the IPBlock read,
// names addresses the holder does not claim there, which readers ignore.

// seenBlock is an IPBlock's spec at a resourceVersion.
type seenBlock struct {
	rv   string
	spec v1alpha1.IPBlockSpec
}

// ownShare is this holder's IPBlockShare spec at a resourceVersion.
type ownShare struct {
	rv   string
	spec v1alpha1.IPBlockShareSpec
}

// shareKey finds a share among a pool's.
type shareKey struct{ prefix, holder string }

// ShareName returns the name of holder's IPBlockShare of block prefix of
// pool: the block's name (see BlockName), cut to fit if need be, a dot and
// a hash of the holder.
func ShareName(pool string, prefix netip.Prefix, holder string) string {
	sum := sha256.Sum256([]byte(holder))
	b := BlockName(pool, prefix)
	if room := validation.DNS1123SubdomainMaxLength - 1 - hashLen; len(b) > room {
		b = shorten(b, room)
	}
	return b + "." + hex.EncodeToString(sum[:])[:hashLen]
}

// BlockLabelValue returns the value of the v1alpha1.BlockLabel label on
// the IPBlockShares of block prefix of pool.
func BlockLabelValue(pool string, prefix netip.Prefix) string {
	sum := sha256.Sum256([]byte(BlockName(pool, prefix)))
	return hex.EncodeToString(sum[:])[:2*hashLen]
}

// merge turns an IPBlock of this pool, and the shares of the holders it
// lists (by holder), into a Block; it remembers the IPBlock's spec and this
// holder's share.
func (s *Store) merge(obj *v1alpha1.IPBlock, shares map[string]*v1alpha1.IPBlockShare) (ipam.Block, error) {
	b, err := s.decode(obj)
	if err != nil {
		return ipam.Block{}, err
	}
	s.remember(b.Prefix, obj.ResourceVersion, &obj.Spec)
	for _, h := range obj.Spec.Shares {
		sh := shares[h]
		if sh == nil || sh.Spec.Pool != s.pool || sh.Spec.Prefix != obj.Spec.Prefix || sh.Spec.Holder != h {
			continue
		}
		if h == s.holder {
			s.mu.Lock()
			s.own[b.Prefix] = ownShare{rv: sh.ResourceVersion, spec: sh.Spec}
			s.mu.Unlock()
		}
		claims := b.Claims[h]
		if claims == nil || claims.Empty() {
			continue
		}
		e := ipam.EncodedBlock{Prefix: obj.Spec.Prefix, Cooldowns: sh.Spec.Cooldowns}
		if sh.Spec.InUse != "" {
			e.InUse = map[string]string{h: sh.Spec.InUse}
		}
		if sh.Spec.Armed != "" {
			e.Armed = map[string]string{h: sh.Spec.Armed}
		}
		part, err := e.Decode("")
		if err != nil {
			return ipam.Block{}, fmt.Errorf("read IPBlockShare %s: %w", sh.Name, err)
		}
		for _, f := range []struct{ from, to map[string]*ipam.Bitmap }{{part.InUse, b.InUse}, {part.Armed, b.Armed}} {
			bm := f.from[h]
			if bm == nil {
				delete(f.to, h)
				continue
			}
			bm.Intersect(claims)
			f.to[h] = bm
		}
		for a, until := range part.Cooldowns {
			if by, ok := b.ClaimedBy(a); ok && by == h {
				b.Cooldowns[a] = until
			}
		}
	}
	return b, nil
}

// split turns a Block to write into the IPBlock's spec and this holder's
// share (nil when it claims nothing there); prev is the IPBlock's spec at
// the version the Block was built from, nil for a new block.
func (s *Store) split(b ipam.Block, prev *v1alpha1.IPBlockSpec) (v1alpha1.IPBlockSpec, *v1alpha1.IPBlockShareSpec) {
	claims := func(h string) bool { bm := b.Claims[h]; return h != "" && bm != nil && !bm.Empty() }
	listed := map[string]bool{}
	if prev != nil {
		for _, h := range prev.Shares {
			listed[h] = claims(h)
		}
	}
	listed[s.holder] = claims(s.holder)
	shared := b.Clone()
	own := ipam.Block{Prefix: b.Prefix, InUse: map[string]*ipam.Bitmap{}, Armed: map[string]*ipam.Bitmap{}, Cooldowns: map[netip.Addr]time.Time{}}
	var list []string
	for h, ok := range listed {
		if !ok {
			continue
		}
		list = append(list, h)
		if h == s.holder {
			if bm := b.InUse[h]; bm != nil && !bm.Empty() {
				own.InUse[h] = bm
			}
			if bm := b.Armed[h]; bm != nil && !bm.Empty() {
				own.Armed[h] = bm
			}
		}
		if shared.InUse == nil {
			shared.InUse = map[string]*ipam.Bitmap{}
		}
		mirror := *b.Claims[h]
		shared.InUse[h] = &mirror
		delete(shared.Armed, h)
	}
	slices.Sort(list)
	for a, until := range b.Cooldowns {
		if h, ok := b.ClaimedBy(a); ok && listed[h] {
			delete(shared.Cooldowns, a)
			if h == s.holder {
				own.Cooldowns[a] = until
			}
		}
	}
	e := shared.Encode()
	spec := v1alpha1.IPBlockSpec{Pool: s.pool, Prefix: e.Prefix, Claims: e.Claims, InUse: e.InUse, Armed: e.Armed,
		Cooldowns: e.Cooldowns, Requests: requestsOf(e.Requests), Format: int32(e.Format), Shares: list}
	if !listed[s.holder] {
		return spec, nil
	}
	oe := own.Encode()
	return spec, &v1alpha1.IPBlockShareSpec{Pool: s.pool, Prefix: e.Prefix, Holder: s.holder,
		InUse: oe.InUse[s.holder], Armed: oe.Armed[s.holder], Cooldowns: oe.Cooldowns}
}

// specAt returns the IPBlock's spec at version, nil for version "" (a
// block to create). A version this Store did not see last is read; a block
// that moved on since is a conflict.
func (s *Store) specAt(ctx context.Context, prefix netip.Prefix, version string) (*v1alpha1.IPBlockSpec, error) {
	if version == "" {
		return nil, nil
	}
	s.mu.Lock()
	seen, ok := s.seen[prefix]
	s.mu.Unlock()
	if ok && seen.rv == version {
		return &seen.spec, nil
	}
	name := BlockName(s.pool, prefix)
	var obj v1alpha1.IPBlock
	if err := s.reader.Get(ctx, client.ObjectKey{Name: name}, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("update IPBlock %s at resourceVersion %s: %w: %w", name, version, ipam.ErrStoreConflict, err)
		}
		return nil, fmt.Errorf("get IPBlock %s: %w", name, err)
	}
	if obj.ResourceVersion != version {
		return nil, fmt.Errorf("update IPBlock %s at resourceVersion %s: it is at %s: %w", name, version, obj.ResourceVersion, ipam.ErrStoreConflict)
	}
	s.remember(prefix, obj.ResourceVersion, &obj.Spec)
	return &obj.Spec, nil
}

// putShare writes this holder's share of block prefix, unless it says
// that already.
func (s *Store) putShare(ctx context.Context, prefix netip.Prefix, spec v1alpha1.IPBlockShareSpec) error {
	s.mu.Lock()
	cur, known := s.own[prefix]
	s.mu.Unlock()
	if known && cur.spec == spec {
		return nil
	}
	name := ShareName(s.pool, prefix, s.holder)
	obj := &v1alpha1.IPBlockShare{
		ObjectMeta: metav1.ObjectMeta{
			Name:            name,
			Labels:          map[string]string{v1alpha1.PoolLabel: s.label, v1alpha1.BlockLabel: BlockLabelValue(s.pool, prefix)},
			OwnerReferences: []metav1.OwnerReference{s.owner},
		},
		Spec: spec,
	}
	var err error
	if known {
		obj.ResourceVersion = cur.rv
		err = s.c.Update(ctx, obj)
	} else if err = s.c.Create(ctx, obj); apierrors.IsAlreadyExists(err) {
		// Left by an earlier process of this holder, or by this one
		// before it read it.
		var old v1alpha1.IPBlockShare
		if err = s.reader.Get(ctx, client.ObjectKey{Name: name}, &old); err == nil {
			obj.ResourceVersion = old.ResourceVersion
			err = s.c.Update(ctx, obj)
		}
	}
	if err != nil {
		// Whether it landed or not, read it before the next write.
		s.mu.Lock()
		delete(s.own, prefix)
		s.mu.Unlock()
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) || apierrors.IsAlreadyExists(err) {
			// Written or deleted by another process: a holder that took
			// this one's claims over, or an earlier process of it.
			return fmt.Errorf("write IPBlockShare %s: %w: %w", name, ipam.ErrStoreConflict, err)
		}
		return fmt.Errorf("write IPBlockShare %s: %w", name, err)
	}
	s.mu.Lock()
	s.own[prefix] = ownShare{rv: obj.ResourceVersion, spec: spec}
	s.mu.Unlock()
	return nil
}

// dropShares deletes the shares of the holders that claimed addresses in
// the block (prev, the IPBlock before the write) or were listed there, and
// claim nothing in b, as written: they left it, or were taken over. A
// share left behind, after an error, is read by nobody.
func (s *Store) dropShares(ctx context.Context, prev *v1alpha1.IPBlockSpec, b ipam.Block) {
	gone := map[string]bool{}
	for _, h := range prev.Shares {
		gone[h] = true
	}
	for h := range prev.Claims {
		gone[h] = true
	}
	for h := range gone {
		if bm := b.Claims[h]; h == "" || bm != nil && !bm.Empty() {
			continue
		}
		if h == s.holder {
			s.mu.Lock()
			delete(s.own, b.Prefix)
			s.mu.Unlock()
		}
		obj := &v1alpha1.IPBlockShare{ObjectMeta: metav1.ObjectMeta{Name: ShareName(s.pool, b.Prefix, h)}}
		_ = s.c.Delete(ctx, obj)
	}
}

// remember records the IPBlock's spec at rv.
func (s *Store) remember(prefix netip.Prefix, rv string, spec *v1alpha1.IPBlockSpec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen[prefix] = seenBlock{rv: rv, spec: *spec.DeepCopy()}
}

// forget drops what this Store keeps of a block that is gone.
func (s *Store) forget(prefix netip.Prefix) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.seen, prefix)
	delete(s.own, prefix)
}

// sameSpec reports whether two IPBlock specs say the same.
func sameSpec(a, b *v1alpha1.IPBlockSpec) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}
