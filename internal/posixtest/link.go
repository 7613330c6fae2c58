package posixtest

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

var linkTests = []testCase{
	{"HardLink", func(e *env) {
		a, b := e.path("a"), e.path("b")
		writeFile(e.t, a, []byte("shared"), 0o644)
		wantNlink(e.t, a, 1)
		must(e.t, unix.Link(a, b), "link %s %s", a, b)
		wantNlink(e.t, a, 2)
		wantNlink(e.t, b, 2)
		if ia, ib := lstat(e.t, a).Ino, lstat(e.t, b).Ino; ia != ib {
			e.t.Errorf("link %s %s: inodes %d and %d, want equal", a, b, ia, ib)
		}
		writeFile(e.t, b, []byte("changed"), 0o644)
		wantContent(e.t, a, []byte("changed"))
		wantErrno(e.t, unix.Link(a, b), unix.EEXIST, "link %s onto existing %s", a, b)
		wantErrno(e.t, unix.Link(e.path("missing"), e.path("c")), unix.ENOENT, "link of missing %s", e.path("missing"))
		wantErrno(e.t, unix.Link(a, e.path("nodir", "c")), unix.ENOENT, "link into missing directory %s", e.path("nodir"))
		must(e.t, unix.Mkdir(e.path("d"), 0o755), "mkdir")
		wantErrno(e.t, unix.Link(e.path("d"), e.path("dlink")), unix.EPERM, "link of directory %s", e.path("d"))
		// Links in another directory.
		must(e.t, unix.Link(a, e.path("d", "c")), "link into a subdirectory")
		wantNlink(e.t, a, 3)
		wantNlink(e.t, e.path("d"), 2)
		must(e.t, unix.Unlink(a), "unlink")
		wantNlink(e.t, b, 2)
		must(e.t, unix.Unlink(e.path("d", "c")), "unlink")
		wantNlink(e.t, b, 1)
		wantContent(e.t, b, []byte("changed"))
	}},
	{"HardLinksAcrossRenameUnlink", func(e *env) {
		a, b, c := e.path("a"), e.path("b"), e.path("c")
		writeFile(e.t, a, []byte("one"), 0o644)
		must(e.t, unix.Link(a, b), "link")
		must(e.t, unix.Rename(a, c), "rename %s %s", a, c)
		wantNlink(e.t, c, 2)
		wantNlink(e.t, b, 2)
		fd, err := unix.Open(b, unix.O_RDONLY, 0)
		must(e.t, err, "open %s", b)
		defer unix.Close(fd)
		// Another file renamed over one name drops one link.
		x := e.path("x")
		writeFile(e.t, x, []byte("other"), 0o644)
		must(e.t, unix.Rename(x, c), "rename %s over %s", x, c)
		wantNlink(e.t, b, 1)
		wantNlink(e.t, c, 1)
		must(e.t, unix.Unlink(b), "unlink %s", b)
		var st unix.Stat_t
		must(e.t, unix.Fstat(fd, &st), "fstat")
		if st.Nlink != 0 {
			e.t.Errorf("fstat of %s after its last name went: nlink %d, want 0", b, st.Nlink)
		}
		wantBytes(e.t, readAt(e.t, fd, 10, 0, b), []byte("one"), "read after last unlink")
	}},
	{"Symlink", func(e *env) {
		f, l := e.path("f"), e.path("l")
		writeFile(e.t, f, []byte("target data"), 0o600)
		must(e.t, unix.Symlink("f", l), "symlink f %s", l)
		buf := make([]byte, 256)
		n, err := unix.Readlink(l, buf)
		must(e.t, err, "readlink %s", l)
		if string(buf[:n]) != "f" {
			e.t.Errorf("readlink %s: %q, want %q", l, buf[:n], "f")
		}
		st := lstat(e.t, l)
		if st.Mode&unix.S_IFMT != unix.S_IFLNK || st.Size != 1 {
			e.t.Errorf("lstat %s: mode %#o size %d, want a symlink of size 1", l, st.Mode, st.Size)
		}
		var fst unix.Stat_t
		must(e.t, unix.Stat(l, &fst), "stat %s", l)
		if fst.Ino != lstat(e.t, f).Ino || fst.Mode != unix.S_IFREG|0o600 || fst.Size != 11 {
			e.t.Errorf("stat %s follows to %s: ino %d mode %#o size %d", l, f, fst.Ino, fst.Mode, fst.Size)
		}
		wantContent(e.t, l, []byte("target data"))
		wantErrno(e.t, unix.Symlink("x", l), unix.EEXIST, "symlink onto existing %s", l)
		wantErrno(e.t, unix.Symlink("x", f), unix.EEXIST, "symlink onto existing file %s", f)
		_, err = unix.Readlink(f, buf)
		wantErrno(e.t, err, unix.EINVAL, "readlink of regular file %s", f)
		_, err = unix.Readlink(e.dir, buf)
		wantErrno(e.t, err, unix.EINVAL, "readlink of directory %s", e.dir)
		_, err = unix.Readlink(e.path("missing"), buf)
		wantErrno(e.t, err, unix.ENOENT, "readlink of missing %s", e.path("missing"))
		// A long target is kept exactly; a short buffer truncates.
		long := strings.Repeat("0123456789/", 300)
		must(e.t, unix.Symlink(long, e.path("long")), "symlink with a %d-byte target", len(long))
		lbuf := make([]byte, 8192)
		n, err = unix.Readlink(e.path("long"), lbuf)
		must(e.t, err, "readlink")
		if string(lbuf[:n]) != long {
			e.t.Errorf("readlink %s: %d bytes, want the %d-byte target", e.path("long"), n, len(long))
		}
		n, err = unix.Readlink(e.path("long"), lbuf[:10])
		if err != nil || string(lbuf[:n]) != long[:10] {
			e.t.Errorf("readlink %s into 10 bytes: %q, %v; want %q", e.path("long"), lbuf[:n], err, long[:10])
		}
		// Symlinks through directories.
		must(e.t, unix.Mkdir(e.path("d"), 0o755), "mkdir")
		writeFile(e.t, e.path("d", "in"), []byte("in"), 0o644)
		must(e.t, unix.Symlink("d", e.path("dl")), "symlink")
		wantContent(e.t, e.path("dl", "in"), []byte("in"))
	}},
	{"SymlinkDangling", func(e *env) {
		l := e.path("l")
		must(e.t, unix.Symlink("target", l), "symlink")
		var st unix.Stat_t
		wantErrno(e.t, unix.Lstat(l, &st), 0, "lstat dangling %s", l)
		wantErrno(e.t, unix.Stat(l, &st), unix.ENOENT, "stat dangling %s", l)
		_, err := unix.Open(l, unix.O_RDONLY, 0)
		wantErrno(e.t, err, unix.ENOENT, "open dangling %s", l)
		// O_CREAT through a dangling symlink creates its target.
		fd, err := unix.Open(l, unix.O_CREAT|unix.O_WRONLY, 0o644)
		wantErrno(e.t, err, 0, "open O_CREAT through dangling %s", l)
		if err == nil {
			unix.Close(fd)
			wantMode(e.t, e.path("target"), unix.S_IFREG|0o644)
		}
	}},
	{"SymlinkLoop", func(e *env) {
		a, b := e.path("a"), e.path("b")
		must(e.t, unix.Symlink("b", a), "symlink")
		must(e.t, unix.Symlink("a", b), "symlink")
		var st unix.Stat_t
		wantErrno(e.t, unix.Stat(a, &st), unix.ELOOP, "stat of symlink loop %s", a)
		_, err := unix.Open(a, unix.O_RDONLY, 0)
		wantErrno(e.t, err, unix.ELOOP, "open of symlink loop %s", a)
		wantErrno(e.t, unix.Lstat(a, &st), 0, "lstat of symlink loop %s", a)
		self := e.path("self")
		must(e.t, unix.Symlink("self", self), "symlink")
		wantErrno(e.t, unix.Stat(self+"/x", &st), unix.ELOOP, "stat through self-referencing %s", self)
		// A chain of 41 links is too long for Linux (limit 40).
		prev := "end"
		writeFile(e.t, e.path("end"), nil, 0o644)
		for i := 0; i < 41; i++ {
			name := fmt.Sprintf("c%02d", i)
			must(e.t, unix.Symlink(prev, e.path(name)), "symlink")
			prev = name
		}
		wantErrno(e.t, unix.Stat(e.path("c39"), &st), 0, "stat through 40 symlinks")
		wantErrno(e.t, unix.Stat(e.path("c40"), &st), unix.ELOOP, "stat through 41 symlinks")
	}},
}

var specialTests = []testCase{
	{"Fifo", func(e *env) {
		p := e.path("fifo")
		must(e.t, unix.Mkfifo(p, 0o640), "mkfifo %s", p)
		wantMode(e.t, p, unix.S_IFIFO|0o640)
		wantErrno(e.t, unix.Mkfifo(p, 0o640), unix.EEXIST, "mkfifo onto existing %s", p)
		must(e.t, unix.Mknod(e.path("fifo2"), unix.S_IFIFO|0o666, 0), "mknod S_IFIFO")
		wantMode(e.t, e.path("fifo2"), unix.S_IFIFO|0o644)
		wantErrno(e.t, unix.Mknod(e.path("nodir", "x"), unix.S_IFIFO|0o644, 0), unix.ENOENT, "mknod in missing directory")
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_NONBLOCK, 0)
		must(e.t, err, "open fifo %s O_RDWR", p)
		defer unix.Close(fd)
		_, err = unix.Write(fd, []byte("through the pipe"))
		must(e.t, err, "write to fifo")
		buf := make([]byte, 64)
		n, err := unix.Read(fd, buf)
		must(e.t, err, "read from fifo")
		wantBytes(e.t, buf[:n], []byte("through the pipe"), "data through fifo "+p)
		wantSize(e.t, p, 0)
		must(e.t, unix.Unlink(p), "unlink fifo")
	}},
	{"Socket", func(e *env) {
		// Bind through /proc/self/fd/N so the address fits in sun_path
		// however deep the test directory is.
		dfd, err := unix.Open(e.dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(e.t, err, "open %s", e.dir)
		defer unix.Close(dfd)
		sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		must(e.t, err, "socket")
		defer unix.Close(sock)
		addr := &unix.SockaddrUnix{Name: fmt.Sprintf("/proc/self/fd/%d/sock", dfd)}
		must(e.t, unix.Bind(sock, addr), "bind unix socket at %s", e.path("sock"))
		st := lstat(e.t, e.path("sock"))
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			e.t.Errorf("lstat %s: mode %#o, want a socket", e.path("sock"), st.Mode)
		}
		sock2, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		must(e.t, err, "socket")
		defer unix.Close(sock2)
		wantErrno(e.t, unix.Bind(sock2, addr), unix.EADDRINUSE, "bind onto existing socket %s", e.path("sock"))
		must(e.t, unix.Mknod(e.path("sock2"), unix.S_IFSOCK|0o600, 0), "mknod S_IFSOCK")
		wantMode(e.t, e.path("sock2"), unix.S_IFSOCK|0o600)
		must(e.t, unix.Unlink(e.path("sock")), "unlink socket")
	}},
}
