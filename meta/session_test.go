package meta

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestCloseSessionManyOpens closes sessions with more open files than one
// transaction of the etcd engine may touch, on pebble (the etcd test of the
// same name runs it over etcd).
func TestCloseSessionManyOpens(t *testing.T) {
	checkCloseManyOpens(t, openService(t, nil, startChunkServer(t)))
}

// countKeys counts the keys starting with prefix.
func countKeys(t *testing.T, s *Service, prefix []byte) uint64 {
	t.Helper()
	var n uint64
	err := s.view(context.Background(), func(x *tx) error {
		var err error
		n, err = countPrefix(x.t, prefix)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func statusOf(t *testing.T, s *Service) *weftv1.StatusResponse {
	t.Helper()
	st, err := s.Status(context.Background(), &weftv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// openFiles creates n files named prefix-<i> in the root, open by session
// sess, and unlinks those for which orphan(i) holds, after giving them
// xattrs(i) extended attributes. It returns the files and which of them
// are orphans.
func openFiles(t *testing.T, s *Service, sess, prefix string, n int, orphan func(int) bool, xattrs func(int) int) (files []*weftv1.Attr, orphans map[uint64]bool) {
	t.Helper()
	ctx := context.Background()
	orphans = map[uint64]bool{}
	for i := range n {
		name := fmt.Sprintf("%s-%03d", prefix, i)
		r, err := s.Create(ctx, &weftv1.CreateRequest{Caller: root, Parent: rootIno, Name: name, Mode: 0o644, Exclusive: true, Session: sess})
		if err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
		if len(r.Attr.Layout.GetChains()) == 0 {
			t.Fatalf("file %s has no chains", name)
		}
		files = append(files, r.Attr)
		if !orphan(i) {
			continue
		}
		for j := range xattrs(i) {
			if _, err := s.SetXattr(ctx, &weftv1.SetXattrRequest{Caller: root, Ino: r.Attr.Ino, Name: fmt.Sprintf("user.k%d", j), Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Unlink(ctx, &weftv1.RemoveRequest{Caller: root, Parent: rootIno, Name: name}); err != nil {
			t.Fatalf("unlink %s: %v", name, err)
		}
		orphans[r.Attr.Ino] = true
	}
	return files, orphans
}

// checkCloseManyOpens has a session with 200 open files, 88 of them
// unlinked (a run of 60 orphans in a row, then every fifth; some with
// extended attributes, two with 40), one of those
// also open by a second session, one plain file opened twice. Closing the
// session drops all its opens, deletes the orphans only it had open (queued
// for GC) and keeps the rest. A third session with 100 open files is taken
// apart by one step of the close only, as a meta server stopping half way
// would: it can no longer be renewed or open files, and expiry finishes
// closing it.
func checkCloseManyOpens(t *testing.T, s *Service) {
	t.Helper()
	ctx := context.Background()
	openSession := func(host string) string {
		r, err := s.OpenSession(ctx, &weftv1.OpenSessionRequest{Host: host})
		if err != nil {
			t.Fatal(err)
		}
		return r.Session
	}
	big, other := openSession("big"), openSession("other")
	const n = 200
	xattrs := func(i int) int {
		switch {
		case i == 45 || i == 150:
			return 40
		case i%7 == 0:
			return 1
		}
		return 0
	}
	files, orphans := openFiles(t, s, big, "f", n, func(i int) bool { return i < 60 || i%5 == 0 }, xattrs)
	if len(orphans) != 88 {
		t.Fatalf("%d orphans, want 88", len(orphans))
	}
	shared, twice := files[30].Ino, files[101].Ino
	for _, o := range []struct {
		ino  uint64
		sess string
	}{{shared, other}, {twice, big}} {
		if _, err := s.Open(ctx, &weftv1.OpenRequest{Caller: root, Ino: o.ino, Session: o.sess}); err != nil {
			t.Fatal(err)
		}
	}
	before := statusOf(t, s)

	if _, err := s.CloseSession(ctx, &weftv1.CloseSessionRequest{Session: big}); err != nil {
		t.Fatalf("close session with %d open files: %v", n, err)
	}
	st := statusOf(t, s)
	if st.Sessions != 1 || st.GcPending != before.GcPending+uint64(len(orphans)-1) || st.Files != before.Files-uint64(len(orphans)-1) {
		t.Errorf("after close: %d sessions, %d queued for GC, %d files; want 1, %d, %d",
			st.Sessions, st.GcPending, st.Files, before.GcPending+uint64(len(orphans)-1), before.Files-uint64(len(orphans)-1))
	}
	for _, c := range []struct {
		prefix []byte
		want   uint64
	}{{sessionOpensPrefix(big), 0}, {prefixOpen, 1}, {prefixSessOpn, 1}, {prefixOrphan, 1}, {prefixXattr, 0}} {
		if got := countKeys(t, s, c.prefix); got != c.want {
			t.Errorf("%d keys under %q after the close, want %d", got, c.prefix, c.want)
		}
	}
	for _, a := range files {
		_, err := s.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: a.Ino})
		switch {
		case orphans[a.Ino] && a.Ino != shared:
			if errnoOf(t, err) != syscall.ENOENT {
				t.Errorf("orphan %d open only by the closed session: %v, want ENOENT", a.Ino, err)
			}
		case err != nil:
			t.Errorf("inode %d after the close: %v", a.Ino, err)
		}
	}
	if _, err := s.Open(ctx, &weftv1.OpenRequest{Caller: root, Ino: files[151].Ino, Session: big}); errnoOf(t, err) != syscall.ESTALE {
		t.Errorf("open in the closed session: %v, want ESTALE", err)
	}

	// A close that stopped after its first step.
	half := openSession("half")
	files, orphans = openFiles(t, s, half, "h", 100, func(i int) bool { return i%3 == 0 }, xattrs)
	before = statusOf(t, s)
	if done, err := s.endSessionStep(ctx, half, false); err != nil || done {
		t.Fatalf("first step of closing a session with 100 open files: done %v, %v; want more steps", done, err)
	}
	left := countKeys(t, s, sessionOpensPrefix(half))
	if left == 0 || left == 100 {
		t.Fatalf("%d of 100 opens left after one step", left)
	}
	if _, err := s.RenewSession(ctx, &weftv1.RenewSessionRequest{Session: half}); errnoOf(t, err) != syscall.ESTALE {
		t.Errorf("renew of a session being closed: %v, want ESTALE", err)
	}
	if _, err := s.Open(ctx, &weftv1.OpenRequest{Caller: root, Ino: files[99].Ino, Session: half}); errnoOf(t, err) != syscall.ESTALE {
		t.Errorf("open in a session being closed: %v, want ESTALE", err)
	}
	if err := s.expireSessions(ctx); err != nil {
		t.Fatalf("expiry finishing an interrupted close: %v", err)
	}
	st = statusOf(t, s)
	if st.Sessions != 1 || st.GcPending != before.GcPending+uint64(len(orphans)) || countKeys(t, s, sessionOpensPrefix(half)) != 0 {
		t.Errorf("after expiry finished the close: %d sessions, %d queued for GC, %d opens left; want 1, %d, 0",
			st.Sessions, st.GcPending, countKeys(t, s, sessionOpensPrefix(half)), before.GcPending+uint64(len(orphans)))
	}

	if _, err := s.CloseSession(ctx, &weftv1.CloseSessionRequest{Session: other}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: shared}); errnoOf(t, err) != syscall.ENOENT {
		t.Errorf("orphan survived the close of its last session: %v", err)
	}
	for _, p := range [][]byte{prefixSession, prefixOpen, prefixSessOpn, prefixOrphan} {
		if got := countKeys(t, s, p); got != 0 {
			t.Errorf("%d keys under %q after every session ended", got, p)
		}
	}
}
