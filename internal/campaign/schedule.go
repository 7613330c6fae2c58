package campaign

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Fault is one fault of a schedule.
type Fault struct {
	// At is when it starts, from the start of the fault phase.
	At time.Duration
	// Kind is what it does.
	Kind Kind
	// Target is the index of the data server, meta server or mount.
	Target int
	// For is how long it lasts: until the restart, the end of the
	// partition or slow link, the SIGCONT, the new mount.
	For time.Duration
	// Latency is the delay of a slow link.
	Latency time.Duration
	// Blackhole makes a partition drop traffic silently; else its
	// connections are reset and refused.
	Blackhole bool
}

// End is when the fault ends, from the start of the fault phase.
func (f Fault) End() time.Duration { return f.At + f.For }

// targetName names the fault's target as the campaign's logs do.
func (f Fault) targetName() string {
	switch f.Kind.class() {
	case "data":
		return fmt.Sprintf("data%d", f.Target+1)
	case "meta":
		return fmt.Sprintf("meta%d", f.Target+1)
	}
	return fmt.Sprintf("mount%d", f.Target+1)
}

func (f Fault) String() string {
	s := fmt.Sprintf("+%5.1fs %-14s %-6s for %4.1fs", f.At.Seconds(), f.Kind, f.targetName(), f.For.Seconds())
	if f.Latency > 0 {
		s += fmt.Sprintf(" (+%v per segment)", f.Latency)
	}
	if f.Kind == DataPartition || f.Kind == MetaPartition {
		if f.Blackhole {
			s += " (traffic dropped)"
		} else {
			s += " (connections refused)"
		}
	}
	return s
}

// Schedule is a campaign's faults, ordered by start.
type Schedule []Fault

func (s Schedule) String() string {
	if len(s) == 0 {
		return "  (no faults)"
	}
	var b strings.Builder
	for i, f := range s {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString("  " + f.String())
	}
	return b.String()
}

// Shape is what a schedule's targets are chosen from.
type Shape struct {
	DataServers, MetaServers, Mounts int
	// Proxied reports whether data server i is behind proxies (the
	// targets of data network faults).
	Proxied func(i int) bool
}

// durations bounds each kind's duration (min, max).
var durations = map[Kind][2]time.Duration{
	DataKill:      {time.Second, 8 * time.Second},
	DataNewPort:   {500 * time.Millisecond, 4 * time.Second},
	DataStop:      {time.Second, 6 * time.Second},
	DataPause:     {time.Second, 6 * time.Second},
	DataPartition: {2 * time.Second, 10 * time.Second},
	DataSlow:      {3 * time.Second, 10 * time.Second},
	MetaKill:      {time.Second, 5 * time.Second},
	MetaStop:      {time.Second, 5 * time.Second},
	MetaPartition: {time.Second, 8 * time.Second},
	MetaSlow:      {3 * time.Second, 10 * time.Second},
	ClientKill:    {500 * time.Millisecond, 3 * time.Second},
	ClientStop:    {500 * time.Millisecond, 3 * time.Second},
	ClientPause:   {time.Second, 9 * time.Second}, // past a 3s session lease, often
}

// Schedule bounds.
const (
	warmUp         = 3 * time.Second // no fault before this
	minGap, maxGap = 2 * time.Second, 6 * time.Second
)

// MakeSchedule draws the faults of a campaign of duration d from seed:
// kinds uniformly from kinds, targets uniformly from those the kind may
// hit and that have no fault then, a duration from the kind's range, a
// quiet gap after each fault, or with probability overlap the next
// fault inside the last one. Every fault ends by d. The same arguments
// make the same schedule.
func MakeSchedule(seed int64, d time.Duration, kinds []Kind, shape Shape, overlap float64) Schedule {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed5c4ed))
	var out Schedule
	if len(kinds) == 0 {
		return out
	}
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
	}
	t := warmUp
	for tries := 0; tries < 10000; tries++ {
		k := kinds[rng.IntN(len(kinds))]
		f := Fault{At: t, Kind: k, For: between(durations[k][0], durations[k][1])}
		if k == DataSlow || k == MetaSlow {
			f.Latency = between(5*time.Millisecond, 60*time.Millisecond).Round(time.Millisecond)
		}
		if k == DataPartition || k == MetaPartition {
			f.Blackhole = rng.IntN(2) == 0
		}
		f.For = f.For.Round(100 * time.Millisecond)
		if f.End() > d {
			break
		}
		var free []int
		for _, i := range targetsOf(k, shape) {
			if !busy(out, k.class(), i, f.At, f.End()) {
				free = append(free, i)
			}
		}
		if len(free) == 0 {
			t += time.Second
			continue
		}
		f.Target = free[rng.IntN(len(free))]
		out = append(out, f)
		if rng.Float64() < overlap {
			t = f.At + time.Duration(rng.Float64()*float64(f.For))
		} else {
			t = f.End() + between(minGap, maxGap)
		}
		t = t.Round(100 * time.Millisecond)
	}
	return out
}

// targetsOf lists the targets kind k may hit.
func targetsOf(k Kind, shape Shape) []int {
	n := shape.Mounts
	switch k.class() {
	case "data":
		n = shape.DataServers
	case "meta":
		n = shape.MetaServers
	}
	var out []int
	for i := range n {
		if k.class() == "data" && k.network() && (shape.Proxied == nil || !shape.Proxied(i)) {
			continue
		}
		out = append(out, i)
	}
	return out
}

// busy reports whether target i of class has a fault in s between from
// and to.
func busy(s Schedule, class string, i int, from, to time.Duration) bool {
	for _, f := range s {
		if f.Kind.class() == class && f.Target == i && f.At < to && from < f.End() {
			return true
		}
	}
	return false
}
