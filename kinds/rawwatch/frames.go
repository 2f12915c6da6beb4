package rawwatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// frames reads the JSON objects of a watch stream one after another, each
// checked with one scan (json.Valid), where encoding/json's Decoder scans
// each value twice (once to find its end, once more to unmarshal it into a
// json.RawMessage) and copies it: a replica reads every event of every
// object it watches whole, most of them objects it does not look after.
//
// It finds an object's end by counting brackets outside strings, a scan
// that resumes where it stopped when more of the stream arrives, so an
// object that comes in many reads is scanned once.
//
// An event longer than max is an error, as it is to client-go's streaming
// decoder: a stream whose brackets never close (a broken proxy, a
// truncated write) must not grow the buffer until the process runs out
// of memory.
type frames struct {
	r   io.Reader
	max int
	buf []byte
	// buf[off:n] is what was read and not returned yet.
	off, n int
	// The object being framed starts at off (open); the bracket count
	// scanned it up to pos, where depth brackets were open, inside a
	// string or not, after a backslash in one or not.
	open          bool
	pos, depth    int
	inString, esc bool
	// err is what r returned last, once read.
	err error
}

// newFrames reads the objects of the stream r.
func newFrames(r io.Reader) *frames { return &frames{r: r, max: maxFrame} }

// maxFrame is the longest event frames reads: client-go's streaming
// decoder refuses longer objects too (16 MiB), and etcd stores none
// larger than its request limit (1.5 MiB unless raised).
const maxFrame = 16 << 20

// minRead is the room frames keeps free for a read.
const minRead = 16 << 10

// next returns the next object in the stream, valid until the next call:
// io.EOF at the end of the stream between objects, io.ErrUnexpectedEOF
// inside one, an error for anything but an object of valid JSON.
func (f *frames) next() ([]byte, error) {
	for {
		if !f.open {
			for f.off < f.n && isSpace(f.buf[f.off]) {
				f.off++
			}
			if f.off < f.n {
				if c := f.buf[f.off]; c != '{' {
					return nil, fmt.Errorf("watch stream: an event starts with %q, not an object", c)
				}
				f.open, f.pos, f.depth, f.inString, f.esc = true, f.off, 0, false, false
			}
		}
		if f.open {
			if end, ok := f.scan(); ok {
				frame := f.buf[f.off:end]
				f.off, f.open = end, false
				if len(frame) > f.max {
					return nil, f.tooLong()
				}
				if !json.Valid(frame) {
					return nil, errors.New("watch stream: an event is not valid JSON")
				}
				return frame, nil
			}
		}
		if f.open && f.n-f.off > f.max {
			return nil, f.tooLong()
		}
		if f.err != nil {
			if errors.Is(f.err, io.EOF) && f.open {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, f.err
		}
		f.fill()
	}
}

// tooLong is the error for an event longer than f.max.
func (f *frames) tooLong() error {
	return fmt.Errorf("watch stream: an event is longer than %d bytes", f.max)
}

// scan counts brackets from pos, and returns the end of the open object
// if it is in buf.
func (f *frames) scan() (int, bool) {
	buf, depth, inString, esc := f.buf[:f.n], f.depth, f.inString, f.esc
	for i := f.pos; i < len(buf); i++ {
		c := buf[i]
		if inString {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				return i + 1, true
			}
		}
	}
	f.pos, f.depth, f.inString, f.esc = len(buf), depth, inString, esc
	return 0, false
}

// fill reads more of the stream into buf, first moving what is left to
// its start, or growing it, when the room left is short.
func (f *frames) fill() {
	if len(f.buf)-f.n < minRead {
		if f.n-f.off+minRead > len(f.buf) {
			grown := make([]byte, max(2*len(f.buf), f.n-f.off+minRead))
			copy(grown, f.buf[f.off:f.n])
			f.buf = grown
		} else {
			copy(f.buf, f.buf[f.off:f.n])
		}
		f.n -= f.off
		f.pos -= f.off
		f.off = 0
	}
	m, err := f.r.Read(f.buf[f.n:])
	f.n += m
	f.err = err
}

// isSpace reports whether c is JSON whitespace.
func isSpace(c byte) bool {
	return c == ' ' || c == '\n' || c == '\r' || c == '\t'
}
