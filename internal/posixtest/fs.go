package posixtest

import (
	"strings"

	"golang.org/x/sys/unix"
)

var xattrTests = []testCase{
	{"Xattr", func(e *env) {
		if e.opts.SkipXattr {
			e.t.Skip("extended attributes not supported (Options.SkipXattr)")
		}
		p := e.path("f")
		writeFile(e.t, p, nil, 0o644)
		buf := make([]byte, 4096)
		_, err := unix.Getxattr(p, "user.missing", buf)
		wantErrno(e.t, err, unix.ENODATA, "getxattr %s user.missing", p)
		must(e.t, unix.Setxattr(p, "user.a", []byte("alpha"), 0), "setxattr %s user.a", p)
		must(e.t, unix.Setxattr(p, "user.empty", nil, 0), "setxattr %s user.empty (empty value)", p)
		big := pattern(1000, 3)
		must(e.t, unix.Setxattr(p, "user.big", big, 0), "setxattr %s user.big (1000 bytes)", p)
		n, err := unix.Getxattr(p, "user.a", buf)
		must(e.t, err, "getxattr %s user.a", p)
		wantBytes(e.t, buf[:n], []byte("alpha"), "getxattr user.a")
		n, err = unix.Getxattr(p, "user.empty", buf)
		if err != nil || n != 0 {
			e.t.Errorf("getxattr %s user.empty: %d bytes, %v; want 0, nil", p, n, err)
		}
		n, err = unix.Getxattr(p, "user.big", buf)
		must(e.t, err, "getxattr %s user.big", p)
		wantBytes(e.t, buf[:n], big, "getxattr user.big")
		// Size probe with an empty buffer, then a buffer too small.
		n, err = unix.Getxattr(p, "user.big", nil)
		if err != nil || n != len(big) {
			e.t.Errorf("getxattr %s user.big size probe: %d, %v; want %d", p, n, err, len(big))
		}
		_, err = unix.Getxattr(p, "user.big", buf[:10])
		wantErrno(e.t, err, unix.ERANGE, "getxattr %s user.big into 10 bytes", p)
		// Flags.
		err = unix.Setxattr(p, "user.a", []byte("again"), unix.XATTR_CREATE)
		wantErrno(e.t, err, unix.EEXIST, "setxattr %s user.a XATTR_CREATE (exists)", p)
		err = unix.Setxattr(p, "user.nope", []byte("x"), unix.XATTR_REPLACE)
		wantErrno(e.t, err, unix.ENODATA, "setxattr %s user.nope XATTR_REPLACE (missing)", p)
		must(e.t, unix.Setxattr(p, "user.a", []byte("beta"), unix.XATTR_REPLACE), "setxattr XATTR_REPLACE")
		must(e.t, unix.Setxattr(p, "user.c", []byte("gamma"), unix.XATTR_CREATE), "setxattr XATTR_CREATE")
		n, err = unix.Getxattr(p, "user.a", buf)
		must(e.t, err, "getxattr")
		wantBytes(e.t, buf[:n], []byte("beta"), "getxattr user.a after replace")
		// List.
		wantXattrNames(e, p, "user.a", "user.big", "user.c", "user.empty")
		size, err := unix.Listxattr(p, nil)
		must(e.t, err, "listxattr %s size probe", p)
		_, err = unix.Listxattr(p, buf[:size-1])
		wantErrno(e.t, err, unix.ERANGE, "listxattr %s into %d bytes (needs %d)", p, size-1, size)
		// Remove.
		must(e.t, unix.Removexattr(p, "user.a"), "removexattr %s user.a", p)
		_, err = unix.Getxattr(p, "user.a", buf)
		wantErrno(e.t, err, unix.ENODATA, "getxattr %s user.a after removexattr", p)
		wantErrno(e.t, unix.Removexattr(p, "user.a"), unix.ENODATA, "removexattr %s user.a (missing)", p)
		wantXattrNames(e, p, "user.big", "user.c", "user.empty")
		_, err = unix.Getxattr(e.path("missing"), "user.a", buf)
		wantErrno(e.t, err, unix.ENOENT, "getxattr on missing %s", e.path("missing"))
		// Directories carry xattrs too; attributes survive a rename.
		must(e.t, unix.Setxattr(e.dir, "user.dir", []byte("d"), 0), "setxattr on directory %s", e.dir)
		n, err = unix.Getxattr(e.dir, "user.dir", buf)
		if err != nil || string(buf[:n]) != "d" {
			e.t.Errorf("getxattr %s user.dir: %q, %v", e.dir, buf[:n], err)
		}
		must(e.t, unix.Rename(p, e.path("g")), "rename")
		n, err = unix.Getxattr(e.path("g"), "user.c", buf)
		if err != nil || string(buf[:n]) != "gamma" {
			e.t.Errorf("getxattr %s user.c after rename: %q, %v", e.path("g"), buf[:n], err)
		}
	}},
	{"XattrOtherUsers", func(e *env) {
		if e.opts.SkipXattr {
			e.t.Skip("extended attributes not supported (Options.SkipXattr)")
		}
		e.needUsers()
		p := e.path("f")
		writeFile(e.t, p, nil, 0o600)
		chown(e.t, p, uidOwner, gidOwner)
		must(e.t, unix.Setxattr(p, "user.a", []byte("v"), 0), "setxattr")
		asWant(e.t, userOther, userOp{Op: "getxattr", Path: p, Data: []byte("user.a")}, unix.EACCES)
		asWant(e.t, userOther, userOp{Op: "setxattr", Path: p, Path2: "user.b", Data: []byte("v")}, unix.EACCES)
		if got := asWant(e.t, userOwner, userOp{Op: "getxattr", Path: p, Data: []byte("user.a")}, 0); string(got) != "v" {
			e.t.Errorf("getxattr %s user.a as owner: %q, want %q", p, got, "v")
		}
	}},
}

// wantXattrNames checks the names listxattr returns for path (in any order).
func wantXattrNames(e *env, path string, want ...string) {
	e.t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Listxattr(path, buf)
	must(e.t, err, "listxattr %s", path)
	var got []string
	for _, name := range strings.Split(strings.TrimSuffix(string(buf[:n]), "\x00"), "\x00") {
		if strings.HasPrefix(name, "user.") {
			got = append(got, name)
		}
	}
	if !sameSet(got, want) {
		e.t.Errorf("listxattr %s: %q, want %q", path, got, want)
	}
}

// sameSet reports whether a and b hold the same strings, each once.
func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]int{}
	for _, s := range a {
		seen[s]++
	}
	for _, s := range b {
		if seen[s] != 1 {
			return false
		}
		seen[s]--
	}
	return true
}

var fsTests = []testCase{
	{"Statfs", func(e *env) {
		var st unix.Statfs_t
		must(e.t, unix.Statfs(e.dir, &st), "statfs %s", e.dir)
		if st.Bsize <= 0 || st.Blocks == 0 || st.Bfree > st.Blocks || st.Bavail > st.Bfree || st.Namelen != 255 {
			e.t.Errorf("statfs %s: bsize %d blocks %d bfree %d bavail %d namelen %d: want bsize > 0, "+
				"blocks > 0, blocks >= bfree >= bavail, namelen 255", e.dir, st.Bsize, st.Blocks, st.Bfree, st.Bavail, st.Namelen)
		}
		if st.Files != 0 && st.Ffree > st.Files {
			e.t.Errorf("statfs %s: files %d ffree %d, want files >= ffree", e.dir, st.Files, st.Ffree)
		}
		wantErrno(e.t, unix.Statfs(e.path("missing"), &st), unix.ENOENT, "statfs %s", e.path("missing"))
	}},
	{"Fallocate", func(e *env) {
		if e.opts.SkipFallocate {
			e.t.Skip("fallocate not supported (Options.SkipFallocate)")
		}
		p := e.path("f")
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o644)
		must(e.t, err, "open %s", p)
		defer unix.Close(fd)
		must(e.t, unix.Fallocate(fd, 0, 0, mib+5), "fallocate %s 0..1MiB+5", p)
		wantSize(e.t, p, mib+5)
		wantBytes(e.t, readAt(e.t, fd, 2*mib, 0, p), make([]byte, mib+5), "fallocated "+p)
		data := pattern(3*mib, 6)
		writeAt(e.t, fd, data, 0, p)
		// Allocating over data changes nothing.
		must(e.t, unix.Fallocate(fd, 0, 100, mib), "fallocate %s over data", p)
		must(e.t, unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 2*mib, 4*mib), "fallocate %s KEEP_SIZE", p)
		wantSize(e.t, p, 3*mib)
		wantBytes(e.t, readAt(e.t, fd, 4*mib, 0, p), data, "after fallocate over data "+p)
		must(e.t, unix.Fallocate(fd, 0, 3*mib, 10), "fallocate %s at the end", p)
		wantSize(e.t, p, 3*mib+10)
		wantErrno(e.t, unix.Fallocate(fd, 0, 0, 0), unix.EINVAL, "fallocate %s length 0", p)
		wantErrno(e.t, unix.Fallocate(fd, 0, -1, 10), unix.EINVAL, "fallocate %s offset -1", p)
		ro, err := unix.Open(p, unix.O_RDONLY, 0)
		must(e.t, err, "open")
		defer unix.Close(ro)
		wantErrno(e.t, unix.Fallocate(ro, 0, 0, 10), unix.EBADF, "fallocate %s opened O_RDONLY", p)
	}},
	{"FallocatePunchHole", func(e *env) {
		if e.opts.SkipFallocate || e.opts.SkipPunchHole {
			e.t.Skip("punching holes not supported (Options.SkipFallocate, SkipPunchHole)")
		}
		p := e.path("f")
		data := pattern(3*mib, 7)
		writeFile(e.t, p, data, 0o644)
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		must(e.t, err, "open %s", p)
		defer closeFd(&fd)
		punch := func(off, n int64) {
			e.t.Helper()
			must(e.t, unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n), "fallocate %s PUNCH_HOLE %d+%d", p, off, n)
			clear(data[off:min(off+n, int64(len(data)))])
		}
		punch(mib-100, 200*kib)
		punch(10, 5)
		punch(64*kib-1, 2)
		punch(3*mib-7, mib) // past the end: size stays
		wantSize(e.t, p, 3*mib)
		wantBytes(e.t, readAt(e.t, fd, 4*mib, 0, p), data, "after punching holes in "+p)
		err = unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE, 0, 10)
		wantErrno(e.t, err, unix.EOPNOTSUPP, "fallocate %s PUNCH_HOLE without KEEP_SIZE", p)
		closeFd(&fd)
		wantContent(e.t, p, data)
	}},
	{"FallocateZeroRange", func(e *env) {
		if e.opts.SkipFallocate || e.opts.SkipPunchHole {
			e.t.Skip("zeroing ranges not supported (Options.SkipFallocate, SkipPunchHole)")
		}
		p := e.path("f")
		data := pattern(2*mib, 9)
		writeFile(e.t, p, data, 0o644)
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		must(e.t, err, "open %s", p)
		defer closeFd(&fd)
		must(e.t, unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, mib-3, 100*kib), "fallocate %s ZERO_RANGE|KEEP_SIZE", p)
		clear(data[mib-3 : mib-3+100*kib])
		wantSize(e.t, p, 2*mib)
		// Without KEEP_SIZE a range past the end grows the file.
		must(e.t, unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE, 2*mib-10, 20), "fallocate %s ZERO_RANGE past the end", p)
		clear(data[2*mib-10:])
		data = append(data, make([]byte, 10)...)
		wantSize(e.t, p, 2*mib+10)
		closeFd(&fd)
		wantContent(e.t, p, data)
	}},
}
