package disk

import (
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"
	"time"
)

// Files of a Mem: their content in pages, what a sync makes durable, and
// the open files.
func (n *memNode) info(name string) fs.FileInfo {
	size := n.size
	if n.dir {
		size = int64(len(n.children))
	}
	return memInfo{name: name, size: size, mode: n.mode, modTime: n.modTime}
}

// sync makes the file's content durable. Pages are never modified in
// place once shared with the synced view (see write).
func (n *memNode) sync() {
	if n.dir {
		return
	}
	for i := range n.dirty {
		if p := n.pages[i]; p != nil {
			n.synced[i] = p
		} else {
			delete(n.synced, i)
		}
	}
	clear(n.dirty)
	n.syncedSize = n.size
}

// truncate sets the size of file n. Called with m.mu held.
func (m *Mem) truncate(n *memNode, size int64) {
	if size < n.size {
		for i := range n.pages {
			switch start := i * PageSize; {
			case start >= size:
				delete(n.pages, i)
				n.dirty[i] = true
				m.used -= PageSize
			case start+PageSize > size:
				m.zeroPage(n, i, size-start, PageSize)
			}
		}
	}
	n.size = size
	n.modTime = time.Now()
}

// zeroPage zeros bytes [from, to) of page i of n.
func (m *Mem) zeroPage(n *memNode, i, from, to int64) {
	p := n.pages[i]
	if p == nil {
		return
	}
	q := *p
	clear(q[from:to])
	n.pages[i] = &q
	n.dirty[i] = true
}

type memInfo struct {
	name    string
	size    int64
	mode    fs.FileMode
	modTime time.Time
}

func (i memInfo) Name() string       { return i.name }
func (i memInfo) Size() int64        { return i.size }
func (i memInfo) Mode() fs.FileMode  { return i.mode }
func (i memInfo) ModTime() time.Time { return i.modTime }
func (i memInfo) IsDir() bool        { return i.mode.IsDir() }
func (i memInfo) Sys() any           { return nil }

// memFile is an open file of a Mem.
type memFile struct {
	m      *Mem
	n      *memNode
	name   string
	write  bool
	closed bool
}

func (f *memFile) check(op string) error {
	if f.closed {
		return pathErr(op, f.name, os.ErrClosed)
	}
	if f.m.crashed {
		return pathErr(op, f.name, ErrCrashed)
	}
	return nil
}

func (f *memFile) Name() string { return f.name }

func (f *memFile) ReadAt(b []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("read"); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, pathErr("read", f.name, syscall.EINVAL)
	}
	n := f.n
	if off >= n.size {
		return 0, io.EOF
	}
	end := min(off+int64(len(b)), n.size)
	for o := off; o < end; {
		i, in := o/PageSize, o%PageSize
		k := min(PageSize-in, end-o)
		if p := n.pages[i]; p != nil {
			copy(b[o-off:o-off+k], p[in:in+k])
		} else {
			clear(b[o-off : o-off+k])
		}
		o += k
	}
	if int(end-off) < len(b) {
		return int(end - off), io.EOF
	}
	return len(b), nil
}

func (f *memFile) WriteAt(b []byte, off int64) (int, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("write"); err != nil {
		return 0, err
	}
	if err := f.m.change(); err != nil {
		return 0, pathErr("write", f.name, err)
	}
	if !f.write {
		return 0, pathErr("write", f.name, syscall.EBADF)
	}
	if off < 0 {
		return 0, pathErr("write", f.name, syscall.EINVAL)
	}
	m, n := f.m, f.n
	end := off + int64(len(b))
	// Room: every page the write makes anew.
	need := int64(0)
	for i := off / PageSize; i*PageSize < end; i++ {
		if n.pages[i] == nil {
			need += PageSize
		}
	}
	if m.capacity > 0 && m.used+need > m.capacity {
		return 0, pathErr("write", f.name, syscall.ENOSPC)
	}
	m.used += need
	for o := off; o < end; {
		i, in := o/PageSize, o%PageSize
		k := min(PageSize-in, end-o)
		// Copy on write: a page may be shared with the synced view.
		q := new([PageSize]byte)
		if p := n.pages[i]; p != nil {
			*q = *p
		}
		copy(q[in:in+k], b[o-off:o-off+k])
		n.pages[i] = q
		n.dirty[i] = true
		o += k
	}
	n.size = max(n.size, end)
	n.modTime = time.Now()
	return len(b), nil
}

func (f *memFile) Close() error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if f.closed {
		return pathErr("close", f.name, os.ErrClosed)
	}
	f.closed = true
	return nil
}

func (f *memFile) Stat() (fs.FileInfo, error) {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("stat"); err != nil {
		return nil, err
	}
	return f.n.info(path.Base(f.name)), nil
}

func (f *memFile) Truncate(size int64) error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("truncate"); err != nil {
		return err
	}
	if err := f.m.change(); err != nil {
		return pathErr("truncate", f.name, err)
	}
	if !f.write || size < 0 {
		return pathErr("truncate", f.name, syscall.EINVAL)
	}
	f.m.truncate(f.n, size)
	return nil
}

func (f *memFile) Chmod(mode fs.FileMode) error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("chmod"); err != nil {
		return err
	}
	if err := f.m.change(); err != nil {
		return pathErr("chmod", f.name, err)
	}
	f.n.mode = f.n.mode&^fs.ModePerm | mode.Perm()
	return nil
}

func (f *memFile) Sync() error { return f.Datasync() }

func (f *memFile) Datasync() error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("fdatasync"); err != nil {
		return err
	}
	if err := f.m.change(); err != nil {
		return pathErr("fdatasync", f.name, err)
	}
	f.n.sync()
	return nil
}

func (f *memFile) PunchHole(off, n int64) error {
	f.m.mu.Lock()
	defer f.m.mu.Unlock()
	if err := f.check("punch hole"); err != nil {
		return err
	}
	if err := f.m.change(); err != nil {
		return pathErr("punch hole", f.name, err)
	}
	if !f.write {
		return pathErr("punch hole", f.name, syscall.EBADF)
	}
	node := f.n
	end := min(off+n, node.size)
	for o := off; o < end; {
		i, in := o/PageSize, o%PageSize
		k := min(PageSize-in, end-o)
		if in == 0 && k == PageSize {
			if node.pages[i] != nil {
				delete(node.pages, i)
				node.dirty[i] = true
				f.m.used -= PageSize
			}
		} else {
			f.m.zeroPage(node, i, in, in+k)
		}
		o += k
	}
	return nil
}

func (f *memFile) OS() *os.File { return nil }
