package jsonscan

import (
	"math/bits"
	"slices"
)

// Extract returns, for each path, the raw bytes of the value at that path
// in the JSON document data, or nil when there is none.
//
// A path is a list of object member names from the root: {"metadata",
// "annotations", "vmipam.io/token"} is the value of that annotation. A path
// is absent when a member is missing or when a value on the way is not an
// object; an empty path is the whole document. Names match exactly and
// case-sensitively after JSON unescaping (a member written "spe\u0063"
// matches "spec"), and when an object holds a name twice the last one
// wins, as with encoding/json.
//
// Each value is a subslice of data with no surrounding whitespace and its
// capacity clipped to its length; nothing is copied. Extract reads data
// once for all paths together, skipping every member not on the way to a
// wanted value without decoding it, so its cost is linear in len(data)
// plus, for each member of an object on a wanted path, a comparison of its
// name with the paths that go through that object.
//
// data must be valid JSON (see json.Valid); otherwise the result is
// unspecified, but Extract does not panic, hang or read outside data.
// Extract allocates the result slice (AppendExtract avoids even that) and,
// for more than 64 paths or a path of more than 15 names, may allocate a
// little bookkeeping.
func Extract(data []byte, paths ...[]string) [][]byte {
	return AppendExtract(make([][]byte, 0, len(paths)), data, paths...)
}

// AppendExtract is Extract appending the values to dst, one per path, and
// returning the extended slice. With room in dst for the results, up to 64
// paths and none longer than 15 names, it does not allocate.
func AppendExtract(dst [][]byte, data []byte, paths ...[]string) [][]byte {
	base := len(dst)
	dst = slices.Grow(dst, len(paths))[:base+len(paths)]
	out := dst[base:]
	clear(out)
	if len(paths) == 0 {
		return dst
	}

	// One bit set of path indices per object level being walked: level d
	// holds the paths whose first d names led to the current object. Most
	// calls fit in the array below and stay off the heap.
	words := (len(paths) + 63) / 64
	longest := 0
	for _, p := range paths {
		longest = max(longest, len(p))
	}
	var buf [16]uint64
	var sets []uint64
	if n := words * (longest + 1); n <= len(buf) {
		sets = buf[:n]
	} else {
		sets = make([]uint64, n)
	}

	whole := false
	walk := false
	for j, p := range paths {
		if len(p) == 0 {
			whole = true
			continue
		}
		sets[j/64] |= 1 << (j % 64)
		walk = true
	}

	start := skipSpace(data, 0)
	if start >= len(data) {
		return dst
	}
	var end int
	switch {
	case walk && data[start] == '{':
		w := walker{data: data, paths: paths, out: out, words: words}
		end = w.object(sets, start+1, 0)
	case whole:
		end = skipValue(data, start)
	default:
		return dst
	}
	if end < 0 {
		clear(out)
		return dst
	}
	if whole {
		for j, p := range paths {
			if len(p) == 0 {
				out[j] = data[start:end:end]
			}
		}
	}
	return dst
}

// walker holds the state of one Extract: the document, the wanted paths
// and their results.
type walker struct {
	data  []byte
	paths [][]string
	out   [][]byte
	words int
}

// object walks the members of the object whose '{' is just before i, at
// level d (the object reached by the first d names of its paths); sets
// holds the bit sets of paths in play, words words per level. (They are
// not in walker, so that escape analysis, which does not tell fields apart
// once results are stored through w, can keep them on the stack.) It
// descends only into members some path goes through, skips the others,
// and returns the index just past the closing '}', or -1 if data is
// malformed. Recursion is bounded by the length of the longest path, not
// by the nesting of data.
func (w *walker) object(sets []uint64, i, d int) int {
	data := w.data
	active := sets[d*w.words : (d+1)*w.words]
	// Every path in active is longer than d, so d+1 <= longest and the
	// child level exists.
	child := sets[(d+1)*w.words : (d+2)*w.words]

	i = skipSpace(data, i)
	if i < len(data) && data[i] == '}' {
		return i + 1
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return -1
		}
		keyEnd := skipString(data, i+1)
		if keyEnd < 0 {
			return -1
		}
		k := newName(data[i+1 : keyEnd-1])
		i = skipSpace(data, keyEnd)
		if i >= len(data) || data[i] != ':' {
			return -1
		}
		i = skipSpace(data, i+1)
		if i >= len(data) {
			return -1
		}
		start := i

		clear(child)
		terminal, descend := false, false
		for wi, word := range active {
			for ; word != 0; word &= word - 1 {
				j := wi*64 + bits.TrailingZeros64(word)
				p := w.paths[j]
				if !k.equals(p[d]) {
					continue
				}
				// A later member of the same name replaces whatever an
				// earlier one gave this path, even if it gives nothing.
				w.out[j] = nil
				if len(p) == d+1 {
					terminal = true
				} else {
					child[wi] |= 1 << (j % 64)
					descend = true
				}
			}
		}

		var end int
		if descend && data[i] == '{' {
			end = w.object(sets, i+1, d+1)
		} else {
			end = skipValue(data, i)
		}
		if end < 0 {
			return -1
		}
		if terminal {
			for wi, word := range active {
				for ; word != 0; word &= word - 1 {
					j := wi*64 + bits.TrailingZeros64(word)
					if p := w.paths[j]; len(p) == d+1 && k.equals(p[d]) {
						w.out[j] = data[start:end:end]
					}
				}
			}
		}

		i = skipSpace(data, end)
		if i >= len(data) {
			return -1
		}
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
		case '}':
			return i + 1
		default:
			return -1
		}
	}
}

// name is an object member name ready for comparison with the names in
// the wanted paths.
type name struct {
	raw   []byte // between the quotes
	plain bool   // raw means itself, see isPlain
}

// newName prepares the member name whose quotes enclose raw.
func newName(raw []byte) name {
	return name{raw: raw, plain: isPlain(raw)}
}

// equals reports whether the name decodes to want.
func (n *name) equals(want string) bool {
	if n.plain {
		return string(n.raw) == want
	}
	return unescapedEquals(n.raw, want)
}
