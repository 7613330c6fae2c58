package meta

import (
	"fmt"
	"syscall"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/perm"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// tx is one namespace transaction: the kv transaction plus the operation's
// timestamp, so that every inode an operation touches gets the same time.
type tx struct {
	t   kv.Txn
	now int64 // ns since the epoch
	// grace: opens lost in a crash may still be replayed (replay.go), so
	// a file nobody is known to have open is kept as an orphan.
	grace bool
	// lazy: the transaction commits unsynced, so it must delete no file
	// (it fails with errNeedsSync instead).
	lazy bool
}

// inode reads inode ino; ENOENT if it does not exist.
func (x *tx) inode(ino uint64, op string) (*weftv1.Attr, error) {
	v, ok, err := x.t.Get(inodeKey(ino))
	if err != nil {
		return nil, fmt.Errorf("%s: read inode %d: %w", op, ino, err)
	}
	if !ok {
		return nil, fserr.Wrap(syscall.ENOENT, "%s: inode %d does not exist", op, ino)
	}
	a := new(weftv1.Attr)
	if err := proto.Unmarshal(v, a); err != nil {
		return nil, fmt.Errorf("%s: corrupt inode record %d: %v: %w", op, ino, err, syscall.EIO)
	}
	return a, nil
}

// inodes reads the inodes inos together (kv.GetMany: a few round trips on
// etcd instead of one per inode); ENOENT if one does not exist.
func (x *tx) inodes(inos []uint64, op string) ([]*weftv1.Attr, error) {
	keys := make([][]byte, len(inos))
	for i, ino := range inos {
		keys[i] = inodeKey(ino)
	}
	vals, found, err := kv.GetMany(x.t, keys)
	if err != nil {
		return nil, fmt.Errorf("%s: read %d inodes: %w", op, len(inos), err)
	}
	out := make([]*weftv1.Attr, len(inos))
	for i, ino := range inos {
		if !found[i] {
			return nil, fserr.Wrap(syscall.ENOENT, "%s: inode %d does not exist", op, ino)
		}
		a := new(weftv1.Attr)
		if err := proto.Unmarshal(vals[i], a); err != nil {
			return nil, fmt.Errorf("%s: corrupt inode record %d: %v: %w", op, ino, err, syscall.EIO)
		}
		out[i] = a
	}
	return out, nil
}

// dir reads inode ino and requires it to be a directory (ENOTDIR).
func (x *tx) dir(ino uint64, op string) (*weftv1.Attr, error) {
	a, err := x.inode(ino, op)
	if err != nil {
		return nil, err
	}
	if !isDir(a.Mode) {
		return nil, fserr.Wrap(syscall.ENOTDIR, "%s: inode %d is not a directory", op, ino)
	}
	return a, nil
}

func (x *tx) putInode(a *weftv1.Attr) error {
	v, err := proto.Marshal(a)
	if err != nil {
		return fmt.Errorf("encode inode %d: %w", a.Ino, err)
	}
	return x.t.Set(inodeKey(a.Ino), v)
}

// touch sets mtime and ctime of a (a directory whose entries changed, or a
// file whose data changed) to the transaction time.
func (x *tx) touch(a *weftv1.Attr) {
	a.MtimeNs, a.CtimeNs = x.now, x.now
}

// entry looks up name in directory parent.
func (x *tx) entry(parent uint64, name string) (ino uint64, typ uint32, ok bool, err error) {
	v, ok, err := x.t.Get(dentryKey(parent, name))
	if err != nil || !ok {
		return 0, 0, false, err
	}
	ino, typ, err = decodeDentry(v)
	if err != nil {
		return 0, 0, false, fmt.Errorf("entry %q in directory %d: %w", name, parent, err)
	}
	return ino, typ, true, nil
}

func (x *tx) setEntry(parent uint64, name string, a *weftv1.Attr) error {
	return x.t.Set(dentryKey(parent, name), encodeDentry(a.Ino, fileType(a.Mode)))
}

func (x *tx) deleteEntry(parent uint64, name string) error {
	return x.t.Delete(dentryKey(parent, name))
}

// dirEmpty reports whether directory ino has no entries.
func (x *tx) dirEmpty(ino uint64) (bool, error) {
	found, err := hasPrefix(x.t, dentryPrefix(ino))
	return !found, err
}

// parentOf returns the parent directory of directory ino (root: itself).
func (x *tx) parentOf(ino uint64) (uint64, error) {
	if ino == rootIno {
		return rootIno, nil
	}
	v, ok, err := x.t.Get(parentKey(ino))
	if err != nil {
		return 0, err
	}
	if !ok || len(v) != 8 {
		return 0, fmt.Errorf("directory %d has no parent record: %w", ino, syscall.EIO)
	}
	return inoFromKeySuffix(v)
}

// isAncestor reports whether dir a is dir b or one of b's ancestors.
func (x *tx) isAncestor(a, b uint64) (bool, error) {
	for depth := 0; ; depth++ {
		if b == a {
			return true, nil
		}
		if b == rootIno {
			return false, nil
		}
		if depth > 1<<16 {
			return false, fmt.Errorf("directory %d: parent chain too deep (loop?): %w", b, syscall.EIO)
		}
		p, err := x.parentOf(b)
		if err != nil {
			return false, err
		}
		b = p
	}
}

// dirLayout returns directory ino's own default layout, or nil.
func (x *tx) dirLayout(ino uint64) (*weftv1.Layout, error) {
	v, ok, err := x.t.Get(layoutKey(ino))
	if err != nil || !ok {
		return nil, err
	}
	l := new(weftv1.Layout)
	if err := proto.Unmarshal(v, l); err != nil {
		return nil, fmt.Errorf("corrupt default layout of directory %d: %v: %w", ino, err, syscall.EIO)
	}
	return l, nil
}

// effectiveLayout returns the nearest default layout at or above directory
// dir, or def if none of them has one.
func (x *tx) effectiveLayout(dir uint64, def *weftv1.Layout) (*weftv1.Layout, error) {
	for depth := 0; depth <= 1<<16; depth++ {
		l, err := x.dirLayout(dir)
		if err != nil {
			return nil, err
		}
		if l != nil {
			return l, nil
		}
		if dir == rootIno {
			return proto.Clone(def).(*weftv1.Layout), nil
		}
		if dir, err = x.parentOf(dir); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("directory %d: parent chain too deep (loop?): %w", dir, syscall.EIO)
}

// isOpen reports whether any session has ino open.
func (x *tx) isOpen(ino uint64) (bool, error) {
	return hasPrefix(x.t, openPrefix(ino))
}

// dropLink decrements a's link count (a non-directory that lost a name)
// and, at zero, makes it an orphan if it is open or deletes it otherwise.
func (x *tx) dropLink(a *weftv1.Attr) error {
	if a.Nlink > 0 {
		a.Nlink--
	}
	a.CtimeNs = x.now
	if a.Nlink > 0 {
		return x.putInode(a)
	}
	open, err := x.isOpen(a.Ino)
	if err != nil {
		return err
	}
	if open || x.grace {
		if err := x.t.Set(orphanKey(a.Ino), nil); err != nil {
			return err
		}
		return x.putInode(a)
	}
	return x.removeInode(a)
}

// removeInode deletes inode a for good: its record, symlink target,
// xattrs, directory records and counters; a regular file's layout goes to
// the GC queue so the GC loop deletes its chunks.
func (x *tx) removeInode(a *weftv1.Attr) error {
	ino := a.Ino
	for _, k := range [][]byte{inodeKey(ino), symlinkKey(ino), orphanKey(ino), parentKey(ino), layoutKey(ino)} {
		if err := x.t.Delete(k); err != nil {
			return err
		}
	}
	if err := deletePrefix(x.t, xattrPrefix(ino)); err != nil {
		return err
	}
	if isDir(a.Mode) {
		return x.countInode(true, ino, -1)
	}
	if isReg(a.Mode) && a.Layout != nil && len(a.Layout.Chains) > 0 {
		v, err := proto.Marshal(a.Layout)
		if err != nil {
			return fmt.Errorf("encode layout of deleted file %d: %w", ino, err)
		}
		if err := x.t.Set(gcKey(ino), v); err != nil {
			return err
		}
	}
	return x.countInode(false, ino, -1)
}

// newInode makes inode ino (from Service.takeIno) owned by the caller in
// directory parent (perm.NewAttr: the setgid-directory rules).
func (x *tx) newInode(c caller, parent *weftv1.Attr, mode uint32, ino uint64) (*weftv1.Attr, error) {
	return perm.NewAttr(c, parent, mode, ino, x.now), nil
}

// addChild adds inode a as name in parent, stores a, and stamps and
// stores the parent.
func (x *tx) addChild(parent *weftv1.Attr, name string, a *weftv1.Attr) error {
	return x.addChildAt(parent, name, a, x.now)
}

// addChildAt is addChild stamping the parent at t (a file made by a client
// under a delegation: at its time, as the client showed it), never
// backwards.
func (x *tx) addChildAt(parent *weftv1.Attr, name string, a *weftv1.Attr, t int64) error {
	if err := x.setEntry(parent.Ino, name, a); err != nil {
		return err
	}
	if err := x.putInode(a); err != nil {
		return err
	}
	parent.MtimeNs, parent.CtimeNs = max(parent.MtimeNs, t), max(parent.CtimeNs, t)
	return x.putInode(parent)
}
