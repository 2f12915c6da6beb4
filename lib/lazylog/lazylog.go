// Package lazylog defers a logger's key-value pairs until a line is
// written.
//
// controller-runtime gives every reconcile a logger with the controller's
// name, the object's key and a reconcile ID. A zap logger encodes such
// values the moment they are added (it clones its encoder), so under load
// a reconciler that usually writes nothing at the enabled level pays for
// the encoding of every reconcile's values: a quarter of vmipam's
// reconcile CPU in `make bench`. A Wrap'ed logger keeps the values and
// hands them to the underlying logger only for a line that is enabled.
package lazylog

import (
	"slices"

	"github.com/go-logr/logr"
)

// Wrap returns a logger that writes through l and passes the values added
// with WithValues on to l only when a line is written.
func Wrap(l logr.Logger) logr.Logger {
	s := l.GetSink()
	if s == nil {
		return l
	}
	return logr.New(&sink{base: s})
}

// sink is a logr.LogSink that holds its values until a line is written.
type sink struct {
	base logr.LogSink
	kv   []any
}

var (
	_ logr.LogSink          = (*sink)(nil)
	_ logr.CallDepthLogSink = (*sink)(nil)
)

// Init implements logr.LogSink. The underlying sink was initialised by
// its own logger already; lines reach it one frame deeper (see bound).
func (s *sink) Init(logr.RuntimeInfo) {}

// Enabled implements logr.LogSink.
func (s *sink) Enabled(level int) bool { return s.base.Enabled(level) }

// Info implements logr.LogSink.
func (s *sink) Info(level int, msg string, kv ...any) { s.bound().Info(level, msg, kv...) }

// Error implements logr.LogSink.
func (s *sink) Error(err error, msg string, kv ...any) { s.bound().Error(err, msg, kv...) }

// WithValues implements logr.LogSink: it only keeps kv.
func (s *sink) WithValues(kv ...any) logr.LogSink {
	c := *s
	c.kv = slices.Concat(s.kv, kv)
	return &c
}

// WithName implements logr.LogSink.
func (s *sink) WithName(name string) logr.LogSink {
	c := *s
	c.base = s.base.WithName(name)
	return &c
}

// WithCallDepth implements logr.CallDepthLogSink, so that the caller the
// underlying logger reports is the one that wrote the line.
func (s *sink) WithCallDepth(depth int) logr.LogSink {
	cd, ok := s.base.(logr.CallDepthLogSink)
	if !ok {
		return s
	}
	c := *s
	c.base = cd.WithCallDepth(depth)
	return &c
}

// bound is the underlying sink with the kept values, for one line.
func (s *sink) bound() logr.LogSink {
	b := s.base
	if cd, ok := b.(logr.CallDepthLogSink); ok {
		// Info and Error here are one frame deeper than the caller.
		b = cd.WithCallDepth(1)
	}
	if len(s.kv) == 0 {
		return b
	}
	return b.WithValues(s.kv...)
}
