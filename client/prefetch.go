package client

import (
	"errors"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/weft-fs/weft/internal/pagecache"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Prefetching a chunk file read in place.
//
// A sequential reader's read-ahead window is read into the page cache
// from the chunk files before the reader gets there, in large folios
// (pagecache.Populate: POSIX_FADV_WILLNEED, the obvious way, reads single
// pages, which the disk here serves at a third of the speed); anything
// that fails falls back to the hint.

// prefetchLocked has the bytes [from, to) of the file read into the
// page cache from the chunk files open in place (localChunk.prefetch),
// as read-ahead would fetch them from a remote server: on a disk the
// reader then finds them in memory; chunk files on a tmpfs are skipped. [from, to) is
// the sequential reader's read-ahead window, so what is prefetched grows
// with the stream and a reader that skips part of each record does not
// make the disks read what it skips. Chunks still opening are prefetched
// when their open completes. Called with in.mu held.
func (in *inode) prefetchLocked(layout *weftv1.Layout, from, to uint64) {
	in.local.adviseTo = to
	cs := uint64(layout.ChunkSize)
	var todo []prefetch
	for idx := from / cs; idx*cs < to; idx++ {
		lc := in.local.chunks[idx]
		if lc == nil || lc.File == nil || lc.inMemory {
			continue
		}
		lo := max(int64(max(from, idx*cs)-idx*cs), lc.advised)
		hi := min(int64(min(to, (idx+1)*cs)-idx*cs), lc.Length)
		if lo >= hi {
			continue
		}
		lc.advised = hi
		lc.refs.Add(1)
		todo = append(todo, prefetch{lc, lo, hi})
	}
	runPrefetches(todo) // in the background: they wait for the disk
}

// prefetch is a range of a chunk to read into the page cache.
type prefetch struct {
	lc     *localChunk
	lo, hi int64
}

// runPrefetches reads each range into the page cache, each in its own
// goroutine (a read waits for the disk: several are in flight at once),
// and drops the references prefetchLocked took.
func runPrefetches(todo []prefetch) {
	for _, p := range todo {
		go func() {
			defer p.lc.release()
			p.lc.prefetch(p.lo, p.hi)
		}()
	}
}

// populateOff is set once MADV_POPULATE_READ turned out to be
// unsupported: prefetches give the hint from then on.
var populateOff atomic.Bool

// maxPopulating bounds the ranges a client populates at once: each holds
// a thread in the kernel until its read is done, and a disk gains
// nothing from more in flight (64 read 9% slower than 16 with four cold
// readers here). A range beyond the bound gets the hint.
const maxPopulating = 16

var populating = make(chan struct{}, maxPopulating)

// prefetch reads bytes [lo, hi) of the chunk file into the page cache,
// waiting for the disk.
func (lc *localChunk) prefetch(lo, hi int64) {
	if lo >= hi {
		return
	}
	lc.FileRanges(lo, hi, lc.prefetchFile)
}

// prefetchFile reads bytes [lo, hi) of the chunk's file into the page
// cache, waiting for the disk.
func (lc *localChunk) prefetchFile(lo, hi int64) {
	fd := int(lc.File.Fd())
	if !populateOff.Load() && tryAcquire(populating) {
		err := pagecache.Populate(fd, lo, hi)
		<-populating
		switch {
		case err == nil, errors.Is(err, unix.EFAULT):
			// Done, or the file is shorter than it was (truncated or
			// replaced meanwhile): readers find out for themselves.
			return
		case errors.Is(err, pagecache.ErrNoPopulate):
			populateOff.Store(true)
		}
	}
	_ = unix.Fadvise(fd, lo, hi-lo, unix.FADV_WILLNEED)
}

// tryAcquire takes a slot of sem if one is free.
func tryAcquire(sem chan struct{}) bool {
	select {
	case sem <- struct{}{}:
		return true
	default:
		return false
	}
}
