package harness

import (
	"bytes"
	"strings"
	"sync"
)

// LogBuffer collects a process's output, written by the process's copying
// goroutine (or several processes') while a test reads it. Its methods are
// safe for concurrent use.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
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
