package posixtest

import (
	"time"

	"golang.org/x/sys/unix"
)

var attrTests = []testCase{
	{"ChmodRoot", func(e *env) {
		p := e.path("f")
		writeFile(e.t, p, nil, 0o644)
		for _, mode := range []uint32{0o600, 0o7777, 0o4755, 0o2755, 0o1755, 0, 0o644} {
			must(e.t, unix.Chmod(p, mode), "chmod %s %#o", p, mode)
			wantMode(e.t, p, unix.S_IFREG|mode)
		}
		must(e.t, unix.Mkdir(e.path("d"), 0o755), "mkdir")
		must(e.t, unix.Chmod(e.path("d"), 0o3700), "chmod")
		wantMode(e.t, e.path("d"), unix.S_IFDIR|0o3700)
		// chmod through a symlink changes the target.
		must(e.t, unix.Symlink("f", e.path("l")), "symlink")
		must(e.t, unix.Chmod(e.path("l"), 0o640), "chmod %s", e.path("l"))
		wantMode(e.t, p, unix.S_IFREG|0o640)
		wantErrno(e.t, unix.Chmod(e.path("missing"), 0o644), unix.ENOENT, "chmod %s", e.path("missing"))
	}},
	{"ChmodOtherUsers", func(e *env) {
		e.needUsers()
		p := e.path("f")
		writeFile(e.t, p, nil, 0o644)
		chown(e.t, p, uidOwner, gidOwner)
		asWant(e.t, userOwner, userOp{Op: "chmod", Path: p, Mode: 0o600}, 0)
		wantMode(e.t, p, unix.S_IFREG|0o600)
		asWant(e.t, userOther, userOp{Op: "chmod", Path: p, Mode: 0o666}, unix.EPERM)
		wantMode(e.t, p, unix.S_IFREG|0o600)
		// An owner outside the file's group cannot set setgid: the bit is
		// silently dropped.
		chown(e.t, p, uidOwner, gidOther)
		asWant(e.t, userOwner, userOp{Op: "chmod", Path: p, Mode: 0o2755}, 0)
		wantMode(e.t, p, unix.S_IFREG|0o755)
		// Setuid set by the owner is kept.
		asWant(e.t, userOwner, userOp{Op: "chmod", Path: p, Mode: 0o4755}, 0)
		wantMode(e.t, p, unix.S_IFREG|0o4755)
	}},
	{"Chown", func(e *env) {
		e.needRoot()
		p := e.path("f")
		writeFile(e.t, p, nil, 0o644)
		must(e.t, unix.Chown(p, uidOwner, sharedGroup), "chown %s", p)
		if st := lstat(e.t, p); st.Uid != uidOwner || st.Gid != sharedGroup {
			e.t.Errorf("chown %s %d:%d: owner now %d:%d", p, uidOwner, sharedGroup, st.Uid, st.Gid)
		}
		must(e.t, unix.Chown(p, -1, gidOther), "chown %s -1:%d", p, gidOther)
		if st := lstat(e.t, p); st.Uid != uidOwner || st.Gid != gidOther {
			e.t.Errorf("chown %s -1:%d: owner now %d:%d", p, gidOther, st.Uid, st.Gid)
		}
		// lchown changes the symlink itself.
		must(e.t, unix.Symlink("f", e.path("l")), "symlink")
		must(e.t, unix.Lchown(e.path("l"), uidOther, gidOther), "lchown")
		if st := lstat(e.t, e.path("l")); st.Uid != uidOther {
			e.t.Errorf("lchown %s: uid %d, want %d", e.path("l"), st.Uid, uidOther)
		}
		if st := lstat(e.t, p); st.Uid != uidOwner {
			e.t.Errorf("lchown of a symlink changed its target %s: uid %d", p, st.Uid)
		}
		wantErrno(e.t, unix.Chown(e.path("missing"), 0, 0), unix.ENOENT, "chown %s", e.path("missing"))
	}},
	{"ChownClearsSetID", func(e *env) {
		e.needRoot()
		p := e.path("f")
		writeFile(e.t, p, nil, 0o644)
		chmod(e.t, p, 0o6755)
		must(e.t, unix.Chown(p, uidOwner, gidOwner), "chown")
		wantMode(e.t, p, unix.S_IFREG|0o755)
		// Without group execute, setgid means mandatory locking and stays.
		chmod(e.t, p, 0o6745)
		must(e.t, unix.Chown(p, uidOther, -1), "chown")
		wantMode(e.t, p, unix.S_IFREG|0o2745)
		// Directories keep both bits.
		d := e.path("d")
		must(e.t, unix.Mkdir(d, 0o755), "mkdir")
		chmod(e.t, d, 0o6755)
		must(e.t, unix.Chown(d, uidOwner, gidOwner), "chown")
		wantMode(e.t, d, unix.S_IFDIR|0o6755)
	}},
	{"ChownOtherUsers", func(e *env) {
		e.needUsers()
		p := e.path("f")
		writeFile(e.t, p, nil, 0o644)
		chown(e.t, p, uidOwner, gidOwner)
		asWant(e.t, userOwner, userOp{Op: "chown", Path: p, UID: uidOther, GID: -1}, unix.EPERM)
		asWant(e.t, userOther, userOp{Op: "chown", Path: p, UID: uidOther, GID: -1}, unix.EPERM)
		asWant(e.t, userOther, userOp{Op: "chown", Path: p, UID: -1, GID: gidOther}, unix.EPERM)
		// The owner may change the group to one of its groups, and keep it.
		asWant(e.t, userOwner, userOp{Op: "chown", Path: p, UID: -1, GID: sharedGroup}, 0)
		asWant(e.t, userOwner, userOp{Op: "chown", Path: p, UID: uidOwner, GID: sharedGroup}, 0)
		asWant(e.t, userOwner, userOp{Op: "chown", Path: p, UID: -1, GID: gidOther}, unix.EPERM)
		if st := lstat(e.t, p); st.Uid != uidOwner || st.Gid != sharedGroup {
			e.t.Errorf("owner of %s: %d:%d, want %d:%d", p, st.Uid, st.Gid, uidOwner, sharedGroup)
		}
		// A non-root chgrp clears setuid and setgid.
		chmod(e.t, p, 0o6755)
		asWant(e.t, userOwner, userOp{Op: "chown", Path: p, UID: -1, GID: gidOwner}, 0)
		wantMode(e.t, p, unix.S_IFREG|0o755)
	}},
	{"WriteClearsSetID", func(e *env) {
		e.needUsers()
		p := e.path("f")
		writeFile(e.t, p, []byte("data"), 0o644)
		chown(e.t, p, uidOwner, gidOwner)
		chmod(e.t, p, 0o6777)
		asWant(e.t, userOther, userOp{Op: "write", Path: p, Data: []byte("x")}, 0)
		wantMode(e.t, p, unix.S_IFREG|0o777)
		chmod(e.t, p, 0o4777)
		asWant(e.t, userOther, userOp{Op: "truncate", Path: p, Size: 1}, 0)
		wantMode(e.t, p, unix.S_IFREG|0o777)
		// Root keeps the bits when writing.
		chmod(e.t, p, 0o6777)
		fd, err := unix.Open(p, unix.O_WRONLY, 0)
		must(e.t, err, "open")
		writeAt(e.t, fd, []byte("y"), 0, p)
		unix.Close(fd)
		wantMode(e.t, p, unix.S_IFREG|0o6777)
	}},
	{"Utimens", func(e *env) {
		p := e.path("f")
		writeFile(e.t, p, nil, 0o644)
		at := unix.Timespec{Sec: 1000000000, Nsec: 123456789}
		mt := unix.Timespec{Sec: 1100000000, Nsec: 987654321}
		must(e.t, unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{at, mt}, 0), "utimensat %s", p)
		st := lstat(e.t, p)
		if st.Atim != at || st.Mtim != mt {
			e.t.Errorf("utimensat %s: atime %v mtime %v, want %v %v", p, st.Atim, st.Mtim, at, mt)
		}
		// UTIME_OMIT leaves a time alone; UTIME_NOW sets it to now.
		before := time.Now().Add(-time.Second)
		omit := unix.Timespec{Nsec: unix.UTIME_OMIT}
		now := unix.Timespec{Nsec: unix.UTIME_NOW}
		must(e.t, unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{omit, now}, 0), "utimensat %s OMIT NOW", p)
		st = lstat(e.t, p)
		if st.Atim != at {
			e.t.Errorf("utimensat %s with UTIME_OMIT atime: atime %v, want %v", p, st.Atim, at)
		}
		if tsTime(st.Mtim).Before(before) {
			e.t.Errorf("utimensat %s with UTIME_NOW mtime: mtime %v, want about now", p, tsTime(st.Mtim))
		}
		must(e.t, unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{now, omit}, 0), "utimensat %s NOW OMIT", p)
		st2 := lstat(e.t, p)
		if st2.Mtim != st.Mtim || tsTime(st2.Atim).Before(before) {
			e.t.Errorf("utimensat %s NOW OMIT: atime %v mtime %v", p, tsTime(st2.Atim), tsTime(st2.Mtim))
		}
		// Both omitted: nothing changes, not even ctime.
		timestampTick()
		must(e.t, unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{omit, omit}, 0), "utimensat OMIT OMIT")
		if st3 := lstat(e.t, p); st3.Ctim != st2.Ctim {
			e.t.Errorf("utimensat %s OMIT OMIT changed ctime %v -> %v", p, st2.Ctim, st3.Ctim)
		}
		// Times on a symlink itself.
		must(e.t, unix.Symlink("f", e.path("l")), "symlink")
		must(e.t, unix.UtimesNanoAt(unix.AT_FDCWD, e.path("l"), []unix.Timespec{at, at}, unix.AT_SYMLINK_NOFOLLOW), "utimensat AT_SYMLINK_NOFOLLOW")
		if got := lstat(e.t, e.path("l")).Mtim; got != at {
			e.t.Errorf("utimensat %s AT_SYMLINK_NOFOLLOW: mtime %v, want %v", e.path("l"), got, at)
		}
		wantErrno(e.t, unix.UtimesNanoAt(unix.AT_FDCWD, e.path("missing"), []unix.Timespec{at, at}, 0), unix.ENOENT, "utimensat %s", e.path("missing"))
	}},
	{"UtimensOtherUsers", func(e *env) {
		e.needUsers()
		p := e.path("f")
		writeFile(e.t, p, nil, 0o666)
		chmod(e.t, p, 0o666)
		chown(e.t, p, uidOwner, gidOwner)
		explicit := []unix.Timespec{{Sec: 5000}, {Sec: 6000}}
		now := []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}
		asWant(e.t, userOwner, userOp{Op: "utimens", Path: p, Times: explicit}, 0)
		if got := lstat(e.t, p).Mtim.Sec; got != 6000 {
			e.t.Errorf("utimensat %s by the owner: mtime %d, want 6000", p, got)
		}
		asWant(e.t, userOther, userOp{Op: "utimens", Path: p, Times: explicit}, unix.EPERM)
		asWant(e.t, userOther, userOp{Op: "utimens", Path: p, Times: now}, 0)
		if got := lstat(e.t, p).Mtim.Sec; got == 6000 {
			e.t.Errorf("utimensat %s UTIME_NOW by a writer: mtime unchanged", p)
		}
		chmod(e.t, p, 0o644)
		asWant(e.t, userOther, userOp{Op: "utimens", Path: p, Times: now}, unix.EACCES)
		asWant(e.t, userOwner, userOp{Op: "utimens", Path: p, Times: now}, 0)
	}},
}
