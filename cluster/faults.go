package cluster

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// Disk faults of targets, as their data servers report them
// (TargetReport.fault_kind; data/faults.go): a read-only or failed target
// is taken out of its replicated chains as if it were offline (it comes
// back syncing once its server reports it healthy again), and no target
// with a fault, full or too small to hold a file gets new files. Status
// warns about each, naming the target, its server and the reason.

// Fault kinds: the ones data servers report, and tooSmall, which the
// manager tells from a target's size.
const (
	faultReadOnly = "read-only"
	faultFailed   = "failed"
	faultFull     = "full"
	faultTooSmall = "too small"
)

// fault is a target's reported disk fault.
type fault struct {
	kind, reason string
	since        int64 // Unix milliseconds
}

// targetWritable reports whether target id is online and its disk takes
// writes (no read-only or failed fault): what a member of a replicated
// chain must be to stay in it.
func (m *Manager) targetWritable(id uint64) bool {
	if !m.targetOnline(id) {
		return false
	}
	r := m.targets[id].report
	return r == nil || (r.fault.kind != faultReadOnly && r.fault.kind != faultFailed)
}

// placeable reports whether target id may get new files, given its last
// report r: no fault, and not full.
func placeable(r *capacity) bool {
	return r.fault.kind == "" && !full(r.total, r.free)
}

// faultOf is target t's fault for status: the reported one, else too
// small or full from its capacity; kind "" when none.
func faultOf(t *targetState) fault {
	r := t.report
	switch {
	case r == nil:
		return fault{}
	case r.fault.kind != "":
		return r.fault
	case r.total > 0 && full(r.total, r.total):
		return fault{kind: faultTooSmall, reason: fmt.Sprintf("its file system holds %s; a target needs at least %s free (and 1%% of its size) to take new files",
			sizeString(r.total), sizeString(minFreeBytes))}
	case r.total > 0 && full(r.total, r.free):
		return fault{kind: faultFull, reason: fmt.Sprintf("%s free of %s; new files need %s free (and 1%% of its size)",
			sizeString(r.free), sizeString(r.total), sizeString(minFreeBytes))}
	}
	return fault{}
}

// faultWarnings says, for every online target with a fault, what is wrong
// and what to do. Called with m.mu held.
func (m *Manager) faultWarnings() []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(m.targets)) {
		t := m.targets[id]
		if t.rec.Removed || !m.targetOnline(id) {
			continue
		}
		f := faultOf(t)
		if f.kind == "" {
			continue
		}
		s := m.servers[t.rec.ServerID]
		where := fmt.Sprintf("target %d (%s) on data server %d (%s)", id, t.rec.Path, t.rec.ServerID, s.rec.Address)
		since := ""
		if f.since > 0 {
			since = " since " + time.UnixMilli(f.since).Format(time.DateTime)
		}
		switch f.kind {
		case faultReadOnly, faultFailed:
			what := "is read-only"
			if f.kind == faultFailed {
				what = "failed"
			}
			out = append(out, fmt.Sprintf("%s: its disk %s%s (%s): it takes no new files, has left its replicated chains and fails writes to its single-copy files with EIO; "+
				"repair the disk and restart the data server, or remove the target (weft target remove %d)", where, what, since, f.reason, id))
		case faultTooSmall:
			out = append(out, fmt.Sprintf("%s is too small to place files on: %s; give it a larger file system or remove it (weft target remove %d)",
				where, f.reason, id))
		default:
			out = append(out, fmt.Sprintf("%s is full%s (%s): it takes no new files and writes to its files fail with ENOSPC; free space on it or add targets",
				where, since, f.reason))
		}
	}
	return out
}

// sizeString renders a byte count with a binary unit.
func sizeString(n uint64) string {
	const unit = 1 << 10
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
