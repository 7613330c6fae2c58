package posixtest

import (
	"golang.org/x/sys/unix"
)

// create makes path as u (O_CREAT|O_EXCL with mode), checking the errno.
func create(e *env, u user, path string, mode uint32, want unix.Errno) {
	e.t.Helper()
	asWant(e.t, u, userOp{Op: "open", Path: path, Flags: unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY, Mode: mode}, want)
}

// openAs opens path as u with flags, checking the errno.
func openAs(e *env, u user, path string, flags int, want unix.Errno) {
	e.t.Helper()
	asWant(e.t, u, userOp{Op: "open", Path: path, Flags: flags}, want)
}

// wantOwner checks the uid and gid of path.
func wantOwner(e *env, path string, uid, gid uint32) {
	e.t.Helper()
	if st := lstat(e.t, path); st.Uid != uid || st.Gid != gid {
		e.t.Errorf("owner of %s: %d:%d, want %d:%d", path, st.Uid, st.Gid, uid, gid)
	}
}

var permTests = []testCase{
	{"PermFileClasses", func(e *env) {
		e.needUsers()
		p := e.path("f")
		writeFile(e.t, p, []byte("secret"), 0o600)
		chown(e.t, p, uidOwner, sharedGroup)
		for _, c := range []struct {
			mode  uint32
			u     user
			flags int
			want  unix.Errno
		}{
			{0o600, userOwner, unix.O_RDONLY, 0},
			{0o600, userOwner, unix.O_RDWR, 0},
			{0o600, userOther, unix.O_RDONLY, unix.EACCES},
			{0o600, userMember, unix.O_RDONLY, unix.EACCES},
			{0o644, userOther, unix.O_RDONLY, 0},
			{0o644, userOther, unix.O_WRONLY, unix.EACCES},
			{0o640, userMember, unix.O_RDONLY, 0},
			{0o640, userMember, unix.O_WRONLY, unix.EACCES},
			{0o640, userOther, unix.O_RDONLY, unix.EACCES},
			{0o660, userMember, unix.O_RDWR, 0},
			// The most specific class decides, even if it grants less.
			{0o077, userOwner, unix.O_RDONLY, unix.EACCES},
			{0o077, userMember, unix.O_RDONLY, 0},
			{0o604, userMember, unix.O_RDONLY, unix.EACCES},
			{0o604, userOther, unix.O_RDONLY, 0},
			{0o602, userOther, unix.O_WRONLY, 0},
			{0o000, userOwner, unix.O_RDONLY, unix.EACCES},
		} {
			chmod(e.t, p, c.mode)
			if got, _ := runAs(e.t, c.u, userOp{Op: "open", Path: p, Flags: c.flags}); got != c.want {
				e.t.Errorf("open %s flags %#x, mode %#o owner %d:%d, as uid %d groups %v: got %s, want %s",
					p, c.flags, c.mode, uidOwner, sharedGroup, c.u.uid, c.u.groups, errnoName(got), errnoName(c.want))
			}
		}
		// access(2) answers the same questions.
		chmod(e.t, p, 0o640)
		asWant(e.t, userMember, userOp{Op: "access", Path: p, Flags: unix.R_OK}, 0)
		asWant(e.t, userMember, userOp{Op: "access", Path: p, Flags: unix.W_OK}, unix.EACCES)
		asWant(e.t, userOther, userOp{Op: "access", Path: p, Flags: unix.R_OK}, unix.EACCES)
		asWant(e.t, userOwner, userOp{Op: "access", Path: p, Flags: unix.R_OK | unix.W_OK}, 0)
		asWant(e.t, userOwner, userOp{Op: "access", Path: p, Flags: unix.X_OK}, unix.EACCES)
		chmod(e.t, p, 0o644)
		asWant(e.t, userOther, userOp{Op: "truncate", Path: p, Size: 0}, unix.EACCES)
		asWant(e.t, userOther, userOp{Op: "write", Path: p, Data: []byte("x")}, unix.EACCES)
		if got := asWant(e.t, userOther, userOp{Op: "read", Path: p}, 0); string(got) != "secret" {
			e.t.Errorf("read %s as uid %d: %q, want %q", p, uidOther, got, "secret")
		}
		// Root reads and writes whatever the mode.
		chmod(e.t, p, 0)
		wantContent(e.t, p, []byte("secret"))
	}},
	{"PermDirectorySearch", func(e *env) {
		e.needUsers()
		d := e.path("d")
		must(e.t, unix.Mkdir(d, 0o755), "mkdir")
		writeFile(e.t, e.path("d", "f"), []byte("x"), 0o644)
		chown(e.t, d, uidOwner, gidOwner)
		chmod(e.t, d, 0o666)
		f := e.path("d", "f")
		asWant(e.t, userOwner, userOp{Op: "stat", Path: f}, unix.EACCES)
		asWant(e.t, userOther, userOp{Op: "stat", Path: f}, unix.EACCES)
		openAs(e, userOther, f, unix.O_RDONLY, unix.EACCES)
		create(e, userOwner, e.path("d", "new"), 0o644, unix.EACCES)
		var st unix.Stat_t
		wantErrno(e.t, unix.Stat(f, &st), 0, "stat %s as root through a directory without x", f)
		// Search without read: names can be used but not listed.
		chmod(e.t, d, 0o711)
		asWant(e.t, userOther, userOp{Op: "stat", Path: f}, 0)
		openAs(e, userOther, d, unix.O_RDONLY|unix.O_DIRECTORY, unix.EACCES)
		openAs(e, userOwner, d, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	}},
	{"PermDirectoryWrite", func(e *env) {
		e.needUsers()
		d := e.path("d")
		must(e.t, unix.Mkdir(d, 0o755), "mkdir")
		writeFile(e.t, e.path("d", "f"), nil, 0o666)
		must(e.t, unix.Mkdir(e.path("d", "sub"), 0o777), "mkdir")
		chmod(e.t, e.path("d", "f"), 0o666)
		chown(e.t, d, uidOwner, gidOwner)
		chmod(e.t, d, 0o555)
		create(e, userOwner, e.path("d", "new"), 0o644, unix.EACCES)
		asWant(e.t, userOwner, userOp{Op: "mkdir", Path: e.path("d", "newdir"), Mode: 0o755}, unix.EACCES)
		asWant(e.t, userOwner, userOp{Op: "unlink", Path: e.path("d", "f")}, unix.EACCES)
		asWant(e.t, userOwner, userOp{Op: "rmdir", Path: e.path("d", "sub")}, unix.EACCES)
		asWant(e.t, userOwner, userOp{Op: "rename", Path: e.path("d", "f"), Path2: e.path("d", "g")}, unix.EACCES)
		asWant(e.t, userOwner, userOp{Op: "symlink", Path: e.path("d", "l"), Path2: "f"}, unix.EACCES)
		asWant(e.t, userOwner, userOp{Op: "link", Path: e.path("d", "f"), Path2: e.path("d", "h")}, unix.EACCES)
		// The file itself stays writable: its own mode decides.
		asWant(e.t, userOwner, userOp{Op: "write", Path: e.path("d", "f"), Data: []byte("ok")}, 0)
		// With w but without x nothing can be created either.
		chmod(e.t, d, 0o666)
		create(e, userOwner, e.path("d", "new"), 0o644, unix.EACCES)
		// Group write through a supplementary group.
		chown(e.t, d, 0, sharedGroup)
		chmod(e.t, d, 0o775)
		create(e, userMember, e.path("d", "bymember"), 0o644, 0)
		create(e, userOther, e.path("d", "byother"), 0o644, unix.EACCES)
		wantOwner(e, e.path("d", "bymember"), uidMember, gidMember)
		// Without the sticky bit, write permission on the directory is
		// enough to remove someone else's file.
		writeFile(e.t, e.path("d", "rootfile"), nil, 0o600)
		asWant(e.t, userMember, userOp{Op: "unlink", Path: e.path("d", "rootfile")}, 0)
		// Moving a file out needs write permission on both directories.
		must(e.t, unix.Mkdir(e.path("ro"), 0o755), "mkdir")
		asWant(e.t, userMember, userOp{Op: "rename", Path: e.path("d", "bymember"), Path2: e.path("ro", "x")}, unix.EACCES)
		asWant(e.t, userMember, userOp{Op: "unlink", Path: e.path("d", "bymember")}, 0)
	}},
	{"PermStickyDirectory", func(e *env) {
		e.needUsers()
		s := e.path("tmp")
		must(e.t, unix.Mkdir(s, 0o755), "mkdir")
		chmod(e.t, s, 0o1777)
		chown(e.t, s, uidMember, gidMember)
		own, other := e.path("tmp", "owners"), e.path("tmp", "others")
		create(e, userOwner, own, 0o666, 0)
		create(e, userOther, other, 0o666, 0)
		chmod(e.t, own, 0o666)
		asWant(e.t, userOwner, userOp{Op: "mkdir", Path: e.path("tmp", "ownersdir"), Mode: 0o777}, 0)
		asWant(e.t, userOther, userOp{Op: "unlink", Path: own}, unix.EPERM)
		asWant(e.t, userOther, userOp{Op: "rename", Path: own, Path2: e.path("tmp", "stolen")}, unix.EPERM)
		asWant(e.t, userOther, userOp{Op: "rename", Path: other, Path2: own}, unix.EPERM)
		asWant(e.t, userOther, userOp{Op: "rmdir", Path: e.path("tmp", "ownersdir")}, unix.EPERM)
		// Writing someone else's file is a matter of its mode, not of the
		// sticky bit.
		asWant(e.t, userOther, userOp{Op: "write", Path: own, Data: []byte("w")}, 0)
		asWant(e.t, userOwner, userOp{Op: "rename", Path: own, Path2: e.path("tmp", "renamed")}, 0)
		asWant(e.t, userOwner, userOp{Op: "unlink", Path: e.path("tmp", "renamed")}, 0)
		// The directory's owner and root may remove anything.
		asWant(e.t, userMember, userOp{Op: "unlink", Path: other}, 0)
		asWant(e.t, userMember, userOp{Op: "rmdir", Path: e.path("tmp", "ownersdir")}, 0)
		create(e, userOther, other, 0o666, 0)
		wantErrno(e.t, unix.Unlink(other), 0, "unlink %s as root in a sticky directory", other)
	}},
	{"PermSetgidDirectory", func(e *env) {
		e.needUsers()
		d := e.path("sg")
		must(e.t, unix.Mkdir(d, 0o755), "mkdir")
		chown(e.t, d, 0, sharedGroup)
		chmod(e.t, d, 0o2777)
		f, sub := e.path("sg", "f"), e.path("sg", "sub")
		create(e, userOther, f, 0o644, 0)
		wantOwner(e, f, uidOther, sharedGroup)
		wantMode(e.t, f, unix.S_IFREG|0o644)
		asWant(e.t, userOther, userOp{Op: "mkdir", Path: sub, Mode: 0o755}, 0)
		wantOwner(e, sub, uidOther, sharedGroup)
		wantMode(e.t, sub, unix.S_IFDIR|0o2755)
		// Inherited again one level down.
		asWant(e.t, userOther, userOp{Op: "mkdir", Path: e.path("sg", "sub", "deeper"), Mode: 0o700}, 0)
		wantOwner(e, e.path("sg", "sub", "deeper"), uidOther, sharedGroup)
		wantMode(e.t, e.path("sg", "sub", "deeper"), unix.S_IFDIR|0o2700)
		// Root's files get the directory's group too.
		writeFile(e.t, e.path("sg", "byroot"), nil, 0o644)
		wantOwner(e, e.path("sg", "byroot"), 0, sharedGroup)
		// Without setgid, a new file gets the creator's group.
		plain := e.path("plain")
		must(e.t, unix.Mkdir(plain, 0o777), "mkdir")
		chmod(e.t, plain, 0o777)
		chown(e.t, plain, 0, sharedGroup)
		create(e, userOther, e.path("plain", "f"), 0o644, 0)
		wantOwner(e, e.path("plain", "f"), uidOther, gidOther)
	}},
}
