package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// Processes whose CPU time is reported; others on the machine count as
// "other".
var cpuProcs = []string{"vmipam", "kube-apiserver", "etcd", "e2ebench"}

// cpuSample is CPU time in seconds: per process of the run, and of the
// whole machine (busy and total, summed over every core).
type cpuSample struct {
	procs       map[string]float64
	busy, total float64
	// softirq is the kernel's deferred interrupt work (loopback networking
	// among it), which /proc does not charge to any process.
	softirq float64
	steal   float64
}

// sampleCPU reads /proc: this process, its children (the control plane and
// vmipam), and the machine.
func sampleCPU() cpuSample {
	s := cpuSample{procs: map[string]float64{}}
	self := os.Getpid()
	if _, _, cpu, ok := procStat("/proc/self/stat"); ok {
		s.procs["e2ebench"] = cpu
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		comm, ppid, cpu, ok := procStat(filepath.Join(d, "stat"))
		if ok && ppid == self {
			s.procs[comm] += cpu
		}
	}
	if raw, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(raw), "\n")
		f := strings.Fields(line)
		for i, v := range f[1:] {
			n, _ := strconv.ParseFloat(v, 64)
			// guest and guest_nice are already in user and nice.
			if i >= 8 {
				break
			}
			s.total += n / clockTicks
			switch i {
			case 3, 4: // idle, iowait
			case 7: // steal: time the hypervisor gave to other guests
				s.steal += n / clockTicks
			default:
				s.busy += n / clockTicks
			}
			if i == 6 {
				s.softirq = n / clockTicks
			}
		}
	}
	return s
}

// procStat returns the command name, parent and user+system CPU seconds
// from a /proc/<pid>/stat file.
func procStat(path string) (string, int, float64, bool) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", 0, 0, false
	}
	s := string(raw)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, 0, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 13 {
		return "", 0, 0, false
	}
	ppid, _ := strconv.Atoi(f[1])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return s[open+1 : end], ppid, (utime + stime) / clockTicks, true
}

func (s cpuSample) sub(o cpuSample) cpuSample {
	d := cpuSample{procs: map[string]float64{}, busy: s.busy - o.busy, total: s.total - o.total, softirq: s.softirq - o.softirq, steal: s.steal - o.steal}
	for k, v := range s.procs {
		d.procs[k] = v - o.procs[k]
	}
	return d
}

func (s *cpuSample) add(o cpuSample) {
	if s.procs == nil {
		s.procs = map[string]float64{}
	}
	for k, v := range o.procs {
		s.procs[k] += v
	}
	s.busy += o.busy
	s.total += o.total
	s.softirq += o.softirq
	s.steal += o.steal
}

// other is the machine's busy CPU time spent outside the run's processes
// and softirq.
func (s cpuSample) other() float64 {
	o := s.busy - s.softirq
	for _, v := range s.procs {
		o -= v
	}
	return max(o, 0)
}

// loadavg returns the 1, 5 and 15 minute load averages.
func loadavg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
