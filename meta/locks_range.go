package meta

import "math"

// Lock types, with Linux's values (LockRequest.type).
const (
	lockRead   = 0 // F_RDLCK
	lockWrite  = 1 // F_WRLCK
	lockUnlock = 2 // F_UNLCK
)

// lockEOF is the end of a range that runs to the end of the file.
const lockEOF = math.MaxUint64

// lockOwner identifies who holds a lock: the kernel's lock owner within
// one client session.
type lockOwner struct {
	session string
	owner   uint64
}

// heldLock is one lock record: a range [start, end] (end inclusive) of
// one type held by one owner.
type heldLock struct {
	lockOwner
	start, end uint64
	typ        uint32
	pid        uint32
}

// overlaps reports whether the ranges [aStart, aEnd] and [bStart, bEnd]
// share a byte.
func overlaps(aStart, aEnd, bStart, bEnd uint64) bool {
	return aStart <= bEnd && bStart <= aEnd
}

// touches reports whether [aStart, aEnd] and [bStart, bEnd] overlap or are
// adjacent, so that two locks of one type can merge.
func touches(aStart, aEnd, bStart, bEnd uint64) bool {
	if overlaps(aStart, aEnd, bStart, bEnd) {
		return true
	}
	return (aEnd != lockEOF && aEnd+1 == bStart) || (bEnd != lockEOF && bEnd+1 == aStart)
}

// conflicts reports whether l (held by someone else) keeps a lock of type
// typ on [start, end] from being granted: the ranges overlap and one of
// the two is a write lock.
func (l *heldLock) conflicts(start, end uint64, typ uint32) bool {
	return overlaps(l.start, l.end, start, end) && (l.typ == lockWrite || typ == lockWrite)
}

// firstConflict returns the first lock of all held by another owner than
// who that conflicts with typ on [start, end], or nil.
func firstConflict(all []heldLock, who lockOwner, start, end uint64, typ uint32) *heldLock {
	if typ == lockUnlock {
		return nil
	}
	for i := range all {
		if all[i].lockOwner != who && all[i].conflicts(start, end, typ) {
			return &all[i]
		}
	}
	return nil
}

// applyLock returns an owner's locks (mine, disjoint) after it locks or
// unlocks [start, end] with typ, following POSIX: the new range replaces
// whatever the owner held on it (a conversion when the type differs),
// parts of older locks outside the range stay, and locks of the same type
// that overlap or touch the new one merge with it. An unlock only cuts.
// The result is disjoint and sorted by start.
func applyLock(mine []heldLock, who lockOwner, start, end uint64, typ, pid uint32) []heldLock {
	out := make([]heldLock, 0, len(mine)+2)
	nStart, nEnd := start, end
	for _, l := range mine {
		switch {
		case typ != lockUnlock && l.typ == typ && touches(l.start, l.end, start, end):
			// Same type: merge into the new lock.
			nStart, nEnd = min(nStart, l.start), max(nEnd, l.end)
		case overlaps(l.start, l.end, start, end):
			// Replaced or unlocked in [start, end]; what lies outside
			// stays.
			if l.start < start {
				left := l
				left.end = start - 1
				out = append(out, left)
			}
			if l.end > end {
				right := l
				right.start = end + 1
				out = append(out, right)
			}
		default:
			out = append(out, l)
		}
	}
	if typ != lockUnlock {
		out = append(out, heldLock{lockOwner: who, start: nStart, end: nEnd, typ: typ, pid: pid})
	}
	sortLocks(out)
	return out
}

// sortLocks sorts locks by start (insertion sort: an owner holds few).
func sortLocks(ls []heldLock) {
	for i := 1; i < len(ls); i++ {
		for j := i; j > 0 && ls[j].start < ls[j-1].start; j-- {
			ls[j], ls[j-1] = ls[j-1], ls[j]
		}
	}
}
