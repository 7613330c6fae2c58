package bench

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestPeakRSSCountsActiveProcesses checks that the peak resident size
// counts only processes that used CPU during the measurement, and that a
// reset brings the peak down to the current size.
func TestPeakRSSCountsActiveProcesses(t *testing.T) {
	self := os.Getpid()
	before := cpuSnapshot{self: 1}
	if got := (cpuSnapshot{self: 1}).peakRSS(before); got != 0 {
		t.Errorf("idle process counted: peak %d", got)
	}
	big := make([]byte, 64<<20)
	for i := range big {
		if i%4096 == 0 {
			big[i] = 1
		}
	}
	withBig := (cpuSnapshot{self: 2}).peakRSS(before)
	if withBig < 64<<20 {
		t.Fatalf("peak %d after touching 64 MiB, want at least that", withBig)
	}
	big = nil
	debug.FreeOSMemory() // the 64 MiB leave the resident set
	before.resetPeakRSS()
	if got := (cpuSnapshot{self: 2}).peakRSS(before); got <= 0 || got >= withBig-32<<20 {
		t.Errorf("peak after freeing 64 MiB and a reset: %d, before %d", got, withBig)
	}
}
