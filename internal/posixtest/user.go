package posixtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Environment variable that turns the test binary into a one-shot process
// running a single operation, as another user or touching mapped memory.
const userOpEnv = "WEFT_POSIXTEST_USER_OP"

// childTimeout bounds one child operation, so that a file system that hangs
// fails the test instead of hanging it.
const childTimeout = 2 * time.Minute

// user is a set of credentials the suite runs operations with. The ids need
// no entry in /etc/passwd.
type user struct {
	uid, gid uint32
	groups   []uint32
}

// Ids used by the other-user tests: userOwner owns files, userOther is an
// unrelated user, userMember is another user who belongs to sharedGroup as a
// supplementary group.
const (
	uidOwner    = 42001
	uidOther    = 42002
	uidMember   = 42003
	gidOwner    = 42001
	gidOther    = 42002
	gidMember   = 42003
	sharedGroup = 42010
)

var (
	userOwner  = user{uid: uidOwner, gid: gidOwner, groups: []uint32{gidOwner, sharedGroup}}
	userOther  = user{uid: uidOther, gid: gidOther, groups: []uint32{gidOther}}
	userMember = user{uid: uidMember, gid: gidMember, groups: []uint32{gidMember, sharedGroup}}
)

// userOp is one operation performed by the child process. Fields not used
// by Op are ignored.
type userOp struct {
	Op    string // open, write, read, stat, mkdir, rmdir, unlink, rename, link, symlink, chmod, chown, utimens, truncate, access, getxattr, setxattr
	Path  string
	Path2 string
	Flags int
	Mode  uint32
	Data  []byte
	UID   int
	GID   int
	Size  int64
	Times []unix.Timespec
	// Offsets are where mmapwrite writes its patterns.
	Offsets []int64
}

// userResult is what the child reports on stdout.
type userResult struct {
	Errno int
	Out   []byte
}

func init() {
	spec := os.Getenv(userOpEnv)
	if spec == "" {
		return
	}
	var op userOp
	var res userResult
	if err := json.Unmarshal([]byte(spec), &op); err != nil {
		fmt.Fprintf(os.Stderr, "posixtest user op %q: %v\n", spec, err)
		os.Exit(2)
	}
	out, err := op.do()
	res.Out = out
	res.Errno = int(errnoOf(err))
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		os.Exit(2)
	}
	os.Exit(0)
}

// do performs the operation with the credentials of the current process.
func (op userOp) do() ([]byte, error) {
	switch op.Op {
	case "open":
		fd, err := unix.Open(op.Path, op.Flags, op.Mode)
		if err != nil {
			return nil, err
		}
		return nil, unix.Close(fd)
	case "write":
		fd, err := unix.Open(op.Path, op.Flags|unix.O_WRONLY, op.Mode)
		if err != nil {
			return nil, err
		}
		defer unix.Close(fd)
		_, err = unix.Pwrite(fd, op.Data, op.Size)
		return nil, err
	case "read":
		fd, err := unix.Open(op.Path, unix.O_RDONLY, 0)
		if err != nil {
			return nil, err
		}
		defer unix.Close(fd)
		buf := make([]byte, 1<<16)
		n, err := unix.Read(fd, buf)
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	case "stat":
		var st unix.Stat_t
		if err := unix.Lstat(op.Path, &st); err != nil {
			return nil, err
		}
		return json.Marshal(st)
	case "mkdir":
		return nil, unix.Mkdir(op.Path, op.Mode)
	case "rmdir":
		return nil, unix.Rmdir(op.Path)
	case "unlink":
		return nil, unix.Unlink(op.Path)
	case "rename":
		return nil, unix.Rename(op.Path, op.Path2)
	case "link":
		return nil, unix.Link(op.Path, op.Path2)
	case "symlink":
		return nil, unix.Symlink(op.Path2, op.Path)
	case "chmod":
		return nil, unix.Chmod(op.Path, op.Mode)
	case "chown":
		return nil, unix.Lchown(op.Path, op.UID, op.GID)
	case "utimens":
		return nil, unix.UtimesNanoAt(unix.AT_FDCWD, op.Path, op.Times, 0)
	case "truncate":
		return nil, unix.Truncate(op.Path, op.Size)
	case "access":
		return nil, unix.Faccessat(unix.AT_FDCWD, op.Path, uint32(op.Flags), 0)
	case "mmapwrite":
		return mmapWrite(op)
	case "mmapread":
		return mmapRead(op)
	case "getxattr":
		buf := make([]byte, 4096)
		n, err := unix.Getxattr(op.Path, string(op.Data), buf)
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	case "setxattr":
		return nil, unix.Setxattr(op.Path, op.Path2, op.Data, op.Flags)
	}
	return nil, fmt.Errorf("posixtest: unknown user op %q", op.Op)
}

// runAs performs op in a child process with u's credentials and returns the
// errno it got (0 on success) and its output (file data, or a JSON Stat_t).
// The child is this very binary (/proc/self/exe, which stays reachable after
// the credential change whatever the permissions of its directory).
func runAs(t testing.TB, u user, op userOp) (unix.Errno, []byte) {
	t.Helper()
	return runChild(t, &u, op)
}

// runChild performs op in a child process, with u's credentials or, if u is
// nil, with the test's own.
func runChild(t testing.TB, u *user, op userOp) (unix.Errno, []byte) {
	t.Helper()
	spec, err := json.Marshal(op)
	must(t, err, "encode user op")
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe")
	cmd.Args = []string{"posixtest-user-op"}
	cmd.Dir = "/"
	cmd.Env = []string{userOpEnv + "=" + string(spec)}
	if u == nil {
		u = &user{uid: uint32(os.Getuid())}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: no answer within %v, killed", err, childTimeout)
		}
		t.Fatalf("run %s %s as uid %d: %v (stderr: %s)", op.Op, op.Path, u.uid, err, stderr.String())
	}
	var res userResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("run %s %s as uid %d: bad output %q: %v (stderr: %s)", op.Op, op.Path, u.uid, stdout.String(), err, stderr.String())
	}
	return unix.Errno(res.Errno), res.Out
}

// asWant runs op as u and checks the errno it gets (0: success).
func asWant(t testing.TB, u user, op userOp, want unix.Errno) []byte {
	t.Helper()
	got, out := runAs(t, u, op)
	if got != want {
		t.Errorf("%s %s (as uid %d gid %d groups %v): got %s, want %s",
			op.Op, op.Path, u.uid, u.gid, u.groups, errnoName(got), errnoName(want))
	}
	return out
}

// needUsers skips the subtest when other users are not available.
func (e *env) needUsers() {
	if e.opts.SkipOtherUsers {
		e.t.Skip("needs root to run operations as other users")
	}
}

// needRoot skips the subtest unless it runs as root.
func (e *env) needRoot() {
	if os.Geteuid() != 0 {
		e.t.Skip("needs root")
	}
}

// chown sets the owner of path (as root), failing the subtest on error.
func chown(t testing.TB, path string, uid, gid int) {
	t.Helper()
	must(t, unix.Lchown(path, uid, gid), "chown %s %d:%d", path, uid, gid)
}

// chmod sets the mode of path (as root), failing the subtest on error.
func chmod(t testing.TB, path string, mode uint32) {
	t.Helper()
	must(t, unix.Chmod(path, mode), "chmod %s %#o", path, mode)
}
