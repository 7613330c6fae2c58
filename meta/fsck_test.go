package meta

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestFsckCleanAfterWorkload runs a workload with hard links, renames, a
// file unlinked while open, symlinks, xattrs and data: fsck finds nothing
// and looked at every chunk copy.
func TestFsckCleanAfterWorkload(t *testing.T) {
	e := newFsckEnv(t)
	a := e.mkdir(rootIno, "a")
	b := e.mkdir(a.Ino, "b")
	c := e.mkdir(rootIno, "c")
	f1 := e.file(a.Ino, "f1", 200<<10, false)
	e.file(b.Ino, "f2", 10, false)
	e.file(rootIno, "sparse", 0, false)
	if _, err := e.s.Link(e.ctx, &weftv1.LinkRequest{Caller: root, Ino: f1.Ino, NewParent: c.Ino, NewName: "hard"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Rename(e.ctx, &weftv1.RenameRequest{Caller: root, OldParent: a.Ino, OldName: "b", NewParent: c.Ino, NewName: "b2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Rename(e.ctx, &weftv1.RenameRequest{Caller: root, OldParent: a.Ino, OldName: "f1", NewParent: rootIno, NewName: "f1moved"}); err != nil {
		t.Fatal(err)
	}
	open := e.file(rootIno, "open-unlinked", 70<<10, true)
	if err := e.unlinkName(rootIno, "open-unlinked"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Symlink(e.ctx, &weftv1.SymlinkRequest{Caller: root, Parent: c.Ino, Name: "sl", Target: "../f1moved"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.SetXattr(e.ctx, &weftv1.SetXattrRequest{Caller: root, Ino: c.Ino, Name: "user.k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	gone := e.file(rootIno, "deleted", 10, false)
	if err := e.unlinkName(rootIno, "deleted"); err != nil {
		t.Fatal(err)
	}
	_ = gone // its chunks wait in the GC queue or are gone: both fine

	for _, repair := range []bool{false, true} {
		r := e.fsck(repair)
		if len(r.Problems) != 0 {
			t.Fatalf("fsck (repair %v) of a clean file system:%s", repair, describeProblems(r))
		}
		// f1: 4 chunks, f2 and open-unlinked: 1 and 2; two copies each.
		if r.ChunksChecked < 14 || r.InodesChecked < 9 || r.EntriesChecked < 8 {
			t.Errorf("checked %d inodes, %d entries, %d chunk copies", r.InodesChecked, r.EntriesChecked, r.ChunksChecked)
		}
	}
	if e.attr(open.Ino).Nlink != 0 {
		t.Errorf("the open unlinked file was changed")
	}
	if _, _, found := e.lookupName(rootIno, lostFoundName); found {
		t.Errorf("fsck of a clean file system made /%s", lostFoundName)
	}
}

func (e *fsckEnv) unlinkName(parent uint64, name string) error {
	_, err := e.s.Unlink(e.ctx, &weftv1.RemoveRequest{Caller: root, Parent: parent, Name: name})
	return err
}

func (e *fsckEnv) lookupName(parent uint64, name string) (ino uint64, typ uint32, found bool) {
	e.t.Helper()
	err := e.s.view(e.ctx, func(x *tx) error {
		var err error
		ino, typ, found, err = x.entry(parent, name)
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return ino, typ, found
}

func setInode(t kv.Txn, ino uint64, change func(a *weftv1.Attr)) error {
	v, _, err := t.Get(inodeKey(ino))
	if err != nil {
		return err
	}
	a := new(weftv1.Attr)
	if err := proto.Unmarshal(v, a); err != nil {
		return err
	}
	change(a)
	v, err = proto.Marshal(a)
	if err != nil {
		return err
	}
	return t.Set(inodeKey(ino), v)
}

// fsckCase corrupts a file system in one way.
type fsckCase struct {
	name string
	// corrupt damages the file system and returns a check run after the
	// repair (nil: none).
	corrupt func(e *fsckEnv) func()
	// want are the kinds the first fsck reports.
	want []string
	// repairs are the kinds fsck --repair reports, if not want (one repair
	// may fix two problems).
	repairs []string
	// kept are the kinds that --repair cannot fix (reported again).
	kept []string
	// cleanup makes the file system clean again after an unrepairable case.
	cleanup func(e *fsckEnv)
}

var fsckCases = []fsckCase{
	{
		name: "dangling entry",
		corrupt: func(e *fsckEnv) func() {
			e.kv(func(t kv.Txn) error {
				return t.Set(dentryKey(rootIno, "ghost"), encodeDentry(4242424, syscall.S_IFREG))
			})
			return func() {
				if _, _, found := e.lookupName(rootIno, "ghost"); found {
					e.t.Errorf("dangling entry still there")
				}
			}
		},
		want: []string{fsckDangling},
	},
	{
		name: "entry type",
		corrupt: func(e *fsckEnv) func() {
			a := e.file(rootIno, "typed", 0, false)
			e.kv(func(t kv.Txn) error { return t.Set(dentryKey(rootIno, "typed"), encodeDentry(a.Ino, syscall.S_IFDIR)) })
			return func() {
				if _, typ, _ := e.lookupName(rootIno, "typed"); typ != syscall.S_IFREG {
					e.t.Errorf("entry type %#o after repair", typ)
				}
			}
		},
		want: []string{fsckTypeMismatch},
	},
	{
		name: "file nlink",
		corrupt: func(e *fsckEnv) func() {
			a := e.file(rootIno, "nl", 0, false)
			e.kv(func(t kv.Txn) error { return setInode(t, a.Ino, func(a *weftv1.Attr) { a.Nlink = 5 }) })
			return func() {
				if n := e.attr(a.Ino).Nlink; n != 1 {
					e.t.Errorf("nlink %d after repair", n)
				}
			}
		},
		want: []string{fsckNlink},
	},
	{
		name: "directory nlink",
		corrupt: func(e *fsckEnv) func() {
			d := e.mkdir(rootIno, "dnl")
			e.mkdir(d.Ino, "sub")
			e.kv(func(t kv.Txn) error { return setInode(t, d.Ino, func(a *weftv1.Attr) { a.Nlink = 9 }) })
			return func() {
				if n := e.attr(d.Ino).Nlink; n != 3 {
					e.t.Errorf("nlink %d after repair, want 3", n)
				}
			}
		},
		want: []string{fsckNlink},
	},
	{
		name: "nameless file",
		corrupt: func(e *fsckEnv) func() {
			a := e.file(rootIno, "lost", 100, false)
			e.kv(func(t kv.Txn) error { return t.Delete(dentryKey(rootIno, "lost")) })
			return func() {
				lf, _, ok := e.lookupName(rootIno, lostFoundName)
				if !ok {
					e.t.Fatalf("no /%s after repair", lostFoundName)
				}
				if ino, _, ok := e.lookupName(lf, "#"+itoa(a.Ino)); !ok || ino != a.Ino {
					e.t.Errorf("file not in /%s", lostFoundName)
				}
				l := e.attr(lf)
				if l.Mode != syscall.S_IFDIR|0o700 || l.Uid != 0 || l.Gid != 0 {
					e.t.Errorf("/%s has mode %#o, owner %d:%d", lostFoundName, l.Mode, l.Uid, l.Gid)
				}
				if e.chunkCopies(a.Ino, 0) != 2 {
					e.t.Errorf("the data of the moved file is gone")
				}
			}
		},
		want: []string{fsckOrphan},
	},
	{
		name: "nameless directory",
		corrupt: func(e *fsckEnv) func() {
			d := e.mkdir(rootIno, "lostdir")
			e.file(d.Ino, "inside", 0, false)
			e.kv(func(t kv.Txn) error { return t.Delete(dentryKey(rootIno, "lostdir")) })
			return nil
		},
		want: []string{fsckNlink, fsckOrphan}, // root counts it as a subdirectory
	},
	{
		name: "directory cycle",
		corrupt: func(e *fsckEnv) func() {
			a := e.mkdir(rootIno, "cyc-a")
			b := e.mkdir(a.Ino, "cyc-b")
			e.kv(func(t kv.Txn) error {
				if err := t.Delete(dentryKey(rootIno, "cyc-a")); err != nil {
					return err
				}
				if err := t.Set(dentryKey(b.Ino, "cyc-a"), encodeDentry(a.Ino, syscall.S_IFDIR)); err != nil {
					return err
				}
				return t.Set(parentKey(a.Ino), be64(b.Ino))
			})
			return nil
		},
		want: []string{fsckNlink, fsckNlink, fsckOrphan},
	},
	{
		name: "second directory name",
		corrupt: func(e *fsckEnv) func() {
			d := e.mkdir(rootIno, "twice")
			e.kv(func(t kv.Txn) error {
				return t.Set(dentryKey(rootIno, "twice-again"), encodeDentry(d.Ino, syscall.S_IFDIR))
			})
			return nil
		},
		want: []string{fsckExtraDirEntry},
	},
	{
		name: "missing parent record",
		corrupt: func(e *fsckEnv) func() {
			d := e.mkdir(rootIno, "noparent")
			e.kv(func(t kv.Txn) error { return t.Delete(parentKey(d.Ino)) })
			return nil
		},
		want: []string{fsckParent},
	},
	{
		name: "wrong parent record",
		corrupt: func(e *fsckEnv) func() {
			d := e.mkdir(rootIno, "wrongparent")
			e.kv(func(t kv.Txn) error { return t.Set(parentKey(d.Ino), be64(d.Ino)) })
			return nil
		},
		want: []string{fsckParent},
	},
	{
		name: "file counter",
		corrupt: func(e *fsckEnv) func() {
			e.kv(func(t kv.Txn) error { return addUint64(t, keyCountFiles, 3) })
			return nil
		},
		want: []string{fsckCounter},
	},
	{
		name: "directory counter",
		corrupt: func(e *fsckEnv) func() {
			e.kv(func(t kv.Txn) error { return addUint64(t, keyCountDirs, 1000) })
			return nil
		},
		want: []string{fsckCounter},
	},
	{
		name: "inode counter",
		corrupt: func(e *fsckEnv) func() {
			a := e.file(rootIno, "top", 0, false)
			e.kv(func(t kv.Txn) error { return t.Set(keyNextIno, be64(a.Ino)) })
			return nil
		},
		want: []string{fsckInoCounter},
	},
	{
		name: "GC entry of a live file",
		corrupt: func(e *fsckEnv) func() {
			a := e.file(rootIno, "queued", 10, false)
			v, _ := proto.Marshal(a.Layout)
			e.kv(func(t kv.Txn) error { return t.Set(gcKey(a.Ino), v) })
			return nil
		},
		want: []string{fsckStaleGC},
	},
	{
		name: "open of an ended session",
		corrupt: func(e *fsckEnv) func() {
			s, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: "gone"})
			if err != nil {
				e.t.Fatal(err)
			}
			a := e.file(rootIno, "opened", 0, false)
			if _, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: a.Ino, Session: s.Session}); err != nil {
				e.t.Fatal(err)
			}
			e.kv(func(t kv.Txn) error { return t.Delete(sessionKey(s.Session)) })
			return nil
		},
		want: []string{fsckStaleOpen},
	},
	{
		name: "orphan of an ended session",
		corrupt: func(e *fsckEnv) func() {
			s, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: "gone"})
			if err != nil {
				e.t.Fatal(err)
			}
			a := e.file(rootIno, "orphaned", 10, false)
			if _, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: a.Ino, Session: s.Session}); err != nil {
				e.t.Fatal(err)
			}
			if err := e.unlinkName(rootIno, "orphaned"); err != nil {
				e.t.Fatal(err)
			}
			e.kv(func(t kv.Txn) error { return t.Delete(sessionKey(s.Session)) })
			return func() {
				if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: a.Ino}); err == nil {
					e.t.Errorf("the orphan was not deleted")
				}
			}
		},
		want:    []string{fsckOrphan, fsckStaleOpen},
		repairs: []string{fsckStaleOpen}, // dropping the open deletes the orphan
	},
	{
		name: "orphan record of a linked file",
		corrupt: func(e *fsckEnv) func() {
			a := e.file(rootIno, "notorphan", 0, false)
			e.kv(func(t kv.Txn) error { return t.Set(orphanKey(a.Ino), nil) })
			return nil
		},
		want: []string{fsckOrphanRecord},
	},
	{
		name: "records of a missing inode",
		corrupt: func(e *fsckEnv) func() {
			e.kv(func(t kv.Txn) error {
				for _, k := range [][]byte{xattrKey(777001, "user.a"), xattrKey(777001, "user.b"), symlinkKey(777002), parentKey(777003), orphanKey(777004)} {
					if err := t.Set(k, be64(1)); err != nil {
						return err
					}
				}
				return nil
			})
			return nil
		},
		want: []string{fsckOrphanRecord, fsckStaleRecord, fsckStaleRecord, fsckStaleRecord},
	},
	{
		name: "symlink without target",
		corrupt: func(e *fsckEnv) func() {
			r, err := e.s.Symlink(e.ctx, &weftv1.SymlinkRequest{Caller: root, Parent: rootIno, Name: "broken", Target: "x"})
			if err != nil {
				e.t.Fatal(err)
			}
			e.kv(func(t kv.Txn) error { return t.Delete(symlinkKey(r.Attr.Ino)) })
			return nil
		},
		want:    []string{fsckNoTarget},
		kept:    []string{fsckNoTarget},
		cleanup: func(e *fsckEnv) { e.unlinkName(rootIno, "broken") },
	},
	{
		name: "chunks of a missing inode",
		corrupt: func(e *fsckEnv) func() {
			ghost := &weftv1.Attr{Ino: 888888, Layout: &weftv1.Layout{ChunkSize: 64 << 10, Chains: e.anyFile().Layout.Chains}}
			e.write(ghost, 0, []byte("nobody's"))
			e.write(ghost, 1, []byte("nobody's"))
			return func() {
				if _, err := e.s.collectGarbage(e.ctx); err != nil {
					e.t.Fatal(err)
				}
				if n := e.chunkCopies(888888, 0) + e.chunkCopies(888888, 1); n != 0 {
					e.t.Errorf("%d copies of the unowned chunks left after the GC", n)
				}
				var next uint64
				e.kv(func(t kv.Txn) error {
					var err error
					next, err = getUint64(t, keyNextIno)
					return err
				})
				if next <= 888888 {
					e.t.Errorf("inode counter %d: the number of the unowned chunks can be handed out again", next)
				}
			}
		},
		want: []string{fsckUnowned},
	},
	{
		name: "chunk past the size",
		corrupt: func(e *fsckEnv) func() {
			a := e.file(rootIno, "short", 10, false)
			e.write(a, 3, []byte("uncommitted"))
			return func() {
				if n := e.chunkCopies(a.Ino, 3); n != 0 {
					e.t.Errorf("%d copies of the tail after the repair, want none (trimmed)", n)
				}
				if n := e.chunkCopies(a.Ino, 0); n != 2 {
					e.t.Errorf("%d copies of the file's own chunk after the trim, want 2", n)
				}
			}
		},
		want:    []string{fsckUnowned},
		cleanup: func(e *fsckEnv) { e.unlinkName(rootIno, "short"); e.s.collectGarbage(e.ctx) },
	},
	{
		name: "chunk missing on a replica",
		corrupt: func(e *fsckEnv) func() {
			a := e.file(rootIno, "halfcopied", 0, false)
			e.writeTail(a, 0, []byte("one copy"))
			if _, err := e.s.CommitWrite(e.ctx, &weftv1.CommitWriteRequest{Caller: root, Ino: a.Ino, Size: 8}); err != nil {
				e.t.Fatal(err)
			}
			return func() {
				if n := e.chunkCopies(a.Ino, 0); n != 2 {
					e.t.Errorf("%d copies after the repair, want 2", n)
				}
			}
		},
		want: []string{fsckMissing},
	},
	{
		name: "chunk corrupt on every replica",
		corrupt: func(e *fsckEnv) func() {
			a := e.file(rootIno, "rotten", 3000, false)
			for _, dir := range e.targets {
				p := filepath.Join(dir, "chunks", fmt.Sprintf("%02x", a.Ino%256), fmt.Sprintf("%x", a.Ino), "0.w")
				b, err := os.ReadFile(p)
				if err != nil {
					e.t.Fatal(err)
				}
				b[2<<20+100] ^= 1 // a byte of the data
				if err := os.WriteFile(p, b, 0o600); err != nil {
					e.t.Fatal(err)
				}
			}
			// The data servers find the bad copies (and cannot repair
			// them: no good one is left).
			c := e.chain(a.Layout.Chains[0])
			for _, m := range c.Members {
				if _, err := e.dataClient(m.Address).Scrub(e.ctx, &weftv1.ScrubRequest{}); err != nil {
					e.t.Fatal(err)
				}
			}
			return nil
		},
		want:    []string{fsckBadCopy, fsckBadCopy},
		kept:    []string{fsckBadCopy, fsckBadCopy},
		cleanup: func(e *fsckEnv) { e.unlinkName(rootIno, "rotten"); e.s.collectGarbage(e.ctx) },
	},
}

func itoa(v uint64) string { return strconv.FormatUint(v, 10) }

// anyFile returns a regular file's attributes (making one).
func (e *fsckEnv) anyFile() *weftv1.Attr {
	e.t.Helper()
	if ino, _, ok := e.lookupName(rootIno, "any"); ok {
		return e.attr(ino)
	}
	return e.file(rootIno, "any", 0, false)
}

// TestFsckFindsAndRepairs damages the namespace and the chunks one way at
// a time under a running service: fsck reports the damage without
// changing anything, --repair fixes it, and the next fsck is clean.
func TestFsckFindsAndRepairs(t *testing.T) {
	e := newFsckEnv(t)
	for _, tc := range fsckCases {
		t.Run(tc.name, func(t *testing.T) {
			e.t = t
			if r := e.fsck(false); len(r.Problems) != 0 {
				t.Fatalf("not clean before the damage:%s", describeProblems(r))
			}
			after := tc.corrupt(e)
			r := e.fsck(false)
			if got, want := kinds(r), sorted(tc.want); !slices.Equal(got, want) {
				t.Fatalf("fsck found %v, want %v:%s", got, want, describeProblems(r))
			}
			again := e.fsck(false)
			if !slices.Equal(kinds(again), kinds(r)) {
				t.Fatalf("fsck without --repair changed something: then %v, now %v", kinds(r), kinds(again))
			}
			r = e.fsck(true)
			var repaired []string
			for _, p := range r.Problems {
				if !p.Repaired && !slices.Contains(tc.kept, p.Kind) {
					t.Errorf("not repaired: %s: %s", p.Kind, p.Detail)
				}
				repaired = append(repaired, p.Kind)
			}
			wantRepairs := tc.repairs
			if wantRepairs == nil {
				wantRepairs = tc.want
			}
			if !slices.Equal(sorted(repaired), sorted(wantRepairs)) {
				t.Errorf("fsck --repair reported %v, want %v:%s", sorted(repaired), sorted(wantRepairs), describeProblems(r))
			}
			if after != nil {
				after()
			}
			r = e.fsck(false)
			var left []string
			for _, p := range r.Problems {
				left = append(left, p.Kind)
			}
			if !slices.Equal(sorted(left), sorted(tc.kept)) {
				t.Errorf("after --repair fsck finds %v, want %v:%s", sorted(left), sorted(tc.kept), describeProblems(r))
			}
			if tc.cleanup != nil {
				tc.cleanup(e)
				waitClean(t, e)
			}
		})
	}
}

// waitClean waits for fsck to find nothing (the GC may still be deleting).
func waitClean(t *testing.T, e *fsckEnv) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := e.fsck(false)
		if len(r.Problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not clean after the cleanup:%s", describeProblems(r))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// TestFsckOnline runs fsck --repair again and again while a workload
// creates, writes, links, renames and removes files and directories (as a
// mount does: files are written while open): fsck must not report, let
// alone repair, anything.
func TestFsckOnline(t *testing.T) {
	e := newFsckEnv(t)
	dirs := []*weftv1.Attr{e.mkdir(rootIno, "w0"), e.mkdir(rootIno, "w1"), e.mkdir(rootIno, "w2")}
	stop := make(chan struct{})
	done := make(chan error, 1)
	var iterations atomic.Int64
	go func() {
		done <- func() error {
			for i := 0; ; i++ {
				iterations.Store(int64(i))
				select {
				case <-stop:
					return nil
				default:
				}
				d, d2 := dirs[i%3], dirs[(i+1)%3]
				name := "f" + itoa(uint64(i))
				a, err := e.fileErr(d.Ino, name, 1+i%3*40000, true)
				if err != nil {
					return err
				}
				ops := []func() error{
					func() error {
						_, err := e.s.Link(e.ctx, &weftv1.LinkRequest{Caller: root, Ino: a.Ino, NewParent: d2.Ino, NewName: name + "l"})
						return err
					},
					func() error {
						_, err := e.s.Rename(e.ctx, &weftv1.RenameRequest{Caller: root, OldParent: d.Ino, OldName: name, NewParent: d2.Ino, NewName: name + "r"})
						return err
					},
					func() error {
						_, err := e.s.Mkdir(e.ctx, &weftv1.MkdirRequest{Caller: root, Parent: d.Ino, Name: name + "d", Mode: 0o755})
						if err == nil {
							_, err = e.s.Rename(e.ctx, &weftv1.RenameRequest{Caller: root, OldParent: d.Ino, OldName: name + "d", NewParent: d2.Ino, NewName: name + "d"})
						}
						return err
					},
					func() error { return e.unlinkName(d.Ino, name) }, // unlinked while open
				}
				if err := ops[i%len(ops)](); err != nil {
					return err
				}
				if _, err := e.s.Release(e.ctx, &weftv1.ReleaseRequest{Ino: a.Ino, Session: e.session}); err != nil {
					return err
				}
				if i%4 == 3 {
					if err := e.unlinkName(dirs[(i-1)%3].Ino, "f"+itoa(uint64(i-2))+"r"); err != nil {
						return err
					}
					if _, err := e.s.Rmdir(e.ctx, &weftv1.RemoveRequest{Caller: root, Parent: dirs[i%3].Ino, Name: "f" + itoa(uint64(i-1)) + "d"}); err != nil {
						return err
					}
				}
			}
		}()
	}()
	for round := range 6 {
		before := iterations.Load()
		r := e.fsck(round%2 == 1)
		t.Logf("round %d: %d inodes, %d chunk copies, %d workload steps meanwhile", round, r.InodesChecked, r.ChunksChecked, iterations.Load()-before)
		if len(r.Problems) != 0 {
			close(stop)
			<-done
			t.Fatalf("round %d: fsck of a file system in use found:%s", round, describeProblems(r))
		}
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("workload: %v", err)
	}
	if r := e.fsck(false); len(r.Problems) != 0 {
		t.Fatalf("after the workload:%s", describeProblems(r))
	}
}
