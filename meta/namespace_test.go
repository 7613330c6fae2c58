package meta

import (
	"strings"
	"syscall"
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// nsCase is one namespace operation and the errno it must give (0:
// success). check, if set, runs after a successful op.
type nsCase struct {
	name  string
	op    func(e *env, fx fixture) error
	want  syscall.Errno
	check func(t *testing.T, e *env, fx fixture)
}

// runCases runs cases in order against one fixture, on each engine;
// cases use distinct names so that they do not disturb each other.
func runCases(t *testing.T, cases []nsCase) {
	onEngines(t, func(t *testing.T, newEnv envMaker) {
		e := newEnv(t)
		fx := e.fixture()
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				e.t = t
				wantErrno(t, tc.op(e, fx), tc.want)
				if tc.check != nil && tc.want == 0 {
					tc.check(t, e, fx)
				}
			})
		}
	})
}

func lookupErr(c *weftv1.Caller, parent func(fixture) uint64, name string) func(*env, fixture) error {
	return func(e *env, fx fixture) error {
		_, err := e.lookup(c, parent(fx), name)
		return err
	}
}

func createErr(c *weftv1.Caller, parent func(fixture) uint64, name string, mode uint32, excl bool, flags uint32) func(*env, fixture) error {
	return func(e *env, fx fixture) error {
		_, err := e.s.Create(e.ctx, &weftv1.CreateRequest{Caller: c, Parent: parent(fx), Name: name, Mode: mode, Exclusive: excl, OpenFlags: flags})
		return err
	}
}

func mkdirErr(c *weftv1.Caller, parent func(fixture) uint64, name string) func(*env, fixture) error {
	return func(e *env, fx fixture) error {
		_, err := e.s.Mkdir(e.ctx, &weftv1.MkdirRequest{Caller: c, Parent: parent(fx), Name: name, Mode: 0o755})
		return err
	}
}

func inRoot(fixture) uint64      { return rootIno }
func inAlice(fx fixture) uint64  { return fx.aliceDir.Ino }
func inTmp(fx fixture) uint64    { return fx.tmp.Ino }
func inSetgid(fx fixture) uint64 { return fx.sg.Ino }
func inFile(fx fixture) uint64   { return fx.f.Ino }
func inMissing(fixture) uint64   { return 999999 }

func TestLookupCreateMkdir(t *testing.T) {
	long := strings.Repeat("x", 256)
	runCases(t, []nsCase{
		{name: "lookup ok", op: lookupErr(alice, inRoot, "home")},
		{name: "lookup empty name", op: lookupErr(alice, inRoot, ""), want: syscall.ENOENT},
		{name: "lookup long name", op: lookupErr(alice, inRoot, long), want: syscall.ENAMETOOLONG},
		{name: "lookup missing", op: lookupErr(alice, inRoot, "nope"), want: syscall.ENOENT},
		{name: "lookup in file", op: lookupErr(alice, inFile, "x"), want: syscall.ENOTDIR},
		{name: "lookup in missing dir", op: lookupErr(alice, inMissing, "x"), want: syscall.ENOENT},
		{name: "lookup other without search permission", op: lookupErr(carol, inAlice, "f"), want: syscall.EACCES},
		{name: "lookup supplementary group member", op: lookupErr(bob, inAlice, "f")},
		{name: "lookup root bypasses", op: lookupErr(root, inAlice, "f")},
		{name: "lookup dot and dotdot", op: func(e *env, fx fixture) error {
			dot, err := e.lookup(alice, fx.aliceDir.Ino, ".")
			if err != nil {
				return err
			}
			up, err := e.lookup(alice, fx.aliceDir.Ino, "..")
			if err != nil {
				return err
			}
			rup, err := e.lookup(alice, rootIno, "..")
			if err != nil {
				return err
			}
			if dot.Ino != fx.aliceDir.Ino || up.Ino != fx.home.Ino || rup.Ino != rootIno {
				e.t.Fatalf(". = %d, .. = %d, /.. = %d", dot.Ino, up.Ino, rup.Ino)
			}
			return nil
		}},

		{name: "create ok", op: createErr(alice, inAlice, "new", 0o644, true, 0), check: func(t *testing.T, e *env, fx fixture) {
			a, err := e.lookup(alice, fx.aliceDir.Ino, "new")
			if err != nil {
				t.Fatal(err)
			}
			if a.Mode != syscall.S_IFREG|0o644 || a.Uid != 1000 || a.Gid != 1000 || a.Nlink != 1 || a.Size != 0 {
				t.Fatalf("new file attr %v", a)
			}
			if a.Layout == nil || a.Layout.StripeCount != 4 || len(a.Layout.Chains) != 4 || a.Layout.ChunkSize != 1<<20 {
				t.Fatalf("new file layout %v", a.Layout)
			}
			if d := e.getattr(fx.aliceDir.Ino); d.MtimeNs < a.CtimeNs || d.CtimeNs < a.CtimeNs {
				t.Fatalf("parent times not updated: %v vs %v", d, a)
			}
		}},
		{name: "create exclusive existing", op: createErr(alice, inAlice, "f", 0o644, true, 0), want: syscall.EEXIST},
		{name: "create non-exclusive existing returns it", op: func(e *env, fx fixture) error {
			r, err := e.s.Create(e.ctx, &weftv1.CreateRequest{Caller: alice, Parent: fx.aliceDir.Ino, Name: "f", Mode: 0o600, OpenFlags: syscall.O_RDWR})
			if err == nil && (r.Created || r.Attr.Ino != fx.f.Ino || r.Attr.Mode&0o777 != 0o640) {
				e.t.Fatalf("create of existing file: %v", r)
			}
			return err
		}},
		{name: "create existing checks open permission", op: createErr(bob, inAlice, "f", 0o644, false, syscall.O_WRONLY), want: syscall.EACCES},
		{name: "create existing group read ok", op: createErr(bob, inAlice, "f", 0o644, false, syscall.O_RDONLY)},
		{name: "create existing directory", op: createErr(alice, inRoot, "home", 0o644, false, 0), want: syscall.EISDIR},
		{name: "create without write permission", op: createErr(bob, inAlice, "bobs", 0o644, true, 0), want: syscall.EACCES},
		{name: "create without search permission", op: createErr(carol, inAlice, "x", 0o644, true, 0), want: syscall.EACCES},
		{name: "create in sticky dir by other", op: createErr(carol, inTmp, "carol2", 0o644, true, 0)},
		{name: "create name with slash", op: createErr(alice, inAlice, "a/b", 0o644, true, 0), want: syscall.EINVAL},
		{name: "create name with NUL", op: createErr(alice, inAlice, "a\x00b", 0o644, true, 0), want: syscall.EINVAL},
		{name: "create long name", op: createErr(alice, inAlice, long, 0o644, true, 0), want: syscall.ENAMETOOLONG},
		{name: "create 255 byte name", op: createErr(alice, inAlice, long[:255], 0o644, true, 0)},
		{name: "create dot", op: createErr(alice, inAlice, ".", 0o644, true, 0), want: syscall.EEXIST},
		{name: "create in file", op: createErr(alice, inFile, "x", 0o644, true, 0), want: syscall.ENOTDIR},
		{name: "create in missing dir", op: createErr(alice, inMissing, "x", 0o644, true, 0), want: syscall.ENOENT},
		{name: "mknod fifo", op: createErr(alice, inAlice, "fifo", syscall.S_IFIFO|0o644, true, 0), check: func(t *testing.T, e *env, fx fixture) {
			a, _ := e.lookup(alice, fx.aliceDir.Ino, "fifo")
			if a.Mode != syscall.S_IFIFO|0o644 || a.Layout != nil {
				t.Fatalf("fifo attr %v", a)
			}
		}},
		{name: "mknod socket", op: createErr(alice, inAlice, "sock", syscall.S_IFSOCK|0o644, true, 0)},
		{name: "mknod char device by user", op: createErr(alice, inAlice, "null", syscall.S_IFCHR|0o644, true, 0), want: syscall.EPERM},
		{name: "mknod char device by root", op: func(e *env, fx fixture) error {
			r, err := e.s.Create(e.ctx, &weftv1.CreateRequest{Caller: root, Parent: rootIno, Name: "null", Mode: syscall.S_IFCHR | 0o666, Rdev: 0x103, Exclusive: true})
			if err == nil && r.Attr.Rdev != 0x103 {
				e.t.Fatalf("rdev %#x", r.Attr.Rdev)
			}
			return err
		}},
		{name: "mknod directory type", op: createErr(root, inRoot, "d", syscall.S_IFDIR|0o755, true, 0), want: syscall.EINVAL},
		{name: "create in setgid dir inherits group", op: createErr(alice, inSetgid, "sgfile", 0o644, true, 0), check: func(t *testing.T, e *env, fx fixture) {
			a, _ := e.lookup(alice, fx.sg.Ino, "sgfile")
			if a.Gid != 1000 || a.Mode&syscall.S_ISGID != 0 {
				t.Fatalf("file in setgid dir: %v", a)
			}
		}},
		{name: "mkdir in setgid dir inherits setgid", op: func(e *env, fx fixture) error {
			a := e.mkdir(root, fx.sg.Ino, "sgdir", 0o755)
			if a.Gid != 1000 || a.Mode != syscall.S_IFDIR|syscall.S_ISGID|0o755 {
				e.t.Fatalf("dir in setgid dir: %v", a)
			}
			return nil
		}},
		{name: "non-member setgid file in setgid dir loses setgid", op: func(e *env, fx fixture) error {
			e.setattr(&weftv1.SetAttrRequest{Caller: root, Ino: fx.sg.Ino, Valid: setMode, Mode: 0o2777})
			a := e.create(carol, fx.sg.Ino, "carolsg", syscall.S_ISGID|0o775)
			if a.Gid != 1000 || a.Mode&syscall.S_ISGID != 0 {
				e.t.Fatalf("non-member's file: %v", a)
			}
			b := e.create(bob, fx.sg.Ino, "bobsg", syscall.S_ISGID|0o775)
			if b.Mode&syscall.S_ISGID == 0 {
				e.t.Fatalf("member's file lost setgid: %v", b)
			}
			return nil
		}},

		{name: "mkdir ok", op: mkdirErr(alice, inAlice, "sub"), check: func(t *testing.T, e *env, fx fixture) {
			a, _ := e.lookup(alice, fx.aliceDir.Ino, "sub")
			if a.Nlink != 2 || a.Mode != syscall.S_IFDIR|0o755 || a.Uid != 1000 {
				t.Fatalf("new dir %v", a)
			}
			if d := e.getattr(fx.aliceDir.Ino); d.Nlink != 3 {
				t.Fatalf("parent nlink %d, want 3", d.Nlink)
			}
		}},
		{name: "mkdir existing", op: mkdirErr(alice, inAlice, "f"), want: syscall.EEXIST},
		{name: "mkdir dot", op: mkdirErr(alice, inAlice, "."), want: syscall.EEXIST},
		{name: "mkdir dotdot", op: mkdirErr(alice, inAlice, ".."), want: syscall.EEXIST},
		{name: "mkdir without write permission", op: mkdirErr(bob, inAlice, "b"), want: syscall.EACCES},
		{name: "mkdir in file", op: mkdirErr(alice, inFile, "b"), want: syscall.ENOTDIR},
		{name: "mkdir long name", op: mkdirErr(alice, inAlice, long), want: syscall.ENAMETOOLONG},
		{name: "mkdir empty name", op: mkdirErr(alice, inAlice, ""), want: syscall.ENOENT},
	})
}

func TestRemoveLinkSymlink(t *testing.T) {
	unlinkErr := func(c *weftv1.Caller, parent func(fixture) uint64, name string) func(*env, fixture) error {
		return func(e *env, fx fixture) error { return e.unlink(c, parent(fx), name) }
	}
	rmdirErr := func(c *weftv1.Caller, parent func(fixture) uint64, name string) func(*env, fixture) error {
		return func(e *env, fx fixture) error { return e.rmdir(c, parent(fx), name) }
	}
	linkErr := func(ino func(fixture) uint64, parent func(fixture) uint64, name string) func(*env, fixture) error {
		return func(e *env, fx fixture) error {
			_, err := e.s.Link(e.ctx, &weftv1.LinkRequest{Caller: alice, Ino: ino(fx), NewParent: parent(fx), NewName: name})
			return err
		}
	}
	symlinkErr := func(name, target string) func(*env, fixture) error {
		return func(e *env, fx fixture) error {
			_, err := e.s.Symlink(e.ctx, &weftv1.SymlinkRequest{Caller: alice, Parent: fx.aliceDir.Ino, Name: name, Target: target})
			return err
		}
	}
	fileF := func(fx fixture) uint64 { return fx.f.Ino }
	dirA := func(fx fixture) uint64 { return fx.aliceDir.Ino }
	runCases(t, []nsCase{
		{name: "unlink directory", op: unlinkErr(root, inRoot, "home"), want: syscall.EISDIR},
		{name: "unlink dot", op: unlinkErr(root, inRoot, "."), want: syscall.EISDIR},
		{name: "unlink missing", op: unlinkErr(root, inRoot, "nope"), want: syscall.ENOENT},
		{name: "unlink without write permission", op: unlinkErr(bob, inAlice, "f"), want: syscall.EACCES},
		{name: "unlink sticky other's file", op: unlinkErr(carol, inTmp, "af"), want: syscall.EPERM},
		{name: "unlink sticky own file", op: unlinkErr(alice, inTmp, "af")},
		{name: "unlink sticky by root", op: unlinkErr(root, inTmp, "cf")},
		{name: "unlink long name", op: unlinkErr(root, inTmp, strings.Repeat("y", 300)), want: syscall.ENAMETOOLONG},

		{name: "link directory", op: linkErr(dirA, inRoot, "dl"), want: syscall.EPERM},
		{name: "link existing name", op: linkErr(fileF, inAlice, "f"), want: syscall.EEXIST},
		{name: "link into file", op: linkErr(fileF, inFile, "x"), want: syscall.ENOTDIR},
		{name: "link missing inode", op: linkErr(inMissing, inAlice, "x"), want: syscall.ENOENT},
		{name: "link ok", op: linkErr(fileF, inAlice, "f2"), check: func(t *testing.T, e *env, fx fixture) {
			if a := e.getattr(fx.f.Ino); a.Nlink != 2 {
				t.Fatalf("nlink after link = %d", a.Nlink)
			}
			if err := e.unlink(alice, fx.aliceDir.Ino, "f2"); err != nil {
				t.Fatal(err)
			}
			if a := e.getattr(fx.f.Ino); a.Nlink != 1 {
				t.Fatalf("nlink after unlink = %d", a.Nlink)
			}
		}},

		{name: "symlink ok", op: symlinkErr("sl", "../somewhere"), check: func(t *testing.T, e *env, fx fixture) {
			a, _ := e.lookup(alice, fx.aliceDir.Ino, "sl")
			if a.Mode != syscall.S_IFLNK|0o777 || a.Size != uint64(len("../somewhere")) {
				t.Fatalf("symlink attr %v", a)
			}
			r, err := e.s.Readlink(e.ctx, &weftv1.ReadlinkRequest{Ino: a.Ino})
			if err != nil || r.Target != "../somewhere" {
				t.Fatalf("readlink = %v, %v", r, err)
			}
		}},
		{name: "symlink empty target", op: symlinkErr("sl2", ""), want: syscall.ENOENT},
		{name: "symlink long target", op: symlinkErr("sl3", strings.Repeat("t", 4096)), want: syscall.ENAMETOOLONG},
		{name: "symlink existing", op: symlinkErr("f", "x"), want: syscall.EEXIST},
		{name: "readlink of file", op: func(e *env, fx fixture) error {
			_, err := e.s.Readlink(e.ctx, &weftv1.ReadlinkRequest{Ino: fx.f.Ino})
			return err
		}, want: syscall.EINVAL},

		{name: "rmdir dot", op: rmdirErr(root, inRoot, "."), want: syscall.EINVAL},
		{name: "rmdir dotdot", op: rmdirErr(root, inAlice, ".."), want: syscall.ENOTEMPTY},
		{name: "rmdir file", op: rmdirErr(alice, inAlice, "f"), want: syscall.ENOTDIR},
		{name: "rmdir non-empty", op: rmdirErr(root, inRoot, "home"), want: syscall.ENOTEMPTY},
		{name: "rmdir missing", op: rmdirErr(root, inRoot, "nope"), want: syscall.ENOENT},
		{name: "rmdir in sticky dir by other", op: func(e *env, fx fixture) error {
			e.mkdir(alice, fx.tmp.Ino, "adir", 0o777)
			return e.rmdir(carol, fx.tmp.Ino, "adir")
		}, want: syscall.EPERM},
		{name: "rmdir ok", op: func(e *env, fx fixture) error {
			e.mkdir(alice, fx.aliceDir.Ino, "gone", 0o755)
			if n := e.getattr(fx.aliceDir.Ino).Nlink; n != 3 {
				e.t.Fatalf("nlink with subdir = %d", n)
			}
			return e.rmdir(alice, fx.aliceDir.Ino, "gone")
		}, check: func(t *testing.T, e *env, fx fixture) {
			if n := e.getattr(fx.aliceDir.Ino).Nlink; n != 2 {
				t.Fatalf("nlink after rmdir = %d", n)
			}
			if _, err := e.lookup(alice, fx.aliceDir.Ino, "gone"); errnoOf(t, err) != syscall.ENOENT {
				t.Fatalf("lookup after rmdir: %v", err)
			}
		}},
	})
}

func TestReadDir(t *testing.T) {
	e := newEnv(t)
	fx := e.fixture()
	want := []string{"a", "b", "c", "d", "e"}
	for _, n := range []string{"c", "a", "e", "b"} {
		e.create(alice, fx.aliceDir.Ino, n, 0o644)
	}
	e.mkdir(alice, fx.aliceDir.Ino, "d", 0o755)
	if err := e.unlink(alice, fx.aliceDir.Ino, "f"); err != nil {
		t.Fatal(err)
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		r, err := e.s.ReadDir(e.ctx, &weftv1.ReadDirRequest{Caller: bob, Ino: fx.aliceDir.Ino, StartAfter: after, Limit: 2, Plus: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range r.Entries {
			if d.Attr == nil || d.Attr.Ino != d.Ino || d.Type != d.Attr.Mode&syscall.S_IFMT {
				t.Fatalf("entry %v", d)
			}
			got = append(got, d.Name)
		}
		if !r.More {
			break
		}
		after = r.Entries[len(r.Entries)-1].Name
		if pages > 5 {
			t.Fatal("too many pages")
		}
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("readdir = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		name string
		c    *weftv1.Caller
		ino  uint64
		want syscall.Errno
	}{
		{"other without read permission", carol, fx.aliceDir.Ino, syscall.EACCES},
		{"not a directory", alice, fx.af.Ino, syscall.ENOTDIR},
		{"missing", alice, 424242, syscall.ENOENT},
		{"root", root, fx.aliceDir.Ino, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.s.ReadDir(e.ctx, &weftv1.ReadDirRequest{Caller: tc.c, Ino: tc.ino})
			wantErrno(t, err, tc.want)
		})
	}
}
