package main

import (
	"fmt"

	"github.com/prometheus/procfs"
)

// Processes whose CPU time is reported (options.cpuProcs adds the no-op
// webhook's stand-in Service when it runs); others on the machine count as
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
	// reaped is the CPU time of this program's children that exited and
	// were waited for (a vmipam process stopped): what they spent before
	// the sample is in procs at the sample before, and gone from procs
	// after.
	reaped float64
}

// sampleCPU reads /proc: this process, its children (the control plane and
// vmipam), and the machine. What cannot be read counts as zero.
func sampleCPU() cpuSample {
	s := cpuSample{procs: map[string]float64{}}
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return s
	}
	self, err := fs.Self()
	if err != nil {
		return s
	}
	if st, err := self.Stat(); err == nil {
		s.procs["e2ebench"] = st.CPUTime()
		s.reaped = float64(st.CUTime+st.CSTime) / userHZ
	}
	procs, _ := fs.AllProcs()
	for _, p := range procs {
		// A process may exit between the listing and the read.
		if st, err := p.Stat(); err == nil && st.PPID == self.PID {
			s.procs[st.Comm] += st.CPUTime()
		}
	}
	if st, err := fs.Stat(); err == nil {
		// guest and guest_nice are already in user and nice; idle and
		// iowait are not busy; steal is time the hypervisor gave to
		// other guests.
		c := st.CPUTotal
		s.busy = c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ
		s.total = s.busy + c.Idle + c.Iowait + c.Steal
		s.softirq = c.SoftIRQ
		s.steal = c.Steal
	}
	return s
}

func (s cpuSample) sub(o cpuSample) cpuSample {
	d := cpuSample{procs: map[string]float64{}, busy: s.busy - o.busy, total: s.total - o.total, softirq: s.softirq - o.softirq, steal: s.steal - o.steal,
		reaped: s.reaped - o.reaped}
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
	s.reaped += o.reaped
}

// userHZ is the clock tick /proc counts children's times in (procfs's
// CPUTime assumes the same).
const userHZ = 100

// other is the machine's busy CPU time spent outside the run's processes
// and softirq.
func (s cpuSample) other() float64 {
	o := s.busy - s.softirq
	for _, v := range s.procs {
		o -= v
	}
	return max(o, 0)
}

// loadavg returns the 1, 5 and 15 minute load averages, as the kernel
// prints them.
func loadavg() string {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return "unknown"
	}
	l, err := fs.LoadAvg()
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%.2f %.2f %.2f", l.Load1, l.Load5, l.Load15)
}
