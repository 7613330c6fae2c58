package meta

import (
	"slices"
	"syscall"
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// renameTree is the tree of the rename cases, made fresh for each case:
//
//	/a/        alice 0755, with a/x (file), a/sub/ (dir), a/sub/deep/ (dir)
//	/b/        alice 0755, with b/y (file), b/empty/ (dir), b/full/ (dir, with b/full/z)
//	/t/        root 01777 (sticky), with t/cf (carol's file)
type renameTree struct {
	a, b, t, x, sub, deep, y, empty, full, cf *weftv1.Attr
}

func newRenameTree(e *env) renameTree {
	var r renameTree
	r.a = e.mkdir(root, rootIno, "a", 0o755)
	e.chown(r.a.Ino, 1000, 1000)
	r.b = e.mkdir(root, rootIno, "b", 0o755)
	e.chown(r.b.Ino, 1000, 1000)
	r.x = e.create(alice, r.a.Ino, "x", 0o644)
	r.sub = e.mkdir(alice, r.a.Ino, "sub", 0o755)
	r.deep = e.mkdir(alice, r.sub.Ino, "deep", 0o755)
	r.y = e.create(alice, r.b.Ino, "y", 0o644)
	r.empty = e.mkdir(alice, r.b.Ino, "empty", 0o755)
	r.full = e.mkdir(alice, r.b.Ino, "full", 0o755)
	e.create(alice, r.full.Ino, "z", 0o644)
	r.t = e.mkdir(root, rootIno, "t", 0o1777)
	r.cf = e.create(carol, r.t.Ino, "cf", 0o644)
	return r
}

func TestRename(t *testing.T) {
	type ref struct {
		dir  func(renameTree) uint64
		name string
	}
	A := func(r renameTree) uint64 { return r.a.Ino }
	B := func(r renameTree) uint64 { return r.b.Ino }
	T := func(r renameTree) uint64 { return r.t.Ino }
	Sub := func(r renameTree) uint64 { return r.sub.Ino }
	Deep := func(r renameTree) uint64 { return r.deep.Ino }
	cases := []struct {
		name     string
		c        *weftv1.Caller
		from, to ref
		flags    uint32
		want     syscall.Errno
		setup    func(t *testing.T, e *env, r renameTree)
		check    func(t *testing.T, e *env, r renameTree)
	}{
		{name: "file within dir", from: ref{A, "x"}, to: ref{A, "x2"}, check: func(t *testing.T, e *env, r renameTree) {
			wantNames(t, e, r.a.Ino, "sub", "x2")
			if a := e.getattr(r.x.Ino); a.CtimeNs <= r.x.CtimeNs || a.Nlink != 1 {
				t.Fatalf("moved file %v", a)
			}
		}},
		{name: "file across dirs", from: ref{A, "x"}, to: ref{B, "x"}, check: func(t *testing.T, e *env, r renameTree) {
			wantNames(t, e, r.a.Ino, "sub")
			wantNames(t, e, r.b.Ino, "empty", "full", "x", "y")
			if a, b := e.getattr(r.a.Ino), e.getattr(r.b.Ino); a.Nlink != 3 || b.Nlink != 4 || a.MtimeNs <= r.a.MtimeNs || b.MtimeNs <= r.b.MtimeNs {
				t.Fatalf("parents %v %v", a, b)
			}
		}},
		{name: "file over existing file", from: ref{A, "x"}, to: ref{B, "y"}, check: func(t *testing.T, e *env, r renameTree) {
			got, err := e.lookup(alice, r.b.Ino, "y")
			if err != nil || got.Ino != r.x.Ino {
				t.Fatalf("b/y = %v, %v", got, err)
			}
			if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: r.y.Ino}); errnoOf(t, err) != syscall.ENOENT {
				t.Fatalf("replaced file still exists: %v", err)
			}
			if e.gcPending() != 1 {
				t.Fatal("replaced file not queued for GC")
			}
		}},
		{name: "dir across dirs fixes nlink and ..", from: ref{A, "sub"}, to: ref{B, "sub"}, check: func(t *testing.T, e *env, r renameTree) {
			if a, b := e.getattr(r.a.Ino), e.getattr(r.b.Ino); a.Nlink != 2 || b.Nlink != 5 {
				t.Fatalf("nlink a=%d b=%d, want 2 and 5", a.Nlink, b.Nlink)
			}
			up, err := e.lookup(alice, r.sub.Ino, "..")
			if err != nil || up.Ino != r.b.Ino {
				t.Fatalf("sub/.. = %v, %v", up, err)
			}
		}},
		{name: "dir over empty dir", from: ref{A, "sub"}, to: ref{B, "empty"}, check: func(t *testing.T, e *env, r renameTree) {
			if a, b := e.getattr(r.a.Ino), e.getattr(r.b.Ino); a.Nlink != 2 || b.Nlink != 4 {
				t.Fatalf("nlink a=%d b=%d, want 2 and 4", a.Nlink, b.Nlink)
			}
			if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: r.empty.Ino}); errnoOf(t, err) != syscall.ENOENT {
				t.Fatalf("replaced dir still exists: %v", err)
			}
		}},
		{name: "dir over non-empty dir", from: ref{A, "sub"}, to: ref{B, "full"}, want: syscall.ENOTEMPTY},
		{name: "dir over file", from: ref{A, "sub"}, to: ref{B, "y"}, want: syscall.ENOTDIR},
		{name: "file over dir", from: ref{A, "x"}, to: ref{B, "empty"}, want: syscall.EISDIR},
		{name: "dir into itself", from: ref{A, "sub"}, to: ref{Sub, "s"}, want: syscall.EINVAL},
		{name: "dir into own subtree", from: ref{A, "sub"}, to: ref{Deep, "s"}, want: syscall.EINVAL},
		{name: "ancestor into its subtree", c: root, from: ref{func(renameTree) uint64 { return rootIno }, "a"}, to: ref{Deep, "a"}, want: syscall.EINVAL},
		{name: "missing source", from: ref{A, "nope"}, to: ref{B, "n"}, want: syscall.ENOENT},
		{name: "noreplace over existing", from: ref{A, "x"}, to: ref{B, "y"}, flags: renameNoReplace, want: syscall.EEXIST},
		{name: "noreplace to free name", from: ref{A, "x"}, to: ref{B, "free"}, flags: renameNoReplace},
		{name: "exchange and noreplace", from: ref{A, "x"}, to: ref{B, "y"}, flags: renameNoReplace | renameExchange, want: syscall.EINVAL},
		{name: "exchange with missing", from: ref{A, "x"}, to: ref{B, "nope"}, flags: renameExchange, want: syscall.ENOENT},
		{name: "exchange file and dir across dirs", from: ref{A, "x"}, to: ref{B, "empty"}, flags: renameExchange, check: func(t *testing.T, e *env, r renameTree) {
			ax, _ := e.lookup(alice, r.a.Ino, "x")
			be, _ := e.lookup(alice, r.b.Ino, "empty")
			if ax.Ino != r.empty.Ino || be.Ino != r.x.Ino {
				t.Fatalf("a/x = %d, b/empty = %d", ax.Ino, be.Ino)
			}
			if a, b := e.getattr(r.a.Ino), e.getattr(r.b.Ino); a.Nlink != 4 || b.Nlink != 3 {
				t.Fatalf("nlink a=%d b=%d, want 4 and 3", a.Nlink, b.Nlink)
			}
			up, _ := e.lookup(alice, r.empty.Ino, "..")
			if up.Ino != r.a.Ino {
				t.Fatalf("exchanged dir's .. = %d", up.Ino)
			}
		}},
		{name: "exchange with dot", from: ref{A, "sub"}, to: ref{Deep, "."}, flags: renameExchange, want: syscall.EBUSY},
		{name: "exchange ancestor", from: ref{Sub, "deep"}, to: ref{A, "sub"}, flags: renameExchange, want: syscall.EINVAL},
		{name: "hard link of same inode is a no-op", from: ref{A, "x"}, to: ref{A, "xlink"},
			setup: func(t *testing.T, e *env, r renameTree) {
				if _, err := e.s.Link(e.ctx, &weftv1.LinkRequest{Caller: alice, Ino: r.x.Ino, NewParent: r.a.Ino, NewName: "xlink"}); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, e *env, r renameTree) {
				wantNames(t, e, r.a.Ino, "sub", "x", "xlink")
				if n := e.getattr(r.x.Ino).Nlink; n != 2 {
					t.Fatalf("nlink = %d", n)
				}
			}},
		{name: "onto itself", from: ref{A, "x"}, to: ref{A, "x"}, check: func(t *testing.T, e *env, r renameTree) {
			wantNames(t, e, r.a.Ino, "sub", "x")
		}},
		{name: "dot source", from: ref{A, "."}, to: ref{B, "n"}, want: syscall.EBUSY},
		{name: "dotdot target", from: ref{A, "x"}, to: ref{B, ".."}, want: syscall.EBUSY},
		{name: "no write permission on source dir", c: bob, from: ref{A, "x"}, to: ref{T, "x"}, want: syscall.EACCES},
		{name: "no write permission on target dir", c: carol, from: ref{T, "cf"}, to: ref{A, "cf"}, want: syscall.EACCES},
		{name: "sticky source owned by other", c: alice, from: ref{T, "cf"}, to: ref{T, "mine"}, want: syscall.EPERM},
		{name: "sticky source owned by caller", c: carol, from: ref{T, "cf"}, to: ref{T, "mine"}},
		{name: "sticky target owned by other", c: alice, from: ref{A, "x"}, to: ref{T, "cf"}, want: syscall.EPERM},
		{name: "sticky by root", c: root, from: ref{T, "cf"}, to: ref{A, "cf"}},
		{name: "own dir in sticky dir", c: bob, from: ref{T, "bobdir"}, to: ref{T, "bobdir2"},
			setup: func(t *testing.T, e *env, r renameTree) { e.mkdir(bob, r.t.Ino, "bobdir", 0o755) }},
		{name: "long target name", from: ref{A, "x"}, to: ref{B, string(make([]byte, 256))}, want: syscall.ENAMETOOLONG},
		{name: "empty target name", from: ref{A, "x"}, to: ref{B, ""}, want: syscall.ENOENT},
	}
	onEngines(t, func(t *testing.T, newEnv envMaker) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t)
				r := newRenameTree(e)
				if tc.setup != nil {
					tc.setup(t, e, r)
				}
				c := tc.c
				if c == nil {
					c = alice
				}
				err := e.rename(c, tc.from.dir(r), tc.from.name, tc.to.dir(r), tc.to.name, tc.flags)
				wantErrno(t, err, tc.want)
				if tc.want == 0 && tc.check != nil {
					tc.check(t, e, r)
				}
			})
		}
	})
}

// TestRenameDirNeedsWriteOnItself checks Linux's rule that moving a
// directory to another parent needs write permission on the directory
// (its ".." entry changes).
func TestRenameDirNeedsWriteOnItself(t *testing.T) {
	e := newEnv(t)
	r := newRenameTree(e)
	e.mkdir(alice, r.t.Ino, "ro", 0o555)
	other := e.mkdir(root, rootIno, "open", 0o777)
	wantErrno(t, e.rename(alice, r.t.Ino, "ro", other.Ino, "ro", 0), syscall.EACCES)
	wantErrno(t, e.rename(alice, r.t.Ino, "ro", r.t.Ino, "ro2", 0), 0)
	wantErrno(t, e.rename(root, r.t.Ino, "ro2", other.Ino, "ro", 0), 0)
}

func wantNames(t *testing.T, e *env, dir uint64, want ...string) {
	t.Helper()
	if got := e.names(dir); !slices.Equal(got, want) {
		t.Fatalf("entries of %d = %q, want %q", dir, got, want)
	}
}
