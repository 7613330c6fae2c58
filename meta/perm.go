package meta

import (
	"strings"
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Access mask bits, as access(2).
const (
	mayRead  = 4
	mayWrite = 2
	mayExec  = 1
)

// maxNameBytes is the longest entry name (as ext4).
const maxNameBytes = 255

// maxSymlinkBytes is the longest symlink target (PATH_MAX - 1).
const maxSymlinkBytes = 4095

// caller is who performs an operation. A request without a Caller acts as
// root: only trusted admin tools talk to the meta service without one.
type caller struct {
	uid    uint32
	gid    uint32
	groups []uint32
}

func callerOf(c *weftv1.Caller) caller {
	if c == nil {
		return caller{}
	}
	return caller{uid: c.Uid, gid: c.Gid, groups: c.Groups}
}

func (c caller) root() bool { return c.uid == 0 }

// inGroup reports whether gid is the caller's primary or a supplementary
// group.
func (c caller) inGroup(gid uint32) bool {
	if c.gid == gid {
		return true
	}
	for _, g := range c.groups {
		if g == gid {
			return true
		}
	}
	return false
}

func (c caller) owns(a *weftv1.Attr) bool { return c.uid == a.Uid }

// allowed reports whether the caller may access a with mask (mayRead,
// mayWrite, mayExec bits) under the owner/group/other bits. Root may do
// anything except execute a non-directory that has no x bit at all.
func (c caller) allowed(a *weftv1.Attr, mask uint32) bool {
	if c.root() {
		if mask&mayExec != 0 && !isDir(a.Mode) && a.Mode&0o111 == 0 {
			return false
		}
		return true
	}
	var bits uint32
	switch {
	case c.uid == a.Uid:
		bits = a.Mode >> 6 & 7
	case c.inGroup(a.Gid):
		bits = a.Mode >> 3 & 7
	default:
		bits = a.Mode & 7
	}
	return bits&mask == mask
}

// check returns EACCES naming the operation and object unless the caller
// may access a with mask.
func (c caller) check(a *weftv1.Attr, mask uint32, op string) error {
	if c.allowed(a, mask) {
		return nil
	}
	return fserr.Wrap(syscall.EACCES, "%s: permission denied on inode %d (mode %#o, uid %d, gid %d) for uid %d",
		op, a.Ino, a.Mode&0o7777, a.Uid, a.Gid, c.uid)
}

// stickyAllows reports whether the caller may remove or rename child out
// of dir: always unless dir is sticky and the caller owns neither.
func (c caller) stickyAllows(dir, child *weftv1.Attr) bool {
	if dir.Mode&syscall.S_ISVTX == 0 || c.root() {
		return true
	}
	return c.uid == dir.Uid || c.uid == child.Uid
}

func fileType(mode uint32) uint32 { return mode & syscall.S_IFMT }
func isDir(mode uint32) bool      { return fileType(mode) == syscall.S_IFDIR }
func isReg(mode uint32) bool      { return fileType(mode) == syscall.S_IFREG }
func isLink(mode uint32) bool     { return fileType(mode) == syscall.S_IFLNK }

// checkName validates a new or looked-up entry name (not "." or "..",
// which callers handle per operation as Linux does).
func checkName(op string, parent uint64, name string) error {
	switch {
	case name == "":
		return fserr.Wrap(syscall.ENOENT, "%s: empty name in directory %d", op, parent)
	case len(name) > maxNameBytes:
		return fserr.Wrap(syscall.ENAMETOOLONG, "%s: name of %d bytes in directory %d is longer than %d bytes",
			op, len(name), parent, maxNameBytes)
	case strings.ContainsAny(name, "/\x00"):
		return fserr.Wrap(syscall.EINVAL, "%s %q in directory %d: a name must not contain '/' or NUL", op, name, parent)
	}
	return nil
}

func isDot(name string) bool { return name == "." || name == ".." }

// killSuid clears setuid, and setgid if group-executable, as Linux
// does when a file is written or truncated by a caller without CAP_FSETID.
func killSuid(mode uint32) uint32 {
	mode &^= syscall.S_ISUID
	if mode&0o010 != 0 {
		mode &^= syscall.S_ISGID
	}
	return mode
}
