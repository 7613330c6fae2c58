package chunk

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Spare files.
//
// Creating a file can be the dearest step of writing a new chunk: ext4
// searches its inode bitmaps for a free inode, and on a disk whose
// files come and go that took 300-650 us per file here, where renaming
// one took 20 us. Each chunk is two files (data and checksums), so a
// megabyte written cost a millisecond of CPU in creates alone. A target
// therefore keeps the files of the chunks it deletes, emptied, in
// <target>/spare (up to maxSpare), and makes the files of new chunks by
// renaming a spare into place (RENAME_NOREPLACE, so it fails as an
// exclusive create would).
//
// A chunk's data file may have been handed to a client for reading in
// place (OpenForRead): the client may still hold that descriptor, so
// the file must never hold another chunk's data. Data files are made
// with mode 0600 and given mode 0644 when first handed out (the mark
// lasts across restarts; files made before spares existed have 0644
// too). A data file with 0644 is only reused as a checksum file, which
// no client reads; what a client would read through a stale descriptor
// then fails its checksums, as any changed block does, and is never
// returned. Checksum files and unmarked data files are reused for
// either.
//
// Spares left at a restart may hold data (a crash between the rename and
// the truncate): they are removed when the target opens.

// maxSpare bounds the spare files a target keeps (each an inode, no
// data blocks).
const maxSpare = 4096

// File modes of chunk data files: fresh ones, and ones handed out for
// reading in place (or made before spares existed).
const (
	dataModeFresh     = 0o600
	dataModeHandedOut = 0o644
)

// spares is a target's pool of spare files.
type spares struct {
	mu sync.Mutex
	// any holds spares that may become data or checksum files; sumsOnly
	// holds data files once handed out, which may only become checksum
	// files. Both hold names of files in the spare directory.
	any, sumsOnly []uint64
	next          uint64 // name of the next file put in the pool
	off           bool   // the file system cannot rename without replacing
}

func (t *Target) spareDir() string { return filepath.Join(t.dir, "spare") }

func (t *Target) sparePath(n uint64) string {
	return filepath.Join(t.spareDir(), strconv.FormatUint(n, 10))
}

// initSpares removes what a previous run left in the spare directory and
// makes it.
func (t *Target) initSpares() error {
	dir := t.spareDir()
	if err := os.RemoveAll(dir); err != nil {
		return t.ioError("empty the spare file directory", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return t.ioError("create the spare file directory", err)
	}
	return nil
}

// SpareFiles is the number of spare files the target holds.
func (t *Target) SpareFiles() int {
	t.spare.mu.Lock()
	defer t.spare.mu.Unlock()
	return len(t.spare.any) + len(t.spare.sumsOnly)
}

// takeSpare pops a spare fit for a data file (sums false) or a checksum
// file (sums true); ok is false when there is none.
func (t *Target) takeSpare(sums bool) (n uint64, sumsOnly, ok bool) {
	s := &t.spare
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.off {
		return 0, false, false
	}
	if sums && len(s.sumsOnly) > 0 {
		n = s.sumsOnly[len(s.sumsOnly)-1]
		s.sumsOnly = s.sumsOnly[:len(s.sumsOnly)-1]
		return n, true, true
	}
	if len(s.any) > 0 {
		n = s.any[len(s.any)-1]
		s.any = s.any[:len(s.any)-1]
		return n, false, true
	}
	return 0, false, false
}

// putBack returns a spare takeSpare gave that was not used.
func (t *Target) putBack(n uint64, sumsOnly bool) {
	s := &t.spare
	s.mu.Lock()
	defer s.mu.Unlock()
	if sumsOnly {
		s.sumsOnly = append(s.sumsOnly, n)
	} else {
		s.any = append(s.any, n)
	}
}

// createFile creates the file at path, which must not exist, open for
// reading and writing and empty: from a spare when there is one, else
// anew. A data file (sums false) gets mode dataModeFresh.
func (t *Target) createFile(path string, sums bool) (*os.File, error) {
	mode := os.FileMode(dataModeFresh)
	if sums {
		mode = 0o644
	}
	for {
		n, sumsOnly, ok := t.takeSpare(sums)
		if !ok {
			return os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, mode)
		}
		err := unix.Renameat2(unix.AT_FDCWD, t.sparePath(n), unix.AT_FDCWD, path, unix.RENAME_NOREPLACE)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS):
			// This file system cannot: create files from now on.
			t.spare.mu.Lock()
			t.spare.off = true
			t.spare.mu.Unlock()
			os.Remove(t.sparePath(n))
			continue
		case errors.Is(err, unix.ENOENT):
			// The spare is gone (it should not be), or the directory of
			// path is (a concurrent delete): the caller tries again.
			if _, serr := os.Lstat(t.sparePath(n)); serr == nil {
				t.putBack(n, sumsOnly)
			}
			return nil, &os.PathError{Op: "create", Path: path, Err: fs.ErrNotExist}
		default:
			// EEXIST (path exists: the create below says so as an
			// exclusive create would), or anything else: create.
			t.putBack(n, sumsOnly)
			return os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, mode)
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return nil, err
		}
		if err := readyFile(f, mode); err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
}

// readyFile makes a file taken from the spares empty and of mode mode.
func readyFile(f *os.File, mode os.FileMode) error {
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if info.Size() != 0 {
		if err := f.Truncate(0); err != nil {
			return err
		}
	}
	if info.Mode().Perm() != mode {
		return f.Chmod(mode)
	}
	return nil
}

// discard removes the file at path from the chunk tree, keeping it as a
// spare when the pool has room (emptied, so its blocks are free at
// once). It fails with fs.ErrNotExist if there is no such file.
func (t *Target) discard(path string, sums bool) error {
	sumsOnly := false
	if !sums {
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		sumsOnly = info.Mode().Perm() != dataModeFresh
	}
	s := &t.spare
	s.mu.Lock()
	if s.off || len(s.any)+len(s.sumsOnly) >= maxSpare {
		s.mu.Unlock()
		return os.Remove(path)
	}
	n := s.next
	s.next++
	s.mu.Unlock()
	spare := t.sparePath(n)
	if err := os.Rename(path, spare); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Lstat(path); serr != nil {
				return err // path is gone
			}
		}
		return os.Remove(path) // the spare directory is not usable: remove as before
	}
	if err := os.Truncate(spare, 0); err != nil {
		os.Remove(spare)
		return nil
	}
	t.putBack(n, sumsOnly)
	return nil
}

// markHandedOut records on a data file about to be handed to a client
// (by its descriptor fd, open for reading; mode is its mode from fstat)
// that it must not become another chunk's data file (see Spare files).
func markHandedOut(fd int, mode uint32) error {
	if mode&0o777 == dataModeHandedOut {
		return nil
	}
	if err := unix.Fchmod(fd, dataModeHandedOut); err != nil {
		return fmt.Errorf("mark chunk file as read in place: %w", err)
	}
	return nil
}
