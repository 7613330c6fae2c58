package posixtest

import (
	"os"

	"golang.org/x/sys/unix"
)

// past is a timestamp set before an operation, so that an update by the
// operation is visible however coarse the clock.
var past = unix.Timespec{Sec: 1000000000}

// setPast sets atime and mtime of path to past.
func setPast(e *env, path string) {
	e.t.Helper()
	must(e.t, unix.UtimesNanoAt(unix.AT_FDCWD, path, []unix.Timespec{past, past}, unix.AT_SYMLINK_NOFOLLOW), "utimensat %s", path)
}

// timesChange runs op on a prepared object and checks which of the
// timestamps of path it updates: mtime is checked against past (set before
// op), ctime against its value before op.
func timesChange(e *env, what, path string, op func(), wantMtime, wantCtime bool) {
	e.t.Helper()
	setPast(e, path)
	before := lstat(e.t, path)
	timestampTick()
	op()
	after := lstat(e.t, path)
	if changed := after.Mtim != past; changed != wantMtime {
		e.t.Errorf("%s: mtime of %s changed=%v (%v), want changed=%v", what, path, changed, tsTime(after.Mtim), wantMtime)
	}
	if changed := after.Ctim != before.Ctim; changed != wantCtime {
		e.t.Errorf("%s: ctime of %s changed=%v (%v -> %v), want changed=%v", what, path,
			changed, tsTime(before.Ctim), tsTime(after.Ctim), wantCtime)
	}
}

var timeTests = []testCase{
	{"TimesFile", func(e *env) {
		p := e.path("f")
		writeFile(e.t, p, []byte("data"), 0o644)
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		must(e.t, err, "open %s", p)
		defer unix.Close(fd)
		timesChange(e, "write", p, func() { writeAt(e.t, fd, []byte("more"), 4, p) }, true, true)
		timesChange(e, "chmod", p, func() { chmod(e.t, p, 0o600) }, false, true)
		if os.Geteuid() == 0 {
			timesChange(e, "chown", p, func() { chown(e.t, p, uidOwner, -1) }, false, true)
		}
		timesChange(e, "chown -1 -1", p, func() { chown(e.t, p, -1, -1) }, false, true)
		timesChange(e, "link", p, func() { must(e.t, unix.Link(p, e.path("g")), "link") }, false, true)
		timesChange(e, "unlink of another link", p, func() { must(e.t, unix.Unlink(e.path("g")), "unlink") }, false, true)
		timesChange(e, "truncate", p, func() { must(e.t, unix.Truncate(p, 2), "truncate") }, true, true)
		timesChange(e, "ftruncate", p, func() { must(e.t, unix.Ftruncate(fd, 100), "ftruncate") }, true, true)
		timesChange(e, "rename", p, func() {
			must(e.t, unix.Rename(p, e.path("r")), "rename")
			must(e.t, unix.Rename(e.path("r"), p), "rename")
		}, false, true)
		timesChange(e, "read", p, func() { readAt(e.t, fd, 10, 0, p) }, false, false)
		if !e.opts.SkipXattr {
			timesChange(e, "setxattr", p, func() { must(e.t, unix.Setxattr(p, "user.t", []byte("v"), 0), "setxattr") }, false, true)
		}
		var trunc int
		timesChange(e, "open O_TRUNC", p, func() {
			trunc, err = unix.Open(p, unix.O_WRONLY|unix.O_TRUNC, 0)
			must(e.t, err, "open %s O_TRUNC", p)
		}, true, true)
		unix.Close(trunc)
	}},
	{"TimesDirectory", func(e *env) {
		d := e.path("d")
		must(e.t, unix.Mkdir(d, 0o755), "mkdir")
		timesChange(e, "create in", d, func() { writeFile(e.t, e.path("d", "f"), nil, 0o644) }, true, true)
		timesChange(e, "write to a child", d, func() { writeFile(e.t, e.path("d", "f"), []byte("x"), 0o644) }, false, false)
		timesChange(e, "mkdir in", d, func() { must(e.t, unix.Mkdir(e.path("d", "sub"), 0o755), "mkdir") }, true, true)
		timesChange(e, "rmdir in", d, func() { must(e.t, unix.Rmdir(e.path("d", "sub")), "rmdir") }, true, true)
		timesChange(e, "symlink in", d, func() { must(e.t, unix.Symlink("f", e.path("d", "l")), "symlink") }, true, true)
		timesChange(e, "link in", d, func() { must(e.t, unix.Link(e.path("d", "f"), e.path("d", "h")), "link") }, true, true)
		timesChange(e, "unlink in", d, func() { must(e.t, unix.Unlink(e.path("d", "h")), "unlink") }, true, true)
		timesChange(e, "rename within", d, func() { must(e.t, unix.Rename(e.path("d", "f"), e.path("d", "g")), "rename") }, true, true)
		timesChange(e, "rename out of", d, func() { must(e.t, unix.Rename(e.path("d", "g"), e.path("g")), "rename") }, true, true)
		timesChange(e, "rename into", d, func() { must(e.t, unix.Rename(e.path("g"), e.path("d", "g")), "rename") }, true, true)
		timesChange(e, "mknod in", d, func() { must(e.t, unix.Mkfifo(e.path("d", "p"), 0o644), "mkfifo") }, true, true)
		timesChange(e, "chmod", d, func() { chmod(e.t, d, 0o700) }, false, true)
		// A new entry gets the current time for all three timestamps.
		st := lstat(e.t, e.path("d", "p"))
		if st.Mtim != st.Ctim || st.Mtim.Sec < past.Sec+1 {
			e.t.Errorf("new fifo %s: mtime %v ctime %v, want equal and current", e.path("d", "p"), tsTime(st.Mtim), tsTime(st.Ctim))
		}
	}},
}
