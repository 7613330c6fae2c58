// Package posixtest is a POSIX behaviour suite for file systems, in the
// spirit of pjdfstest: every operation a POSIX program uses, with its success
// cases and its error cases, errno checked exactly. It issues raw system
// calls (golang.org/x/sys/unix) so that flags and errno values are the ones
// the kernel returns, not a translation by the os package.
//
// The same suite runs on every implementation: on a directory of the local
// disk as the baseline that proves the suite itself right, and on a weft
// FUSE mount. Where Linux file systems legitimately differ, the suite
// follows ext4.
//
// Tests that need a caller other than root (permission checks, chown,
// sticky directories) run the operation in a child process: the test binary
// re-executed with other credentials, selected by an environment variable
// that this package's init function recognises. Go cannot change the
// credentials of one thread safely, so a process it is. Tests that touch
// mapped pages do so in such a child process too (with the test's own
// credentials): a page fault on a file served by the test process itself,
// as an in-process FUSE mount is, can deadlock with the Go garbage
// collector.
//
// Run and the suite close every descriptor exactly once: the file system
// under test may be served by goroutines of the same process, whose
// descriptors a second close of a reused number would take away.
package posixtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Options marks features that a file system under test does not provide.
// The zero value expects everything, which is what weft and ext4 provide.
type Options struct {
	// SkipOtherUsers skips the tests that run operations as non-root users.
	// They are skipped anyway when the test process is not root.
	SkipOtherUsers bool
	// SkipRenameExchange skips renameat2(RENAME_EXCHANGE), for file systems
	// that refuse it with EINVAL.
	SkipRenameExchange bool
	// SkipFallocate skips all fallocate tests.
	SkipFallocate bool
	// SkipPunchHole skips fallocate(FALLOC_FL_PUNCH_HOLE).
	SkipPunchHole bool
	// SkipXattr skips the extended attribute tests.
	SkipXattr bool
	// SkipMmap skips the shared mapping tests.
	SkipMmap bool
}

// env is what one subtest works with: its own fresh directory and the
// options of the run.
type env struct {
	t    *testing.T
	dir  string
	opts Options
}

// path joins names below the subtest's directory.
func (e *env) path(names ...string) string {
	return filepath.Join(append([]string{e.dir}, names...)...)
}

// testCase is one named subtest of the suite.
type testCase struct {
	name string
	run  func(e *env)
}

// suite lists every subtest; each file of this package contributes a group.
func suite() []testCase {
	var all []testCase
	for _, group := range [][]testCase{
		openTests, ioTests, truncateTests, dirTests, unlinkTests, renameTests,
		linkTests, specialTests, attrTests, permTests, xattrTests, fsTests, mmapTests,
		readdirTests, timeTests,
	} {
		all = append(all, group...)
	}
	return all
}

// Run runs the POSIX behaviour suite in dir. Each subtest gets a fresh
// subdirectory of dir (mode 0755, owned by the caller) named after it, so a
// failure can be inspected afterwards. Subtests run one after another: some
// change the process umask. dir must exist; for the tests that run as other
// users, dir and its ancestors must be searchable by everyone (see
// MakeSearchable).
func Run(t *testing.T, dir string, opts Options) {
	if os.Getuid() != 0 && !opts.SkipOtherUsers {
		t.Logf("posixtest: not running as root; tests that need other users are skipped")
		opts.SkipOtherUsers = true
	}
	if !opts.SkipOtherUsers {
		checkSearchable(t, dir)
	}
	oldMask := unix.Umask(0o022)
	defer unix.Umask(oldMask)
	for _, tc := range suite() {
		t.Run(tc.name, func(t *testing.T) {
			d := filepath.Join(dir, tc.name)
			if err := unix.Mkdir(d, 0o755); err != nil {
				t.Fatalf("mkdir %s for the subtest: %v", d, err)
			}
			if err := unix.Chmod(d, 0o755); err != nil {
				t.Fatalf("chmod %s for the subtest: %v", d, err)
			}
			tc.run(&env{t: t, dir: d, opts: opts})
		})
	}
}

// MakeSearchable adds the search (x) permission for everyone to dir and to
// those of its ancestors that lie below os.TempDir() and are owned by the
// caller, so that the suite's other-user tests can reach dir.
// t.TempDir() creates 0700 directories; call this on its result.
func MakeSearchable(t testing.TB, dir string) {
	t.Helper()
	tmp := filepath.Clean(os.TempDir())
	for p := filepath.Clean(dir); strings.HasPrefix(p, tmp+string(filepath.Separator)); p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			t.Fatalf("stat %s: %v", p, err)
		}
		if st.Uid != uint32(os.Getuid()) || st.Mode&0o001 != 0 {
			continue
		}
		if err := unix.Chmod(p, st.Mode&0o7777|0o011); err != nil {
			t.Fatalf("chmod g+x,o+x %s so other users can reach the test directory: %v", p, err)
		}
	}
}

// checkSearchable fails the run early, with the fix, when the other-user
// tests could not even reach dir.
func checkSearchable(t *testing.T, dir string) {
	t.Helper()
	if errno, _ := runAs(t, userOther, userOp{Op: "stat", Path: dir}); errno != 0 {
		t.Fatalf("uid %d cannot reach %s (stat: %v): make dir and its ancestors searchable "+
			"(posixtest.MakeSearchable), or set Options.SkipOtherUsers", userOther.uid, dir, errno)
	}
}

// errnoOf extracts the errno from a system call error (0 for nil).
func errnoOf(err error) unix.Errno {
	if err == nil {
		return 0
	}
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return unix.Errno(0xffff)
}

// errnoName names an errno for messages, "OK" for success.
func errnoName(e unix.Errno) string {
	if e == 0 {
		return "OK"
	}
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return fmt.Sprintf("errno %d", int(e))
}

// wantErrno reports a failure unless err carries the errno want (0: success).
// what names the operation and its path, e.g. "mkdir /d/x".
func wantErrno(t testing.TB, err error, want unix.Errno, what string, args ...any) {
	t.Helper()
	if got := errnoOf(err); got != want {
		t.Errorf("%s: got %s (%v), want %s", fmt.Sprintf(what, args...), errnoName(got), err, errnoName(want))
	}
}

// must fails the subtest now if err is not nil: a setup step failed.
func must(t testing.TB, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}
