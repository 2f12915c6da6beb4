package kubestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vmipam/vmipam/api/v1alpha1"
	"github.com/vmipam/vmipam/ipam"
)

// hashLen is how many hex digits of a SHA-256 stand in for the cut part of a
// pool name too long to fit in a block's name or a label value.
const hashLen = 10

// listPageSize bounds one List response: a block whose every address cools
// down weighs some 55 KiB.
const listPageSize = 100

// Store is an ipam.Store for one pool and one holder that keeps each block
// in an IPBlock named by BlockName, labelled with the pool and owned by the
// IPPool, and the holder's own part of it (the addresses it has in use or
// armed, and its cooldowns) in an IPBlockShare named by ShareName that only
// this holder writes (see shares.go). Put is a compare-and-swap on the
// objects' resourceVersions. It is safe for concurrent use.
type Store struct {
	c      client.Client
	reader client.Reader
	pool   string
	label  string
	owner  metav1.OwnerReference
	holder string

	mu sync.Mutex
	// seen is, by block, the IPBlock's spec at the version this Store
	// last read or wrote: what Put compares a block against to tell a
	// write of the holder's share alone from one of the IPBlock.
	seen map[netip.Prefix]seenBlock
	// own is, by block, the holder's IPBlockShare as last read or
	// written.
	own map[netip.Prefix]ownShare
}

var _ ipam.Store = (*Store)(nil)

// New returns the Store of pool's blocks for holder. c writes; reader reads
// and must read from the API server, not a cache: pass mgr.GetAPIReader().
// pool must be the IPPool as stored, with its UID, which the objects' owner
// reference names; only its name and UID are kept. An empty holder keeps
// no share: its Puts write what they are given into the IPBlock.
func New(c client.Client, reader client.Reader, pool *v1alpha1.IPPool, holder string) *Store {
	return &Store{
		c:      c,
		reader: reader,
		pool:   pool.Name,
		label:  PoolLabelValue(pool.Name),
		owner:  *metav1.NewControllerRef(pool, v1alpha1.GroupVersion.WithKind("IPPool")),
		holder: holder,
		seen:   map[netip.Prefix]seenBlock{},
		own:    map[netip.Prefix]ownShare{},
	}
}

// Read returns every block of pool as vmipam reads it, each IPBlock
// merged with the IPBlockShares of its holders: for tools and tests that
// look at the persisted state without writing it.
func Read(ctx context.Context, reader client.Reader, pool string) ([]ipam.Block, error) {
	s := &Store{reader: reader, pool: pool, label: PoolLabelValue(pool), seen: map[netip.Prefix]seenBlock{}, own: map[netip.Prefix]ownShare{}}
	return s.List(ctx)
}

// BlockName returns the name of the IPBlock that holds block prefix of pool:
// the pool name, a dot, then the address with ':' and '.' turned into '-'
// and the prefix length, as in "pool-a.10-0-16-0-20" or "pool-a.fd00---116".
// It is a valid DNS-1123 subdomain for any valid pool name, and distinct for
// distinct (pool, prefix) pairs; a pool name too long to fit is cut and
// suffixed with a hash of the whole name.
func BlockName(pool string, prefix netip.Prefix) string {
	suffix := PrefixName(prefix)
	if room := validation.DNS1123SubdomainMaxLength - len(".") - len(suffix); len(pool) > room {
		pool = shorten(pool, room)
	}
	return pool + "." + suffix
}

// PrefixName spells prefix as a DNS-1123 label and label value: the
// address with ':' and '.' turned into '-', then the prefix length, as in
// "10-0-16-0-20" or "fd00---116". Distinct prefixes get distinct names.
func PrefixName(prefix netip.Prefix) string {
	a := prefix.Addr().WithZone("")
	s := a.String()
	switch {
	case a.Is4In6():
		// The mixed form "::ffff:10.0.0.0" would read as the plain IPv6
		// "::ffff:10:0:0:0" once dots became dashes.
		s = a.StringExpanded()
	case strings.HasPrefix(s, ":"):
		// A label must start with an alphanumeric; no canonical address
		// starts with "0::", so this stays unambiguous.
		s = "0" + s
	}
	return strings.NewReplacer(":", "-", ".", "-").Replace(s) + "-" + strconv.Itoa(prefix.Bits())
}

// PoolLabelValue returns the value of the v1alpha1.PoolLabel label on the
// IPBlocks of pool: the pool name, or, for a name longer than a label value
// may be, the name cut and suffixed with a hash of the whole name. Select
// blocks with it, then check spec.pool, which is always the full name.
func PoolLabelValue(pool string) string {
	if len(pool) <= validation.LabelValueMaxLength {
		return pool
	}
	return shorten(pool, validation.LabelValueMaxLength)
}

// shorten cuts name to at most n characters, the last hashLen+1 of them a
// dash and a hash of the whole name, keeping it a valid DNS-1123 subdomain
// and label value when name is one.
func shorten(name string, n int) string {
	sum := sha256.Sum256([]byte(name))
	h := hex.EncodeToString(sum[:])[:hashLen]
	keep := strings.TrimRight(name[:max(n-1-hashLen, 0)], "-.")
	if keep == "" {
		return h
	}
	return keep + "-" + h
}

// List implements ipam.Store. IPBlocks and IPBlockShares carrying the
// pool's label but naming another pool are skipped.
func (s *Store) List(ctx context.Context) ([]ipam.Block, error) {
	// The IPBlocks first, then the shares: a holder writes its share
	// before the IPBlock, so every claim read has its share's marks read
	// too (Get reads in the same order).
	var blocks []v1alpha1.IPBlock
	var bl v1alpha1.IPBlockList
	if err := s.pages(ctx, &bl, func() {
		for i := range bl.Items {
			if bl.Items[i].Spec.Pool == s.pool {
				blocks = append(blocks, *bl.Items[i].DeepCopy())
			}
		}
	}); err != nil {
		return nil, fmt.Errorf("list IPBlocks of pool %s: %w", s.pool, err)
	}
	shares := map[shareKey]*v1alpha1.IPBlockShare{}
	var sl v1alpha1.IPBlockShareList
	if err := s.pages(ctx, &sl, func() {
		for i := range sl.Items {
			if sh := sl.Items[i].DeepCopy(); sh.Spec.Pool == s.pool {
				shares[shareKey{prefix: sh.Spec.Prefix, holder: sh.Spec.Holder}] = sh
			}
		}
	}); err != nil {
		return nil, fmt.Errorf("list IPBlockShares of pool %s: %w", s.pool, err)
	}
	out := make([]ipam.Block, 0, len(blocks))
	for i := range blocks {
		obj := &blocks[i]
		of := map[string]*v1alpha1.IPBlockShare{}
		for _, h := range obj.Spec.Shares {
			if sh := shares[shareKey{prefix: obj.Spec.Prefix, holder: h}]; sh != nil {
				of[h] = sh
			}
		}
		b, err := s.merge(obj, of)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b ipam.Block) int { return a.Prefix.Compare(b.Prefix) })
	return out, nil
}

// pages lists the pool's objects into list a page at a time, calling each
// after every page.
func (s *Store) pages(ctx context.Context, list client.ObjectList, each func()) error {
	for cont := ""; ; {
		err := s.reader.List(ctx, list, client.MatchingLabels{v1alpha1.PoolLabel: s.label},
			client.Limit(listPageSize), client.Continue(cont))
		if err != nil {
			return err
		}
		each()
		if cont = list.GetContinue(); cont == "" {
			return nil
		}
	}
}

// Get implements ipam.Store.
func (s *Store) Get(ctx context.Context, prefix netip.Prefix) (ipam.Block, error) {
	name := BlockName(s.pool, prefix)
	if err := checkPrefix(prefix); err != nil {
		return ipam.Block{}, fmt.Errorf("get IPBlock %s: %w", name, err)
	}
	var obj v1alpha1.IPBlock
	if err := s.reader.Get(ctx, client.ObjectKey{Name: name}, &obj); err != nil {
		if apierrors.IsNotFound(err) {
			s.forget(prefix)
			return ipam.Block{Prefix: prefix}, nil
		}
		return ipam.Block{}, fmt.Errorf("get IPBlock %s: %w", name, err)
	}
	if obj.Spec.Pool != s.pool {
		return ipam.Block{}, fmt.Errorf("get IPBlock %s: it belongs to pool %q, not %q", name, obj.Spec.Pool, s.pool)
	}
	shares := map[string]*v1alpha1.IPBlockShare{}
	for _, h := range obj.Spec.Shares {
		sh := &v1alpha1.IPBlockShare{}
		switch err := s.reader.Get(ctx, client.ObjectKey{Name: ShareName(s.pool, prefix, h)}, sh); {
		case apierrors.IsNotFound(err):
		case err != nil:
			return ipam.Block{}, fmt.Errorf("get IPBlockShare %s of IPBlock %s: %w", ShareName(s.pool, prefix, h), name, err)
		default:
			shares[h] = sh
		}
	}
	return s.merge(&obj, shares)
}

// Put implements ipam.Store. An empty Version creates the IPBlock; any other
// updates it at that resourceVersion. A create that finds the object, and an
// update that finds it changed or gone, return an error matching
// ipam.ErrStoreConflict (and the API server's error). An update rewrites the
// whole object: labels and owner reference are set again, annotations and
// finalizers others added are dropped.
//
// The holder's own part goes to its IPBlockShare first. A Put that changes
// nothing else (an arming, a flush of allocations and releases) writes the
// share alone, whatever others wrote to the IPBlock since Version, and
// returns Version unchanged.
func (s *Store) Put(ctx context.Context, b ipam.Block) (string, error) {
	name := BlockName(s.pool, b.Prefix)
	if err := checkPrefix(b.Prefix); err != nil {
		return "", fmt.Errorf("write IPBlock %s: %w", name, err)
	}
	if s.owner.UID == "" {
		return "", fmt.Errorf("write IPBlock %s: IPPool %s has no UID: build the Store from the IPPool as read from the API server", name, s.pool)
	}
	prev, err := s.specAt(ctx, b.Prefix, b.Version)
	if err != nil {
		return "", err
	}
	spec, own := s.split(b, prev)
	if own != nil {
		if err := s.putShare(ctx, b.Prefix, *own); err != nil {
			return "", err
		}
	}
	if prev != nil && sameSpec(prev, &spec) {
		return b.Version, nil
	}
	obj := &v1alpha1.IPBlock{
		ObjectMeta: metav1.ObjectMeta{
			Name:            name,
			Labels:          map[string]string{v1alpha1.PoolLabel: s.label},
			OwnerReferences: []metav1.OwnerReference{s.owner},
			ResourceVersion: b.Version,
		},
		Spec: spec,
	}
	if b.Version == "" {
		if err := s.c.Create(ctx, obj); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return "", fmt.Errorf("create IPBlock %s: %w: %w", name, ipam.ErrStoreConflict, err)
			}
			return "", fmt.Errorf("create IPBlock %s: %w", name, err)
		}
	} else if err := s.c.Update(ctx, obj); err != nil {
		// Gone counts as a conflict too: the caller re-reads, finds no
		// block and creates it again.
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return "", fmt.Errorf("update IPBlock %s at resourceVersion %s: %w: %w", name, b.Version, ipam.ErrStoreConflict, err)
		}
		return "", fmt.Errorf("update IPBlock %s: %w", name, err)
	}
	s.remember(b.Prefix, obj.ResourceVersion, &obj.Spec)
	if prev != nil {
		s.dropShares(ctx, prev, b)
	}
	return obj.ResourceVersion, nil
}

// Delete implements ipam.Store: it deletes the IPBlock of prefix if its
// resourceVersion is still version, then the block's IPBlockShares. A
// block already gone is no error.
func (s *Store) Delete(ctx context.Context, prefix netip.Prefix, version string) error {
	name := BlockName(s.pool, prefix)
	if err := checkPrefix(prefix); err != nil {
		return fmt.Errorf("delete IPBlock %s: %w", name, err)
	}
	obj := &v1alpha1.IPBlock{ObjectMeta: metav1.ObjectMeta{Name: name}}
	err := s.c.Delete(ctx, obj, client.Preconditions{ResourceVersion: &version})
	switch {
	case err == nil, apierrors.IsNotFound(err):
		s.forget(prefix)
		// Left behind, a share is read by nobody (no IPBlock lists its
		// holder) and overwritten by its holder's next write there.
		_ = s.c.DeleteAllOf(ctx, &v1alpha1.IPBlockShare{}, client.MatchingLabels{
			v1alpha1.PoolLabel: s.label, v1alpha1.BlockLabel: BlockLabelValue(s.pool, prefix)})
		return nil
	case apierrors.IsConflict(err):
		return fmt.Errorf("delete IPBlock %s at resourceVersion %s: %w: %w", name, version, ipam.ErrStoreConflict, err)
	}
	return fmt.Errorf("delete IPBlock %s: %w", name, err)
}

// decode turns an IPBlock of this pool into a Block versioned by its
// resourceVersion, as the IPBlock alone says it.
func (s *Store) decode(obj *v1alpha1.IPBlock) (ipam.Block, error) {
	e := EncodedOf(obj)
	b, err := e.Decode(obj.ResourceVersion)
	if err != nil {
		return ipam.Block{}, fmt.Errorf("read IPBlock %s: %w", obj.Name, err)
	}
	// Get finds a block only under this name, so a block stored under
	// another one would be invisible to it, and a second copy could be
	// created beside it: refuse rather than merge two truths.
	if want := BlockName(s.pool, b.Prefix); obj.Name != want {
		return ipam.Block{}, fmt.Errorf("read IPBlock %s: it holds block %s of pool %s, which vmipam keeps in IPBlock %s: this object was not written by vmipam",
			obj.Name, b.Prefix, s.pool, want)
	}
	return b, nil
}

// checkPrefix refuses a prefix that is not a block, which would be stored
// under a name no reader looks up and fail to decode.
func checkPrefix(p netip.Prefix) error {
	if !p.IsValid() || p.Addr().Zone() != "" || p.Masked() != p || p.Bits() != p.Addr().BitLen()-ipam.BlockBits {
		return fmt.Errorf("prefix %s is not a block: want a masked /%d (IPv4) or /%d (IPv6)", p, 32-ipam.BlockBits, 128-ipam.BlockBits)
	}
	return nil
}

// EncodedOf returns an IPBlock's spec as ipam's persisted form.
func EncodedOf(obj *v1alpha1.IPBlock) ipam.EncodedBlock {
	e := ipam.EncodedBlock{Prefix: obj.Spec.Prefix, Claims: obj.Spec.Claims, InUse: obj.Spec.InUse, Armed: obj.Spec.Armed,
		Cooldowns: obj.Spec.Cooldowns, Format: int(obj.Spec.Format)}
	if len(obj.Spec.Requests) > 0 {
		e.Requests = make(map[string]ipam.EncodedRequest, len(obj.Spec.Requests))
		for h, r := range obj.Spec.Requests {
			e.Requests[h] = ipam.EncodedRequest{Count: int(r.Count), Addrs: r.Addrs, Refused: r.Refused}
		}
	}
	return e
}

func requestsOf(in map[string]ipam.EncodedRequest) map[string]v1alpha1.IPBlockRequest {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]v1alpha1.IPBlockRequest, len(in))
	for h, r := range in {
		out[h] = v1alpha1.IPBlockRequest{Count: int32(r.Count), Addrs: r.Addrs, Refused: r.Refused}
	}
	return out
}
