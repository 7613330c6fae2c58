package disk

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/weft-fs/weft/internal/pagecache"
)

// OS is the local file system.
type OS struct{}

var _ FS = OS{}

// OpenFile implements FS.
func (OS) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag|syscall.O_CLOEXEC, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

// Mkdir implements FS.
func (OS) Mkdir(name string, perm fs.FileMode) error { return os.Mkdir(name, perm) }

// MkdirAll implements FS.
func (OS) MkdirAll(name string, perm fs.FileMode) error { return os.MkdirAll(name, perm) }

// Remove implements FS.
func (OS) Remove(name string) error { return os.Remove(name) }

// RemoveAll implements FS.
func (OS) RemoveAll(name string) error { return os.RemoveAll(name) }

// Rename implements FS.
func (OS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// RenameNoReplace implements FS with renameat2(RENAME_NOREPLACE).
func (OS) RenameNoReplace(oldname, newname string) error {
	err := unix.Renameat2(unix.AT_FDCWD, oldname, unix.AT_FDCWD, newname, unix.RENAME_NOREPLACE)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS):
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: ErrUnsupported}
	}
	return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
}

// ReadDir implements FS.
func (OS) ReadDir(name string) ([]fs.DirEntry, error) { return os.ReadDir(name) }

// Lstat implements FS.
func (OS) Lstat(name string) (fs.FileInfo, error) { return os.Lstat(name) }

// SyncDir implements FS.
func (OS) SyncDir(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// SyncFS implements FS.
func (OS) SyncFS(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return &os.PathError{Op: "syncfs", Path: name, Err: err}
	}
	return nil
}

// Lock implements FS with flock(2).
func (OS) Lock(name string) (io.Closer, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: held by another process: %w", name, err)
	}
	return f, nil
}

// Statfs implements FS.
func (OS) Statfs(name string) (Space, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(name, &st); err != nil {
		return Space{}, &os.PathError{Op: "statfs", Path: name, Err: err}
	}
	var fi syscall.Stat_t
	if err := syscall.Stat(name, &fi); err != nil {
		return Space{}, &os.PathError{Op: "stat", Path: name, Err: err}
	}
	return Space{
		Total:    st.Blocks * uint64(st.Bsize),
		Free:     st.Bavail * uint64(st.Bsize),
		Device:   fmt.Sprintf("dev %d:%d", unix.Major(fi.Dev), unix.Minor(fi.Dev)),
		InMemory: pagecache.DirInMemory(name),
	}, nil
}

// osFile is a File of the local file system.
type osFile struct{ *os.File }

func (f osFile) OS() *os.File { return f.File }

// Datasync is fdatasync(2), retried on EINTR. The descriptor is held for
// the call, so a concurrent Close makes it fail with os.ErrClosed instead
// of syncing whatever file reuses the number.
func (f osFile) Datasync() error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if serr = syscall.Fdatasync(int(fd)); serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}

// PunchHole is fallocate(PUNCH_HOLE); where the file system cannot, the
// range is overwritten with zeros.
func (f osFile) PunchHole(off, n int64) error {
	if n <= 0 {
		return nil
	}
	err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return &os.PathError{Op: "punch hole", Path: f.Name(), Err: err}
	}
	st, serr := f.Stat()
	if serr != nil {
		return serr
	}
	end := min(off+n, st.Size())
	zeros := make([]byte, min(end-off, 1<<20))
	for o := off; o < end; o += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), end-o)], o); err != nil {
			return err
		}
	}
	return nil
}
