package meta

import (
	"bytes"
	"slices"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/protobuf/proto"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func setattrErr(c *weftv1.Caller, ino func(fixture) uint64, req *weftv1.SetAttrRequest) func(*env, fixture) error {
	return func(e *env, fx fixture) error {
		r := proto.Clone(req).(*weftv1.SetAttrRequest)
		r.Caller, r.Ino = c, ino(fx)
		_, err := e.s.SetAttr(e.ctx, r)
		return err
	}
}

// newFile makes a fresh file of alice's with mode for one case.
func newFile(e *env, fx fixture, name string, mode uint32) *weftv1.Attr {
	e.t.Helper()
	return e.create(alice, fx.aliceDir.Ino, name, mode)
}

func TestSetAttr(t *testing.T) {
	fileF := func(fx fixture) uint64 { return fx.f.Ino }
	dirA := func(fx fixture) uint64 { return fx.aliceDir.Ino }
	runCases(t, []nsCase{
		{name: "chmod by owner", op: setattrErr(alice, fileF, &weftv1.SetAttrRequest{Valid: setMode, Mode: 0o600}), check: func(t *testing.T, e *env, fx fixture) {
			if a := e.getattr(fx.f.Ino); a.Mode != syscall.S_IFREG|0o600 || a.CtimeNs < fx.f.CtimeNs {
				t.Fatalf("after chmod: %v", a)
			}
		}},
		{name: "chmod by group member", op: setattrErr(bob, fileF, &weftv1.SetAttrRequest{Valid: setMode, Mode: 0o666}), want: syscall.EPERM},
		{name: "chmod by root", op: setattrErr(root, fileF, &weftv1.SetAttrRequest{Valid: setMode, Mode: 0o640})},
		{name: "chmod setgid by non-member owner clears it", op: func(e *env, fx fixture) error {
			a := newFile(e, fx, "sgid", 0o644)
			e.setattr(&weftv1.SetAttrRequest{Caller: root, Ino: a.Ino, Valid: setGID, Gid: 4242})
			a = e.setattr(&weftv1.SetAttrRequest{Caller: alice, Ino: a.Ino, Valid: setMode, Mode: 0o2755})
			if a.Mode != syscall.S_IFREG|0o755 {
				e.t.Fatalf("mode %#o, want setgid cleared", a.Mode)
			}
			a = e.setattr(&weftv1.SetAttrRequest{Caller: root, Ino: a.Ino, Valid: setMode, Mode: 0o2755})
			if a.Mode != syscall.S_IFREG|0o2755 {
				e.t.Fatalf("root's chmod: mode %#o", a.Mode)
			}
			return nil
		}},
		{name: "chown by owner", op: setattrErr(alice, fileF, &weftv1.SetAttrRequest{Valid: setUID, Uid: 1001}), want: syscall.EPERM},
		{name: "chown to self by owner is allowed", op: setattrErr(alice, fileF, &weftv1.SetAttrRequest{Valid: setUID, Uid: 1000})},
		{name: "chown to self by non-owner", op: setattrErr(bob, fileF, &weftv1.SetAttrRequest{Valid: setUID, Uid: 1001}), want: syscall.EPERM},
		{name: "chgrp by owner to a foreign group", op: setattrErr(alice, fileF, &weftv1.SetAttrRequest{Valid: setGID, Gid: 1002}), want: syscall.EPERM},
		{name: "chgrp by non-owner", op: setattrErr(bob, fileF, &weftv1.SetAttrRequest{Valid: setGID, Gid: 1000}), want: syscall.EPERM},
		{name: "chgrp by owner to supplementary group", op: func(e *env, fx fixture) error {
			a := e.create(bob, fx.tmp.Ino, "bobs", 0o644)
			if a.Gid != 1001 {
				e.t.Fatalf("gid %d", a.Gid)
			}
			a = e.setattr(&weftv1.SetAttrRequest{Caller: bob, Ino: a.Ino, Valid: setGID, Gid: 1000})
			if a.Gid != 1000 {
				e.t.Fatalf("gid after chgrp %d", a.Gid)
			}
			return nil
		}},
		{name: "chown clears setuid and setgid", op: func(e *env, fx fixture) error {
			a := newFile(e, fx, "suid", 0o6755)
			a = e.setattr(&weftv1.SetAttrRequest{Caller: root, Ino: a.Ino, Valid: setUID | setGID, Uid: 1001, Gid: 1001})
			if a.Mode != syscall.S_IFREG|0o755 || a.Uid != 1001 || a.Gid != 1001 {
				e.t.Fatalf("after chown: %v", a)
			}
			return nil
		}},
		{name: "chown keeps setgid without group exec", op: func(e *env, fx fixture) error {
			a := newFile(e, fx, "mandlock", 0o2644)
			a = e.setattr(&weftv1.SetAttrRequest{Caller: alice, Ino: a.Ino, Valid: setGID, Gid: 1000})
			if a.Mode != syscall.S_IFREG|0o2644 {
				e.t.Fatalf("after chgrp: %#o", a.Mode)
			}
			return nil
		}},
		{name: "explicit times by owner", op: setattrErr(alice, fileF, &weftv1.SetAttrRequest{Valid: setAtime | setMtime, AtimeNs: 1e9, MtimeNs: 2e9}), check: func(t *testing.T, e *env, fx fixture) {
			if a := e.getattr(fx.f.Ino); a.AtimeNs != 1e9 || a.MtimeNs != 2e9 {
				t.Fatalf("times %d %d", a.AtimeNs, a.MtimeNs)
			}
		}},
		{name: "explicit times by writer non-owner", op: func(e *env, fx fixture) error {
			a := newFile(e, fx, "shared", 0o666)
			_, err := e.s.SetAttr(e.ctx, &weftv1.SetAttrRequest{Caller: bob, Ino: a.Ino, Valid: setMtime, MtimeNs: 5})
			return err
		}, want: syscall.EPERM},
		{name: "times now by writer non-owner", op: func(e *env, fx fixture) error {
			a := newFile(e, fx, "shared2", 0o666)
			_, err := e.s.SetAttr(e.ctx, &weftv1.SetAttrRequest{Caller: bob, Ino: a.Ino, Valid: setAtime | setMtime | setAtimeNow | setMtimeNow})
			return err
		}},
		{name: "times now by non-writer", op: setattrErr(bob, fileF, &weftv1.SetAttrRequest{Valid: setAtimeNow | setMtimeNow}), want: syscall.EACCES},
		{name: "truncate without write permission", op: setattrErr(bob, fileF, &weftv1.SetAttrRequest{Valid: setSize, Size: 0}), want: syscall.EACCES},
		{name: "truncate directory", op: setattrErr(root, dirA, &weftv1.SetAttrRequest{Valid: setSize, Size: 0}), want: syscall.EISDIR},
		{name: "truncate fifo", op: func(e *env, fx fixture) error {
			r, _ := e.s.Create(e.ctx, &weftv1.CreateRequest{Caller: alice, Parent: fx.aliceDir.Ino, Name: "tfifo", Mode: syscall.S_IFIFO | 0o666})
			_, err := e.s.SetAttr(e.ctx, &weftv1.SetAttrRequest{Caller: alice, Ino: r.Attr.Ino, Valid: setSize})
			return err
		}, want: syscall.EINVAL},
		{name: "truncate up and down", op: func(e *env, fx fixture) error {
			a := newFile(e, fx, "trunc", 0o4755)
			if _, err := e.s.CommitWrite(e.ctx, &weftv1.CommitWriteRequest{Caller: root, Ino: a.Ino, Size: 5000}); err != nil {
				return err
			}
			a = e.setattr(&weftv1.SetAttrRequest{Caller: alice, Ino: a.Ino, Valid: setSize, Size: 100})
			if a.Size != 100 || e.data.truncatedSize(a.Ino) != 100 {
				e.t.Fatalf("after truncate down: size %d, data server saw %d", a.Size, e.data.truncatedSize(a.Ino))
			}
			if a.Mode&syscall.S_ISUID != 0 {
				e.t.Fatalf("truncate by non-root kept setuid: %#o", a.Mode)
			}
			a = e.setattr(&weftv1.SetAttrRequest{Caller: alice, Ino: a.Ino, Valid: setSize, Size: 1 << 30})
			if a.Size != 1<<30 || e.data.truncatedSize(a.Ino) != 100 {
				e.t.Fatalf("after truncate up: size %d, data server saw %d (want min(old,new) = 100)", a.Size, e.data.truncatedSize(a.Ino))
			}
			return nil
		}},
		{name: "setattr missing inode", op: setattrErr(root, inMissing, &weftv1.SetAttrRequest{Valid: setMode}), want: syscall.ENOENT},
	})
}

func TestOpenAccessCommitWrite(t *testing.T) {
	openErr := func(c *weftv1.Caller, ino func(fixture) uint64, flags uint32) func(*env, fixture) error {
		return func(e *env, fx fixture) error {
			_, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: c, Ino: ino(fx), Flags: flags})
			return err
		}
	}
	accessErr := func(c *weftv1.Caller, ino func(fixture) uint64, mask uint32) func(*env, fixture) error {
		return func(e *env, fx fixture) error {
			_, err := e.s.Access(e.ctx, &weftv1.AccessRequest{Caller: c, Ino: ino(fx), Mask: mask})
			return err
		}
	}
	fileF := func(fx fixture) uint64 { return fx.f.Ino }
	dirA := func(fx fixture) uint64 { return fx.aliceDir.Ino }
	runCases(t, []nsCase{
		{name: "open read by owner", op: openErr(alice, fileF, syscall.O_RDONLY)},
		{name: "open rdwr by owner", op: openErr(alice, fileF, syscall.O_RDWR)},
		{name: "open read by group", op: openErr(bob, fileF, syscall.O_RDONLY)},
		{name: "open write by group", op: openErr(bob, fileF, syscall.O_WRONLY), want: syscall.EACCES},
		{name: "open trunc needs write", op: openErr(bob, fileF, syscall.O_RDONLY|syscall.O_TRUNC), want: syscall.EACCES},
		{name: "open read by other", op: openErr(carol, fileF, syscall.O_RDONLY), want: syscall.EACCES},
		{name: "open by root", op: openErr(root, fileF, syscall.O_RDWR)},
		{name: "open directory for reading", op: openErr(alice, dirA, syscall.O_RDONLY)},
		{name: "open directory for writing", op: openErr(alice, dirA, syscall.O_WRONLY), want: syscall.EISDIR},
		{name: "open unknown session", op: func(e *env, fx fixture) error {
			_, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: alice, Ino: fx.f.Ino, Session: "nope"})
			return err
		}, want: syscall.ESTALE},
		{name: "access exists", op: accessErr(carol, fileF, 0)},
		{name: "access read by other", op: accessErr(carol, fileF, 4), want: syscall.EACCES},
		{name: "access read by group", op: accessErr(bob, fileF, 4)},
		{name: "access exec by root without x bits", op: accessErr(root, fileF, 1), want: syscall.EACCES},
		{name: "access exec by root with one x bit", op: func(e *env, fx fixture) error {
			a := newFile(e, fx, "script", 0o701)
			_, err := e.s.Access(e.ctx, &weftv1.AccessRequest{Caller: root, Ino: a.Ino, Mask: 1})
			return err
		}},
		{name: "access search on dir by root", op: accessErr(root, dirA, 7)},
		{name: "commit write", op: func(e *env, fx fixture) error {
			a := newFile(e, fx, "written", 0o6775)
			for _, sz := range []uint64{100, 50} {
				r, err := e.s.CommitWrite(e.ctx, &weftv1.CommitWriteRequest{Caller: bob, Ino: a.Ino, Size: sz, MtimeNs: 77})
				if err != nil {
					return err
				}
				if r.Attr.Size != 100 || r.Attr.MtimeNs != 77 || r.Attr.Mode != syscall.S_IFREG|0o775 {
					e.t.Fatalf("after commit of %d: %v", sz, r.Attr)
				}
			}
			return nil
		}},
		{name: "commit write to directory", op: func(e *env, fx fixture) error {
			_, err := e.s.CommitWrite(e.ctx, &weftv1.CommitWriteRequest{Caller: root, Ino: fx.aliceDir.Ino, Size: 1})
			return err
		}, want: syscall.EINVAL},
	})
}

func TestXattr(t *testing.T) {
	set := func(c *weftv1.Caller, ino func(fixture) uint64, name string, value []byte, flags uint32) func(*env, fixture) error {
		return func(e *env, fx fixture) error {
			_, err := e.s.SetXattr(e.ctx, &weftv1.SetXattrRequest{Caller: c, Ino: ino(fx), Name: name, Value: value, Flags: flags})
			return err
		}
	}
	get := func(c *weftv1.Caller, ino func(fixture) uint64, name string, want string) func(*env, fixture) error {
		return func(e *env, fx fixture) error {
			r, err := e.s.GetXattr(e.ctx, &weftv1.GetXattrRequest{Caller: c, Ino: ino(fx), Name: name})
			if err == nil && !bytes.Equal(r.Value, []byte(want)) {
				e.t.Fatalf("value %q, want %q", r.Value, want)
			}
			return err
		}
	}
	remove := func(c *weftv1.Caller, ino func(fixture) uint64, name string) func(*env, fixture) error {
		return func(e *env, fx fixture) error {
			_, err := e.s.RemoveXattr(e.ctx, &weftv1.RemoveXattrRequest{Caller: c, Ino: ino(fx), Name: name})
			return err
		}
	}
	fileF := func(fx fixture) uint64 { return fx.f.Ino }
	var symlink uint64
	sym := func(fixture) uint64 { return symlink }
	runCases(t, []nsCase{
		{name: "set user", op: set(alice, fileF, "user.a", []byte("1"), 0)},
		{name: "get user", op: get(bob, fileF, "user.a", "1")},
		{name: "get user by other without read", op: get(carol, fileF, "user.a", ""), want: syscall.EACCES},
		{name: "set user by group without write", op: set(bob, fileF, "user.b", nil, 0), want: syscall.EACCES},
		{name: "create existing", op: set(alice, fileF, "user.a", []byte("2"), xattrCreate), want: syscall.EEXIST},
		{name: "replace missing", op: set(alice, fileF, "user.zz", []byte("2"), xattrReplace), want: syscall.ENODATA},
		{name: "replace existing", op: set(alice, fileF, "user.a", []byte("3"), xattrReplace)},
		{name: "get replaced", op: get(alice, fileF, "user.a", "3")},
		{name: "empty value", op: set(alice, fileF, "user.empty", nil, xattrCreate)},
		{name: "get empty value", op: get(alice, fileF, "user.empty", "")},
		{name: "get missing", op: get(alice, fileF, "user.nope", ""), want: syscall.ENODATA},
		{name: "name too long", op: set(alice, fileF, "user."+strings.Repeat("n", 251), nil, 0), want: syscall.ERANGE},
		{name: "name 255 bytes", op: set(alice, fileF, "user."+strings.Repeat("n", 250), nil, 0)},
		{name: "empty name", op: set(alice, fileF, "", nil, 0), want: syscall.ERANGE},
		{name: "value too big", op: set(alice, fileF, "user.big", make([]byte, 64<<10+1), 0), want: syscall.E2BIG},
		{name: "value 64 KiB", op: set(alice, fileF, "user.big", make([]byte, 64<<10), 0)},
		{name: "unknown namespace", op: set(alice, fileF, "weird.x", nil, 0), want: syscall.EOPNOTSUPP},
		{name: "trusted by user", op: set(alice, fileF, "trusted.x", nil, 0), want: syscall.EPERM},
		{name: "trusted by root", op: set(root, fileF, "trusted.x", []byte("t"), 0)},
		{name: "get trusted by user", op: get(alice, fileF, "trusted.x", ""), want: syscall.ENODATA},
		{name: "security by user", op: set(alice, fileF, "security.x", nil, 0), want: syscall.EPERM},
		{name: "security by root", op: set(root, fileF, "security.x", []byte("s"), 0)},
		{name: "get security by user", op: get(carol, fileF, "security.x", "s")},
		{name: "user on symlink", op: func(e *env, fx fixture) error {
			r, err := e.s.Symlink(e.ctx, &weftv1.SymlinkRequest{Caller: alice, Parent: fx.aliceDir.Ino, Name: "l", Target: "f"})
			if err != nil {
				return err
			}
			symlink = r.Attr.Ino
			return set(alice, sym, "user.a", nil, 0)(e, fx)
		}, want: syscall.EPERM},
		{name: "trusted on symlink by root", op: set(root, sym, "trusted.a", nil, 0)},
		{name: "list", op: func(e *env, fx fixture) error {
			for _, c := range []struct {
				who  *weftv1.Caller
				want []string
			}{
				{alice, []string{"security.x", "user.a", "user.big", "user.empty", "user." + strings.Repeat("n", 250)}},
				{root, []string{"security.x", "trusted.x", "user.a", "user.big", "user.empty", "user." + strings.Repeat("n", 250)}},
			} {
				r, err := e.s.ListXattr(e.ctx, &weftv1.ListXattrRequest{Caller: c.who, Ino: fx.f.Ino})
				if err != nil {
					return err
				}
				got := slices.Sorted(slices.Values(r.Names))
				if !slices.Equal(got, slices.Sorted(slices.Values(c.want))) {
					e.t.Fatalf("list for uid %d = %q, want %q", c.who.Uid, got, c.want)
				}
			}
			return nil
		}},
		{name: "remove by group without write", op: remove(bob, fileF, "user.a"), want: syscall.EACCES},
		{name: "remove", op: remove(alice, fileF, "user.a")},
		{name: "remove missing", op: remove(alice, fileF, "user.a"), want: syscall.ENODATA},
		{name: "get removed", op: get(alice, fileF, "user.a", ""), want: syscall.ENODATA},
	})
}

func TestLayout(t *testing.T) {
	setLayout := func(c *weftv1.Caller, ino func(fixture) uint64, l *weftv1.Layout) func(*env, fixture) error {
		return func(e *env, fx fixture) error {
			_, err := e.s.SetLayout(e.ctx, &weftv1.SetLayoutRequest{Caller: c, Ino: ino(fx), Layout: l})
			return err
		}
	}
	dirA := func(fx fixture) uint64 { return fx.aliceDir.Ino }
	fileF := func(fx fixture) uint64 { return fx.f.Ino }
	runCases(t, []nsCase{
		{name: "root default", op: func(e *env, fx fixture) error {
			r, err := e.s.GetLayout(e.ctx, &weftv1.GetLayoutRequest{Caller: alice, Ino: rootIno})
			if err == nil && (r.HasOwn || r.Effective.ChunkSize != 1<<20 || r.Effective.StripeCount != 4 || r.Effective.Replicas != 1) {
				e.t.Fatalf("root layout %v", r)
			}
			return err
		}},
		{name: "chunk size not a power of two", op: setLayout(alice, dirA, &weftv1.Layout{ChunkSize: 100000}), want: syscall.EINVAL},
		{name: "chunk size too small", op: setLayout(alice, dirA, &weftv1.Layout{ChunkSize: 32 << 10}), want: syscall.EINVAL},
		{name: "chunk size too big", op: setLayout(alice, dirA, &weftv1.Layout{ChunkSize: 128 << 20}), want: syscall.EINVAL},
		{name: "stripe count too big", op: setLayout(alice, dirA, &weftv1.Layout{StripeCount: 129}), want: syscall.EINVAL},
		{name: "replicas too many", op: setLayout(alice, dirA, &weftv1.Layout{Replicas: 9}), want: syscall.EINVAL},
		{name: "by non-owner", op: setLayout(bob, dirA, &weftv1.Layout{StripeCount: 2}), want: syscall.EPERM},
		{name: "on non-empty file", op: func(e *env, fx fixture) error {
			if _, err := e.s.CommitWrite(e.ctx, &weftv1.CommitWriteRequest{Caller: alice, Ino: fx.f.Ino, Size: 10}); err != nil {
				return err
			}
			return setLayout(alice, fileF, &weftv1.Layout{StripeCount: 1})(e, fx)
		}, want: syscall.ENOTEMPTY},
		{name: "on empty file", op: func(e *env, fx fixture) error {
			a := newFile(e, fx, "empty", 0o644)
			r, err := e.s.SetLayout(e.ctx, &weftv1.SetLayoutRequest{Caller: alice, Ino: a.Ino, Layout: &weftv1.Layout{StripeCount: 2, ChunkSize: 64 << 10}})
			if err != nil {
				return err
			}
			if got := e.getattr(a.Ino).Layout; len(got.Chains) != 2 || got.StripeCount != 2 || got.ChunkSize != 64<<10 || r.Layout.StripeCount != 2 {
				e.t.Fatalf("file layout %v", got)
			}
			return nil
		}},
		{name: "directory default inherited down the tree", op: func(e *env, fx fixture) error {
			if err := setLayout(alice, dirA, &weftv1.Layout{ChunkSize: 4 << 20, StripeCount: 100})(e, fx); err != nil {
				return err
			}
			sub := e.mkdir(alice, fx.aliceDir.Ino, "deep", 0o755)
			a := e.create(alice, sub.Ino, "g", 0o644)
			// 100 stripes capped to the 4 chains there are.
			if a.Layout.ChunkSize != 4<<20 || a.Layout.StripeCount != 4 || len(a.Layout.Chains) != 4 {
				e.t.Fatalf("inherited layout %v", a.Layout)
			}
			r, err := e.s.GetLayout(e.ctx, &weftv1.GetLayoutRequest{Caller: alice, Ino: sub.Ino})
			if err != nil {
				return err
			}
			if r.HasOwn || r.Effective.ChunkSize != 4<<20 {
				e.t.Fatalf("subdir layout %v", r)
			}
			if err := setLayout(alice, func(fixture) uint64 { return sub.Ino }, &weftv1.Layout{StripeCount: 1})(e, fx); err != nil {
				return err
			}
			b := e.create(alice, sub.Ino, "h", 0o644)
			if b.Layout.ChunkSize != 4<<20 || len(b.Layout.Chains) != 1 {
				e.t.Fatalf("layout with own default over inherited: %v", b.Layout)
			}
			return nil
		}},
		{name: "layout of symlink", op: func(e *env, fx fixture) error {
			r, err := e.s.Symlink(e.ctx, &weftv1.SymlinkRequest{Caller: alice, Parent: fx.aliceDir.Ino, Name: "ls", Target: "x"})
			if err != nil {
				return err
			}
			_, err = e.s.GetLayout(e.ctx, &weftv1.GetLayoutRequest{Caller: alice, Ino: r.Attr.Ino})
			return err
		}, want: syscall.EINVAL},
	})
}

func TestStatFSAndStatus(t *testing.T) {
	e := newEnv(t)
	e.fixture()
	r, err := e.s.StatFS(e.ctx, &weftv1.StatFSRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// fixture: 5 directories (root, home, alice, tmp, sg) and 3 files.
	if r.TotalBytes != 4<<40 || r.FreeBytes != 4<<39 || r.BlockSize != 4096 || r.Files != 8 {
		t.Fatalf("statfs %v", r)
	}
	st, err := e.s.Status(e.ctx, &weftv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Files != 3 || st.Directories != 5 || st.Chains != 4 || st.Engine != "pebble" || len(st.Servers) != 1 ||
		st.ClusterId == "" || st.DefaultLayout.StripeCount != 4 {
		t.Fatalf("status %v", st)
	}
}
