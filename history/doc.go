// Package history keeps who held which address when: every tenure of an
// address by an object, from its create to its deletion, and every
// release an operator asked for, in IPHistory objects.
//
// The addresses are cut into chunks of 256 (an aligned /24 in IPv4, /120
// in IPv6). A chunk's records live in segments, IPHistory objects named
// by SegmentName and labelled with ChunkLabelValue, each of at most
// SegmentRecords records. A Writer appends to a chunk's newest segment in
// batches, so that the releases of a flush cost one write per chunk, and
// starts a new segment when the newest is full; then it prunes the
// chunk's older segments to the newest Keep records of each address and
// the Retention. Read lists one chunk's segments: the history of an
// address costs one List of at most a few hundred kilobytes, whatever the
// pool's size.
package history
