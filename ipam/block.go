package ipam

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"
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
	// Claims maps a holder to the addresses it has claimed.
	Claims map[string]*Bitmap
	// Cooldowns maps released addresses to the end of their cooldown.
	Cooldowns map[netip.Addr]time.Time
}

// Clone returns a deep copy of b.
func (b Block) Clone() Block {
	c := b
	c.Claims = make(map[string]*Bitmap, len(b.Claims))
	for h, bm := range b.Claims {
		cp := *bm
		c.Claims[h] = &cp
	}
	c.Cooldowns = maps.Clone(b.Cooldowns)
	return c
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
	// Cooldowns is base64 of records sorted by offset: the offset as a
	// big-endian uint16, then the deadline as big-endian int64 Unix seconds
	// (rounded up, so a restart never shortens a cooldown).
	Cooldowns string `json:"cooldowns,omitempty"`
}

const cooldownRecord = 2 + 8

// Encode returns the persisted form of b.
func (b Block) Encode() EncodedBlock {
	e := EncodedBlock{Prefix: b.Prefix.String()}
	if len(b.Claims) > 0 {
		e.Claims = make(map[string]string, len(b.Claims))
		for h, bm := range b.Claims {
			if bm.Empty() {
				continue
			}
			var raw [BlockSize / 8]byte
			for i, w := range bm {
				binary.LittleEndian.PutUint64(raw[i*8:], w)
			}
			n := len(raw)
			for n > 0 && raw[n-1] == 0 {
				n--
			}
			e.Claims[h] = base64.StdEncoding.EncodeToString(raw[:n])
		}
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
	b := Block{Prefix: p, Version: version, Claims: map[string]*Bitmap{}, Cooldowns: map[netip.Addr]time.Time{}}
	for h, s := range e.Claims {
		raw, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(raw) > BlockSize/8 {
			return Block{}, fmt.Errorf("decode block %s: claims of holder %q: not base64 of at most %d bytes", e.Prefix, h, BlockSize/8)
		}
		var full [BlockSize / 8]byte
		copy(full[:], raw)
		bm := new(Bitmap)
		for i := range bm {
			bm[i] = binary.LittleEndian.Uint64(full[i*8:])
		}
		b.Claims[h] = bm
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
