package meta

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestFsckOnEtcd repairs damage on the etcd engine, whose transactions
// take at most 128 operations: many records of a missing inode, a large
// directory with a wrong link count, a file without a name, a counter.
func TestFsckOnEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	s := openService(t, openEtcd(t, srv, "/fsck/"), nil)
	ctx := context.Background()
	d, err := s.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: "big", Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if _, err := s.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: d.Attr.Ino, Name: fmt.Sprint("s", i), Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
	}
	f, err := s.Create(ctx, &weftv1.CreateRequest{Caller: root, Parent: rootIno, Name: "lost", Mode: syscall.S_IFIFO | 0o644})
	if err != nil {
		t.Fatal(err)
	}
	err = s.eng.Update(ctx, func(t kv.Txn) error {
		for i := range 120 {
			if err := t.Set(xattrKey(555555, fmt.Sprint("user.", i)), []byte("v")); err != nil {
				return err
			}
		}
		if err := setInode(t, d.Attr.Ino, func(a *weftv1.Attr) { a.Nlink = 3 }); err != nil {
			return err
		}
		if err := t.Delete(dentryKey(rootIno, "lost")); err != nil {
			return err
		}
		return addUint64(t, keyCountDirs, 7)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := sorted([]string{fsckCounter, fsckNlink, fsckOrphan, fsckStaleRecord})
	for _, repair := range []bool{false, true} {
		r, err := s.Fsck(ctx, &weftv1.FsckRequest{Repair: repair})
		if err != nil {
			t.Fatalf("fsck (repair %v): %v", repair, err)
		}
		var got []string
		for _, p := range r.Problems {
			got = append(got, p.Kind)
			if p.Repaired != repair {
				t.Errorf("repair %v: %s repaired %v", repair, p.Kind, p.Repaired)
			}
		}
		if fmt.Sprint(sorted(got)) != fmt.Sprint(want) {
			t.Fatalf("repair %v: found %v, want %v:%s", repair, sorted(got), want, describeProblems(r))
		}
	}
	r, err := s.Fsck(ctx, &weftv1.FsckRequest{})
	if err != nil || len(r.Problems) != 0 {
		t.Fatalf("after the repair: %v%s", err, describeProblems(r))
	}
	if a, err := s.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: f.Attr.Ino}); err != nil || a.Attr.Nlink != 1 {
		t.Errorf("the nameless file after the repair: %v, %v", a, err)
	}
}
