package pebblekv

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/weft-fs/weft/internal/disk"
)

// OpenFS opens (creating if needed) the database in dir of fsys: the
// file-system seam shared with the chunk store (package disk), through
// which tests run the engine on a file system that can crash. On the
// local file system it is Open.
func OpenFS(dir string, fsys disk.FS) (*Engine, error) {
	if _, ok := fsys.(disk.OS); ok || fsys == nil {
		return Open(dir)
	}
	return open(dir, diskFS{fsys})
}

// diskFS is pebble's file-system interface over a disk.FS.
type diskFS struct{ fs disk.FS }

var _ vfs.FS = diskFS{}

func (d diskFS) Create(name string, _ vfs.DiskWriteCategory) (vfs.File, error) {
	if err := d.fs.Remove(name); err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	f, err := d.fs.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	return &diskFile{f: f}, nil
}

func (d diskFS) Link(oldname, newname string) error {
	return &os.LinkError{Op: "link", Old: oldname, New: newname, Err: disk.ErrUnsupported}
}

func (d diskFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := d.fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	return &diskFile{f: f}, nil
}

func (d diskFS) OpenReadWrite(name string, _ vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := d.fs.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	return &diskFile{f: f}, nil
}

func (d diskFS) OpenDir(name string) (vfs.File, error) {
	info, err := d.fs.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("open directory %s: not a directory", name)
	}
	return &diskDir{fs: d.fs, name: name}, nil
}

func (d diskFS) Remove(name string) error    { return d.fs.Remove(name) }
func (d diskFS) RemoveAll(name string) error { return d.fs.RemoveAll(name) }
func (d diskFS) Rename(oldname, newname string) error {
	return d.fs.Rename(oldname, newname)
}

func (d diskFS) ReuseForWrite(oldname, newname string, _ vfs.DiskWriteCategory) (vfs.File, error) {
	if err := d.fs.Rename(oldname, newname); err != nil {
		return nil, err
	}
	f, err := d.fs.OpenFile(newname, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return &diskFile{f: f}, nil
}

func (d diskFS) MkdirAll(dir string, perm os.FileMode) error { return d.fs.MkdirAll(dir, perm) }
func (d diskFS) Lock(name string) (io.Closer, error)         { return d.fs.Lock(name) }

func (d diskFS) List(dir string) ([]string, error) {
	entries, err := d.fs.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}

func (d diskFS) Stat(name string) (vfs.FileInfo, error) {
	info, err := d.fs.Lstat(name)
	if err != nil {
		return nil, err
	}
	return fileInfo{info}, nil
}

func (d diskFS) PathBase(path string) string    { return filepath.Base(path) }
func (d diskFS) PathJoin(elem ...string) string { return filepath.Join(elem...) }
func (d diskFS) PathDir(path string) string     { return filepath.Dir(path) }
func (d diskFS) Unwrap() vfs.FS                 { return nil }
func (d diskFS) GetDiskUsage(path string) (vfs.DiskUsage, error) {
	sp, err := d.fs.Statfs(path)
	if err != nil {
		return vfs.DiskUsage{}, err
	}
	return vfs.DiskUsage{AvailBytes: sp.Free, TotalBytes: sp.Total, UsedBytes: sp.Total - sp.Free}, nil
}

type fileInfo struct{ fs.FileInfo }

func (fileInfo) DeviceID() vfs.DeviceID { return vfs.DeviceID{} }

// diskFile is a pebble file over a disk.File, with the position that
// Read and Write advance.
type diskFile struct {
	f    disk.File
	rpos int64
	wpos int64
}

func (f *diskFile) Close() error { return f.f.Close() }

func (f *diskFile) Read(p []byte) (int, error) {
	n, err := f.f.ReadAt(p, f.rpos)
	f.rpos += int64(n)
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

func (f *diskFile) ReadAt(p []byte, off int64) (int, error) { return f.f.ReadAt(p, off) }

func (f *diskFile) Write(p []byte) (int, error) {
	n, err := f.f.WriteAt(p, f.wpos)
	f.wpos += int64(n)
	return n, err
}

func (f *diskFile) WriteAt(p []byte, off int64) (int, error) { return f.f.WriteAt(p, off) }
func (f *diskFile) Preallocate(offset, length int64) error   { return nil }
func (f *diskFile) Stat() (vfs.FileInfo, error) {
	info, err := f.f.Stat()
	if err != nil {
		return nil, err
	}
	return fileInfo{info}, nil
}
func (f *diskFile) Sync() error { return f.f.Sync() }
func (f *diskFile) SyncTo(length int64) (fullSync bool, err error) {
	return true, f.f.Datasync()
}
func (f *diskFile) SyncData() error                     { return f.f.Datasync() }
func (f *diskFile) Prefetch(offset, length int64) error { return nil }
func (f *diskFile) Fd() uintptr                         { return vfs.InvalidFd }

// diskDir is a directory opened for syncing.
type diskDir struct {
	fs   disk.FS
	name string
}

func (d *diskDir) Close() error                       { return nil }
func (d *diskDir) Read([]byte) (int, error)           { return 0, d.unsupported("read") }
func (d *diskDir) ReadAt([]byte, int64) (int, error)  { return 0, d.unsupported("read") }
func (d *diskDir) Write([]byte) (int, error)          { return 0, d.unsupported("write") }
func (d *diskDir) WriteAt([]byte, int64) (int, error) { return 0, d.unsupported("write") }
func (d *diskDir) Preallocate(int64, int64) error     { return nil }
func (d *diskDir) Stat() (vfs.FileInfo, error)        { return diskFS{d.fs}.Stat(d.name) }
func (d *diskDir) Sync() error                        { return d.fs.SyncDir(d.name) }
func (d *diskDir) SyncTo(int64) (bool, error)         { return false, nil }
func (d *diskDir) SyncData() error                    { return d.fs.SyncDir(d.name) }
func (d *diskDir) Prefetch(int64, int64) error        { return nil }
func (d *diskDir) Fd() uintptr                        { return vfs.InvalidFd }
func (d *diskDir) unsupported(op string) error {
	return &os.PathError{Op: op, Path: d.name, Err: disk.ErrUnsupported}
}
