package client

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Prefetching a chunk file read in place.
//
// A sequential reader's read-ahead window is read into the page cache
// from the chunk files before the reader gets there. POSIX_FADV_WILLNEED
// would be the obvious way, but the kernel serves it with single pages:
// a MiB becomes requests of up to 254 segments, which a virtual disk
// without indirect descriptors serves one at a time and slowly (here
// 0.8 ms per MiB, 1.2 GB/s). The
// kernel's own read-ahead uses large folios where the file system has
// them (XFS, ext4 since Linux 6.16), a few segments per MiB (0.3 ms,
// 3 GB/s). prefetch gets those by mapping the range with MADV_HUGEPAGE
// and populating it (MADV_POPULATE_READ, Linux 5.14), which waits for
// the disk and maps nothing the client touches; anything that fails
// falls back to the hint.

// populateOff is set once MADV_POPULATE_READ turned out to be
// unsupported: prefetches give the hint from then on.
var populateOff atomic.Bool

// maxPopulating bounds the ranges a client populates at once: each holds
// a thread in the kernel until its read is done, and a disk gains
// nothing from more in flight. A range beyond the bound gets the hint.
const maxPopulating = 16

var populating = make(chan struct{}, maxPopulating)

// prefetch reads bytes [lo, hi) of the chunk file into the page cache,
// waiting for the disk.
func (lc *localChunk) prefetch(lo, hi int64) {
	if lo >= hi {
		return
	}
	fd := int(lc.file.Fd())
	if !populateOff.Load() && tryAcquire(populating) {
		err := populate(fd, lo, hi)
		<-populating
		switch {
		case err == nil, errors.Is(err, unix.EFAULT):
			// Done, or the file is shorter than it was (truncated or
			// replaced meanwhile): readers find out for themselves.
			return
		case errors.Is(err, errNoPopulate):
			populateOff.Store(true)
		}
	}
	_ = unix.Fadvise(fd, lo, hi-lo, unix.FADV_WILLNEED)
}

// errNoPopulate says the kernel has no MADV_POPULATE_READ.
var errNoPopulate = errors.New("MADV_POPULATE_READ is not supported")

// populate maps bytes [lo, hi) of the file open as fd read-only, asks
// for large folios and reads them in, then unmaps them.
func populate(fd int, lo, hi int64) error {
	page := int64(os.Getpagesize())
	start := lo / page * page
	m, err := unix.Mmap(fd, start, int(hi-start), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map bytes %d-%d: %w", start, hi, err)
	}
	defer unix.Munmap(m)
	_ = unix.Madvise(m, unix.MADV_HUGEPAGE) // a hint: without it, single pages
	if err := unix.Madvise(m, unix.MADV_POPULATE_READ); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return errNoPopulate
		}
		return fmt.Errorf("populate bytes %d-%d: %w", start, hi, err)
	}
	return nil
}

// inMemoryFS reports whether f is on a file system that keeps its files
// in memory, where there is nothing to prefetch.
func inMemoryFS(f *os.File) bool {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return false
	}
	return st.Type == unix.TMPFS_MAGIC || st.Type == unix.RAMFS_MAGIC
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
