// Package memlimit sets the Go runtime's soft memory limit
// (runtime/debug.SetMemoryLimit, what GOMEMLIMIT sets) to a share of the
// memory limit of the cgroup the process runs in, so that the garbage
// collector works harder as a container nears its limit instead of letting
// the heap's slack grow into it and the kernel kill the process. Without a
// limit a Go heap grows to twice what is live between collections, and
// vmipam's live heap is a fraction of its RSS (README, "At scale").
package memlimit

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
)

// unlimited is where cgroup v1 reports no limit: it gives the largest
// page-aligned int64 instead.
const unlimited = int64(1) << 62

// Cgroup returns the memory limit, in bytes, of the cgroup that
// /proc/self/cgroup in fsys (the root file system) names: cgroup v2's
// memory.max, else cgroup v1's memory.limit_in_bytes, at the cgroup's path
// or, inside a container's cgroup namespace, at the root of
// /sys/fs/cgroup. It reports false when there is no limit, or nothing to
// read.
func Cgroup(fsys fs.FS) (int64, bool) {
	v2, v1 := "/", "/"
	if f, err := fsys.Open("proc/self/cgroup"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// hierarchy-ID:controllers:path
			parts := strings.SplitN(sc.Text(), ":", 3)
			switch {
			case len(parts) != 3:
			case parts[0] == "0" && parts[1] == "":
				v2 = parts[2]
			case slices.Contains(strings.Split(parts[1], ","), "memory"):
				v1 = parts[2]
			}
		}
		_ = f.Close()
	}
	for _, p := range []string{
		path.Join("sys/fs/cgroup", v2, "memory.max"), "sys/fs/cgroup/memory.max",
		path.Join("sys/fs/cgroup/memory", v1, "memory.limit_in_bytes"), "sys/fs/cgroup/memory/memory.limit_in_bytes",
	} {
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, false
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= unlimited {
			return 0, false
		}
		return n, true
	}
	return 0, false
}

// Set sets the runtime's soft memory limit to ratio (0 to 1) of the
// cgroup's limit read from fsys, and returns the limit set and the
// cgroup's. It sets nothing, and returns 0, when ratio is 0, when
// GOMEMLIMIT is in the environment (the runtime took it already), or when
// the cgroup has no limit.
func Set(fsys fs.FS, ratio float64) (set, cgroup int64, err error) {
	if ratio < 0 || ratio > 1 {
		return 0, 0, fmt.Errorf("memory limit ratio %v: want 0 to 1", ratio)
	}
	if ratio == 0 || os.Getenv("GOMEMLIMIT") != "" {
		return 0, 0, nil
	}
	limit, ok := Cgroup(fsys)
	if !ok {
		return 0, 0, nil
	}
	set = int64(float64(limit) * ratio)
	if set <= 0 {
		return 0, limit, errors.New("the cgroup's memory limit is too small to set a share of it")
	}
	debug.SetMemoryLimit(set)
	return set, limit, nil
}
