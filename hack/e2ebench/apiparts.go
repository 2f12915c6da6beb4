package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// profilePart is a part of a process's work that a profile is split into:
// the samples with a function matching re on their stack.
type profilePart struct {
	name string
	re   *regexp.Regexp
}

// apiserverParts split the API server's profiles. A sample goes to the
// first part that matches a function on its stack, so the parts do not
// overlap and, with the rest, add up to the profile: the admission policy
// and the object's validation run inside the store's create, which runs
// inside the create's handler, so they come first.
var apiserverParts = []profilePart{
	{"vmipam's admission policies (ValidatingAdmissionPolicy, CEL)", regexp.MustCompile(`/admission/plugin/policy/validating\.`)},
	{"the mutating webhook's call (the review's encoding, the round trip, the answer's decoding, the patch)", regexp.MustCompile(`/admission/plugin/webhook/mutating\.`)},
	{"the object's validation (the schema, the CRD's rules, the metadata)", regexp.MustCompile(`customresource\.customResourceStrategy\.Validate`)},
	{"the store's create (the object's encoding, etcd's write)", regexp.MustCompile(`/storage/etcd3\.\(\*store\)\.Create`)},
	{"the rest of the create's handler (the body's decoding, defaulting, the answer)", regexp.MustCompile(`\.CreateResource\.`)},
	{"the watch cache reading etcd's events", regexp.MustCompile(`/storage/etcd3\.\(\*watchChan\)|/storage/cacher\.\(\*watchCache\)`)},
	{"serving watches", regexp.MustCompile(`handlers\.\(\*WatchServer\)|/storage/cacher\.\(\*cacheWatcher\)|/storage/cacher\.\(\*Cacher\)\.dispatchEvent`)},
	{"the garbage collector", regexp.MustCompile(`^runtime\.(gcBgMarkWorker|gcAssistAlloc|bgsweep|bgscavenge)$`)},
	{"other requests, and the server and its filters around every request", regexp.MustCompile(`^net/http\.\(\*conn\)\.serve$|http2\.\(\*serverConn\)`)},
}

// profileSplit is a profile's CPU by part: parts[i] for the i-th part,
// rest for the samples no part matched, total for all (seconds).
type profileSplit struct {
	parts       []float64
	rest, total float64
}

// splitTraces splits a profile printed by `go tool pprof -traces` into
// parts: each trace is a line of dashes, then its value and leaf
// function, then one function a line up to its root.
func splitTraces(r io.Reader, parts []profilePart) (profileSplit, error) {
	s := profileSplit{parts: make([]float64, len(parts))}
	var v float64
	matched, inTrace := -1, false
	flush := func() {
		if !inTrace || v < 0 {
			return // a trace's separator, with no trace after it
		}
		s.total += v
		if matched >= 0 {
			s.parts[matched] += v
		} else {
			s.rest += v
		}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "-----------+"):
			flush()
			inTrace, v, matched = true, -1, -1
			continue
		case !inTrace || line == "":
			continue
		}
		fn := line
		if v < 0 {
			value, leaf, ok := strings.Cut(line, " ")
			d, err := time.ParseDuration(value)
			if !ok || err != nil {
				return profileSplit{}, fmt.Errorf("a trace starts with %q, not a value and a function", line)
			}
			v, fn = d.Seconds(), strings.TrimSpace(leaf)
		}
		fn = strings.TrimSuffix(fn, " (inline)")
		for i := range parts {
			if matched >= 0 && i >= matched {
				break
			}
			if parts[i].re.MatchString(fn) {
				matched = i
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return profileSplit{}, err
	}
	flush()
	return s, nil
}

// splitProfile splits the CPU profile at path into parts with go tool
// pprof.
func splitProfile(ctx context.Context, path string, parts []profilePart) (profileSplit, error) {
	cmd := exec.CommandContext(ctx, "go", "tool", "pprof", "-traces", path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return profileSplit{}, fmt.Errorf("go tool pprof -traces %s: %w: %s", path, err, strings.TrimSpace(stderr.String()))
	}
	return splitTraces(bytes.NewReader(out), parts)
}

// apiserverProfile is the file profile writes the API server's profile
// named name to, in the results folder.
func apiserverProfile(name string) string { return "e2e-bench-apiserver-" + name + ".pprof" }

// apiserverSplit is what the API server's profile of each mode's first
// round (-profile) holds, by part; nil for a mode without one.
type apiserverSplit [numModes]*profileSplit

// splitAPIServerProfiles splits the API server's profiles of the first
// round with vmipam and through the no-op webhook that -profile took, the
// two the report compares. A profile that cannot be read is left out (and
// logged): the rest of the report does not depend on it.
func (b *bench) splitAPIServerProfiles(ctx context.Context) apiserverSplit {
	var out apiserverSplit
	for _, m := range []mode{modeWith, modeNoop} {
		path := filepath.Join(b.results, apiserverProfile(m.prefix()))
		if _, err := os.Stat(path); err != nil {
			continue
		}
		s, err := splitProfile(ctx, path, apiserverParts)
		if err != nil {
			logf("the API server's profile of %s: %v", m, err)
			continue
		}
		out[m] = &s
	}
	return out
}

// apiserverPartsSection writes the API server's CPU per create by part
// with vmipam and through the no-op webhook: each part's share of the
// profile of the mode's first round times the API server's CPU per create
// in that round.
func (r *report) apiserverPartsSection(b *strings.Builder) {
	with, noop := r.apiserverSplit[modeWith], r.apiserverSplit[modeNoop]
	rw, rn := r.firstRound(modeWith), r.firstRound(modeNoop)
	if with == nil || noop == nil || with.total <= 0 || noop.total <= 0 || rw == nil || rn == nil || rw.created == 0 || rn.created == 0 {
		return
	}
	w := func(format string, a ...any) { fmt.Fprintf(b, format+"\n", a...) }
	perCreate := func(s *profileSplit, rs *roundStat, v float64) float64 {
		return 1000 * v / s.total * rs.cpu.procs["kube-apiserver"] / float64(rs.created)
	}
	w("Where the API server's CPU per create went, from its profiles of each mode's first round (-profile, %s from the round's start): "+
		"each part's share of the profile times the API server's CPU per create in that round. A sample counts in the first part "+
		"that a function on its stack matches, so the parts do not overlap; \"other requests\" includes vmipam's own requests "+
		"and, for every request, the HTTP server and the filters (authentication, priority and fairness) before its handler.",
		r.opts.profile)
	if short := r.shortRounds(rw, rn); short != "" {
		w("")
		w("%s", short)
	}
	w("")
	t := table{b: b}
	t.header("API server CPU ms per create", "with vmipam", "no-op mutating webhook", "difference")
	row := func(name string, a, n float64) {
		t.row(name, fmt.Sprintf("%.3f", a), fmt.Sprintf("%.3f", n), fmt.Sprintf("%+.3f", noNegZero(a-n)))
	}
	for i, p := range apiserverParts {
		row(p.name, perCreate(with, rw, with.parts[i]), perCreate(noop, rn, noop.parts[i]))
	}
	row("the rest", perCreate(with, rw, with.rest), perCreate(noop, rn, noop.rest))
	row("all", perCreate(with, rw, with.total), perCreate(noop, rn, noop.total))
	w("")
}

// firstRound is mode m's first round, nil if it ran none.
func (r *report) firstRound(m mode) *roundStat {
	for i := range r.rounds {
		if r.rounds[i].mode == m {
			return &r.rounds[i]
		}
	}
	return nil
}

// shortRounds says which of the rounds lasted less than the profile, whose
// samples then include what came after the round; empty if none did.
func (r *report) shortRounds(rs ...*roundStat) string {
	var short []string
	for _, s := range rs {
		if s.rate <= 0 {
			continue
		}
		if lasted := float64(s.created) / s.rate; lasted < r.opts.profile.Seconds() {
			short = append(short, fmt.Sprintf("%s (%.1f s)", s.mode, lasted))
		}
	}
	if len(short) == 0 {
		return ""
	}
	return fmt.Sprintf("The first round %s lasted less than the profile, which then holds what came after it as well "+
		"(the settling of the controllers, the next round's start): more creates (-n) make the rounds outlast it.", strings.Join(short, " and "))
}
