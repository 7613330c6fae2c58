package meta

import (
	"context"
	"errors"
	"fmt"
	"google.golang.org/protobuf/proto"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestPersistenceAcrossRestart(t *testing.T) {
	e := newEnv(t)
	fx := e.fixture()
	if _, err := e.s.SetXattr(e.ctx, &weftv1.SetXattrRequest{Caller: alice, Ino: fx.f.Ino, Name: "user.k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.SetLayout(e.ctx, &weftv1.SetLayoutRequest{Caller: root, Ino: fx.tmp.Ino, Layout: &weftv1.Layout{StripeCount: 2}}); err != nil {
		t.Fatal(err)
	}
	gone := e.create(alice, fx.aliceDir.Ino, "gone", 0o644)
	if err := e.unlink(alice, fx.aliceDir.Ino, "gone"); err != nil {
		t.Fatal(err)
	}
	before := e.getattr(fx.f.Ino)

	e.reopen()

	after, err := e.lookup(alice, fx.aliceDir.Ino, "f")
	if err != nil {
		t.Fatal(err)
	}
	if after.String() != before.String() {
		t.Fatalf("attrs changed across restart:\n%v\n%v", before, after)
	}
	x, err := e.s.GetXattr(e.ctx, &weftv1.GetXattrRequest{Caller: alice, Ino: fx.f.Ino, Name: "user.k"})
	if err != nil || string(x.Value) != "v" {
		t.Fatalf("xattr after restart: %v, %v", x, err)
	}
	wantNames(t, e, rootIno, "home", "sg", "tmp")
	if a := e.create(alice, fx.tmp.Ino, "new", 0o644); a.Ino <= gone.Ino || len(a.Layout.Chains) != 2 {
		t.Fatalf("after restart: new inode %d (deleted one was %d), layout %v", a.Ino, gone.Ino, a.Layout)
	}
	if e.gcPending() != 1 {
		t.Fatalf("GC queue lost across restart")
	}
}

func TestInodeNumbersNeverReused(t *testing.T) {
	e := newEnv(t)
	seen := map[uint64]bool{rootIno: true}
	for round := range 3 {
		for i := range 5 {
			name := string(rune('a' + i))
			a := e.create(root, rootIno, name, 0o644)
			if seen[a.Ino] {
				t.Fatalf("round %d: inode %d reused", round, a.Ino)
			}
			seen[a.Ino] = true
			if err := e.unlink(root, rootIno, name); err != nil {
				t.Fatal(err)
			}
		}
		e.reopen()
	}
}

func TestOrphanLivesUntilLastRelease(t *testing.T) {
	e := newEnv(t)
	s1, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: "h1", MountPoint: "/m"})
	if err != nil {
		t.Fatal(err)
	}
	s2, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: "h2", MountPoint: "/m"})
	if err != nil {
		t.Fatal(err)
	}
	cr, err := e.s.Create(e.ctx, &weftv1.CreateRequest{Caller: alice, Parent: rootIno, Name: "o", Mode: 0o644, Session: s1.Session})
	if err == nil {
		t.Fatal("alice created a file in root's 0755 directory")
	}
	cr, err = e.s.Create(e.ctx, &weftv1.CreateRequest{Caller: root, Parent: rootIno, Name: "o", Mode: 0o644, Session: s1.Session, Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	ino := cr.Attr.Ino
	for _, sess := range []string{s1.Session, s2.Session} {
		if _, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: ino, Flags: syscall.O_RDWR, Session: sess}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.unlink(root, rootIno, "o"); err != nil {
		t.Fatal(err)
	}
	if a := e.getattr(ino); a.Nlink != 0 {
		t.Fatalf("orphan nlink = %d", a.Nlink)
	}
	if _, err := e.lookup(root, rootIno, "o"); errnoOf(t, err) != syscall.ENOENT {
		t.Fatalf("orphan still has a name: %v", err)
	}
	if _, err := e.s.Link(e.ctx, &weftv1.LinkRequest{Caller: root, Ino: ino, NewParent: rootIno, NewName: "back"}); errnoOf(t, err) != syscall.ENOENT {
		t.Fatalf("link of an orphan: %v", err)
	}
	// The orphan is still writable through its open handle.
	if _, err := e.s.CommitWrite(e.ctx, &weftv1.CommitWriteRequest{Caller: root, Ino: ino, Size: 10}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		session string
		gone    bool
	}{
		{s1.Session, false}, // s1 had it open twice (create + open)
		{s2.Session, false},
		{s2.Session, false}, // releasing what is not open is harmless
		{s1.Session, true},
	}
	for i, st := range steps {
		if _, err := e.s.Release(e.ctx, &weftv1.ReleaseRequest{Ino: ino, Session: st.session}); err != nil {
			t.Fatal(err)
		}
		_, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: ino})
		if gone := errnoOf(t, err) == syscall.ENOENT; gone != st.gone {
			t.Fatalf("step %d: gone = %v, want %v (err %v)", i, gone, st.gone, err)
		}
		if want := map[bool]uint64{false: 0, true: 1}[st.gone]; e.gcPending() != want {
			t.Fatalf("step %d: gc pending %d, want %d", i, e.gcPending(), want)
		}
	}
	n, err := e.s.collectGarbage(e.ctx)
	if err != nil || n != 1 || e.data.deletedCount(ino) != 1 || e.gcPending() != 0 {
		t.Fatalf("GC: collected %d, err %v, data server deletes %d, pending %d", n, err, e.data.deletedCount(ino), e.gcPending())
	}
}

func TestGCRetriesWithBackoff(t *testing.T) {
	e := newEnv(t)
	a := e.create(root, rootIno, "f", 0o644)
	if err := e.unlink(root, rootIno, "f"); err != nil {
		t.Fatal(err)
	}
	e.data.mu.Lock()
	e.data.failDel = true
	e.data.mu.Unlock()
	if n, err := e.s.collectGarbage(e.ctx); err != nil || n != 0 || e.gcPending() != 1 {
		t.Fatalf("failing GC pass: %d, %v, pending %d", n, err, e.gcPending())
	}
	e.data.mu.Lock()
	e.data.failDel = false
	e.data.mu.Unlock()
	if n, _ := e.s.collectGarbage(e.ctx); n != 0 {
		t.Fatal("GC retried before its backoff ran out")
	}
	e.s.gcMu.Lock()
	e.s.gcRetryAt[a.Ino] = gcRetry{at: time.Now().Add(-time.Second), backoff: time.Second}
	e.s.gcMu.Unlock()
	if n, err := e.s.collectGarbage(e.ctx); err != nil || n != 1 || e.gcPending() != 0 {
		t.Fatalf("GC after backoff: %d, %v, pending %d", n, err, e.gcPending())
	}
}

// TestGCKeepsLiveFiles checks that a GC queue entry of an inode that
// still exists (only damaged metadata makes one) does not get the live
// file's chunks deleted: the entry stays for weft fsck to report; that a
// full batch of such entries does not keep the queue's other files from
// being collected; and that once the file is deleted, its chunks are.
func TestGCKeepsLiveFiles(t *testing.T) {
	e := newEnv(t)
	var live []*weftv1.Attr
	for i := range gcBatch + 1 {
		a := e.create(root, rootIno, fmt.Sprintf("live%d", i), 0o644)
		v, err := proto.Marshal(a.Layout)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.s.update(e.ctx, func(x *tx) error { return x.t.Set(gcKey(a.Ino), v) }); err != nil {
			t.Fatal(err)
		}
		live = append(live, a)
	}
	gone := e.create(root, rootIno, "gone", 0o644)
	if err := e.unlink(root, rootIno, "gone"); err != nil {
		t.Fatal(err)
	}
	collected := 0
	for range 3 {
		n, err := e.s.collectGarbage(e.ctx)
		if err != nil {
			t.Fatalf("GC pass: %v", err)
		}
		collected += n
	}
	if collected != 1 || e.data.deletedCount(gone.Ino) != 1 {
		t.Fatalf("collected %d (deleted file's chunks deleted %d times); want the deleted file alone", collected, e.data.deletedCount(gone.Ino))
	}
	for _, a := range live {
		if d := e.data.deletedCount(a.Ino); d != 0 {
			t.Fatalf("the chunks of live file %d were deleted %d times", a.Ino, d)
		}
	}
	if p := e.gcPending(); p != uint64(len(live)) {
		t.Fatalf("GC pending %d, want the %d live entries kept for fsck", p, len(live))
	}
	// Once the file is really deleted, its chunks go.
	if err := e.unlink(root, rootIno, "live0"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := e.s.collectGarbage(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if d := e.data.deletedCount(live[0].Ino); d != 1 {
		t.Fatalf("the chunks of the file deleted after its stale entry were deleted %d times, want 1", d)
	}
}

func TestSessionExpiryDropsOpens(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	e.s.now = func() time.Time { return now }
	live, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: "live"})
	if err != nil {
		t.Fatal(err)
	}
	dead, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: "dead"})
	if err != nil {
		t.Fatal(err)
	}
	if dead.LeaseMs != e.lease.Milliseconds() {
		t.Fatalf("lease %d ms", dead.LeaseMs)
	}
	a := e.create(root, rootIno, "f", 0o644)
	b := e.create(root, rootIno, "g", 0o644)
	for _, o := range []struct {
		ino     uint64
		session string
	}{{a.Ino, dead.Session}, {b.Ino, dead.Session}, {b.Ino, live.Session}} {
		if _, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: o.ino, Session: o.session}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"f", "g"} {
		if err := e.unlink(root, rootIno, n); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(e.lease * 2 / 3)
	if _, err := e.s.RenewSession(e.ctx, &weftv1.RenewSessionRequest{Session: live.Session}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(e.lease * 2 / 3)
	if err := e.s.expireSessions(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: a.Ino}); errnoOf(t, err) != syscall.ENOENT {
		t.Fatalf("orphan open only by the expired session survived: %v", err)
	}
	if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: b.Ino}); err != nil {
		t.Fatalf("orphan still open by a live session: %v", err)
	}
	if _, err := e.s.RenewSession(e.ctx, &weftv1.RenewSessionRequest{Session: dead.Session}); errnoOf(t, err) != syscall.ESTALE {
		t.Fatalf("renew of expired session: %v", err)
	}
	if _, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: b.Ino, Session: dead.Session}); errnoOf(t, err) != syscall.ESTALE {
		t.Fatalf("open in expired session: %v", err)
	}
	if _, err := e.s.CloseSession(e.ctx, &weftv1.CloseSessionRequest{Session: live.Session}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: b.Ino}); errnoOf(t, err) != syscall.ENOENT {
		t.Fatalf("orphan survived the close of its last session: %v", err)
	}
	if st, _ := e.s.Status(e.ctx, &weftv1.StatusRequest{}); st.Sessions != 0 || st.GcPending != 2 || st.Files != 0 {
		t.Fatalf("status after sessions ended: %v", st)
	}
}

// TestServe runs the service over real gRPC: errnos cross the wire and
// Serve returns after its context ends.
func TestServe(t *testing.T) {
	e := newEnv(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.s.Serve(ctx, lis) }()
	cc, err := rpc.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := weftv1.NewMetaClient(cc)
	if _, err := c.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: "d", Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	_, err = c.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: "d", Mode: 0o755})
	if !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("second mkdir over gRPC: %v", err)
	}
	if _, err := c.GetChains(ctx, &weftv1.GetChainsRequest{}); err != nil {
		t.Fatal(err)
	}
	// The renewal of a session the service does not know (it expired
	// while its client was paused) fails with ESTALE, and the service
	// goes on serving.
	for _, replay := range []bool{false, true} {
		_, err = c.RenewSession(ctx, &weftv1.RenewSessionRequest{Session: "0123456789abcdef", Replay: replay})
		if !errors.Is(err, syscall.ESTALE) {
			t.Fatalf("renew an unknown session over gRPC (replay %v): %v, want ESTALE", replay, err)
		}
	}
	if _, err := c.OpenSession(ctx, &weftv1.OpenSessionRequest{Host: "h"}); err != nil {
		t.Fatalf("open a session after renewing an unknown one: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
}

// TestSessionsSurviveRestart checks that a meta server restart gives every
// session a fresh lease to renew in, so open files stay open.
func TestSessionsSurviveRestart(t *testing.T) {
	e := newEnv(t)
	e.lease = 200 * time.Millisecond
	e.reopen()
	sess, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: "h"})
	if err != nil {
		t.Fatal(err)
	}
	cr, err := e.s.Create(e.ctx, &weftv1.CreateRequest{Caller: root, Parent: rootIno, Name: "f", Mode: 0o644, Session: sess.Session})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.unlink(root, rootIno, "f"); err != nil {
		t.Fatal(err)
	}
	e.s.Close()
	time.Sleep(2 * e.lease) // the meta server is down longer than the lease
	e.open()
	if err := e.s.expireSessions(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.RenewSession(e.ctx, &weftv1.RenewSessionRequest{Session: sess.Session}); err != nil {
		t.Fatalf("renew after restart: %v", err)
	}
	if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: cr.Attr.Ino}); err != nil {
		t.Fatalf("open orphan lost across restart: %v", err)
	}
	time.Sleep(2 * e.lease)
	if err := e.s.expireSessions(e.ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: cr.Attr.Ino}); errnoOf(t, err) != syscall.ENOENT {
		t.Fatalf("orphan of an expired session: %v", err)
	}
}

// TestNoDataServers checks that without chains new regular files fail with
// ENOSPC (after the permission checks) while the rest of the namespace
// works.
func TestNoDataServers(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{Dir: t.TempDir(), Logger: quietLogger(), Cluster: cluster.Config{Logger: quietLogger()}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		c    *weftv1.Caller
		mode uint32
		want syscall.Errno
	}{
		{alice, 0o644, syscall.EACCES},
		{root, 0o644, syscall.ENOSPC},
		{root, syscall.S_IFIFO | 0o644, 0},
	} {
		_, err := s.Create(ctx, &weftv1.CreateRequest{Caller: tc.c, Parent: rootIno, Name: "f", Mode: tc.mode})
		wantErrno(t, err, tc.want)
	}
	if _, err := s.Mkdir(ctx, &weftv1.MkdirRequest{Caller: root, Parent: rootIno, Name: "d", Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	st, err := s.StatFS(ctx, &weftv1.StatFSRequest{})
	if err != nil || st.TotalBytes != 0 || st.Files != 3 {
		t.Fatalf("statfs %v, %v", st, err)
	}
}

// One Release call with more_inos releases every file it names, in one
// transaction: orphans among them go, the others lose one open each.
func TestReleaseBatch(t *testing.T) {
	e := newEnv(t)
	s, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: "h", MountPoint: "/m"})
	if err != nil {
		t.Fatal(err)
	}
	var inos []uint64
	for i := range 5 {
		cr, err := e.s.Create(e.ctx, &weftv1.CreateRequest{Caller: root, Parent: rootIno, Name: "b" + string(rune('0'+i)), Mode: 0o644, Session: s.Session, Exclusive: true})
		if err != nil {
			t.Fatal(err)
		}
		inos = append(inos, cr.Attr.Ino)
	}
	// Files 0 and 1 are unlinked while open (orphans); file 4 is open
	// twice.
	for _, name := range []string{"b0", "b1"} {
		if err := e.unlink(root, rootIno, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: inos[4], Flags: syscall.O_RDONLY, Session: s.Session}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.Release(e.ctx, &weftv1.ReleaseRequest{Ino: inos[0], Session: s.Session, MoreInos: inos[1:]}); err != nil {
		t.Fatal(err)
	}
	for i, ino := range inos {
		_, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: ino})
		if gone := errnoOf(t, err) == syscall.ENOENT; gone != (i < 2) {
			t.Errorf("file %d: gone = %v after the batched release (err %v)", i, gone, err)
		}
	}
	if e.gcPending() != 2 {
		t.Errorf("gc pending %d, want the 2 orphans", e.gcPending())
	}
	// File 4 is still open once: a second release closes it.
	open := func() bool {
		var n uint64
		err := e.s.view(e.ctx, func(x *tx) error {
			var err error
			n, err = getUint64(x.t, openKey(inos[4], s.Session))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	if !open() {
		t.Fatal("file opened twice is closed after one release")
	}
	if _, err := e.s.Release(e.ctx, &weftv1.ReleaseRequest{Ino: inos[4], Session: s.Session}); err != nil {
		t.Fatal(err)
	}
	if open() {
		t.Fatal("file still open after its last release")
	}
	big := make([]uint64, maxReleaseBatch+1)
	if _, err := e.s.Release(e.ctx, &weftv1.ReleaseRequest{Ino: 1, Session: s.Session, MoreInos: big}); errnoOf(t, err) != syscall.EINVAL {
		t.Fatalf("release of %d files in one call: %v, want EINVAL", len(big)+1, err)
	}
}
