package meta

import (
	"context"
	"fmt"
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// SetAttr bits.
const (
	setMode     = uint32(weftv1.SetAttrValid_SETATTR_MODE)
	setUID      = uint32(weftv1.SetAttrValid_SETATTR_UID)
	setGID      = uint32(weftv1.SetAttrValid_SETATTR_GID)
	setSize     = uint32(weftv1.SetAttrValid_SETATTR_SIZE)
	setAtime    = uint32(weftv1.SetAttrValid_SETATTR_ATIME)
	setMtime    = uint32(weftv1.SetAttrValid_SETATTR_MTIME)
	setAtimeNow = uint32(weftv1.SetAttrValid_SETATTR_ATIME_NOW)
	setMtimeNow = uint32(weftv1.SetAttrValid_SETATTR_MTIME_NOW)
)

// SetAttr changes mode, owner, size and times as chmod, chown, truncate and
// utimensat do, with their permission rules. A size change first has the
// data servers cut the file's chunks at min(old, new) size, then commits
// the new size.
func (s *Service) SetAttr(ctx context.Context, req *weftv1.SetAttrRequest) (*weftv1.AttrResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("setattr of inode %d", req.Ino)
	if req.Valid&setSize != 0 {
		if err := s.truncateChunks(ctx, c, req.Ino, req.Size, op); err != nil {
			return nil, err
		}
	}
	var a *weftv1.Attr
	err := s.update(ctx, func(x *tx) error {
		var err error
		if a, err = x.inode(req.Ino, op); err != nil {
			return err
		}
		if err := applySetAttr(c, a, req, x.now, op); err != nil {
			return err
		}
		return x.putInode(a)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.AttrResponse{Attr: a}, nil
}

// truncateChunks checks that c may truncate ino and has the data servers
// drop the file's data beyond min(old size, size), so that growing the
// file later reads zeros and shrinking it frees space.
func (s *Service) truncateChunks(ctx context.Context, c caller, ino, size uint64, op string) error {
	var a *weftv1.Attr
	err := s.view(ctx, func(x *tx) error {
		var err error
		if a, err = x.inode(ino, op); err != nil {
			return err
		}
		return checkTruncate(c, a, op)
	})
	if err != nil {
		return err
	}
	if a.Layout == nil || len(a.Layout.Chains) == 0 {
		return nil
	}
	if err := s.cluster.TruncateFile(ctx, ino, a.Layout, min(a.Size, size)); err != nil {
		return fmt.Errorf("%s: truncate to %d bytes on the data servers: %w", op, size, err)
	}
	return nil
}

func checkTruncate(c caller, a *weftv1.Attr, op string) error {
	switch {
	case isDir(a.Mode):
		return fserr.Wrap(syscall.EISDIR, "%s: cannot truncate a directory", op)
	case !isReg(a.Mode):
		return fserr.Wrap(syscall.EINVAL, "%s: only regular files can be truncated", op)
	}
	return c.check(a, mayWrite, op)
}

// applySetAttr applies req to a with Linux's rules:
//   - chmod: owner or root; setgid is cleared unless the caller is root
//     or in the file's group;
//   - chown: root only, except that the owner may set the group to one
//     of its groups; it clears setuid (and setgid on a group-executable
//     file) of a non-directory, as Linux does even for root;
//   - truncate: write permission; clears setuid/setgid for non-root;
//   - explicit times: owner or root; "now": owner, root or a writer.
//
// ctime becomes now on every change.
func applySetAttr(c caller, a *weftv1.Attr, req *weftv1.SetAttrRequest, now int64, op string) error {
	v := req.Valid
	owner := c.root() || c.owns(a)
	if v&setUID != 0 && !c.root() && (req.Uid != a.Uid || !c.owns(a)) {
		return fserr.Wrap(syscall.EPERM, "%s: only root may change the owner (uid %d -> %d)", op, a.Uid, req.Uid)
	}
	if v&setGID != 0 && !c.root() && (!c.owns(a) || (req.Gid != a.Gid && !c.inGroup(req.Gid))) {
		return fserr.Wrap(syscall.EPERM, "%s: only root, or the owner to one of its own groups, may change the group to %d", op, req.Gid)
	}
	if v&setMode != 0 && !owner {
		return fserr.Wrap(syscall.EPERM, "%s: only the owner (uid %d) or root may change the mode", op, a.Uid)
	}
	if v&setSize != 0 {
		if err := checkTruncate(c, a, op); err != nil {
			return err
		}
	}
	explicitTime := (v&setAtime != 0 && v&setAtimeNow == 0) || (v&setMtime != 0 && v&setMtimeNow == 0)
	nowTime := v&(setAtimeNow|setMtimeNow) != 0
	if explicitTime && !owner {
		return fserr.Wrap(syscall.EPERM, "%s: only the owner (uid %d) or root may set explicit times", op, a.Uid)
	}
	if nowTime && !owner && !c.allowed(a, mayWrite) {
		return fserr.Wrap(syscall.EACCES, "%s: setting times to now needs ownership or write permission", op)
	}

	if v&(setUID|setGID) != 0 {
		if v&setUID != 0 {
			a.Uid = req.Uid
		}
		if v&setGID != 0 {
			a.Gid = req.Gid
		}
		if !isDir(a.Mode) {
			a.Mode = fileType(a.Mode) | killSuid(a.Mode&0o7777)
		}
	}
	if v&setMode != 0 {
		mode := req.Mode & 0o7777
		if !c.root() && !c.inGroup(a.Gid) {
			mode &^= syscall.S_ISGID
		}
		a.Mode = fileType(a.Mode) | mode
	}
	if v&setSize != 0 {
		a.Size = req.Size
		a.MtimeNs = now
		if !c.root() {
			a.Mode = fileType(a.Mode) | killSuid(a.Mode&0o7777)
		}
	}
	switch {
	case v&setAtimeNow != 0:
		a.AtimeNs = now
	case v&setAtime != 0:
		a.AtimeNs = req.AtimeNs
	}
	switch {
	case v&setMtimeNow != 0:
		a.MtimeNs = now
	case v&setMtime != 0:
		a.MtimeNs = req.MtimeNs
	}
	if v != 0 {
		a.CtimeNs = now
	}
	return nil
}
