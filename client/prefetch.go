package client

import (
	"errors"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/weft-fs/weft/internal/pagecache"
	"github.com/weft-fs/weft/internal/wire"
)

// Prefetching a chunk file read in place.
//
// A sequential reader's read-ahead window is read into the page cache
// from the chunk files before the reader gets there, in large folios
// (pagecache.Populate: POSIX_FADV_WILLNEED, the obvious way, reads single
// pages, which the disk here serves at a third of the speed); anything
// that fails falls back to the hint.

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
	if lc.slots != nil {
		// Blocks in several places of the file: a run at a time.
		for b := lo / wire.BlockSize; b*wire.BlockSize < hi; {
			e := b + 1
			for e*wire.BlockSize < hi && lc.slot(e) == lc.slot(b) {
				e++
			}
			rlo, rhi := max(lo, b*wire.BlockSize), min(hi, e*wire.BlockSize)
			lc.prefetchFile(lc.fileOff(b)+rlo-b*wire.BlockSize, lc.fileOff(b)+rhi-b*wire.BlockSize)
			b = e
		}
		return
	}
	lc.prefetchFile(lc.dataOff+lo, lc.dataOff+hi)
}

// prefetchFile reads bytes [lo, hi) of the chunk's file into the page
// cache, waiting for the disk.
func (lc *localChunk) prefetchFile(lo, hi int64) {
	fd := int(lc.file.Fd())
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
