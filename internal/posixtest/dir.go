package posixtest

import (
	"golang.org/x/sys/unix"
)

var dirTests = []testCase{
	{"MkdirRmdir", func(e *env) {
		d := e.path("d")
		must(e.t, unix.Mkdir(d, 0o755), "mkdir %s", d)
		wantMode(e.t, d, unix.S_IFDIR|0o755)
		wantErrno(e.t, unix.Mkdir(d, 0o755), unix.EEXIST, "mkdir %s (exists)", d)
		writeFile(e.t, e.path("f"), nil, 0o644)
		wantErrno(e.t, unix.Mkdir(e.path("f"), 0o755), unix.EEXIST, "mkdir %s (a file exists)", e.path("f"))
		wantErrno(e.t, unix.Mkdir(e.path("missing", "x"), 0o755), unix.ENOENT, "mkdir %s", e.path("missing", "x"))
		wantErrno(e.t, unix.Mkdir(e.path("f", "x"), 0o755), unix.ENOTDIR, "mkdir %s", e.path("f", "x"))
		must(e.t, unix.Mkdir(e.path("d", "sub"), 0o755), "mkdir")
		wantErrno(e.t, unix.Rmdir(d), unix.ENOTEMPTY, "rmdir %s (has a subdirectory)", d)
		must(e.t, unix.Rmdir(e.path("d", "sub")), "rmdir")
		writeFile(e.t, e.path("d", "file"), nil, 0o644)
		wantErrno(e.t, unix.Rmdir(d), unix.ENOTEMPTY, "rmdir %s (has a file)", d)
		must(e.t, unix.Unlink(e.path("d", "file")), "unlink")
		wantErrno(e.t, unix.Rmdir(e.path("f")), unix.ENOTDIR, "rmdir %s (a file)", e.path("f"))
		wantErrno(e.t, unix.Rmdir(e.path("missing")), unix.ENOENT, "rmdir %s", e.path("missing"))
		wantErrno(e.t, unix.Rmdir(d+"/."), unix.EINVAL, "rmdir %s/.", d)
		wantErrno(e.t, unix.Rmdir(e.path("d")+"/.."), unix.ENOTEMPTY, "rmdir %s/..", d)
		wantErrno(e.t, unix.Rmdir(d), 0, "rmdir %s (empty)", d)
		var st unix.Stat_t
		wantErrno(e.t, unix.Lstat(d, &st), unix.ENOENT, "lstat %s after rmdir", d)
	}},
	{"MkdirNlink", func(e *env) {
		d := e.path("d")
		must(e.t, unix.Mkdir(d, 0o755), "mkdir %s", d)
		wantNlink(e.t, d, 2)
		for i, name := range []string{"a", "b", "c"} {
			must(e.t, unix.Mkdir(e.path("d", name), 0o755), "mkdir")
			wantNlink(e.t, d, uint64(3+i))
		}
		writeFile(e.t, e.path("d", "file"), nil, 0o644)
		wantNlink(e.t, d, 5)
		must(e.t, unix.Rmdir(e.path("d", "b")), "rmdir")
		wantNlink(e.t, d, 4)
		wantNlink(e.t, e.path("d", "a"), 2)
		// ".." of a subdirectory is its parent.
		var parent, dotdot unix.Stat_t
		must(e.t, unix.Stat(d, &parent), "stat")
		must(e.t, unix.Stat(e.path("d", "a")+"/..", &dotdot), "stat")
		if parent.Ino != dotdot.Ino {
			e.t.Errorf("stat %s/a/..: inode %d, want %d (of %s)", d, dotdot.Ino, parent.Ino, d)
		}
	}},
	{"MkdirModeUmask", func(e *env) {
		for _, c := range []struct {
			mode, umask, want uint32
		}{
			{0o777, 0o022, 0o755},
			{0o777, 0o077, 0o700},
			{0o700, 0o000, 0o700},
			{0o1777, 0o022, 0o1755},
			{0o555, 0o000, 0o555},
		} {
			d := e.path("d")
			old := unix.Umask(int(c.umask))
			err := unix.Mkdir(d, c.mode)
			unix.Umask(old)
			must(e.t, err, "mkdir %s %#o", d, c.mode)
			wantMode(e.t, d, unix.S_IFDIR|c.want)
			must(e.t, unix.Rmdir(d), "rmdir %s", d)
		}
	}},
}

var unlinkTests = []testCase{
	{"UnlinkErrors", func(e *env) {
		wantErrno(e.t, unix.Unlink(e.path("missing")), unix.ENOENT, "unlink %s", e.path("missing"))
		d := e.path("d")
		must(e.t, unix.Mkdir(d, 0o755), "mkdir")
		wantErrno(e.t, unix.Unlink(d), unix.EISDIR, "unlink directory %s", d)
		writeFile(e.t, e.path("f"), nil, 0o644)
		wantErrno(e.t, unix.Unlink(e.path("f", "x")), unix.ENOTDIR, "unlink %s", e.path("f", "x"))
		wantErrno(e.t, unix.Unlink(e.path("f")), 0, "unlink %s", e.path("f"))
		var st unix.Stat_t
		wantErrno(e.t, unix.Lstat(e.path("f"), &st), unix.ENOENT, "lstat %s after unlink", e.path("f"))
		// Unlinking a symlink removes the link, not its target.
		writeFile(e.t, e.path("target"), []byte("t"), 0o644)
		must(e.t, unix.Symlink("target", e.path("l")), "symlink")
		must(e.t, unix.Unlink(e.path("l")), "unlink symlink")
		wantContent(e.t, e.path("target"), []byte("t"))
	}},
	{"UnlinkOpenFile", func(e *env) {
		p := e.path("f")
		data := pattern(mib+300, 4)
		writeFile(e.t, p, data, 0o644)
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		must(e.t, err, "open %s", p)
		defer unix.Close(fd)
		must(e.t, unix.Unlink(p), "unlink %s", p)
		var st unix.Stat_t
		wantErrno(e.t, unix.Lstat(p, &st), unix.ENOENT, "lstat %s after unlink", p)
		must(e.t, unix.Fstat(fd, &st), "fstat unlinked %s", p)
		if st.Nlink != 0 {
			e.t.Errorf("fstat of unlinked %s: nlink %d, want 0", p, st.Nlink)
		}
		wantBytes(e.t, readAt(e.t, fd, 2*mib, 0, p), data, "read of unlinked "+p)
		writeAt(e.t, fd, []byte("more"), int64(len(data)), p)
		writeAt(e.t, fd, []byte("XY"), 10, p)
		want := append(append([]byte{}, data...), "more"...)
		copy(want[10:], "XY")
		wantBytes(e.t, readAt(e.t, fd, 2*mib, 0, p), want, "read of unlinked "+p+" after writes")
		must(e.t, unix.Fsync(fd), "fsync unlinked %s", p)
		// A new file under the same name is a different file.
		writeFile(e.t, p, []byte("new"), 0o644)
		wantBytes(e.t, readAt(e.t, fd, 2*mib, 0, p), want, "read of unlinked "+p+" after re-creating the name")
		wantContent(e.t, p, []byte("new"))
	}},
}
