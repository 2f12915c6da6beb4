package history

import (
	"net/netip"
	"strconv"

	"github.com/vmipam/vmipam/kubestore"
)

// chunkBits4 and chunkBits6 size a chunk: 256 addresses.
const (
	chunkBits4 = 24
	chunkBits6 = 120
)

// ChunkOf returns the chunk of addr: its aligned /24, or /120 in IPv6.
func ChunkOf(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap().WithZone("")
	bits := chunkBits6
	if addr.Is4() {
		bits = chunkBits4
	}
	return netip.PrefixFrom(addr, bits).Masked()
}

// ChunkLabelValue returns the value of the vmipamv1.ChunkLabel label on
// the segments of chunk, as "10-100-0-0-24".
func ChunkLabelValue(chunk netip.Prefix) string { return kubestore.PrefixName(chunk) }

// SegmentName returns the name of segment seq of chunk: its label value,
// a dot and the sequence, as "10-100-0-0-24.3".
func SegmentName(chunk netip.Prefix, seq int64) string {
	return ChunkLabelValue(chunk) + "." + strconv.FormatInt(seq, 10)
}
