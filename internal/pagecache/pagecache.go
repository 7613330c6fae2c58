// Package pagecache reads file ranges into the kernel's page cache in
// large folios.
//
// The kernel's read-ahead of a file opened afresh starts with single
// pages and moves to larger folios only as a stream goes on, and
// POSIX_FADV_WILLNEED and readahead(2) always read single pages. A chunk
// file of a MiB or a few is read whole in that first round: a MiB goes to
// the disk as requests of up to 254 segments, which a virtual disk without
// indirect descriptors serves one at a time and slowly (0.8 ms per MiB on
// the machine the benchmarks ran on, where a request of large folios took
// 0.33 ms). Populate gets large folios instead, where the file system has
// them (XFS, ext4 since Linux 6.16): it maps the range with MADV_HUGEPAGE
// and populates the mapping (MADV_POPULATE_READ, Linux 5.14), which waits
// for the disk, then unmaps it; nothing is touched through the mapping.
package pagecache

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNoPopulate says the kernel has no MADV_POPULATE_READ (before Linux
// 5.14): callers should stop trying.
var ErrNoPopulate = errors.New("MADV_POPULATE_READ is not supported")

// Populate reads bytes [lo, hi) of the file open as fd into the page
// cache in large folios, waiting for the disk. A range past the end of
// the file fails with EFAULT (not a signal).
func Populate(fd int, lo, hi int64) error {
	_, err := populate(fd, lo, hi, -1)
	return err
}

// PopulateIfCold is Populate when the range's first page is not in the
// page cache (a cold range), and nothing otherwise: the cost of a cached
// range is one mapping and a mincore. populated reports whether it read.
func PopulateIfCold(fd int, lo, hi int64) (populated bool, err error) {
	return populate(fd, lo, hi, lo)
}

// PopulateIfColdAt is PopulateIfCold that looks at the page holding byte
// probe (in [lo, hi)) to tell a cold range, for a range whose first
// pages another read may bring in meanwhile.
func PopulateIfColdAt(fd int, lo, hi, probe int64) (populated bool, err error) {
	return populate(fd, lo, hi, probe)
}

// populate is Populate, or PopulateIfCold probing byte probe if probe >= 0.
func populate(fd int, lo, hi int64, probe int64) (bool, error) {
	if lo >= hi {
		return false, nil
	}
	page := int64(os.Getpagesize())
	start := lo / page * page
	m, err := unix.Mmap(fd, start, int(hi-start), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return false, fmt.Errorf("map bytes %d-%d: %w", start, hi, err)
	}
	defer unix.Munmap(m)
	if probe >= 0 {
		at := min(max(probe, start), hi-1) / page * page
		var vec [1]byte
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[at-start])), uintptr(page), uintptr(unsafe.Pointer(&vec[0])))
		if errno == 0 && vec[0]&1 != 0 {
			return false, nil
		}
	}
	_ = unix.Madvise(m, unix.MADV_HUGEPAGE) // a hint: without it, single pages
	if err := unix.Madvise(m, unix.MADV_POPULATE_READ); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return false, ErrNoPopulate
		}
		return false, fmt.Errorf("populate bytes %d-%d: %w", start, hi, err)
	}
	return true, nil
}

// InMemory reports whether f is on a file system that keeps its files in
// memory (tmpfs, ramfs), where there is nothing to read in.
func InMemory(f *os.File) bool {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return false
	}
	return isInMemory(st.Type)
}

// DirInMemory is InMemory for the file system holding directory dir.
func DirInMemory(dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false
	}
	return isInMemory(st.Type)
}

func isInMemory(fsType int64) bool {
	return fsType == unix.TMPFS_MAGIC || fsType == unix.RAMFS_MAGIC
}
