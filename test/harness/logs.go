package harness

import (
	"bytes"
	"io"
	"strconv"
	"strings"
	"sync"
)

// LogBuffer collects a process's output, written by the process's copying
// goroutine (or several processes') while a test reads it. Its methods are
// safe for concurrent use.
type LogBuffer struct {
	// Max, if not zero, bounds the bytes kept: a flood of log lines must
	// not take the machine's memory. What comes once it is full is
	// dropped (and counted), so the beginning of a run, where a failure
	// usually starts, stays; Mark's lines are kept regardless.
	Max int

	mu      sync.Mutex
	buf     bytes.Buffer
	dropped int
}

// Write appends p, unless that would take the buffer past Max.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.Max > 0 && b.buf.Len()+len(p) > b.Max {
		b.dropped += len(p)
		return len(p), nil
	}
	return b.buf.Write(p)
}

// Mark appends a line of the test's own, so a reader sees where each
// process begins and ends, and returns its offset, for Since.
func (b *LogBuffer) Mark(line string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	off := b.buf.Len()
	b.buf.WriteString(strings.TrimSuffix(line, "\n") + "\n")
	return off
}

// String returns everything kept so far.
func (b *LogBuffer) String() string {
	return b.Since(0)
}

// Since returns what was kept from offset off on.
func (b *LogBuffer) Since(off int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if off > b.buf.Len() {
		return ""
	}
	return string(b.buf.Bytes()[off:])
}

// Dropped returns how many bytes were dropped once the buffer was full.
func (b *LogBuffer) Dropped() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dropped
}

// Grep returns the last limit lines of text that contain any of words.
func Grep(text string, limit int, words ...string) []string {
	var out []string
	for line := range strings.SplitSeq(text, "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	if len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out
}

// Tail returns the last n lines of text.
func Tail(text string, n int) []string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

// Tagged returns a writer that adds "replica":i as the first field of each
// JSON line it passes to w, so that the lines of several processes logging
// into one buffer say whose they are. A line split over writes is tagged
// once, at its start. Lines that are not JSON objects pass as they are.
func Tagged(w io.Writer, i int) io.Writer {
	return &tagged{w: w, tag: []byte(`{"replica":` + strconv.Itoa(i) + `,`), start: true}
}

type tagged struct {
	w     io.Writer
	tag   []byte
	start bool // the next byte begins a line
}

// Write tags the lines of p and writes them to w in one call. A process's
// output is copied by one goroutine, so writes do not overlap.
func (t *tagged) Write(p []byte) (int, error) {
	out := make([]byte, 0, len(p)+len(t.tag)*4)
	for rest := p; len(rest) > 0; {
		if t.start && rest[0] == '{' {
			out = append(out, t.tag...)
			rest = rest[1:]
		}
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			out = append(out, rest...)
			t.start = false
			break
		}
		out = append(out, rest[:i+1]...)
		rest = rest[i+1:]
		t.start = true
	}
	if _, err := t.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}
