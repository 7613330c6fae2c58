package bench

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"sync"
)

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat
// (100 on every Linux architecture Go supports).
const clockTicks = 100

// cpuSnapshot maps a pid to its user+system CPU seconds.
type cpuSnapshot map[int]float64

// peakRSS is the largest peak resident set size (VmHWM) among the pids of
// s that used CPU since before, in bytes: with resetPeakRSS called on
// before, the peak of the processes that took part in one measurement.
func (s cpuSnapshot) peakRSS(before cpuSnapshot) int64 {
	var peak int64
	for pid, t := range s {
		if t-before[pid] < 0.01 {
			continue // idle meanwhile: another target's processes
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				f := strings.Fields(v)
				if len(f) > 0 {
					kb, _ := strconv.ParseInt(f[0], 10, 64)
					peak = max(peak, kb<<10)
				}
			}
		}
	}
	return peak
}

// resetPeakRSS resets the peak resident set size of the pids of s to
// their current size (clear_refs 5), so that the next peakRSS covers one
// measurement. Processes this user may not touch keep their lifetime peak.
func (s cpuSnapshot) resetPeakRSS() {
	for pid := range s {
		_ = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/clear_refs", []byte("5"), 0)
	}
}

// minus is the CPU time spent between before and s: processes present in
// both count their difference, new ones all of theirs.
func (s cpuSnapshot) minus(before cpuSnapshot) float64 {
	var sum float64
	for pid, t := range s {
		sum += t - before[pid]
	}
	return sum
}

// matchCPU reads the CPU time of every process whose command line contains
// pattern, except this process and bench workers. An empty pattern
// measures nothing.
func matchCPU(pattern string) cpuSnapshot {
	if pattern == "" {
		return nil
	}
	snap := cpuSnapshot{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return snap
	}
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(cmdline) == 0 {
			continue
		}
		args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
		if len(args) > 1 && (string(args[1]) == "bench-worker" || string(args[1]) == "bench") {
			continue
		}
		if !bytes.Contains(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), []byte(pattern)) {
			continue
		}
		if t, ok := procCPU(e.Name()); ok {
			snap[pid] = t
		}
	}
	return snap
}

// procCPU reads utime+stime of /proc/<pid>/stat in seconds.
func procCPU(pid string) (float64, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may contain spaces: fields restart after
	// its closing parenthesis, at field 3 (state).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return float64(ut+st) / clockTicks, true
}

// lockedBuffer collects a worker's stderr safely while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
