package ipam

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"maps"
	"math/bits"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// BlockBits is log2 of the number of addresses in a persisted block. A block
// of 4096 addresses keeps its claim bitmap at 512 bytes per holder and even a
// block whose every address is cooling down well under 64 KiB encoded, far
// below the 256 KiB limit set for one object, while a /12 IPv4 pool needs
// only 256 blocks.
const BlockBits = 12

// BlockSize is the number of addresses in a block.
const BlockSize = 1 << BlockBits

// BlockOf returns the block prefix that holds a.
func BlockOf(a netip.Addr) netip.Prefix {
	p, _ := a.Prefix(a.BitLen() - BlockBits)
	return p
}

// blockOffset is a's index inside its block.
func blockOffset(a netip.Addr) int {
	return int(toU128(a).lo & (BlockSize - 1))
}

// blockAddr returns the address at offset off of block p.
func blockAddr(p netip.Prefix, off int) netip.Addr {
	return fromU128(toU128(p.Addr()).add(uint64(off)), p.Addr().Is4())
}

// Bitmap is a set of offsets inside one block.
type Bitmap [BlockSize / 64]uint64

// Has reports whether offset i is set.
func (b *Bitmap) Has(i int) bool { return b[i/64]&(1<<(i%64)) != 0 }

// Set adds offset i.
func (b *Bitmap) Set(i int) { b[i/64] |= 1 << (i % 64) }

// Clear removes offset i.
func (b *Bitmap) Clear(i int) { b[i/64] &^= 1 << (i % 64) }

// Empty reports whether no offset is set.
func (b *Bitmap) Empty() bool { return *b == Bitmap{} }

// Each calls f with every offset set, in order.
func (b *Bitmap) Each(f func(off int)) {
	for w, x := range b {
		for x != 0 {
			f(w*64 + bits.TrailingZeros64(x))
			x &= x - 1
		}
	}
}

// Count returns how many offsets are set.
func (b *Bitmap) Count() int {
	n := 0
	for _, x := range b {
		n += bits.OnesCount64(x)
	}
	return n
}

// Block is the persisted state of one block of a pool's addresses: which
// holder (Manager) has claimed which address, and the cooldown deadlines of
// released addresses. Allocations themselves are not persisted here: they
// live on the virtual machines, which recovery reads.
type Block struct {
	// Prefix is the block, aligned to BlockBits host bits.
	Prefix netip.Prefix
	// Version is the store's opaque version of this block; empty for a block
	// that does not exist yet. Writes are compare-and-swap on it.
	Version string
	// Claims maps a holder to the addresses it has claimed. No address is
	// claimed by two holders: a holder sets a bit only in a write over a
	// version that shows no other holder's bit there.
	Claims map[string]*Bitmap
	// InUse maps a holder to its claimed addresses that were pending or
	// allocated when it last wrote the block; Armed, to its free addresses
	// that it may hand out before it writes the block again. Together they
	// are every address of the holder that a crash may have left in use:
	// recovery rests those and frees the rest of the holder's claims.
	InUse, Armed map[string]*Bitmap
	// Cooldowns maps released addresses to the end of their cooldown.
	Cooldowns map[netip.Addr]time.Time
	// Requests maps a holder to what it asks the block's other holders to
	// hand over: a count of any free addresses, and specific ones.
	Requests map[string]Request
	// Exact reports that InUse and Armed are recorded: a block written by
	// an older version of vmipam is read as if every claimed address might
	// be in use.
	Exact bool
}

// Request is a holder's request for addresses another holder claims.
type Request struct {
	// Count is how many of any free addresses it asks for.
	Count int
	// Addrs are specific addresses it asks for (static requests); nil when
	// none.
	Addrs *Bitmap
	// Refused says, by offset, why the holder of a specific address asked
	// for did not hand it over: the answer the requester reads and then
	// withdraws. At most maxRefusals.
	Refused map[int]Refusal
}

// Asks reports whether r asks for anything (a request may hold only
// refusals, waiting for their reader).
func (r Request) Asks() bool { return r.Count > 0 || r.Addrs != nil && !r.Addrs.Empty() }

// empty reports whether r holds nothing any more.
func (r Request) empty() bool { return !r.Asks() && len(r.Refused) == 0 }

// Refusal is why a holder did not hand over an address: pending for, or
// allocated to, the object Ref names, or cooling down until Until.
type Refusal struct {
	State State
	Ref   string
	Until time.Time
}

// maxRefusals bounds the refusals a request holds, and maxRefusalRef the
// length of a Ref in one (a namespace and a name fit).
const (
	maxRefusals   = 64
	maxRefusalRef = 317
)

// encode is the persisted form of a refusal: "allocated <ref>", "pending
// <ref>" or "cooldown <RFC 3339 time>"; false for a state that gives no
// reason.
func (f Refusal) encode() (string, bool) {
	switch f.State {
	case StateCooldown:
		return "cooldown " + f.Until.UTC().Format(time.RFC3339), true
	case StateAllocated, StatePending:
		return f.State.String() + " " + f.Ref[:min(len(f.Ref), maxRefusalRef)], true
	}
	return "", false
}

func decodeRefusal(s string) (Refusal, bool) {
	word, rest, _ := strings.Cut(s, " ")
	switch word {
	case StateCooldown.String():
		t, err := time.Parse(time.RFC3339, rest)
		return Refusal{State: StateCooldown, Until: t}, err == nil
	case StateAllocated.String():
		return Refusal{State: StateAllocated, Ref: rest}, true
	case StatePending.String():
		return Refusal{State: StatePending, Ref: rest}, true
	}
	return Refusal{}, false
}

// Clone returns a deep copy of b.
func (b Block) Clone() Block {
	c := b
	c.Claims = cloneBitmaps(b.Claims)
	c.InUse = cloneBitmaps(b.InUse)
	c.Armed = cloneBitmaps(b.Armed)
	c.Cooldowns = maps.Clone(b.Cooldowns)
	if b.Requests != nil {
		c.Requests = make(map[string]Request, len(b.Requests))
		for h, r := range b.Requests {
			if r.Addrs != nil {
				cp := *r.Addrs
				r.Addrs = &cp
			}
			r.Refused = maps.Clone(r.Refused)
			c.Requests[h] = r
		}
	}
	return c
}

func cloneBitmaps(m map[string]*Bitmap) map[string]*Bitmap {
	c := make(map[string]*Bitmap, len(m))
	for h, bm := range m {
		cp := *bm
		c[h] = &cp
	}
	return c
}

// has reports whether holder h's bitmap in m has offset off.
func has(m map[string]*Bitmap, h string, off int) bool {
	bm := m[h]
	return bm != nil && bm.Has(off)
}

// ClaimedBy returns the holder that claims a in b, if any.
func (b *Block) ClaimedBy(a netip.Addr) (string, bool) {
	if !b.Prefix.Contains(a) {
		return "", false
	}
	return b.holderOf(blockOffset(a))
}

// Intersect clears every bit of b that is not set in o.
func (b *Bitmap) Intersect(o *Bitmap) {
	for w := range b {
		b[w] &= o[w]
	}
}

// holderOf returns the holder that claimed offset off, if any.
func (b *Block) holderOf(off int) (string, bool) {
	for h, bm := range b.Claims {
		if bm.Has(off) {
			return h, true
		}
	}
	return "", false
}

// EncodedBlock is Block in its persisted form: strings only, compact enough
// that a whole block of 4096 addresses in cooldown stays near 55 KiB.
type EncodedBlock struct {
	// Prefix is the block's CIDR.
	Prefix string `json:"prefix"`
	// Claims maps a holder to its claim bitmap, base64 (standard, padded) of
	// BlockSize/8 bytes, bit i of byte j being offset 8j+i. Trailing zero
	// bytes are trimmed.
	Claims map[string]string `json:"claims,omitempty"`
	// InUse and Armed map a holder to bitmaps in the same encoding.
	InUse map[string]string `json:"inUse,omitempty"`
	Armed map[string]string `json:"armed,omitempty"`
	// Cooldowns is base64 of records sorted by offset: the offset as a
	// big-endian uint16, then the deadline as big-endian int64 Unix seconds
	// (rounded up, so a restart never shortens a cooldown).
	Cooldowns string `json:"cooldowns,omitempty"`
	// Requests maps a holder to its request.
	Requests map[string]EncodedRequest `json:"requests,omitempty"`
	// Format is 2 for blocks that record InUse and Armed, 0 before.
	Format int `json:"format,omitempty"`
}

// EncodedRequest is Request in its persisted form; Refused is keyed by
// the offset in decimal.
type EncodedRequest struct {
	Count   int               `json:"count,omitempty"`
	Addrs   string            `json:"addrs,omitempty"`
	Refused map[string]string `json:"refused,omitempty"`
}

// exactFormat is EncodedBlock.Format for blocks that record InUse and Armed.
const exactFormat = 2

func encodeBitmap(bm *Bitmap) string {
	var raw [BlockSize / 8]byte
	for i, w := range bm {
		binary.LittleEndian.PutUint64(raw[i*8:], w)
	}
	n := len(raw)
	for n > 0 && raw[n-1] == 0 {
		n--
	}
	return base64.StdEncoding.EncodeToString(raw[:n])
}

func encodeBitmaps(m map[string]*Bitmap) map[string]string {
	var out map[string]string
	for h, bm := range m {
		if bm == nil || bm.Empty() {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(m))
		}
		out[h] = encodeBitmap(bm)
	}
	return out
}

func decodeBitmap(s string) (*Bitmap, bool) {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) > BlockSize/8 {
		return nil, false
	}
	var full [BlockSize / 8]byte
	copy(full[:], raw)
	bm := new(Bitmap)
	for i := range bm {
		bm[i] = binary.LittleEndian.Uint64(full[i*8:])
	}
	return bm, true
}

const cooldownRecord = 2 + 8

// Encode returns the persisted form of b.
func (b Block) Encode() EncodedBlock {
	e := EncodedBlock{Prefix: b.Prefix.String(), Claims: encodeBitmaps(b.Claims), InUse: encodeBitmaps(b.InUse), Armed: encodeBitmaps(b.Armed)}
	if b.Exact {
		e.Format = exactFormat
	}
	for h, r := range b.Requests {
		er := EncodedRequest{Count: r.Count}
		if r.Addrs != nil && !r.Addrs.Empty() {
			er.Addrs = encodeBitmap(r.Addrs)
		}
		for off, f := range r.Refused {
			v, ok := f.encode()
			if !ok {
				continue
			}
			if er.Refused == nil {
				er.Refused = make(map[string]string, len(r.Refused))
			}
			er.Refused[strconv.Itoa(off)] = v
		}
		if er.Count == 0 && er.Addrs == "" && len(er.Refused) == 0 {
			continue
		}
		if e.Requests == nil {
			e.Requests = map[string]EncodedRequest{}
		}
		e.Requests[h] = er
	}
	if len(b.Cooldowns) > 0 {
		addrs := slices.SortedFunc(maps.Keys(b.Cooldowns), netip.Addr.Compare)
		raw := make([]byte, 0, len(addrs)*cooldownRecord)
		for _, a := range addrs {
			until := b.Cooldowns[a]
			secs := until.Unix()
			if until.Nanosecond() > 0 {
				secs++
			}
			raw = binary.BigEndian.AppendUint16(raw, uint16(blockOffset(a)))
			raw = binary.BigEndian.AppendUint64(raw, uint64(secs))
		}
		e.Cooldowns = base64.StdEncoding.EncodeToString(raw)
	}
	return e
}

// Decode parses the persisted form of a block; version is the store's.
func (e EncodedBlock) Decode(version string) (Block, error) {
	p, err := netip.ParsePrefix(e.Prefix)
	if err != nil || p.Bits() != p.Addr().BitLen()-BlockBits || p.Masked() != p {
		return Block{}, fmt.Errorf("decode block %q: prefix must be a block-aligned /%d (IPv4) or /%d (IPv6)",
			e.Prefix, 32-BlockBits, 128-BlockBits)
	}
	b := Block{Prefix: p, Version: version, Claims: map[string]*Bitmap{}, InUse: map[string]*Bitmap{}, Armed: map[string]*Bitmap{},
		Cooldowns: map[netip.Addr]time.Time{}, Exact: e.Format >= exactFormat}
	for _, f := range []struct {
		name string
		in   map[string]string
		out  map[string]*Bitmap
	}{{"claims", e.Claims, b.Claims}, {"inUse", e.InUse, b.InUse}, {"armed", e.Armed, b.Armed}} {
		for h, s := range f.in {
			bm, ok := decodeBitmap(s)
			if !ok {
				return Block{}, fmt.Errorf("decode block %s: %s of holder %q: not base64 of at most %d bytes", e.Prefix, f.name, h, BlockSize/8)
			}
			f.out[h] = bm
		}
	}
	for h, r := range e.Requests {
		req := Request{Count: max(r.Count, 0)}
		if r.Addrs != "" {
			bm, ok := decodeBitmap(r.Addrs)
			if !ok {
				return Block{}, fmt.Errorf("decode block %s: request of holder %q: addresses not base64 of at most %d bytes", e.Prefix, h, BlockSize/8)
			}
			req.Addrs = bm
		}
		for k, v := range r.Refused {
			// A refusal that cannot be read is only an answer lost: the
			// requester then says the address is in use, without why.
			off, err := strconv.Atoi(k)
			f, ok := decodeRefusal(v)
			if err != nil || off < 0 || off >= BlockSize || !ok || len(req.Refused) >= maxRefusals {
				continue
			}
			if req.Refused == nil {
				req.Refused = map[int]Refusal{}
			}
			req.Refused[off] = f
		}
		if b.Requests == nil {
			b.Requests = map[string]Request{}
		}
		b.Requests[h] = req
	}
	if e.Cooldowns != "" {
		raw, err := base64.StdEncoding.DecodeString(e.Cooldowns)
		if err != nil || len(raw)%cooldownRecord != 0 {
			return Block{}, fmt.Errorf("decode block %s: cooldowns: not base64 of %d-byte records", e.Prefix, cooldownRecord)
		}
		for i := 0; i < len(raw); i += cooldownRecord {
			off := int(binary.BigEndian.Uint16(raw[i:]))
			if off >= BlockSize {
				return Block{}, fmt.Errorf("decode block %s: cooldown offset %d is outside the block", e.Prefix, off)
			}
			b.Cooldowns[blockAddr(p, off)] = time.Unix(int64(binary.BigEndian.Uint64(raw[i+2:])), 0)
		}
	}
	return b, nil
}
