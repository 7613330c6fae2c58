package meta

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// fsckMaxDepth bounds the parent records one verification walks (each is
// a read of the transaction, which the etcd engine limits to 128).
const fsckMaxDepth = 64

// checkUnreachable verifies inodes no entry names (apart from files
// unlinked while open, whose open keeps them) and directory cycles cut off
// from the root. Repair moves them into /lost+found, named #<ino>; it
// deletes only an unlinked file whose opens all belonged to sessions that
// ended (its last close would have deleted it).
func (f *fscker) checkUnreachable(ctx context.Context) error {
	sc := f.scan
	// run verifies; a move into a lost+found that does not exist yet
	// makes it first (in a transaction of its own) and verifies again.
	run := func(fn func(x *tx, repair bool) (*weftv1.FsckProblem, error)) error {
		err := f.verify(ctx, fn)
		if errors.Is(err, errNeedLostFound) {
			if err = f.ensureLostFound(ctx); err == nil {
				err = f.verify(ctx, fn)
			}
		}
		return err
	}
	for _, ino := range sortedInos(sc.inodes) {
		if ino == rootIno || sc.refs[ino] > 0 {
			continue
		}
		if err := run(func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
			return f.verifyNameless(x, repair, ino)
		}); err != nil {
			return err
		}
	}
	for _, dir := range f.cycleRoots() {
		if err := run(func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
			return f.verifyCycle(x, repair, dir)
		}); err != nil {
			return err
		}
	}
	return nil
}

// errNeedLostFound asks checkUnreachable to make lost+found first.
var errNeedLostFound = errors.New("fsck: lost+found does not exist yet")

// verifyNameless verifies an inode that had no entry in the scan.
func (f *fscker) verifyNameless(x *tx, repair bool, ino uint64) (*weftv1.FsckProblem, error) {
	a, same, err := f.unchanged(x, ino)
	if err != nil || !same {
		return nil, err
	}
	_, orphan, err := x.t.Get(orphanKey(ino))
	if err != nil {
		return nil, err
	}
	if orphan && a.Nlink == 0 && !isDir(a.Mode) && x.grace {
		return nil, nil // kept until its opener replays it or the grace period ends (replay.go)
	}
	if orphan && a.Nlink == 0 && !isDir(a.Mode) {
		var sessions []string
		prefix := openPrefix(ino)
		err := x.t.Scan(prefix, kv.PrefixEnd(prefix), func(k, _ []byte) (bool, error) {
			sessions = append(sessions, string(k[len(prefix):]))
			return len(sessions) < fsckRecordBatch/2, nil
		})
		if err != nil {
			return nil, err
		}
		for _, id := range sessions {
			if _, live, err := x.t.Get(sessionKey(id)); err != nil || live {
				return nil, err // open by a live session: a legal orphan
			}
		}
		if repair {
			for _, id := range sessions {
				if err := x.t.Delete(openKey(ino, id)); err != nil {
					return nil, err
				}
				if err := x.t.Delete(sessionOpenKey(id, ino)); err != nil {
					return nil, err
				}
			}
			if err := x.removeInode(a); err != nil {
				return nil, err
			}
		}
		return problem(fsckOrphan, ino, 0, "", repair,
			"inode %d was unlinked while open, but no live session has it open any more: it is deleted (chunks queued for garbage collection), as its last close would have done", ino), nil
	}
	p := problem(fsckOrphan, ino, 0, "", false, "inode %d (mode %#o, %d bytes) has no name", ino, a.Mode, a.Size)
	if repair {
		name, err := f.moveToLostFound(x, a, 0, "")
		if err != nil {
			return nil, err
		}
		p.Repaired, p.Parent, p.Name = true, f.lostFound, name
		p.Detail += fmt.Sprintf("; moved to /%s/%s", lostFoundName, name)
	}
	return p, nil
}

// cycleRoots returns one directory of every group of directories that
// have names but are cut off from the root (their parents form a cycle).
func (f *fscker) cycleRoots() []uint64 {
	reached := map[uint64]bool{rootIno: true}
	children := map[uint64][]uint64{}
	for dir := range f.scan.dirNames {
		if e, ok := f.keptName(dir); ok {
			children[e.parent] = append(children[e.parent], dir)
		}
	}
	queue := []uint64{rootIno}
	for len(queue) > 0 {
		d := queue[0]
		queue = queue[1:]
		for _, c := range children[d] {
			if !reached[c] {
				reached[c] = true
				queue = append(queue, c)
			}
		}
	}
	done := map[uint64]bool{}
	var roots []uint64
	for _, dir := range sortedInos(f.scan.dirNames) {
		walk := map[uint64]bool{}
		for cur := dir; !reached[cur] && !done[cur]; {
			if walk[cur] {
				roots = append(roots, cur)
				break
			}
			walk[cur] = true
			e, ok := f.keptName(cur)
			if !ok {
				break // a nameless directory: moved on its own
			}
			cur = e.parent
		}
		for d := range walk {
			done[d] = true
		}
	}
	return roots
}

// verifyCycle verifies that directory dir is still cut off from the root
// and moves it into lost+found.
func (f *fscker) verifyCycle(x *tx, repair bool, dir uint64) (*weftv1.FsckProblem, error) {
	a, same, err := f.unchanged(x, dir)
	if err != nil || !same {
		return nil, err
	}
	kept, _ := f.keptName(dir)
	ino, _, ok, err := x.entry(kept.parent, kept.name)
	if err != nil || !ok || ino != dir {
		return nil, err
	}
	seen := map[uint64]bool{}
	for cur := dir; ; {
		if cur == rootIno || len(seen) > fsckMaxDepth {
			return nil, nil // reachable, or too deep to tell here
		}
		if seen[cur] {
			break
		}
		seen[cur] = true
		if cur, err = x.parentOf(cur); err != nil {
			return nil, nil // a missing parent record: reported by checkParents
		}
	}
	p := problem(fsckOrphan, dir, kept.parent, kept.name, false,
		"directory %d (%q in directory %d) cannot be reached from the root: its parents form a cycle", dir, kept.name, kept.parent)
	if repair {
		name, err := f.moveToLostFound(x, a, kept.parent, kept.name)
		if err != nil {
			return nil, err
		}
		p.Repaired = true
		p.Detail += fmt.Sprintf("; moved to /%s/%s", lostFoundName, name)
	}
	return p, nil
}

// ensureLostFound finds or makes /lost+found (mode 0700, owned by root)
// in a transaction of its own.
func (f *fscker) ensureLostFound(ctx context.Context) error {
	if f.lostFound != 0 {
		return nil
	}
	var ino uint64
	fresh, err := f.s.takeIno(ctx)
	if err != nil {
		return fmt.Errorf("make /%s: %w", lostFoundName, err)
	}
	err = f.s.update(ctx, func(x *tx) error {
		id, _, ok, err := x.entry(rootIno, lostFoundName)
		if err != nil {
			return err
		}
		if ok {
			a, err := x.inode(id, "fsck")
			if err != nil {
				return err
			}
			if !isDir(a.Mode) {
				return fmt.Errorf("/%s exists and is not a directory: rename it so that fsck can make the directory: %w", lostFoundName, syscall.ENOTDIR)
			}
			ino = id
			return nil
		}
		root, err := x.dir(rootIno, "fsck")
		if err != nil {
			return err
		}
		a, err := x.newInode(caller{}, root, syscall.S_IFDIR|0o700, fresh)
		if err != nil {
			return err
		}
		a.Nlink = 2
		root.Nlink++
		if err := x.addChild(root, lostFoundName, a); err != nil {
			return err
		}
		if err := x.t.Set(parentKey(a.Ino), be64(rootIno)); err != nil {
			return err
		}
		ino = a.Ino
		return x.countInode(true, a.Ino, 1)
	})
	if err != nil {
		return fmt.Errorf("make /%s: %w", lostFoundName, err)
	}
	f.lostFound = ino
	return nil
}

// moveToLostFound gives inode a the name #<ino> in lost+found, taking it
// out of directory oldParent (name oldName) if oldParent is not 0.
// It returns errNeedLostFound if lost+found was not made yet (that takes
// a transaction of its own, ensureLostFound).
func (f *fscker) moveToLostFound(x *tx, a *weftv1.Attr, oldParent uint64, oldName string) (string, error) {
	if f.lostFound == 0 {
		return "", errNeedLostFound
	}
	lf, err := x.dir(f.lostFound, "fsck")
	if err != nil {
		return "", fmt.Errorf("/%s: %w", lostFoundName, err)
	}
	name := fmt.Sprintf("#%d", a.Ino)
	if _, _, taken, err := x.entry(lf.Ino, name); err != nil || taken {
		if err == nil {
			err = fmt.Errorf("/%s/%s already exists: move it away and repair again: %w", lostFoundName, name, syscall.EEXIST)
		}
		return "", err
	}
	if oldParent != 0 {
		if err := x.deleteEntry(oldParent, oldName); err != nil {
			return "", err
		}
		if isDir(a.Mode) && oldParent != a.Ino {
			op, err := x.dir(oldParent, "fsck")
			if err != nil {
				return "", err
			}
			if op.Nlink > 2 {
				op.Nlink--
			}
			x.touch(op)
			if err := x.putInode(op); err != nil {
				return "", err
			}
		}
	}
	if err := x.setEntry(lf.Ino, name, a); err != nil {
		return "", err
	}
	if isDir(a.Mode) {
		lf.Nlink++
		if err := x.t.Set(parentKey(a.Ino), be64(lf.Ino)); err != nil {
			return "", err
		}
		if err := x.bumpLayoutGen(); err != nil {
			return "", err
		}
	} else {
		a.Nlink = 1
	}
	if err := x.t.Delete(orphanKey(a.Ino)); err != nil {
		return "", err
	}
	a.CtimeNs = x.now
	if err := x.putInode(a); err != nil {
		return "", err
	}
	x.touch(lf)
	return name, x.putInode(lf)
}
