package ctl

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// parseWhen reads a time flag: an RFC 3339 time (2026-03-01T14:00:00Z or
// with an offset), or a duration back from now: "90m", "2h", "3d" (days of
// 24 hours), "1w". flag names the flag in the error.
func parseWhen(flag, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, fmt.Errorf("--%s is empty: give an RFC 3339 time such as 2026-03-01T14:00:00Z, or a duration back from now such as 2h or 3d", flag)
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	d, err := parseAgo(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s %q: want an RFC 3339 time such as 2026-03-01T14:00:00Z, or a duration back from now such as 2h or 3d", flag, s)
	}
	return now.Add(-d), nil
}

// parseAgo reads a non-negative duration, allowing days (d) and weeks (w)
// as a whole leading number, as in "3d" or "1w2h".
func parseAgo(s string) (time.Duration, error) {
	var d time.Duration
	for _, unit := range []struct {
		suffix string
		size   time.Duration
	}{{"w", 7 * 24 * time.Hour}, {"d", 24 * time.Hour}} {
		if n, rest, ok := strings.Cut(s, unit.suffix); ok {
			v, err := strconv.ParseUint(n, 10, 31)
			if err != nil {
				return 0, fmt.Errorf("parse %q: %w", s, err)
			}
			d += time.Duration(v) * unit.size
			s = rest
		}
	}
	if s != "" {
		rest, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("parse duration: %w", err)
		}
		d += rest
	}
	if d < 0 {
		return 0, fmt.Errorf("duration %s is negative", d)
	}
	return d, nil
}
