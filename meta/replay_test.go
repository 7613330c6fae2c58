package meta

import (
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/pebblekv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// crash stops the service as a crash would (no clean-stop record) and
// opens it again.
func (e *env) crash() {
	e.t.Helper()
	e.s.closeOnce.Do(func() {
		e.s.cluster.Close()
		e.s.eng.Close()
	})
	e.open()
}

// lazyGroups is how many commit groups the engine wrote without a sync.
func (e *env) lazyGroups() uint64 { return e.s.eng.(*pebblekv.Engine).LazyGroups() }

// session opens a session; fails the test on error.
func (e *env) session(host string) string {
	e.t.Helper()
	r, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: host})
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Session
}

// openCount is the open count of ino recorded for session.
func (e *env) openCount(ino uint64, session string) uint64 {
	e.t.Helper()
	var n uint64
	if err := e.s.view(e.ctx, func(x *tx) error {
		var err error
		n, err = getUint64(x.t, openKey(ino, session))
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// forgetOpens drops every open record, as a crash may lose them.
func (e *env) forgetOpens() {
	e.t.Helper()
	if err := e.s.eng.Update(e.ctx, func(t kv.Txn) error {
		for _, p := range [][]byte{prefixOpen, prefixSessOpn} {
			if err := deletePrefix(t, p); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
}

// Opens commit lazily on the embedded engine unless OpenGrace is
// negative; creates and other changes always sync.
func TestOpensCommitLazily(t *testing.T) {
	for _, tt := range []struct {
		name  string
		grace time.Duration
		lazy  bool
	}{
		{"default", 0, true},
		{"negative grace: synced", -1, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := &env{t: t, ctx: t.Context(), dir: t.TempDir(), lease: time.Minute, grace: tt.grace, data: startChunkServer(t)}
			e.open()
			t.Cleanup(func() { e.s.Close() })
			sess := e.session("h")
			before := e.lazyGroups()
			a := e.create(root, rootIno, "f", 0o644)
			if e.lazyGroups() != before {
				t.Fatal("a create committed without a sync")
			}
			if _, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: a.Ino, Flags: syscall.O_RDONLY, Session: sess}); err != nil {
				t.Fatal(err)
			}
			if got := e.lazyGroups() > before; got != tt.lazy {
				t.Errorf("the open committed lazily: %v, want %v", got, tt.lazy)
			}
			if (e.s.epoch != "") != tt.lazy {
				t.Errorf("epoch %q with lazy opens %v", e.s.epoch, tt.lazy)
			}
		})
	}
}

// A grace period follows a start after a crash, and every start after it
// until its sweep of orphans has run: not a first start, not a start
// after a clean stop. Every start has a new epoch.
func TestGraceOnlyAfterCrash(t *testing.T) {
	e := newEnv(t)
	sweep := func() {
		e.s.graceUntil = time.Now().UnixNano() // over: graceLoop sweeps at once
		e.s.graceLoop(e.ctx)
		e.reopen()
	}
	steps := []struct {
		name    string
		restart func()
		grace   bool
	}{
		{"first start", func() {}, false},
		{"after a clean stop", e.reopen, false},
		{"after a crash", e.crash, true},
		{"after a clean stop during the grace period", e.reopen, true},
		{"after a crash during the grace period", e.crash, true},
		{"after the sweep and a clean stop", sweep, false},
		{"after a clean stop again", e.reopen, false},
	}
	seen := map[string]bool{}
	for _, st := range steps {
		st.restart()
		if got := e.s.graceUntil > time.Now().UnixNano(); got != st.grace {
			t.Errorf("%s: grace period %v, want %v", st.name, got, st.grace)
		}
		status, err := e.s.Status(e.ctx, &weftv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got := status.OpenGraceLeftMs > 0; got != st.grace {
			t.Errorf("%s: status says %d ms of grace left, want some: %v", st.name, status.OpenGraceLeftMs, st.grace)
		}
		if e.s.epoch == "" || seen[e.s.epoch] {
			t.Errorf("%s: epoch %q is empty or not new", st.name, e.s.epoch)
		}
		seen[e.s.epoch] = true
	}
}

// A replay sets a session's open records to the counts it sends (up or
// down), drops the session's records of files it does not list, and
// skips files that no longer exist.
func TestReplaySetsOpenCounts(t *testing.T) {
	e := newEnv(t)
	sess := e.session("h")
	f := e.create(root, rootIno, "f", 0o644)
	g := e.create(root, rootIno, "g", 0o644)
	h := e.create(root, rootIno, "h", 0o644)
	for _, ino := range []uint64{g.Ino, g.Ino, g.Ino, h.Ino} {
		if _, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: ino, Flags: syscall.O_RDONLY, Session: sess}); err != nil {
			t.Fatal(err)
		}
	}
	const missing = 1 << 40
	if _, err := e.s.RenewSession(e.ctx, &weftv1.RenewSessionRequest{Session: sess}); err != nil {
		t.Fatal(err)
	}
	if got := e.openCount(h.Ino, sess); got != 1 {
		t.Fatalf("a renewal without a replay changed an open count: %d, want 1", got)
	}
	_, err := e.s.RenewSession(e.ctx, &weftv1.RenewSessionRequest{Session: sess, Replay: true, Reopen: []*weftv1.OpenCount{
		{Ino: f.Ino, Count: 2}, {Ino: g.Ino, Count: 1}, {Ino: missing, Count: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		ino  uint64
		want uint64
	}{{"raised", f.Ino, 2}, {"lowered", g.Ino, 1}, {"not listed", h.Ino, 0}, {"missing", missing, 0}} {
		if got := e.openCount(c.ino, sess); got != c.want {
			t.Errorf("%s (inode %d): open count %d, want %d", c.name, c.ino, got, c.want)
		}
	}
	// A new session can take over the opens of one that expired.
	r, err := e.s.OpenSession(e.ctx, &weftv1.OpenSessionRequest{Host: "h", Reopen: []*weftv1.OpenCount{{Ino: f.Ino, Count: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.openCount(f.Ino, r.Session); got != 1 {
		t.Errorf("new session: open count %d, want 1", got)
	}
}

// A release commits lazily, unless it deletes a file (the last release
// of an orphan): that one syncs.
func TestReleaseSyncsOnlyWhenItDeletes(t *testing.T) {
	e := newEnv(t)
	sess := e.session("h")
	a := e.create(root, rootIno, "f", 0o644)
	open := func() {
		if _, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: a.Ino, Flags: syscall.O_RDONLY, Session: sess}); err != nil {
			t.Fatal(err)
		}
	}
	release := func() (lazy bool) {
		before := e.lazyGroups()
		if _, err := e.s.Release(e.ctx, &weftv1.ReleaseRequest{Ino: a.Ino, Session: sess}); err != nil {
			t.Fatal(err)
		}
		return e.lazyGroups() > before
	}
	open()
	open()
	if !release() {
		t.Error("a release that deletes nothing synced")
	}
	if err := e.unlink(root, rootIno, "f"); err != nil {
		t.Fatal(err)
	}
	gc := e.gcPending()
	if release() {
		t.Error("the last release of an orphan, which deletes it, committed lazily")
	}
	if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: a.Ino}); errnoOf(t, err) != syscall.ENOENT || e.gcPending() != gc+1 {
		t.Errorf("the orphan after its last release: %v, GC queue %d to %d", err, gc, e.gcPending())
	}
}

// In the grace period after a crash, files that lose their last name or
// their last known open are kept; when it ends, the sweep deletes those
// nobody has open, and a file a client replayed stays until its release.
func TestGraceKeepsFilesUntilReplayed(t *testing.T) {
	e := newEnv(t)
	e.grace = time.Hour
	reader, other := e.session("reader"), e.session("other")
	files := map[string]*weftv1.Attr{}
	for _, name := range []string{"replayed", "unlinked", "released"} {
		files[name] = e.create(root, rootIno, name, 0o644)
		if _, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: files[name].Ino, Flags: syscall.O_RDONLY, Session: reader}); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.unlink(root, rootIno, "released"); err != nil { // an orphan
		t.Fatal(err)
	}
	e.crash()
	e.forgetOpens() // what the crash lost
	if e.s.graceUntil == 0 {
		t.Fatal("no grace period after a crash")
	}
	// Another session opens the orphan and releases it: its last known
	// open.
	if _, err := e.s.Open(e.ctx, &weftv1.OpenRequest{Caller: root, Ino: files["released"].Ino, Flags: syscall.O_RDONLY, Session: other}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"replayed", "unlinked"} {
		if err := e.unlink(root, rootIno, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.s.Release(e.ctx, &weftv1.ReleaseRequest{Ino: files["released"].Ino, Session: other}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.RenewSession(e.ctx, &weftv1.RenewSessionRequest{Session: reader, Replay: true, Reopen: []*weftv1.OpenCount{
		{Ino: files["replayed"].Ino, Count: 1},
	}}); err != nil {
		t.Fatal(err)
	}
	for name, a := range files {
		if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: a.Ino}); err != nil {
			t.Errorf("%s was deleted in the grace period: %v", name, err)
		}
	}
	// fsck --repair leaves them alone too: they are not stray orphans yet.
	if _, err := e.s.Fsck(e.ctx, &weftv1.FsckRequest{Repair: true}); err != nil {
		t.Fatal(err)
	}
	for name, a := range files {
		if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: a.Ino}); err != nil {
			t.Errorf("fsck deleted %s in the grace period: %v", name, err)
		}
	}
	gcBefore := e.gcPending()
	e.s.now = func() time.Time { return time.Now().Add(2 * time.Hour) } // the grace period is over
	n, err := e.s.sweepOrphans(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || e.gcPending() != gcBefore+2 {
		t.Errorf("the sweep deleted %d files (GC queue %d to %d), want 2", n, gcBefore, e.gcPending())
	}
	for name, wantErr := range map[string]error{"replayed": nil, "unlinked": syscall.ENOENT, "released": syscall.ENOENT} {
		_, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: files[name].Ino})
		if errnoOf(t, err) != errnoOf(t, wantErr) {
			t.Errorf("%s after the sweep: %v, want %v", name, err, wantErr)
		}
	}
	if _, err := e.s.Release(e.ctx, &weftv1.ReleaseRequest{Ino: files["replayed"].Ino, Session: reader}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.s.GetAttr(e.ctx, &weftv1.GetAttrRequest{Ino: files["replayed"].Ino}); errnoOf(t, err) != syscall.ENOENT {
		t.Errorf("the replayed file after its release: %v, want ENOENT", err)
	}
}
