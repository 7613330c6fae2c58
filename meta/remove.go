package meta

import (
	"context"
	"fmt"
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Unlink removes the name of a non-directory. When the last name goes, the
// file is deleted (its chunks queued for GC) unless a session has it open;
// then it lives on as an orphan until the last Release.
func (s *Service) Unlink(ctx context.Context, req *weftv1.RemoveRequest) (*weftv1.RemoveResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("unlink %q in directory %d", req.Name, req.Parent)
	if err := checkName("unlink", req.Parent, req.Name); err != nil {
		return nil, err
	}
	if isDot(req.Name) {
		return nil, fserr.Wrap(syscall.EISDIR, "%s: is a directory", op)
	}
	var parent *weftv1.Attr
	err := s.update(ctx, func(x *tx) error {
		d, a, err := x.removable(c, req.Parent, req.Name, op)
		if err != nil {
			return err
		}
		if isDir(a.Mode) {
			return fserr.Wrap(syscall.EISDIR, "%s: is a directory (use rmdir)", op)
		}
		if err := x.deleteEntry(d.Ino, req.Name); err != nil {
			return err
		}
		x.touch(d)
		if err := x.putInode(d); err != nil {
			return err
		}
		parent = d
		return x.dropLink(a)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.RemoveResponse{Parent: parent}, nil
}

// Rmdir removes an empty directory.
func (s *Service) Rmdir(ctx context.Context, req *weftv1.RemoveRequest) (*weftv1.RemoveResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("rmdir %q in directory %d", req.Name, req.Parent)
	if err := checkName("rmdir", req.Parent, req.Name); err != nil {
		return nil, err
	}
	switch req.Name {
	case ".":
		return nil, fserr.Wrap(syscall.EINVAL, "%s: cannot remove '.'", op)
	case "..":
		return nil, fserr.Wrap(syscall.ENOTEMPTY, "%s: directory not empty", op)
	}
	var parent *weftv1.Attr
	err := s.update(ctx, func(x *tx) error {
		d, a, err := x.removable(c, req.Parent, req.Name, op)
		if err != nil {
			return err
		}
		if err := x.checkRemovableDir(a, op); err != nil {
			return err
		}
		if err := x.deleteEntry(d.Ino, req.Name); err != nil {
			return err
		}
		d.Nlink--
		x.touch(d)
		if err := x.putInode(d); err != nil {
			return err
		}
		parent = d
		return x.removeInode(a)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.RemoveResponse{Parent: parent}, nil
}

// removable loads directory parent and its entry name, checking that c
// may remove the entry (perm.Caller.CheckRemove).
func (x *tx) removable(c caller, parent uint64, name, op string) (dir, child *weftv1.Attr, err error) {
	d, err := x.dir(parent, op)
	if err != nil {
		return nil, nil, err
	}
	ino, _, ok, err := x.entry(d.Ino, name)
	if err != nil {
		return nil, nil, err
	}
	var a *weftv1.Attr
	if ok {
		if a, err = x.inode(ino, op); err != nil {
			return nil, nil, err
		}
	}
	if err := c.CheckRemove(d, a, op); err != nil {
		return nil, nil, err
	}
	return d, a, nil
}

// checkRemovableDir requires a to be an empty directory other than root.
func (x *tx) checkRemovableDir(a *weftv1.Attr, op string) error {
	if !isDir(a.Mode) {
		return fserr.Wrap(syscall.ENOTDIR, "%s: not a directory", op)
	}
	if a.Ino == rootIno {
		return fserr.Wrap(syscall.EBUSY, "%s: the root directory cannot be removed", op)
	}
	empty, err := x.dirEmpty(a.Ino)
	if err != nil {
		return err
	}
	if !empty {
		return fserr.Wrap(syscall.ENOTEMPTY, "%s: directory not empty", op)
	}
	return nil
}

// Rename flags.
const (
	renameNoReplace = uint32(weftv1.RenameFlags_RENAME_NOREPLACE)
	renameExchange  = uint32(weftv1.RenameFlags_RENAME_EXCHANGE)
)

// Rename moves old_name in old_parent to new_name in new_parent in one
// transaction, replacing a target file or empty directory (or, with
// RENAME_EXCHANGE, swapping the two). A directory cannot move into its
// own subtree.
func (s *Service) Rename(ctx context.Context, req *weftv1.RenameRequest) (*weftv1.RenameResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("rename %q in directory %d to %q in directory %d", req.OldName, req.OldParent, req.NewName, req.NewParent)
	if err := checkRenameRequest(req, op); err != nil {
		return nil, err
	}
	resp := new(weftv1.RenameResponse)
	err := s.update(ctx, func(x *tx) error {
		r := renaming{x: x, c: c, req: req, op: op}
		err := r.run()
		resp.OldParent, resp.NewParent = r.oldDir, r.newDir
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func checkRenameRequest(req *weftv1.RenameRequest, op string) error {
	if req.Flags&^(renameNoReplace|renameExchange) != 0 || req.Flags == renameNoReplace|renameExchange {
		return fserr.Wrap(syscall.EINVAL, "%s: invalid flags %#x", op, req.Flags)
	}
	if err := checkName("rename", req.OldParent, req.OldName); err != nil {
		return err
	}
	if err := checkName("rename", req.NewParent, req.NewName); err != nil {
		return err
	}
	if isDot(req.OldName) || isDot(req.NewName) {
		if req.Flags&renameNoReplace != 0 && !isDot(req.OldName) {
			return fserr.Wrap(syscall.EEXIST, "%s: file exists", op)
		}
		return fserr.Wrap(syscall.EBUSY, "%s: cannot rename '.' or '..'", op)
	}
	return nil
}

// renaming is one Rename's transaction.
type renaming struct {
	x   *tx
	c   caller
	req *weftv1.RenameRequest
	op  string

	oldDir, newDir *weftv1.Attr // as stored, once the rename changed them
}

func (r *renaming) run() error {
	x, c, req, op := r.x, r.c, r.req, r.op
	oldDir, src, err := x.removable(c, req.OldParent, req.OldName, op)
	if err != nil {
		return err
	}
	newDir := oldDir
	if req.NewParent != req.OldParent {
		if newDir, err = x.dir(req.NewParent, op); err != nil {
			return err
		}
		if err := c.Check(newDir, mayWrite|mayExec, op); err != nil {
			return err
		}
	}
	dstIno, _, exists, err := x.entry(newDir.Ino, req.NewName)
	if err != nil {
		return err
	}
	var dst *weftv1.Attr
	if exists {
		if dst, err = x.inode(dstIno, op); err != nil {
			return err
		}
	}
	switch {
	case exists && req.Flags&renameNoReplace != 0:
		return fserr.Wrap(syscall.EEXIST, "%s: target exists", op)
	case !exists && req.Flags&renameExchange != 0:
		return fserr.Wrap(syscall.ENOENT, "%s: target does not exist to exchange with", op)
	case exists && dst.Ino == src.Ino:
		// Both names are links to one inode: POSIX says do nothing.
		return nil
	}
	if exists && !c.StickyAllows(newDir, dst) {
		return fserr.Wrap(syscall.EPERM, "%s: target directory is sticky and uid %d owns neither it nor the target", op, c.Uid)
	}
	if err := r.checkDirMove(src, newDir); err != nil {
		return err
	}
	if req.Flags&renameExchange != 0 {
		if err := r.checkDirMove(dst, oldDir); err != nil {
			return err
		}
		return r.exchange(oldDir, newDir, src, dst)
	}
	if exists {
		if err := r.removeTarget(newDir, src, dst); err != nil {
			return err
		}
	}
	if err := x.deleteEntry(oldDir.Ino, req.OldName); err != nil {
		return err
	}
	if err := x.setEntry(newDir.Ino, req.NewName, src); err != nil {
		return err
	}
	if isDir(src.Mode) && oldDir != newDir {
		oldDir.Nlink--
		newDir.Nlink++
		if err := x.t.Set(parentKey(src.Ino), be64(newDir.Ino)); err != nil {
			return err
		}
		if err := x.bumpLayoutGen(); err != nil {
			return err
		}
	}
	return r.finish(oldDir, newDir, src)
}

// checkDirMove refuses to move directory a into its own subtree (EINVAL)
// and, across directories, requires write permission on a itself (its ".."
// changes), as Linux does.
func (r *renaming) checkDirMove(a, to *weftv1.Attr) error {
	if !isDir(a.Mode) || r.req.OldParent == r.req.NewParent {
		return nil
	}
	inside, err := r.x.isAncestor(a.Ino, to.Ino)
	if err != nil {
		return err
	}
	if inside {
		return fserr.Wrap(syscall.EINVAL, "%s: cannot move directory %d into its own subtree", r.op, a.Ino)
	}
	return r.c.Check(a, mayWrite, r.op)
}

// removeTarget drops the existing target dst that src replaces.
func (r *renaming) removeTarget(newDir, src, dst *weftv1.Attr) error {
	switch {
	case isDir(src.Mode) && !isDir(dst.Mode):
		return fserr.Wrap(syscall.ENOTDIR, "%s: source is a directory but the target is not", r.op)
	case !isDir(src.Mode) && isDir(dst.Mode):
		return fserr.Wrap(syscall.EISDIR, "%s: target is a directory but the source is not", r.op)
	case isDir(dst.Mode):
		if err := r.x.checkRemovableDir(dst, r.op); err != nil {
			return err
		}
		newDir.Nlink--
		return r.x.removeInode(dst)
	}
	return r.x.dropLink(dst)
}

// exchange swaps the two entries (RENAME_EXCHANGE).
func (r *renaming) exchange(oldDir, newDir, src, dst *weftv1.Attr) error {
	x, req := r.x, r.req
	if err := x.setEntry(oldDir.Ino, req.OldName, dst); err != nil {
		return err
	}
	if err := x.setEntry(newDir.Ino, req.NewName, src); err != nil {
		return err
	}
	if oldDir != newDir {
		for _, m := range []struct{ a, from, to *weftv1.Attr }{{src, oldDir, newDir}, {dst, newDir, oldDir}} {
			if !isDir(m.a.Mode) {
				continue
			}
			m.from.Nlink--
			m.to.Nlink++
			if err := x.t.Set(parentKey(m.a.Ino), be64(m.to.Ino)); err != nil {
				return err
			}
			if err := x.bumpLayoutGen(); err != nil {
				return err
			}
		}
	}
	dst.CtimeNs = x.now
	if err := x.putInode(dst); err != nil {
		return err
	}
	return r.finish(oldDir, newDir, src)
}

// finish stamps and stores the changed directories and the moved inode.
func (r *renaming) finish(oldDir, newDir, src *weftv1.Attr) error {
	x := r.x
	src.CtimeNs = x.now
	if err := x.putInode(src); err != nil {
		return err
	}
	x.touch(oldDir)
	if err := x.putInode(oldDir); err != nil {
		return err
	}
	r.oldDir, r.newDir = oldDir, newDir
	if newDir != oldDir {
		x.touch(newDir)
		return x.putInode(newDir)
	}
	return nil
}
