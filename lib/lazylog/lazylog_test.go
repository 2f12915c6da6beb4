package lazylog

import (
	"errors"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// recorder is a sink that counts the values it was given and records the
// lines it wrote.
type recorder struct {
	lines      *[]string
	withValues *int
	kv         []any
	name       string
	verbosity  int
}

func (r recorder) Init(logr.RuntimeInfo)  {}
func (r recorder) Enabled(level int) bool { return level <= r.verbosity }
func (r recorder) Info(level int, msg string, kv ...any) {
	*r.lines = append(*r.lines, r.line(msg, kv))
}
func (r recorder) Error(err error, msg string, kv ...any) {
	*r.lines = append(*r.lines, r.line(msg+": "+err.Error(), kv))
}
func (r recorder) WithValues(kv ...any) logr.LogSink {
	*r.withValues++
	r.kv = append(append([]any{}, r.kv...), kv...)
	return r
}
func (r recorder) WithName(name string) logr.LogSink {
	r.name = strings.TrimPrefix(r.name+"/"+name, "/")
	return r
}
func (r recorder) line(msg string, kv []any) string {
	var b strings.Builder
	b.WriteString(r.name + " " + msg)
	for _, v := range append(append([]any{}, r.kv...), kv...) {
		b.WriteString(" " + v.(string))
	}
	return b.String()
}

func TestWrap(t *testing.T) {
	tests := []struct {
		name string
		log  func(l logr.Logger)
		// want are the lines written; withValues, how often the
		// underlying sink was given values.
		want       []string
		withValues int
	}{
		{name: "values without a line cost nothing",
			log: func(l logr.Logger) {
				l.WithValues("k", "v").WithValues("k2", "v2").V(1).Info("hidden")
			}},
		{name: "an enabled line carries every value, in order",
			log: func(l logr.Logger) {
				l.WithName("a").WithValues("k", "v").WithName("b").WithValues("k2", "v2").Info("shown", "x", "y")
			},
			want: []string{"a/b shown k v k2 v2 x y"}, withValues: 1},
		{name: "errors are always written",
			log: func(l logr.Logger) {
				l.WithValues("k", "v").Error(errors.New("boom"), "failed")
			},
			want: []string{" failed: boom k v"}, withValues: 1},
		{name: "siblings do not share values",
			log: func(l logr.Logger) {
				base := l.WithValues("k", "v")
				base.WithValues("a", "1").Info("one")
				base.WithValues("b", "2").Info("two")
			},
			want: []string{" one k v a 1", " two k v b 2"}, withValues: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var lines []string
			n := 0
			tt.log(Wrap(logr.New(recorder{lines: &lines, withValues: &n})))
			if strings.Join(lines, "\n") != strings.Join(tt.want, "\n") || n != tt.withValues {
				t.Errorf("lines %q with %d WithValues; want %q with %d", lines, n, tt.want, tt.withValues)
			}
		})
	}
}

// TestWrapKeepsTheCaller: the underlying logger still reports the line's
// caller, not this package.
func TestWrapKeepsTheCaller(t *testing.T) {
	var got string
	l := funcr.New(func(_, args string) { got = args }, funcr.Options{LogCaller: funcr.All})
	Wrap(l).WithValues("k", "v").Info("here")
	if !strings.Contains(got, "lazylog_test.go") {
		t.Errorf("caller in %s; want lazylog_test.go", got)
	}
}
