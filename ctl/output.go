package ctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"
)

// printStructured writes v as JSON or YAML, as o.Output asks; it reports
// false for a table, which the caller writes.
func (o *Options) printStructured(v any) (bool, error) {
	switch o.Output {
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return true, fmt.Errorf("write json: %w", err)
		}
		_, err = fmt.Fprintf(o.Out, "%s\n", b)
		return true, err
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return true, fmt.Errorf("write yaml: %w", err)
		}
		_, err = o.Out.Write(b)
		return true, err
	}
	return false, nil
}

// table writes rows under header, aligned as kubectl aligns its tables.
func table(out io.Writer, header []string, rows [][]string) error {
	w := printers.GetNewTabWriter(out)
	pw := &printer{w: w}
	pw.printf("%s\n", strings.Join(header, "\t"))
	for _, r := range rows {
		pw.printf("%s\n", strings.Join(r, "\t"))
	}
	if err := errors.Join(pw.err, w.Flush()); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// printer writes to w until a write fails, and keeps that error: the
// commands write many lines and report one failure.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

// orDash is s, or "-" when empty: a table cell is never blank.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stamp writes t in RFC 3339 (UTC), or "-" for the zero time.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// human writes d as kubectl writes ages: 45s, 12m, 3h20m, 5d4h, 400d.
func human(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + human(-d)
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
		if m == 0 {
			return fmt.Sprintf("%dh", h)
		}
		return fmt.Sprintf("%dh%dm", h, m)
	case d < 100*24*time.Hour:
		days, h := int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour)
		if h == 0 {
			return fmt.Sprintf("%dd", days)
		}
		return fmt.Sprintf("%dd%dh", days, h)
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

// metav1Time is t as the API types hold it.
func metav1Time(t time.Time) metav1.Time { return metav1.NewTime(t) }
