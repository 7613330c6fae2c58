package disk

import (
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Mem is a file system in memory that can simulate a power loss.
//
// The model, stricter than a journaling file system on a disk with a
// volatile write cache:
//
//   - File contents are kept in pages of PageSize bytes. A page written
//     since the file's last Sync or Datasync may or may not survive a
//     crash, each page on its own (a torn write), and so may a change of
//     the file's size.
//   - Namespace changes (create, mkdir, rename, remove) are kept in the
//     order they were made. SyncDir(d) makes every change up to the last
//     one that touched d durable (a journal commits in order); a crash
//     keeps the durable changes and any prefix of the others.
//   - SyncFS makes everything durable.
//
// Crash returns such a state as a new Mem and makes every later
// operation on this one fail with ErrCrashed, as the processes using it
// would have died. A Mem with a capacity fails writes that would exceed
// it with ENOSPC.
type Mem struct {
	mu       sync.Mutex
	root     *memNode
	durable  map[*memNode]map[string]*memNode // directory entries as durable
	log      []nsOp                           // namespace changes not yet durable, in order
	locks    map[string]bool
	crashed  bool
	capacity int64 // bytes; 0: unbounded
	used     int64 // pages held, in bytes

	// An armed crash (CrashAfter): after countdown more changes, the
	// next one crashes the file system, leaving image.
	countdown int
	crashRNG  *rand.Rand
	image     *Mem
}

// PageSize is the unit in which a crash keeps or loses unsynced data.
const PageSize = 4096

type memNode struct {
	dir      bool
	children map[string]*memNode // directories
	mode     fs.FileMode
	modTime  time.Time

	// Files.
	pages      map[int64]*[PageSize]byte
	size       int64
	synced     map[int64]*[PageSize]byte // content as durable
	syncedSize int64
	dirty      map[int64]bool // pages changed since the last sync
}

// nsOp is a namespace change: entry name of dir set to node (nil:
// removed).
type nsOp struct {
	sets []nsSet
}

type nsSet struct {
	dir  *memNode
	name string
	node *memNode
}

// NewMem returns an empty Mem; capacity bounds the bytes its files hold
// (0: unbounded).
func NewMem(capacity int64) *Mem {
	root := newDir(0o755)
	return &Mem{root: root, durable: map[*memNode]map[string]*memNode{root: {}}, locks: map[string]bool{}, capacity: capacity,
		countdown: -1}
}

// CrashAfter arms a crash: ops more changes (writes, truncates, hole
// punches, syncs, creates, renames, removes) are made, and instead of
// the next one the Mem crashes as Crash does, with rng choosing what
// survives; Image then returns the result.
func (m *Mem) CrashAfter(ops int, rng *rand.Rand) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.countdown, m.crashRNG = ops, rng
}

// Image returns what an armed crash left, or nil if it has not happened.
func (m *Mem) Image() *Mem {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.image
}

// change is called, with m.mu held, before each change: it fails if the
// Mem crashed, or crashes it now if an armed crash is due.
func (m *Mem) change() error {
	if m.crashed {
		return ErrCrashed
	}
	switch {
	case m.countdown == 0:
		m.image = m.crashLocked(m.crashRNG)
		return ErrCrashed
	case m.countdown > 0:
		m.countdown--
	}
	return nil
}

func newDir(mode fs.FileMode) *memNode {
	return &memNode{dir: true, children: map[string]*memNode{}, mode: mode | fs.ModeDir, modTime: time.Now()}
}

func newFile(mode fs.FileMode) *memNode {
	return &memNode{mode: mode, modTime: time.Now(), pages: map[int64]*[PageSize]byte{},
		synced: map[int64]*[PageSize]byte{}, dirty: map[int64]bool{}}
}

var _ FS = (*Mem)(nil)

func pathErr(op, name string, err error) error { return &os.PathError{Op: op, Path: name, Err: err} }

// split cleans name into its components.
func split(name string) []string {
	name = path.Clean("/" + name)
	if name == "/" {
		return nil
	}
	return strings.Split(name[1:], "/")
}

// lookup finds the parent directory of name and the node at name (nil if
// absent). Called with m.mu held.
func (m *Mem) lookup(name string) (parent *memNode, base string, node *memNode, err error) {
	if m.crashed {
		return nil, "", nil, ErrCrashed
	}
	parts := split(name)
	if len(parts) == 0 {
		return nil, "", m.root, nil
	}
	dir := m.root
	for _, p := range parts[:len(parts)-1] {
		next := dir.children[p]
		if next == nil {
			return nil, "", nil, fs.ErrNotExist
		}
		if !next.dir {
			return nil, "", nil, syscall.ENOTDIR
		}
		dir = next
	}
	base = parts[len(parts)-1]
	return dir, base, dir.children[base], nil
}

// set changes the namespace (one change, applied at once) and logs it.
func (m *Mem) set(sets ...nsSet) {
	for _, s := range sets {
		if s.node == nil {
			delete(s.dir.children, s.name)
		} else {
			s.dir.children[s.name] = s.node
		}
	}
	m.log = append(m.log, nsOp{sets: sets})
}

// applyDurable applies the first n logged changes to the durable view.
func (m *Mem) applyDurable(n int) {
	for _, op := range m.log[:n] {
		applyOp(m.durable, op)
	}
	m.log = slices.Delete(m.log, 0, n)
}

func applyOp(view map[*memNode]map[string]*memNode, op nsOp) {
	for _, s := range op.sets {
		d := view[s.dir]
		if d == nil {
			d = map[string]*memNode{}
			view[s.dir] = d
		}
		if s.node == nil {
			delete(d, s.name)
			continue
		}
		d[s.name] = s.node
		if s.node.dir && view[s.node] == nil {
			view[s.node] = map[string]*memNode{}
		}
	}
}

// OpenFile implements FS.
func (m *Mem) OpenFile(name string, flag int, perm fs.FileMode) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	parent, base, n, err := m.lookup(name)
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	if n == nil {
		if flag&os.O_CREATE == 0 {
			return nil, pathErr("open", name, fs.ErrNotExist)
		}
		if err := m.change(); err != nil {
			return nil, pathErr("open", name, err)
		}
		n = newFile(perm.Perm())
		m.set(nsSet{parent, base, n})
	} else if flag&(os.O_CREATE|os.O_EXCL) == os.O_CREATE|os.O_EXCL {
		return nil, pathErr("open", name, fs.ErrExist)
	}
	if n.dir && flag&(os.O_WRONLY|os.O_RDWR) != 0 {
		return nil, pathErr("open", name, syscall.EISDIR)
	}
	if flag&os.O_TRUNC != 0 && !n.dir && n.size > 0 {
		if err := m.change(); err != nil {
			return nil, pathErr("open", name, err)
		}
		m.truncate(n, 0)
	}
	return &memFile{m: m, n: n, name: name, write: flag&(os.O_WRONLY|os.O_RDWR) != 0}, nil
}

// Mkdir implements FS.
func (m *Mem) Mkdir(name string, perm fs.FileMode) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	parent, base, n, err := m.lookup(name)
	if err != nil {
		return pathErr("mkdir", name, err)
	}
	if n != nil || parent == nil {
		return pathErr("mkdir", name, fs.ErrExist)
	}
	if err := m.change(); err != nil {
		return pathErr("mkdir", name, err)
	}
	m.set(nsSet{parent, base, newDir(perm.Perm())})
	return nil
}

// MkdirAll implements FS.
func (m *Mem) MkdirAll(name string, perm fs.FileMode) error {
	parts := split(name)
	for i := range parts {
		err := m.Mkdir("/"+strings.Join(parts[:i+1], "/"), perm)
		if err != nil && !os.IsExist(err) {
			return err
		}
	}
	return nil
}

// Remove implements FS.
func (m *Mem) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	parent, base, n, err := m.lookup(name)
	if err == nil && n == nil {
		err = fs.ErrNotExist
	}
	if err == nil && parent == nil {
		err = syscall.EBUSY
	}
	if err == nil && n.dir && len(n.children) > 0 {
		err = syscall.ENOTEMPTY
	}
	if err == nil {
		err = m.change()
	}
	if err != nil {
		return pathErr("remove", name, err)
	}
	m.set(nsSet{parent, base, nil})
	m.release(n)
	return nil
}

// release returns the room of a file no longer in the namespace.
func (m *Mem) release(n *memNode) {
	if !n.dir {
		m.used -= int64(len(n.pages)) * PageSize
	}
}

// RemoveAll implements FS.
func (m *Mem) RemoveAll(name string) error {
	m.mu.Lock()
	_, _, n, err := m.lookup(name)
	var names []string
	if err == nil && n != nil && n.dir {
		for c := range n.children {
			names = append(names, c)
		}
	}
	m.mu.Unlock()
	if err != nil && err != fs.ErrNotExist {
		return pathErr("removeall", name, err)
	}
	if n == nil {
		return nil
	}
	for _, c := range names {
		if err := m.RemoveAll(path.Join(name, c)); err != nil {
			return err
		}
	}
	return m.Remove(name)
}

// Rename implements FS.
func (m *Mem) Rename(oldname, newname string) error { return m.rename(oldname, newname, true) }

// RenameNoReplace implements FS.
func (m *Mem) RenameNoReplace(oldname, newname string) error {
	return m.rename(oldname, newname, false)
}

func (m *Mem) rename(oldname, newname string, replace bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	op, np, ob, n, err := m.lookup2(oldname, newname)
	if err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	if err := m.change(); err != nil {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	nb := path.Base(path.Clean("/" + newname))
	if old := np.children[nb]; old != nil && old != n {
		if !replace {
			return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: fs.ErrExist}
		}
		if old.dir != n.dir || old.dir && len(old.children) > 0 {
			return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: syscall.ENOTEMPTY}
		}
		m.release(old)
	}
	m.set(nsSet{op, ob, nil}, nsSet{np, nb, n})
	return nil
}

func (m *Mem) lookup2(oldname, newname string) (op, np *memNode, ob string, n *memNode, err error) {
	op, ob, n, err = m.lookup(oldname)
	if err == nil && (n == nil || op == nil) {
		err = fs.ErrNotExist
	}
	if err != nil {
		return nil, nil, "", nil, err
	}
	np, _, _, err = m.lookup(newname)
	if err == nil && np == nil {
		err = syscall.EBUSY
	}
	return op, np, ob, n, err
}

// ReadDir implements FS.
func (m *Mem) ReadDir(name string) ([]fs.DirEntry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, _, n, err := m.lookup(name)
	if err == nil && n == nil {
		err = fs.ErrNotExist
	}
	if err == nil && !n.dir {
		err = syscall.ENOTDIR
	}
	if err != nil {
		return nil, pathErr("readdir", name, err)
	}
	out := make([]fs.DirEntry, 0, len(n.children))
	for c, cn := range n.children {
		out = append(out, fs.FileInfoToDirEntry(cn.info(c)))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out, nil
}

// Lstat implements FS.
func (m *Mem) Lstat(name string) (fs.FileInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, _, n, err := m.lookup(name)
	if err == nil && n == nil {
		err = fs.ErrNotExist
	}
	if err != nil {
		return nil, pathErr("lstat", name, err)
	}
	return n.info(path.Base(path.Clean("/" + name))), nil
}

// SyncDir implements FS.
func (m *Mem) SyncDir(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, _, n, err := m.lookup(name)
	if err == nil && (n == nil || !n.dir) {
		err = fs.ErrNotExist
	}
	if err == nil {
		err = m.change()
	}
	if err != nil {
		return pathErr("fsync", name, err)
	}
	last := -1
	for i, op := range m.log {
		for _, s := range op.sets {
			if s.dir == n {
				last = i
			}
		}
	}
	m.applyDurable(last + 1)
	return nil
}

// SyncFS implements FS.
func (m *Mem) SyncFS(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.change(); err != nil {
		return pathErr("syncfs", name, err)
	}
	m.applyDurable(len(m.log))
	m.walk(m.root, func(n *memNode) { n.sync() })
	return nil
}

func (m *Mem) walk(n *memNode, fn func(*memNode)) {
	fn(n)
	for _, c := range n.children {
		m.walk(c, fn)
	}
}

// Lock implements FS.
func (m *Mem) Lock(name string) (io.Closer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return nil, pathErr("lock", name, ErrCrashed)
	}
	if m.locks[name] {
		return nil, fmt.Errorf("lock %s: held: %w", name, syscall.EWOULDBLOCK)
	}
	m.locks[name] = true
	return closerFunc(func() error {
		m.mu.Lock()
		delete(m.locks, name)
		m.mu.Unlock()
		return nil
	}), nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// Statfs implements FS.
func (m *Mem) Statfs(name string) (Space, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.crashed {
		return Space{}, pathErr("statfs", name, ErrCrashed)
	}
	total := m.capacity
	if total == 0 {
		total = 1 << 40
	}
	return Space{Total: uint64(total), Free: uint64(max(total-m.used, 0)), Device: fmt.Sprintf("mem %p", m), InMemory: true}, nil
}

// Crash simulates a power loss now: it returns what the file system could
// hold after it (see Mem), chosen with rng (nil: nothing that was not
// synced survives), and makes every later operation on m fail with
// ErrCrashed.
func (m *Mem) Crash(rng *rand.Rand) *Mem {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.crashLocked(rng)
}

// CrashCopy returns what a crash now could leave (as Crash does) while m
// goes on working: for a crash under writers that must not see it.
func (m *Mem) CrashCopy(rng *rand.Rand) *Mem {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.imageLocked(rng)
}

func (m *Mem) crashLocked(rng *rand.Rand) *Mem {
	m.crashed = true
	return m.imageLocked(rng)
}

func (m *Mem) imageLocked(rng *rand.Rand) *Mem {
	view := make(map[*memNode]map[string]*memNode, len(m.durable))
	for d, entries := range m.durable {
		view[d] = mapsClone(entries)
	}
	kept := 0
	if rng != nil {
		kept = rng.IntN(len(m.log) + 1)
	}
	for _, op := range m.log[:kept] {
		applyOp(view, op)
	}
	out := &Mem{locks: map[string]bool{}, capacity: m.capacity, durable: map[*memNode]map[string]*memNode{}, countdown: -1}
	copied := map[*memNode]*memNode{}
	var clone func(n *memNode) *memNode
	clone = func(n *memNode) *memNode {
		if c := copied[n]; c != nil {
			return c
		}
		if n.dir {
			c := newDir(n.mode.Perm())
			copied[n] = c
			for _, name := range slices.Sorted(maps.Keys(view[n])) {
				c.children[name] = clone(view[n][name])
			}
			out.durable[c] = mapsClone(c.children)
			return c
		}
		c := n.crashCopy(rng)
		copied[n] = c
		out.used += int64(len(c.pages)) * PageSize
		return c
	}
	out.root = clone(m.root)
	return out
}

func mapsClone[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// crashCopy is the file as a crash could leave it: its synced pages and
// size, and any of the changes since.
func (n *memNode) crashCopy(rng *rand.Rand) *memNode {
	c := newFile(n.mode.Perm())
	c.modTime = n.modTime
	c.size = n.syncedSize
	if rng != nil && n.size != n.syncedSize && rng.IntN(2) == 0 {
		c.size = n.size
	}
	for i, p := range n.synced {
		c.pages[i] = p
	}
	for _, i := range slices.Sorted(maps.Keys(n.dirty)) { // in order: a seed replays
		if rng == nil || rng.IntN(2) == 0 {
			continue
		}
		if p := n.pages[i]; p != nil {
			c.pages[i] = p
		} else {
			delete(c.pages, i)
		}
	}
	// Pages past the size are gone; the rest of a partial last page
	// reads as zeros.
	for i, p := range c.pages {
		switch start := i * PageSize; {
		case start >= c.size:
			delete(c.pages, i)
		case start+PageSize > c.size:
			q := *p
			clear(q[c.size-start:])
			c.pages[i] = &q
		}
	}
	for i, p := range c.pages {
		c.synced[i] = p
	}
	c.syncedSize = c.size
	return c
}

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
