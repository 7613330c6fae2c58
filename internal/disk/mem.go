package disk

import (
	"fmt"
	"io"
	"io/fs"
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
