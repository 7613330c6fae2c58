package posixtest

import (
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

var openTests = []testCase{
	{"OpenCreateExcl", func(e *env) {
		p := e.path("f")
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
		must(e.t, err, "open %s O_CREAT|O_EXCL", p)
		unix.Close(fd)
		wantMode(e.t, p, unix.S_IFREG|0o644)
		_, err = unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
		wantErrno(e.t, err, unix.EEXIST, "open %s O_CREAT|O_EXCL on an existing file", p)
		must(e.t, unix.Mkdir(e.path("d"), 0o755), "mkdir")
		_, err = unix.Open(e.path("d"), unix.O_CREAT|unix.O_EXCL|unix.O_RDONLY, 0o644)
		wantErrno(e.t, err, unix.EEXIST, "open %s O_CREAT|O_EXCL on a directory", e.path("d"))
		must(e.t, unix.Symlink("missing", e.path("dangling")), "symlink")
		_, err = unix.Open(e.path("dangling"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
		wantErrno(e.t, err, unix.EEXIST, "open %s O_CREAT|O_EXCL on a dangling symlink", e.path("dangling"))
	}},
	{"OpenCreateModeUmask", func(e *env) {
		p := e.path("f")
		fd, err := unix.Open(p, unix.O_CREAT|unix.O_WRONLY, 0o666)
		must(e.t, err, "open %s O_CREAT", p)
		unix.Close(fd)
		wantMode(e.t, p, unix.S_IFREG|0o644)
		old := unix.Umask(0o077)
		fd, err = unix.Open(e.path("g"), unix.O_CREAT|unix.O_WRONLY, 0o666)
		unix.Umask(old)
		must(e.t, err, "open %s O_CREAT", e.path("g"))
		unix.Close(fd)
		wantMode(e.t, e.path("g"), unix.S_IFREG|0o600)
		// O_CREAT on an existing file opens it without truncating.
		writeFile(e.t, p, []byte("keep"), 0o644)
		fd, err = unix.Open(p, unix.O_CREAT|unix.O_RDWR, 0o600)
		must(e.t, err, "open %s O_CREAT on an existing file", p)
		unix.Close(fd)
		wantContent(e.t, p, []byte("keep"))
		wantMode(e.t, p, unix.S_IFREG|0o644)
		var st unix.Stat_t
		must(e.t, unix.Stat(p, &st), "stat")
		if int(st.Uid) != os.Geteuid() || int(st.Gid) != os.Getegid() {
			e.t.Errorf("stat %s: owner %d:%d, want %d:%d (the creating process)", p, st.Uid, st.Gid, os.Geteuid(), os.Getegid())
		}
	}},
	{"OpenTrunc", func(e *env) {
		p := e.path("f")
		writeFile(e.t, p, pattern(5000, 1), 0o644)
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_TRUNC, 0)
		must(e.t, err, "open %s O_TRUNC", p)
		defer unix.Close(fd)
		wantSize(e.t, p, 0)
		writeAt(e.t, fd, []byte("new"), 0, p)
		wantContent(e.t, p, []byte("new"))
	}},
	{"OpenAppend", func(e *env) {
		p := e.path("f")
		writeFile(e.t, p, []byte("0123456789"), 0o644)
		fd, err := unix.Open(p, unix.O_WRONLY|unix.O_APPEND, 0)
		must(e.t, err, "open %s O_APPEND", p)
		defer unix.Close(fd)
		_, err = unix.Seek(fd, 2, unix.SEEK_SET)
		must(e.t, err, "lseek")
		_, err = unix.Write(fd, []byte("ab"))
		must(e.t, err, "write %s", p)
		off, err := unix.Seek(fd, 0, unix.SEEK_CUR)
		must(e.t, err, "lseek SEEK_CUR")
		if off != 12 {
			e.t.Errorf("offset after O_APPEND write to %s: %d, want 12", p, off)
		}
		_, err = unix.Seek(fd, 0, unix.SEEK_SET)
		must(e.t, err, "lseek")
		_, err = unix.Write(fd, []byte("cd"))
		must(e.t, err, "write %s", p)
		wantContent(e.t, p, []byte("0123456789abcd"))
	}},
	{"OpenDirectoryFlags", func(e *env) {
		p := e.path("f")
		writeFile(e.t, p, nil, 0o644)
		_, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		wantErrno(e.t, err, unix.ENOTDIR, "open %s O_DIRECTORY on a file", p)
		d := e.path("d")
		must(e.t, unix.Mkdir(d, 0o755), "mkdir %s", d)
		fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		wantErrno(e.t, err, 0, "open %s O_DIRECTORY", d)
		if err == nil {
			unix.Close(fd)
		}
		_, err = unix.Open(d, unix.O_WRONLY, 0)
		wantErrno(e.t, err, unix.EISDIR, "open %s O_WRONLY on a directory", d)
		_, err = unix.Open(d, unix.O_RDWR, 0)
		wantErrno(e.t, err, unix.EISDIR, "open %s O_RDWR on a directory", d)
		_, err = unix.Open(d, unix.O_WRONLY|unix.O_CREAT, 0o644)
		wantErrno(e.t, err, unix.EISDIR, "open %s O_WRONLY|O_CREAT on a directory", d)
	}},
	{"OpenNotFound", func(e *env) {
		_, err := unix.Open(e.path("missing"), unix.O_RDONLY, 0)
		wantErrno(e.t, err, unix.ENOENT, "open %s", e.path("missing"))
		_, err = unix.Open(e.path("nodir", "f"), unix.O_CREAT|unix.O_WRONLY, 0o644)
		wantErrno(e.t, err, unix.ENOENT, "open %s O_CREAT in a missing directory", e.path("nodir", "f"))
		writeFile(e.t, e.path("file"), nil, 0o644)
		_, err = unix.Open(e.path("file", "f"), unix.O_RDONLY, 0)
		wantErrno(e.t, err, unix.ENOTDIR, "open %s (a file as directory)", e.path("file", "f"))
		_, err = unix.Open(e.path("file", "f"), unix.O_CREAT|unix.O_WRONLY, 0o644)
		wantErrno(e.t, err, unix.ENOTDIR, "open %s O_CREAT (a file as directory)", e.path("file", "f"))
		_, err = unix.Open(e.path("file")+"/", unix.O_RDONLY, 0)
		wantErrno(e.t, err, unix.ENOTDIR, "open %s/ (trailing slash on a file)", e.path("file"))
	}},
	{"OpenNoFollow", func(e *env) {
		writeFile(e.t, e.path("f"), []byte("x"), 0o644)
		must(e.t, unix.Symlink("f", e.path("l")), "symlink")
		_, err := unix.Open(e.path("l"), unix.O_RDONLY|unix.O_NOFOLLOW, 0)
		wantErrno(e.t, err, unix.ELOOP, "open %s O_NOFOLLOW on a symlink", e.path("l"))
	}},
	{"NameMax", func(e *env) {
		ok, long := strings.Repeat("a", 255), strings.Repeat("b", 256)
		src := e.path("src")
		writeFile(e.t, src, nil, 0o644)
		type nameOp struct {
			what string
			do   func(name string) error
		}
		for _, op := range []nameOp{
			{"open O_CREAT", func(n string) error {
				fd, err := unix.Open(e.path(n), unix.O_CREAT|unix.O_WRONLY, 0o644)
				if err == nil {
					unix.Close(fd)
					return unix.Unlink(e.path(n))
				}
				return err
			}},
			{"mkdir", func(n string) error {
				if err := unix.Mkdir(e.path(n), 0o755); err != nil {
					return err
				}
				return unix.Rmdir(e.path(n))
			}},
			{"rename", func(n string) error {
				if err := unix.Rename(src, e.path(n)); err != nil {
					return err
				}
				return unix.Rename(e.path(n), src)
			}},
			{"link", func(n string) error {
				if err := unix.Link(src, e.path(n)); err != nil {
					return err
				}
				return unix.Unlink(e.path(n))
			}},
			{"symlink", func(n string) error {
				if err := unix.Symlink("src", e.path(n)); err != nil {
					return err
				}
				return unix.Unlink(e.path(n))
			}},
			{"mknod S_IFIFO", func(n string) error {
				if err := unix.Mknod(e.path(n), unix.S_IFIFO|0o644, 0); err != nil {
					return err
				}
				return unix.Unlink(e.path(n))
			}},
		} {
			wantErrno(e.t, op.do(ok), 0, "%s with a 255-byte name in %s", op.what, e.dir)
			wantErrno(e.t, op.do(long), unix.ENAMETOOLONG, "%s with a 256-byte name in %s", op.what, e.dir)
		}
		var st unix.Stat_t
		wantErrno(e.t, unix.Stat(e.path(long), &st), unix.ENAMETOOLONG, "stat of a 256-byte name in %s", e.dir)
		_, err := unix.Open(e.path(long), unix.O_RDONLY, 0)
		wantErrno(e.t, err, unix.ENAMETOOLONG, "open of a 256-byte name in %s", e.dir)
	}},
}
