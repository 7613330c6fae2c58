package campaign

import (
	"fmt"
	"math/rand/v2"
	"path"
	"slices"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// metaWorker creates, renames and removes files and directories in its
// own directory on one mount, and checks names, types, inode numbers and
// file contents against its model.
type metaWorker struct {
	name  string
	m     *mountNode
	base  string // its directory, relative to the mount's root
	rng   *rand.Rand
	rec   *recorder
	model *nsModel
	next  int // for fresh names
}

func newMetaWorker(name string, m *mountNode, base string, seed uint64, rec *recorder) *metaWorker {
	return &metaWorker{name: name, m: m, base: base, rng: rand.New(rand.NewPCG(seed, 0x3e7a)), rec: rec, model: newNSModel()}
}

// abs is p (relative to the worker's directory) relative to the mount's
// root.
func (w *metaWorker) abs(p string) string { return path.Join(w.base, p) }

func (w *metaWorker) call(op string, fn func() error) error {
	start := time.Now()
	err := fn()
	w.rec.done(w.name, op, start, err)
	return err
}

// run works until stop is closed.
func (w *metaWorker) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		root, _, ok := w.m.rootOf()
		if !ok {
			time.Sleep(downPause)
			continue
		}
		w.resolve(root)
		w.step(root)
		time.Sleep(stepPause)
	}
}

// fresh returns a new name with prefix.
func (w *metaWorker) fresh(prefix string) string {
	w.next++
	return fmt.Sprintf("%s%d", prefix, w.next)
}

func (w *metaWorker) step(root int) {
	m := w.model
	dirs := m.dirs()
	r := w.rng.IntN(100)
	switch {
	case r < 30: // create a file with some content
		p := path.Join(dirs[w.rng.IntN(len(dirs))], w.fresh("f"))
		content := make([]byte, w.rng.IntN(8<<10))
		for i := range content {
			content[i] = byte(w.rng.IntN(256))
		}
		var ino uint64
		err := w.call("create", func() error {
			fd, err := unix.Openat(root, w.abs(p), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err == nil {
				ino = st.Ino
			}
			if _, err := unix.Write(fd, content); err != nil {
				unix.Close(fd)
				return err
			}
			return unix.Close(fd)
		})
		if err != nil {
			m.pending = append(m.pending, &nsPending{op: "create", from: p, ino: ino})
			return
		}
		m.entries[p] = &nsEntry{ino: ino, content: content}
	case r < 40:
		p := path.Join(dirs[w.rng.IntN(len(dirs))], w.fresh("d"))
		if err := w.call("mkdir", func() error { return unix.Mkdirat(root, w.abs(p), 0o755) }); err != nil {
			m.pending = append(m.pending, &nsPending{op: "mkdir", from: p})
			return
		}
		e := &nsEntry{dir: true}
		var st unix.Stat_t
		if w.call("stat", func() error { return unix.Fstatat(root, w.abs(p), &st, unix.AT_SYMLINK_NOFOLLOW) }) == nil {
			e.ino = st.Ino
		}
		m.entries[p] = e
	case r < 60:
		w.rename(root)
	case r < 72:
		files := m.pick(func(p string, e *nsEntry) bool { return !e.dir })
		if len(files) == 0 {
			return
		}
		p := files[w.rng.IntN(len(files))]
		if err := w.call("unlink", func() error { return unix.Unlinkat(root, w.abs(p), 0) }); err != nil {
			m.pending = append(m.pending, &nsPending{op: "unlink", from: p, ino: m.entries[p].ino})
			return
		}
		delete(m.entries, p)
	case r < 77:
		empty := m.pick(func(p string, e *nsEntry) bool { return e.dir && p != "" && len(m.children(p)) == 0 })
		if len(empty) == 0 {
			return
		}
		p := empty[w.rng.IntN(len(empty))]
		if err := w.call("rmdir", func() error { return unix.Unlinkat(root, w.abs(p), unix.AT_REMOVEDIR) }); err != nil {
			m.pending = append(m.pending, &nsPending{op: "rmdir", from: p, ino: m.entries[p].ino})
			return
		}
		delete(m.entries, p)
	case r < 90:
		all := m.pick(func(p string, e *nsEntry) bool { return p != "" })
		if len(all) == 0 {
			return
		}
		w.checkEntry(root, all[w.rng.IntN(len(all))], "stat")
	default:
		ds := m.pick(func(p string, e *nsEntry) bool { return e.dir })
		w.checkDir(root, ds[w.rng.IntN(len(ds))])
	}
}

// rename renames an entry to a fresh name or over a file.
func (w *metaWorker) rename(root int) {
	m := w.model
	srcs := m.pick(func(p string, e *nsEntry) bool { return p != "" })
	if len(srcs) == 0 {
		return
	}
	from := srcs[w.rng.IntN(len(srcs))]
	src := m.entries[from]
	var parents []string
	for _, d := range m.dirs() {
		if !within(d, from) {
			parents = append(parents, d)
		}
	}
	to := path.Join(parents[w.rng.IntN(len(parents))], w.fresh("r"))
	var replaced *nsEntry
	if !src.dir && w.rng.IntN(3) == 0 {
		files := m.pick(func(p string, e *nsEntry) bool { return !e.dir && p != from })
		if len(files) > 0 {
			to = files[w.rng.IntN(len(files))]
			replaced = m.entries[to]
		}
	}
	if err := w.call("rename", func() error { return unix.Renameat(root, w.abs(from), root, w.abs(to)) }); err != nil {
		m.pending = append(m.pending, &nsPending{op: "rename", from: from, to: to, ino: src.ino, replaced: replaced})
		return
	}
	m.move(from, to)
}

// lstat returns the entry at p: ok false if there is none, err if the
// file system could not say.
func (w *metaWorker) lstat(root int, p string) (st unix.Stat_t, ok bool, err error) {
	var e error
	err = w.call("stat", func() error {
		e = unix.Fstatat(root, w.abs(p), &st, unix.AT_SYMLINK_NOFOLLOW)
		return ignoreENOENT(e)
	})
	if err != nil {
		return st, false, err
	}
	return st, e == nil, nil
}

// resolve looks at the outcome of each pending operation and settles the
// model; one it cannot look at yet stays pending.
func (w *metaWorker) resolve(root int) {
	m := w.model
	var left []*nsPending
	for _, x := range m.pending {
		st, there, err := w.lstat(root, x.from)
		if err != nil {
			left = append(left, x)
			continue
		}
		switch x.op {
		case "create", "mkdir":
			if there {
				isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
				if isDir != (x.op == "mkdir") || (x.ino != 0 && st.Ino != x.ino) {
					w.rec.find("%s: failed %s of %s left a different entry (mode %o, inode %d, want inode %d)", w.name, x.op, x.from, st.Mode, st.Ino, x.ino)
				}
				m.entries[x.from] = &nsEntry{dir: isDir, ino: st.Ino}
			}
		case "unlink", "rmdir":
			if !there {
				m.removeTree(x.from)
			} else if x.ino != 0 && st.Ino != x.ino {
				w.rec.find("%s: failed %s of %s left another inode there (%d, want %d)", w.name, x.op, x.from, st.Ino, x.ino)
				m.entries[x.from].ino = st.Ino
			}
		case "rename":
			dst, dstThere, err := w.lstat(root, x.to)
			if err != nil {
				left = append(left, x)
				continue
			}
			applied := !there && dstThere && (x.ino == 0 || dst.Ino == x.ino)
			notApplied := there && (x.ino == 0 || st.Ino == x.ino) &&
				(x.replaced == nil && !dstThere || x.replaced != nil && dstThere && (x.replaced.ino == 0 || dst.Ino == x.replaced.ino))
			switch {
			case applied:
				m.move(x.from, x.to)
			case notApplied:
			default:
				w.rec.find("%s: failed rename of %s to %s left neither outcome: source there %v (inode %d), target there %v (inode %d); moved inode %d, replaced %v",
					w.name, x.from, x.to, there, st.Ino, dstThere, dst.Ino, x.ino, x.replaced != nil)
				if !there {
					m.removeTree(x.from)
				}
				if dstThere && !applied {
					m.entries[x.to] = &nsEntry{dir: dst.Mode&unix.S_IFMT == unix.S_IFDIR, ino: dst.Ino}
				}
			}
		}
	}
	m.pending = left
}

// checkEntry checks that p exists with its type, inode and content.
func (w *metaWorker) checkEntry(root int, p, how string) {
	e := w.model.entries[p]
	st, there, err := w.lstat(root, p)
	if err != nil {
		return
	}
	if !there {
		w.rec.find("%s: %s: acknowledged %s is gone", w.name, how, w.abs(p))
		w.model.removeTree(p)
		return
	}
	if isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR; isDir != e.dir || (e.ino != 0 && st.Ino != e.ino) {
		w.rec.find("%s: %s: %s has mode %o and inode %d; want a directory %v, inode %d", w.name, how, w.abs(p), st.Mode, st.Ino, e.dir, e.ino)
		return
	}
	if e.dir || e.content == nil {
		return
	}
	var got []byte
	if w.call("read", func() (err error) { got, err = readWhole(root, w.abs(p)); return }) != nil {
		return
	}
	if string(got) != string(e.content) {
		w.rec.find("%s: %s: %s: %s", w.name, how, w.abs(p), describeDiff(got, e.content))
	}
}

// checkDir lists directory p and compares its names with the model's;
// names of pending operations may or may not be there.
func (w *metaWorker) checkDir(root int, p string) {
	var names []string
	err := w.call("readdir", func() (err error) { names, err = listDir(root, w.abs(p)); return })
	if err != nil {
		return
	}
	want := w.model.children(p)
	for _, n := range names {
		if !slices.Contains(want, n) && !w.model.locked(path.Join(p, n)) {
			w.rec.find("%s: %s lists %q, which was never made or was removed", w.name, w.abs(p), n)
		}
	}
	for _, n := range want {
		if !slices.Contains(names, n) && !w.model.locked(path.Join(p, n)) {
			w.rec.find("%s: %s does not list %q, which was made and never removed", w.name, w.abs(p), n)
		}
	}
}

// listDir returns the names in directory p below root, sorted.
func listDir(root int, p string) ([]string, error) {
	fd, err := unix.Openat(root, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var names []string
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	sort.Strings(names)
	return names, nil
}

// finish settles the pending operations (after recovery they must
// settle).
func (w *metaWorker) finish() {
	for try := 0; len(w.model.pending) > 0 && try < 10; try++ {
		root, _, ok := w.m.rootOf()
		if ok {
			w.resolve(root)
		}
		if len(w.model.pending) > 0 {
			time.Sleep(time.Second)
		}
	}
	for _, x := range w.model.pending {
		w.rec.find("%s: the outcome of the failed %s of %s could not be seen after recovery", w.name, x.op, x.from)
	}
}

// check walks the worker's tree through root (of another mount) and
// compares it with the model: every name, type, inode and known content.
func (w *metaWorker) check(root int) {
	seen := map[string]bool{}
	var walk func(p string) error
	walk = func(p string) error {
		names, err := listDir(root, w.abs(p))
		if err != nil {
			return err
		}
		for _, n := range names {
			q := path.Join(p, n)
			seen[q] = true
			if e := w.model.entries[q]; e == nil {
				w.rec.find("%s: a fresh mount lists %s, which was never made or was removed", w.name, w.abs(q))
				continue
			} else if e.dir {
				if err := walk(q); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(""); err != nil {
		w.rec.find("%s: walk its tree through a fresh mount: %v", w.name, err)
		return
	}
	for p := range w.model.entries {
		if p == "" {
			continue
		}
		if !seen[p] {
			w.rec.find("%s: a fresh mount does not list %s, whose creation was acknowledged", w.name, w.abs(p))
			continue
		}
		w.checkEntry(root, p, "through a fresh mount")
	}
}
