package perm

import (
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// SetAttrValid bits, as uint32.
const (
	SetMode     = uint32(weftv1.SetAttrValid_SETATTR_MODE)
	SetUID      = uint32(weftv1.SetAttrValid_SETATTR_UID)
	SetGID      = uint32(weftv1.SetAttrValid_SETATTR_GID)
	SetSize     = uint32(weftv1.SetAttrValid_SETATTR_SIZE)
	SetAtime    = uint32(weftv1.SetAttrValid_SETATTR_ATIME)
	SetMtime    = uint32(weftv1.SetAttrValid_SETATTR_MTIME)
	SetAtimeNow = uint32(weftv1.SetAttrValid_SETATTR_ATIME_NOW)
	SetMtimeNow = uint32(weftv1.SetAttrValid_SETATTR_MTIME_NOW)
	SetCtimeNow = uint32(weftv1.SetAttrValid_SETATTR_CTIME_NOW)
)

// CheckTruncate checks that c may truncate a: a regular file it may
// write.
func CheckTruncate(c Caller, a *weftv1.Attr, op string) error {
	switch {
	case IsDir(a.Mode):
		return fserr.Wrap(syscall.EISDIR, "%s: cannot truncate a directory", op)
	case !IsReg(a.Mode):
		return fserr.Wrap(syscall.EINVAL, "%s: only regular files can be truncated", op)
	}
	return c.Check(a, MayWrite, op)
}

// ApplySetAttr applies req to a with Linux's rules:
//   - chmod: owner or root; setgid is cleared unless the caller is root
//     or in the file's group;
//   - chown: root only, except that the owner may set the group to one
//     of its groups; it clears setuid (and setgid on a group-executable
//     file) of a non-directory, as Linux does even for root;
//   - truncate: write permission; clears setuid/setgid for non-root;
//   - explicit times: owner or root; "now": owner, root or a writer.
//
// ctime becomes now on every change. On an error a is unchanged.
func ApplySetAttr(c Caller, a *weftv1.Attr, req *weftv1.SetAttrRequest, now int64, op string) error {
	v := req.Valid
	owner := c.Root() || c.Owns(a)
	if v&SetUID != 0 && !c.Root() && (req.Uid != a.Uid || !c.Owns(a)) {
		return fserr.Wrap(syscall.EPERM, "%s: only root may change the owner (uid %d -> %d)", op, a.Uid, req.Uid)
	}
	if v&SetGID != 0 && !c.Root() && (!c.Owns(a) || (req.Gid != a.Gid && !c.InGroup(req.Gid))) {
		return fserr.Wrap(syscall.EPERM, "%s: only root, or the owner to one of its own groups, may change the group to %d", op, req.Gid)
	}
	if v&SetMode != 0 && !owner {
		return fserr.Wrap(syscall.EPERM, "%s: only the owner (uid %d) or root may change the mode", op, a.Uid)
	}
	if v&SetSize != 0 {
		if err := CheckTruncate(c, a, op); err != nil {
			return err
		}
	}
	explicitTime := (v&SetAtime != 0 && v&SetAtimeNow == 0) || (v&SetMtime != 0 && v&SetMtimeNow == 0)
	nowTime := v&(SetAtimeNow|SetMtimeNow) != 0
	if explicitTime && !owner {
		return fserr.Wrap(syscall.EPERM, "%s: only the owner (uid %d) or root may set explicit times", op, a.Uid)
	}
	if nowTime && !owner && !c.Allowed(a, MayWrite) {
		return fserr.Wrap(syscall.EACCES, "%s: setting times to now needs ownership or write permission", op)
	}

	if v&(SetUID|SetGID) != 0 {
		if v&SetUID != 0 {
			a.Uid = req.Uid
		}
		if v&SetGID != 0 {
			a.Gid = req.Gid
		}
		if !IsDir(a.Mode) {
			a.Mode = FileType(a.Mode) | KillSuid(a.Mode&0o7777)
		}
	}
	if v&SetMode != 0 {
		mode := req.Mode & 0o7777
		if !c.Root() && !c.InGroup(a.Gid) {
			mode &^= syscall.S_ISGID
		}
		a.Mode = FileType(a.Mode) | mode
	}
	if v&SetSize != 0 {
		a.Size = req.Size
		a.MtimeNs = now
		if !c.Root() {
			a.Mode = FileType(a.Mode) | KillSuid(a.Mode&0o7777)
		}
	}
	switch {
	case v&SetAtimeNow != 0:
		a.AtimeNs = now
	case v&SetAtime != 0:
		a.AtimeNs = req.AtimeNs
	}
	switch {
	case v&SetMtimeNow != 0:
		a.MtimeNs = now
	case v&SetMtime != 0:
		a.MtimeNs = req.MtimeNs
	}
	if v != 0 {
		a.CtimeNs = now
	}
	return nil
}
