// Package disk is the file-system seam under the data servers' chunk
// store and the meta service's embedded engine: the few file operations
// they make (open, positioned reads and writes, truncate, hole punching,
// fdatasync, rename, directory sync), behind an interface with two
// implementations. OS is the local file system. Mem is a file system in
// memory that knows what was made durable: Crash returns the state a
// power loss could leave at that instant (everything synced, and any
// subset of the rest), which is how tests prove that what was
// acknowledged survives (see mem.go for the model).
package disk

import (
	"errors"
	"io"
	"io/fs"
	"os"
)

// FS is a file system. Paths are as the os package takes them.
type FS interface {
	// OpenFile opens a file with the flags of os.OpenFile (O_RDONLY,
	// O_RDWR, O_CREATE, O_EXCL, O_TRUNC).
	OpenFile(name string, flag int, perm fs.FileMode) (File, error)
	Mkdir(name string, perm fs.FileMode) error
	MkdirAll(name string, perm fs.FileMode) error
	// Remove removes a file or an empty directory.
	Remove(name string) error
	RemoveAll(name string) error
	// Rename replaces newname if it exists, as rename(2) does.
	Rename(oldname, newname string) error
	// RenameNoReplace fails with fs.ErrExist if newname exists, and with
	// ErrUnsupported where the file system cannot rename that way.
	RenameNoReplace(oldname, newname string) error
	ReadDir(name string) ([]fs.DirEntry, error)
	Lstat(name string) (fs.FileInfo, error)
	// SyncDir makes the entries of directory name durable.
	SyncDir(name string) error
	// SyncFS makes everything written to the file system holding name
	// durable (syncfs(2)).
	SyncFS(name string) error
	// Lock takes an exclusive lock on the file name (created if needed)
	// against other processes; it fails at once if it is held.
	Lock(name string) (io.Closer, error)
	// Statfs reports the capacity of the file system holding name.
	Statfs(name string) (Space, error)
}

// File is an open file.
type File interface {
	io.ReaderAt
	io.WriterAt
	io.Closer
	Name() string
	Stat() (fs.FileInfo, error)
	Truncate(size int64) error
	Chmod(mode fs.FileMode) error
	// Sync makes the file's data and metadata durable (fsync).
	Sync() error
	// Datasync makes the file's data, and the metadata needed to read it
	// back, durable (fdatasync).
	Datasync() error
	// PunchHole frees the bytes [off, off+n): they read as zeros and take
	// no room where the file system can do that.
	PunchHole(off, n int64) error
	// OS returns the *os.File behind the file, or nil for a file that is
	// not one (in memory): descriptor-level work (read-ahead, handing a
	// descriptor to another process) is skipped for those.
	OS() *os.File
}

// Space is a file system's capacity.
type Space struct {
	Total, Free uint64
	// Device identifies the file system, so that capacity shared by
	// several directories is counted once.
	Device string
	// InMemory is set for a file system that keeps its files in memory
	// (tmpfs, Mem): there is nothing to read ahead from a disk.
	InMemory bool
}

// ErrUnsupported is returned for an operation the file system cannot do.
var ErrUnsupported = errors.New("not supported by this file system")

// ErrCrashed is returned by every operation on a Mem after Crash.
var ErrCrashed = errors.New("file system crashed (simulated power loss)")

// ReadFile reads the whole file name.
func ReadFile(fsys FS, name string) ([]byte, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := make([]byte, st.Size())
	n, err := f.ReadAt(b, 0)
	if err == io.EOF {
		err = nil
	}
	return b[:n], err
}

// WriteFileDurably writes data to name through a temporary file that is
// synced and renamed into place, then syncs the directory: after a crash
// name holds either its old content or data.
func WriteFileDurably(fsys FS, dir, name string, data []byte, perm fs.FileMode) error {
	tmp := name + ".tmp"
	f, err := fsys.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err = f.WriteAt(data, 0); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fsys.Rename(tmp, name)
	}
	if err != nil {
		fsys.Remove(tmp)
		return err
	}
	return fsys.SyncDir(dir)
}
