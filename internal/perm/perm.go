// Package perm holds Linux's permission rules for weft's inodes: who may
// read, write or search an inode, remove an entry, and what a setattr may
// change and how. The meta service decides with them; a client applies
// them to what it answers under a delegation (files it made that the meta
// service does not have yet, removes), so both reach the same answer.
package perm

import (
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Access mask bits, as access(2).
const (
	MayRead  = 4
	MayWrite = 2
	MayExec  = 1
)

// Caller is who performs an operation. A request without a Caller acts as
// root: only trusted admin tools talk to the meta service without one.
type Caller struct {
	Uid    uint32
	Gid    uint32
	Groups []uint32
}

// Of returns the Caller of a request.
func Of(c *weftv1.Caller) Caller {
	if c == nil {
		return Caller{}
	}
	return Caller{Uid: c.Uid, Gid: c.Gid, Groups: c.Groups}
}

// Root reports whether the caller is root.
func (c Caller) Root() bool { return c.Uid == 0 }

// InGroup reports whether gid is the caller's primary or a supplementary
// group.
func (c Caller) InGroup(gid uint32) bool {
	if c.Gid == gid {
		return true
	}
	for _, g := range c.Groups {
		if g == gid {
			return true
		}
	}
	return false
}

// Owns reports whether the caller owns a.
func (c Caller) Owns(a *weftv1.Attr) bool { return c.Uid == a.Uid }

// Allowed reports whether the caller may access a with mask (MayRead,
// MayWrite, MayExec bits) under the owner/group/other bits. Root may do
// anything except execute a non-directory that has no x bit at all.
func (c Caller) Allowed(a *weftv1.Attr, mask uint32) bool {
	if c.Root() {
		if mask&MayExec != 0 && !IsDir(a.Mode) && a.Mode&0o111 == 0 {
			return false
		}
		return true
	}
	var bits uint32
	switch {
	case c.Uid == a.Uid:
		bits = a.Mode >> 6 & 7
	case c.InGroup(a.Gid):
		bits = a.Mode >> 3 & 7
	default:
		bits = a.Mode & 7
	}
	return bits&mask == mask
}

// Check returns EACCES naming the operation and object unless the caller
// may access a with mask.
func (c Caller) Check(a *weftv1.Attr, mask uint32, op string) error {
	if c.Allowed(a, mask) {
		return nil
	}
	return fserr.Wrap(syscall.EACCES, "%s: permission denied on inode %d (mode %#o, uid %d, gid %d) for uid %d",
		op, a.Ino, a.Mode&0o7777, a.Uid, a.Gid, c.Uid)
}

// StickyAllows reports whether the caller may remove or rename child out
// of dir: always unless dir is sticky and the caller owns neither.
func (c Caller) StickyAllows(dir, child *weftv1.Attr) bool {
	if dir.Mode&syscall.S_ISVTX == 0 || c.Root() {
		return true
	}
	return c.Uid == dir.Uid || c.Uid == child.Uid
}

// CheckRemove applies Linux's rules for removing the entry child of
// directory dir (an unlink, rmdir, or the source of a rename): search
// permission on dir, ENOENT when child is nil (no such entry), then write
// permission on dir and, in a sticky directory, ownership of dir or
// child.
func (c Caller) CheckRemove(dir, child *weftv1.Attr, op string) error {
	if err := c.Check(dir, MayExec, op); err != nil {
		return err
	}
	if child == nil {
		return fserr.Wrap(syscall.ENOENT, "%s: no such file or directory", op)
	}
	if err := c.Check(dir, MayWrite, op); err != nil {
		return err
	}
	if !c.StickyAllows(dir, child) {
		return fserr.Wrap(syscall.EPERM, "%s: directory is sticky and uid %d owns neither it nor the entry", op, c.Uid)
	}
	return nil
}

// FileType returns the type bits (S_IFMT) of mode.
func FileType(mode uint32) uint32 { return mode & syscall.S_IFMT }

// IsDir reports whether mode is a directory's.
func IsDir(mode uint32) bool { return FileType(mode) == syscall.S_IFDIR }

// IsReg reports whether mode is a regular file's.
func IsReg(mode uint32) bool { return FileType(mode) == syscall.S_IFREG }

// IsLink reports whether mode is a symbolic link's.
func IsLink(mode uint32) bool { return FileType(mode) == syscall.S_IFLNK }

// KillSuid clears setuid, and setgid if group-executable, as Linux
// does when a file is written or truncated by a caller without CAP_FSETID.
func KillSuid(mode uint32) uint32 {
	mode &^= syscall.S_ISUID
	if mode&0o010 != 0 {
		mode &^= syscall.S_ISGID
	}
	return mode
}

// NewAttr returns the attributes of a new inode ino of mode (type and
// permission bits) that c makes in directory parent at time now, with
// Linux's setgid-directory rules: entries inherit the directory's group,
// subdirectories also its setgid bit, and a caller outside the group
// cannot make a group-executable setgid file there.
func NewAttr(c Caller, parent *weftv1.Attr, mode uint32, ino uint64, now int64) *weftv1.Attr {
	a := &weftv1.Attr{
		Ino: ino, Mode: mode, Nlink: 1, Uid: c.Uid, Gid: c.Gid,
		AtimeNs: now, MtimeNs: now, CtimeNs: now, Generation: 1,
	}
	if parent.Mode&syscall.S_ISGID != 0 {
		a.Gid = parent.Gid
		if IsDir(mode) {
			a.Mode |= syscall.S_ISGID
		}
	}
	if !IsDir(mode) && a.Mode&(syscall.S_ISGID|0o010) == syscall.S_ISGID|0o010 && !c.Root() && !c.InGroup(a.Gid) {
		a.Mode &^= syscall.S_ISGID
	}
	return a
}
