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

	"github.com/weft-fs/weft/internal/disk"
)

// Spare files.
//
// Creating a file can be the dearest step of writing a new chunk: ext4
// searches its inode bitmaps for a free inode, and on a disk whose
// files come and go that took 300-650 us per file here, where renaming
// one took 20 us. A target therefore keeps the files of the chunks it
// deletes, emptied, in <target>/spare (up to maxSpare), and makes the
// files of new chunks by renaming a spare into place (RENAME_NOREPLACE,
// so it fails as an exclusive create would).
//
// A chunk file may have been handed to a client for reading in place
// (OpenForRead): the client may still hold that descriptor, so the file
// must never hold another chunk. Chunk files are made with mode 0600 and
// given mode 0644 when first handed out (the mark lasts across
// restarts; files made before spares existed have 0644 too); a file
// with 0644 is removed, not kept, when its chunk is deleted.
//
// Spares left at a restart may hold data: they are removed when the
// target opens. A discarded file is first only renamed into the spare
// directory (pending); in batches (when pendingBatch of them wait, or
// when no ready one is left), the spare directory is synced, making the
// renames durable, and only then is each spare emptied and synced. So a
// power loss never brings a deleted chunk back with part of its bytes
// gone (read as corrupt), nor a deleted chunk's bytes and head under a
// new chunk's name, where its block table would describe the new
// chunk's bytes wrongly.

// maxSpare bounds the spare files a target keeps (each an inode, no
// data blocks).
const maxSpare = 4096

// File modes of chunk files: fresh ones, and ones handed out for
// reading in place (or made before spares existed).
const (
	dataModeFresh     = 0o600
	dataModeHandedOut = 0o644
)

// spares is a target's pool of spare files.
type spares struct {
	mu      sync.Mutex
	names   []uint64 // spares emptied durably, ready to use
	pending []uint64 // spares not yet emptied
	next    uint64   // name of the next file put in the pool
	off     bool     // the file system cannot rename without replacing
}

func (t *Target) spareDir() string { return filepath.Join(t.dir, "spare") }

func (t *Target) sparePath(n uint64) string {
	return filepath.Join(t.spareDir(), strconv.FormatUint(n, 10))
}

// initSpares removes what a previous run left in the spare directory and
// makes it.
func (t *Target) initSpares() error {
	dir := t.spareDir()
	if err := t.fs.RemoveAll(dir); err != nil {
		return t.ioError("empty the spare file directory", err)
	}
	if err := t.fs.Mkdir(dir, 0o700); err != nil {
		return t.ioError("create the spare file directory", err)
	}
	return nil
}

// SpareFiles is the number of spare files the target holds.
func (t *Target) SpareFiles() int {
	t.spare.mu.Lock()
	defer t.spare.mu.Unlock()
	return len(t.spare.names) + len(t.spare.pending)
}

// pendingBatch is how many discarded files wait before they are made
// spares.
const pendingBatch = 32

// takeSpare pops a spare; ok is false when there is none. When only
// pending spares are left, they are readied first.
func (t *Target) takeSpare() (n uint64, ok bool) {
	s := &t.spare
	s.mu.Lock()
	if s.off || len(s.names)+len(s.pending) == 0 {
		s.mu.Unlock()
		return 0, false
	}
	if len(s.names) == 0 {
		s.mu.Unlock()
		t.readySpares()
		s.mu.Lock()
		if len(s.names) == 0 {
			s.mu.Unlock()
			return 0, false
		}
	}
	defer s.mu.Unlock()
	n = s.names[len(s.names)-1]
	s.names = s.names[:len(s.names)-1]
	return n, true
}

// readySpares makes the pending spares ready: the spare directory is
// synced (their renames out of the chunk tree are durable), then each is
// emptied and synced. One that fails is removed.
func (t *Target) readySpares() {
	s := &t.spare
	s.mu.Lock()
	pending := s.pending
	s.pending = nil
	s.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	if err := t.fs.SyncDir(t.spareDir()); err != nil {
		for _, n := range pending {
			t.fs.Remove(t.sparePath(n))
		}
		return
	}
	ready := pending[:0]
	for _, n := range pending {
		f, err := t.fs.OpenFile(t.sparePath(n), os.O_RDWR, 0)
		if err == nil {
			err = f.Truncate(0)
			if err == nil {
				err = f.Datasync()
			}
			f.Close()
		}
		if err != nil {
			t.fs.Remove(t.sparePath(n))
			continue
		}
		ready = append(ready, n)
	}
	s.mu.Lock()
	s.names = append(s.names, ready...)
	s.mu.Unlock()
}

// putBack returns a spare takeSpare gave that was not used.
func (t *Target) putBack(n uint64) {
	s := &t.spare
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names = append(s.names, n)
}

// createFile creates the chunk file at path, which must not exist, open
// for reading and writing, empty and of mode dataModeFresh: from a spare
// when there is one, else anew.
func (t *Target) createFile(path string) (disk.File, error) {
	const mode = dataModeFresh
	create := func() (disk.File, error) {
		return t.fs.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, mode)
	}
	for {
		n, ok := t.takeSpare()
		if !ok {
			return create()
		}
		err := t.fs.RenameNoReplace(t.sparePath(n), path)
		switch {
		case err == nil:
		case errors.Is(err, disk.ErrUnsupported):
			// This file system cannot: create files from now on.
			t.spare.mu.Lock()
			t.spare.off = true
			t.spare.mu.Unlock()
			t.fs.Remove(t.sparePath(n))
			continue
		case errors.Is(err, fs.ErrNotExist):
			// The spare is gone (it should not be), or the directory of
			// path is (a concurrent delete): the caller tries again.
			if _, serr := t.fs.Lstat(t.sparePath(n)); serr == nil {
				t.putBack(n)
			}
			return nil, &os.PathError{Op: "create", Path: path, Err: fs.ErrNotExist}
		default:
			// EEXIST (path exists: the create below says so as an
			// exclusive create would), or anything else: create.
			t.putBack(n)
			return create()
		}
		f, err := t.fs.OpenFile(path, os.O_RDWR, 0)
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
func readyFile(f disk.File, mode os.FileMode) error {
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
// spare when the pool has room and no client was handed it (emptied with
// the next batch, see readySpares). It fails with fs.ErrNotExist if there
// is no such file.
func (t *Target) discard(path string) error {
	info, err := t.fs.Lstat(path)
	if err != nil {
		return err
	}
	s := &t.spare
	s.mu.Lock()
	if s.off || len(s.names)+len(s.pending) >= maxSpare || info.Mode().Perm() != dataModeFresh {
		s.mu.Unlock()
		return t.fs.Remove(path)
	}
	n := s.next
	s.next++
	s.mu.Unlock()
	spare := t.sparePath(n)
	if err := t.fs.Rename(path, spare); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := t.fs.Lstat(path); serr != nil {
				return err // path is gone
			}
		}
		return t.fs.Remove(path) // the spare directory is not usable: remove as before
	}
	s.mu.Lock()
	s.pending = append(s.pending, n)
	batch := len(s.pending) >= pendingBatch
	s.mu.Unlock()
	if batch {
		t.readySpares()
	}
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
