package meta

import (
	"strings"
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/perm"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Access mask bits, as access(2).
const (
	mayRead  = perm.MayRead
	mayWrite = perm.MayWrite
	mayExec  = perm.MayExec
)

// maxNameBytes is the longest entry name (as ext4).
const maxNameBytes = 255

// maxSymlinkBytes is the longest symlink target (PATH_MAX - 1).
const maxSymlinkBytes = 4095

// caller is who performs an operation (perm.Caller). A request without a
// Caller acts as root: only trusted admin tools talk to the meta service
// without one.
type caller = perm.Caller

func callerOf(c *weftv1.Caller) caller { return perm.Of(c) }

func fileType(mode uint32) uint32 { return perm.FileType(mode) }
func isDir(mode uint32) bool      { return perm.IsDir(mode) }
func isReg(mode uint32) bool      { return perm.IsReg(mode) }
func isLink(mode uint32) bool     { return perm.IsLink(mode) }

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

// killSuid clears setuid, and setgid if group-executable (perm.KillSuid).
func killSuid(mode uint32) uint32 { return perm.KillSuid(mode) }
