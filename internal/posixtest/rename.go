package posixtest

import (
	"golang.org/x/sys/unix"
)

var renameTests = []testCase{
	{"RenameFile", func(e *env) {
		a, b := e.path("a"), e.path("b")
		writeFile(e.t, a, []byte("A"), 0o644)
		inoA := lstat(e.t, a).Ino
		must(e.t, unix.Rename(a, b), "rename %s %s", a, b)
		var st unix.Stat_t
		wantErrno(e.t, unix.Lstat(a, &st), unix.ENOENT, "lstat %s after renaming it", a)
		if got := lstat(e.t, b).Ino; got != inoA {
			e.t.Errorf("rename %s %s: inode %d, want %d (kept)", a, b, got, inoA)
		}
		wantContent(e.t, b, []byte("A"))
		wantErrno(e.t, unix.Rename(a, b), unix.ENOENT, "rename of missing %s", a)
		wantErrno(e.t, unix.Rename(b, e.path("missing", "x")), unix.ENOENT, "rename %s into a missing directory", b)
		wantErrno(e.t, unix.Rename(b, e.path("b", "x")), unix.ENOTDIR, "rename %s to %s", b, e.path("b", "x"))
		// Same name: nothing happens.
		wantErrno(e.t, unix.Rename(b, b), 0, "rename %s onto itself", b)
		wantContent(e.t, b, []byte("A"))
	}},
	{"RenameReplaceFile", func(e *env) {
		a, b := e.path("a"), e.path("b")
		writeFile(e.t, a, []byte("new"), 0o644)
		writeFile(e.t, b, pattern(3*mib, 1), 0o644)
		inoA := lstat(e.t, a).Ino
		fd, err := unix.Open(b, unix.O_RDONLY, 0)
		must(e.t, err, "open %s", b)
		defer unix.Close(fd)
		must(e.t, unix.Rename(a, b), "rename %s over existing %s", a, b)
		if got := lstat(e.t, b).Ino; got != inoA {
			e.t.Errorf("rename %s over %s: inode %d, want %d", a, b, got, inoA)
		}
		wantContent(e.t, b, []byte("new"))
		// The replaced file lives on for its open descriptor.
		var st unix.Stat_t
		must(e.t, unix.Fstat(fd, &st), "fstat replaced file")
		if st.Nlink != 0 {
			e.t.Errorf("fstat of the file replaced by rename: nlink %d, want 0", st.Nlink)
		}
		wantBytes(e.t, readAt(e.t, fd, 4*mib, 0, b), pattern(3*mib, 1), "read of the replaced file")
	}},
	{"RenameDirectories", func(e *env) {
		must(e.t, unix.Mkdir(e.path("d1"), 0o755), "mkdir")
		must(e.t, unix.Mkdir(e.path("d2"), 0o755), "mkdir")
		writeFile(e.t, e.path("d1", "f"), []byte("in d1"), 0o644)
		// Directory over an empty directory.
		must(e.t, unix.Rename(e.path("d1"), e.path("d2")), "rename directory %s over empty directory %s", e.path("d1"), e.path("d2"))
		wantContent(e.t, e.path("d2", "f"), []byte("in d1"))
		// Directory over a non-empty directory.
		must(e.t, unix.Mkdir(e.path("d3"), 0o755), "mkdir")
		wantErrno(e.t, unix.Rename(e.path("d3"), e.path("d2")), unix.ENOTEMPTY, "rename %s over non-empty %s", e.path("d3"), e.path("d2"))
		// File over directory, directory over file.
		writeFile(e.t, e.path("f"), nil, 0o644)
		wantErrno(e.t, unix.Rename(e.path("f"), e.path("d3")), unix.EISDIR, "rename file %s over directory %s", e.path("f"), e.path("d3"))
		wantErrno(e.t, unix.Rename(e.path("d3"), e.path("f")), unix.ENOTDIR, "rename directory %s over file %s", e.path("d3"), e.path("f"))
		// A directory into its own subtree.
		must(e.t, unix.Mkdir(e.path("d3", "sub"), 0o755), "mkdir")
		wantErrno(e.t, unix.Rename(e.path("d3"), e.path("d3", "sub", "x")), unix.EINVAL, "rename %s into its own subdirectory", e.path("d3"))
		wantErrno(e.t, unix.Rename(e.path("d3"), e.path("d3", "x")), unix.EINVAL, "rename %s into itself", e.path("d3"))
		wantErrno(e.t, unix.Rename(e.path("d3"), e.path("d3")), 0, "rename directory %s onto itself", e.path("d3"))
		wantMode(e.t, e.path("d3", "sub"), unix.S_IFDIR|0o755)
		wantErrno(e.t, unix.Rename(e.path("d3")+"/.", e.path("x")), unix.EBUSY, "rename %s/.", e.path("d3"))
	}},
	{"RenameAcrossDirectories", func(e *env) {
		src, dst := e.path("src"), e.path("dst")
		must(e.t, unix.Mkdir(src, 0o755), "mkdir")
		must(e.t, unix.Mkdir(dst, 0o755), "mkdir")
		must(e.t, unix.Mkdir(e.path("src", "sub"), 0o755), "mkdir")
		writeFile(e.t, e.path("src", "sub", "f"), []byte("deep"), 0o644)
		writeFile(e.t, e.path("src", "file"), []byte("file"), 0o644)
		wantNlink(e.t, src, 3)
		wantNlink(e.t, dst, 2)
		must(e.t, unix.Rename(e.path("src", "sub"), e.path("dst", "moved")), "rename directory across directories")
		wantNlink(e.t, src, 2)
		wantNlink(e.t, dst, 3)
		wantContent(e.t, e.path("dst", "moved", "f"), []byte("deep"))
		var dotdot unix.Stat_t
		must(e.t, unix.Stat(e.path("dst", "moved")+"/..", &dotdot), "stat")
		if want := lstat(e.t, dst).Ino; dotdot.Ino != want {
			e.t.Errorf("stat %s/moved/..: inode %d, want %d (the new parent)", dst, dotdot.Ino, want)
		}
		must(e.t, unix.Rename(e.path("src", "file"), e.path("dst", "file")), "rename file across directories")
		wantNlink(e.t, src, 2)
		wantNlink(e.t, dst, 3)
		wantContent(e.t, e.path("dst", "file"), []byte("file"))
		// Moving a directory over an empty directory elsewhere.
		must(e.t, unix.Mkdir(e.path("src", "empty"), 0o755), "mkdir")
		must(e.t, unix.Rename(e.path("dst", "moved"), e.path("src", "empty")), "rename directory over an empty directory in another directory")
		wantNlink(e.t, src, 3)
		wantNlink(e.t, dst, 2)
	}},
	{"RenameNoReplace", func(e *env) {
		a, b := e.path("a"), e.path("b")
		writeFile(e.t, a, []byte("A"), 0o644)
		writeFile(e.t, b, []byte("B"), 0o644)
		err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_NOREPLACE)
		wantErrno(e.t, err, unix.EEXIST, "renameat2 %s %s RENAME_NOREPLACE", a, b)
		wantContent(e.t, a, []byte("A"))
		wantContent(e.t, b, []byte("B"))
		c := e.path("c")
		err = unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, c, unix.RENAME_NOREPLACE)
		wantErrno(e.t, err, 0, "renameat2 %s %s RENAME_NOREPLACE (target missing)", a, c)
		wantContent(e.t, c, []byte("A"))
	}},
	{"RenameExchange", func(e *env) {
		if e.opts.SkipRenameExchange {
			e.t.Skip("RENAME_EXCHANGE not supported by this file system (Options.SkipRenameExchange)")
		}
		f, d := e.path("f"), e.path("d")
		writeFile(e.t, f, []byte("file"), 0o644)
		must(e.t, unix.Mkdir(d, 0o755), "mkdir")
		writeFile(e.t, e.path("d", "inner"), []byte("inner"), 0o644)
		inoF, inoD := lstat(e.t, f).Ino, lstat(e.t, d).Ino
		err := unix.Renameat2(unix.AT_FDCWD, f, unix.AT_FDCWD, d, unix.RENAME_EXCHANGE)
		wantErrno(e.t, err, 0, "renameat2 %s %s RENAME_EXCHANGE", f, d)
		if err != nil {
			return
		}
		if st := lstat(e.t, f); st.Ino != inoD || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			e.t.Errorf("after RENAME_EXCHANGE %s: inode %d mode %#o, want the directory %d", f, st.Ino, st.Mode, inoD)
		}
		if st := lstat(e.t, d); st.Ino != inoF || st.Mode&unix.S_IFMT != unix.S_IFREG {
			e.t.Errorf("after RENAME_EXCHANGE %s: inode %d mode %#o, want the file %d", d, st.Ino, st.Mode, inoF)
		}
		wantContent(e.t, e.path("f", "inner"), []byte("inner"))
		wantContent(e.t, d, []byte("file"))
		err = unix.Renameat2(unix.AT_FDCWD, f, unix.AT_FDCWD, e.path("missing"), unix.RENAME_EXCHANGE)
		wantErrno(e.t, err, unix.ENOENT, "renameat2 RENAME_EXCHANGE with missing %s", e.path("missing"))
		err = unix.Renameat2(unix.AT_FDCWD, f, unix.AT_FDCWD, d, unix.RENAME_EXCHANGE|unix.RENAME_NOREPLACE)
		wantErrno(e.t, err, unix.EINVAL, "renameat2 RENAME_EXCHANGE|RENAME_NOREPLACE")
		// Exchange across directories moves ".." too.
		must(e.t, unix.Mkdir(e.path("other"), 0o755), "mkdir")
		writeFile(e.t, e.path("other", "g"), []byte("g"), 0o644)
		err = unix.Renameat2(unix.AT_FDCWD, f, unix.AT_FDCWD, e.path("other", "g"), unix.RENAME_EXCHANGE)
		must(e.t, err, "renameat2 RENAME_EXCHANGE across directories")
		var dotdot unix.Stat_t
		must(e.t, unix.Stat(e.path("other", "g")+"/..", &dotdot), "stat")
		if want := lstat(e.t, e.path("other")).Ino; dotdot.Ino != want {
			e.t.Errorf("stat %s/..: inode %d, want %d", e.path("other", "g"), dotdot.Ino, want)
		}
		wantNlink(e.t, e.path("other"), 3)
		wantNlink(e.t, e.dir, 3) // f and d are files now; other is the only subdirectory
	}},
	{"RenameHardLinkOntoItself", func(e *env) {
		a, b := e.path("a"), e.path("b")
		writeFile(e.t, a, []byte("x"), 0o644)
		must(e.t, unix.Link(a, b), "link %s %s", a, b)
		wantErrno(e.t, unix.Rename(a, b), 0, "rename %s onto its own hard link %s", a, b)
		wantNlink(e.t, a, 2)
		wantNlink(e.t, b, 2)
	}},
}
