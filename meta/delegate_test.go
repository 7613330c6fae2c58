package meta

import (
	"context"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/etcdtest"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// waitRecall reads w's callbacks until one recalls dir, and returns its
// generation.
func (w *watcher) waitRecall(dir uint64) uint64 {
	w.t.Helper()
	for {
		for _, r := range w.next().Recalls {
			if r.Dir == dir {
				return r.Generation
			}
		}
	}
}

// TestDelegation walks a create delegation through its life: the grant
// and its exclusivity, files sent in one CreateMany and checked one by
// one, a recall by another session's lookup (which then sees what the
// holder sent before returning), a holder that never answers losing it,
// opens recorded for files made under it, and a session's end.
func TestDelegation(t *testing.T) {
	ctx := context.Background()
	s := openService(t, nil, startChunkServer(t))
	s.recallWait = 300 * time.Millisecond
	m := serveMeta(t, s)
	a, b := watch(t, m), watch(t, m)

	d, err := m.Mkdir(ctx, &weftv1.MkdirRequest{Caller: a.caller, Parent: rootIno, Name: "d", Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	dir := d.Attr.Ino
	g, err := m.Delegate(ctx, &weftv1.DelegateRequest{Caller: a.caller, Dir: dir})
	if err != nil || !g.Granted || g.InoCount == 0 || g.Dir.GetIno() != dir {
		t.Fatalf("delegate to a: %v %v", g, err)
	}
	if gb, err := m.Delegate(ctx, &weftv1.DelegateRequest{Caller: b.caller, Dir: dir}); err != nil || gb.Granted {
		t.Fatalf("delegate to b while a holds it: %v %v, want refused", gb, err)
	}

	ino := g.InoFirst
	now := time.Now().UnixNano()
	file := func(name string, ino uint64) *weftv1.NewFile {
		return &weftv1.NewFile{Caller: a.caller, Parent: dir, Name: name, Mode: 0o640, Ino: ino, TimeNs: now}
	}
	cm, err := m.CreateMany(ctx, &weftv1.CreateManyRequest{Session: a.session, Files: []*weftv1.NewFile{
		file("f1", ino), file("f2", ino+1), file("f1", ino+2), file("f3", 5), file("f4", ino+g.InoCount),
		file("f5", ino+1), {Caller: a.caller, Parent: 424242, Name: "x", Ino: ino + 3},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := []syscall.Errno{0, 0, syscall.EEXIST, syscall.EINVAL, syscall.EINVAL, syscall.EINVAL, syscall.ENOENT}
	for i, r := range cm.Results {
		if syscall.Errno(r.Errno) != want[i] {
			t.Errorf("file %d (%s): errno %d (%s), want %d", i, cm.Results[i].Error, r.Errno, r.Error, want[i])
		}
	}
	if f1 := cm.Results[0].Attr; f1.GetIno() != ino || f1.Mode != syscall.S_IFREG|0o640 || f1.CtimeNs != now || f1.Layout == nil {
		t.Errorf("f1 stored as %v", f1)
	}

	// b's lookup of a name a has not sent yet waits for a's return.
	type result struct {
		attr *weftv1.AttrResponse
		err  error
	}
	looked := make(chan result, 1)
	go func() {
		r, err := m.Lookup(ctx, &weftv1.LookupRequest{Caller: b.caller, Parent: dir, Name: "late"})
		looked <- result{r, err}
	}()
	gen := a.waitRecall(dir)
	if gen != g.Generation {
		t.Errorf("recall of generation %d, want %d", gen, g.Generation)
	}
	select {
	case r := <-looked:
		t.Fatalf("lookup ran before the delegation came back: %v %v", r.attr, r.err)
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := m.CreateMany(ctx, &weftv1.CreateManyRequest{Session: a.session, Files: []*weftv1.NewFile{file("late", ino+3)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.ReturnDelegation(ctx, &weftv1.ReturnDelegationRequest{Session: a.session, Dir: dir, Generation: gen}); err != nil {
		t.Fatal(err)
	}
	if r := <-looked; r.err != nil || r.attr.Attr.Ino != ino+3 {
		t.Fatalf("lookup after the return: %v %v, want inode %d", r.attr, r.err, ino+3)
	}

	// b takes it and never answers a recall: a's create waits, then it is
	// revoked.
	gb, err := m.Delegate(ctx, &weftv1.DelegateRequest{Caller: b.caller, Dir: dir})
	if err != nil || !gb.Granted || gb.Generation == g.Generation {
		t.Fatalf("delegate to b after a returned it: %v %v", gb, err)
	}
	start := time.Now()
	if _, err := m.Create(ctx, &weftv1.CreateRequest{Caller: a.caller, Parent: dir, Name: "g", Mode: 0o644, Exclusive: true}); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < s.recallWait {
		t.Errorf("create waited %v for an unanswered recall, want at least %v", waited, s.recallWait)
	}
	if s.deleg.revoked.Load() != 1 || s.deleg.holder(dir) != "" {
		t.Errorf("after the unanswered recall: %d revoked, holder %q", s.deleg.revoked.Load(), s.deleg.holder(dir))
	}

	// An open recorded for a file made under a delegation keeps it
	// through an unlink by another session.
	if _, err := m.RecordOpens(ctx, &weftv1.RecordOpensRequest{Session: a.session, Inos: []uint64{ino, 999999}}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Unlink(ctx, &weftv1.RemoveRequest{Caller: b.caller, Parent: dir, Name: "f1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: ino}); err != nil {
		t.Fatalf("open file gone after the unlink: %v", err)
	}
	if _, err := m.Release(ctx, &weftv1.ReleaseRequest{Session: a.session, Ino: ino}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: ino}); errnoOf(t, err) != syscall.ENOENT {
		t.Errorf("unlinked file after its last release: %v, want ENOENT", err)
	}

	// A session's end drops its delegations.
	if g, err := m.Delegate(ctx, &weftv1.DelegateRequest{Caller: b.caller, Dir: dir}); err != nil || !g.Granted {
		t.Fatalf("delegate to b again: %v %v", g, err)
	}
	if _, err := m.CloseSession(ctx, &weftv1.CloseSessionRequest{Session: b.session}); err != nil {
		t.Fatal(err)
	}
	if h := s.deleg.holder(dir); h != "" {
		t.Errorf("delegation held by %q after its session closed", h)
	}
}

// TestDelegationRefusedOnEtcd checks that meta servers over etcd (where
// several may serve at once) do not delegate.
func TestDelegationRefusedOnEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	m := serveMeta(t, openService(t, openEtcd(t, srv, "/dg/"), nil))
	a := watch(t, m)
	g, err := m.Delegate(context.Background(), &weftv1.DelegateRequest{Caller: a.caller, Dir: rootIno})
	if err != nil || g.Granted {
		t.Fatalf("delegate on etcd: %v %v, want refused", g, err)
	}
}

// delegatedDir starts a meta service with one chunk server, makes a
// directory of mode mode and has it granted to a new session: the
// service, its client, the session and the grant.
func delegatedDir(t *testing.T, mode uint32) (*Service, weftv1.MetaClient, *watcher, *weftv1.DelegateResponse) {
	t.Helper()
	ctx := context.Background()
	s := openService(t, nil, startChunkServer(t))
	m := serveMeta(t, s)
	a := watch(t, m)
	d, err := m.Mkdir(ctx, &weftv1.MkdirRequest{Caller: a.caller, Parent: rootIno, Name: "d", Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.Delegate(ctx, &weftv1.DelegateRequest{Caller: a.caller, Dir: d.Attr.Ino})
	if err != nil || !g.Granted {
		t.Fatalf("delegate: %v %v", g, err)
	}
	return s, m, a, g
}

// TestDelegationLayouts checks the layouts a grant places for its files
// and what CreateMany does with a file that carries one: kept as given,
// its length and mtime stored with the create when it was written and
// closed first, and refused (EINVAL) when the layout is not one weft
// could have placed.
func TestDelegationLayouts(t *testing.T) {
	ctx := context.Background()
	s, m, a, g := delegatedDir(t, 0o755)
	dir := g.Dir.Ino
	if len(g.Layouts) != delegationLayouts {
		t.Fatalf("grant placed %d layouts, want %d", len(g.Layouts), delegationLayouts)
	}
	for _, l := range g.Layouts {
		if err := s.checkGivenLayout(l); err != nil {
			t.Fatalf("grant's layout %v: %v", l, err)
		}
	}
	good := g.Layouts[0]
	bad := func(edit func(l *weftv1.Layout)) *weftv1.Layout {
		l := proto.Clone(good).(*weftv1.Layout)
		edit(l)
		return l
	}
	now := time.Now().UnixNano()
	mtime := now + 5e9
	tests := []struct {
		name   string
		layout *weftv1.Layout
		commit bool
		errno  syscall.Errno
	}{
		{"given", good, false, 0},
		{"given and committed", good, true, 0},
		{"placed here", nil, true, 0},
		{"unknown chain", bad(func(l *weftv1.Layout) { l.Chains = []uint64{987654} }), false, syscall.EINVAL},
		{"chains short of the stripe count", bad(func(l *weftv1.Layout) { l.StripeCount++ }), false, syscall.EINVAL},
		{"too many replicas for its chain", bad(func(l *weftv1.Layout) { l.Replicas = 2 }), false, syscall.EINVAL},
		{"chunk size not a power of two", bad(func(l *weftv1.Layout) { l.ChunkSize = 100000 }), false, syscall.EINVAL},
	}
	var files []*weftv1.NewFile
	for i, tt := range tests {
		nf := &weftv1.NewFile{Caller: a.caller, Parent: dir, Name: tt.name, Mode: 0o644, Ino: g.InoFirst + uint64(i), TimeNs: now, Layout: tt.layout}
		if tt.commit {
			nf.Committed, nf.Size, nf.MtimeNs = true, 12345, mtime
		}
		files = append(files, nf)
	}
	cm, err := m.CreateMany(ctx, &weftv1.CreateManyRequest{Session: a.session, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	for i, tt := range tests {
		r := cm.Results[i]
		if syscall.Errno(r.Errno) != tt.errno {
			t.Errorf("%s: errno %d (%s), want %d", tt.name, r.Errno, r.Error, tt.errno)
			continue
		}
		if tt.errno != 0 {
			if _, err := m.Lookup(ctx, &weftv1.LookupRequest{Caller: a.caller, Parent: dir, Name: tt.name}); err == nil {
				t.Errorf("%s: refused, yet its name exists", tt.name)
			}
			continue
		}
		got, err := m.Lookup(ctx, &weftv1.LookupRequest{Caller: a.caller, Parent: dir, Name: tt.name})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if tt.layout != nil && !proto.Equal(got.Attr.Layout, tt.layout) {
			t.Errorf("%s: stored layout %v, want the given %v", tt.name, got.Attr.Layout, tt.layout)
		}
		if tt.layout == nil && len(got.Attr.Layout.GetChains()) == 0 {
			t.Errorf("%s: no layout placed", tt.name)
		}
		wantSize, wantMtime := uint64(0), now
		if tt.commit {
			wantSize, wantMtime = 12345, mtime
		}
		if got.Attr.Size != wantSize || got.Attr.MtimeNs != wantMtime {
			t.Errorf("%s: size %d mtime %d, want %d %d", tt.name, got.Attr.Size, got.Attr.MtimeNs, wantSize, wantMtime)
		}
	}
}

// TestPendingRangesNotGarbage checks which chunks of missing inodes fsck
// may take for garbage: not those of numbers reserved for a live
// session's delegation (the data of a file made there may go ahead of
// its create); those of a session gone for pendingKeep, yes.
func TestPendingRangesNotGarbage(t *testing.T) {
	var ds delegations
	ds.reserve("s1", 100, 10)
	ds.reserve("s2", 200, 10)
	ds.dropSession("s2")
	ds.ranges[1].until = time.Now().Add(-time.Second) // s2 ended long ago
	for _, tc := range []struct {
		ino  uint64
		want bool
	}{{99, false}, {100, true}, {109, true}, {110, false}, {205, false}} {
		if got := ds.mayBePending(tc.ino); got != tc.want {
			t.Errorf("inode %d may be pending: %v, want %v", tc.ino, got, tc.want)
		}
	}
	ds.dropSession("s1")
	if !ds.mayBePending(105) {
		t.Errorf("a range stopped protecting its numbers as soon as its session ended")
	}
}

// TestCreateManyAppliesChanges checks the attribute changes a client made
// to files before sending them (a tarball's times, owner and mode): they
// are applied in order with SetAttr's rules, the commit of the writes at
// its place among them, and a change SetAttr would refuse refuses the
// file.
func TestCreateManyAppliesChanges(t *testing.T) {
	ctx := context.Background()
	_, m, a, g := delegatedDir(t, 0o777)
	dir := g.Dir.Ino
	user := &weftv1.Caller{Uid: 1000, Gid: 100, Session: a.session}
	const made, wrote, stamped = int64(1e18), int64(1e18 + 5), int64(1e9)
	times := func(mtime int64) *weftv1.SetAttrRequest {
		return &weftv1.SetAttrRequest{Caller: user, Valid: setMtime, MtimeNs: mtime}
	}
	chmod := &weftv1.SetAttrRequest{Caller: user, Valid: setMode, Mode: 0o600}
	tests := []struct {
		name        string
		changes     []*weftv1.SetAttrRequest
		times       []int64
		commitAfter uint32
		errno       syscall.Errno
		mode        uint32
		mtime       int64
	}{
		{"written, then stamped and chmodded (tar)", []*weftv1.SetAttrRequest{times(stamped), chmod}, []int64{made + 1, made + 2}, 0, 0, 0o600, stamped},
		{"stamped, then written", []*weftv1.SetAttrRequest{times(stamped)}, []int64{made + 1}, 1, 0, 0o644, wrote},
		{"given away by its owner", []*weftv1.SetAttrRequest{{Caller: user, Valid: setUID, Uid: 0}}, []int64{made}, 0, syscall.EPERM, 0, 0},
		{"a size change", []*weftv1.SetAttrRequest{{Caller: user, Valid: setSize, Size: 1}}, []int64{made}, 0, syscall.EINVAL, 0, 0},
		{"changes without their times", []*weftv1.SetAttrRequest{chmod}, nil, 0, syscall.EINVAL, 0, 0},
	}
	var files []*weftv1.NewFile
	for i, tt := range tests {
		files = append(files, &weftv1.NewFile{Caller: user, Parent: dir, Name: tt.name, Mode: 0o644, Ino: g.InoFirst + uint64(i), TimeNs: made,
			Layout: g.Layouts[0], Committed: true, Size: 100, MtimeNs: wrote, Setattrs: tt.changes, SetattrTimesNs: tt.times, CommitAfter: tt.commitAfter})
	}
	cm, err := m.CreateMany(ctx, &weftv1.CreateManyRequest{Session: a.session, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	for i, tt := range tests {
		r := cm.Results[i]
		if syscall.Errno(r.Errno) != tt.errno {
			t.Errorf("%s: errno %d (%s), want %d", tt.name, r.Errno, r.Error, tt.errno)
			continue
		}
		if tt.errno != 0 {
			continue
		}
		if r.Attr.Mode&0o7777 != tt.mode || r.Attr.MtimeNs != tt.mtime || r.Attr.Size != 100 || r.Attr.Uid != 1000 {
			t.Errorf("%s: mode %#o mtime %d size %d uid %d, want %#o %d 100 1000", tt.name, r.Attr.Mode&0o7777, r.Attr.MtimeNs, r.Attr.Size, r.Attr.Uid, tt.mode, tt.mtime)
		}
		if want := tt.times[len(tt.times)-1]; tt.commitAfter == 0 && r.Attr.CtimeNs != want {
			t.Errorf("%s: ctime %d, want the last change's %d", tt.name, r.Attr.CtimeNs, want)
		}
	}
}

// TestMkdirDelegation checks Mkdir's delegate: the new directory is
// granted to the caller's session with layouts (and inode numbers unless
// no_inos), held as a Delegate grant is (another session's delegate is
// refused), and a session-less mkdir gets none.
func TestMkdirDelegation(t *testing.T) {
	ctx := context.Background()
	s := openService(t, nil, startChunkServer(t))
	m := serveMeta(t, s)
	a, b := watch(t, m), watch(t, m)
	tests := []struct {
		name    string
		caller  *weftv1.Caller
		noInos  bool
		granted bool
		inos    uint64
	}{
		{"with numbers", a.caller, false, true, delegationInos},
		{"without numbers", a.caller, true, true, 0},
		{"no session", &weftv1.Caller{}, false, false, 0},
	}
	for _, tt := range tests {
		r, err := m.Mkdir(ctx, &weftv1.MkdirRequest{Caller: tt.caller, Parent: rootIno, Name: tt.name, Mode: 0o755, Delegate: true, NoInos: tt.noInos})
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		g := r.Delegation
		if g.GetGranted() != tt.granted || g.GetInoCount() != tt.inos {
			t.Fatalf("%s: grant %v, want granted %v with %d numbers", tt.name, g, tt.granted, tt.inos)
		}
		if !tt.granted {
			continue
		}
		if len(g.Layouts) == 0 || g.Dir.GetIno() != r.Attr.Ino {
			t.Errorf("%s: grant of directory %d with %d layouts", tt.name, g.Dir.GetIno(), len(g.Layouts))
		}
		if gb, err := m.Delegate(ctx, &weftv1.DelegateRequest{Caller: b.caller, Dir: r.Attr.Ino}); err != nil || gb.Granted {
			t.Errorf("%s: another session's delegate: %v %v, want refused", tt.name, gb, err)
		}
	}
}

// TestCollectedFileRefused checks that a file made under a delegation
// whose number fsck found with unowned chunks (queued for deletion, or
// deleted already) is refused when it comes: its data is gone, and the
// client must hear so rather than keep an empty file.
func TestCollectedFileRefused(t *testing.T) {
	ctx := context.Background()
	s, m, a, g := delegatedDir(t, 0o755)
	dead := g.InoFirst + 1
	if err := s.update(ctx, func(x *tx) error { return x.t.Set(deadKey(dead), nil) }); err != nil {
		t.Fatal(err)
	}
	cm, err := m.CreateMany(ctx, &weftv1.CreateManyRequest{Session: a.session, Files: []*weftv1.NewFile{
		{Caller: a.caller, Parent: g.Dir.Ino, Name: "alive", Mode: 0o644, Ino: g.InoFirst, Layout: g.Layouts[0]},
		{Caller: a.caller, Parent: g.Dir.Ino, Name: "collected", Mode: 0o644, Ino: dead, Layout: g.Layouts[0]},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if cm.Results[0].Errno != 0 || syscall.Errno(cm.Results[1].Errno) != syscall.EIO {
		t.Fatalf("results %v, want the first made and the collected one refused with EIO", cm.Results)
	}
}

// TestCreateManyAfterLayoutGenerationMoved: a directory moved to another
// parent anywhere moves the layout generation on. The files of a
// delegation sent after that, whose directory's layout the cache still
// holds at the old generation, must be made (the cache is not trusted
// again on a retry), not refused with EIO.
func TestCreateManyAfterLayoutGenerationMoved(t *testing.T) {
	ctx := context.Background()
	_, m, a, g := delegatedDir(t, 0o755)
	dir := g.Dir.Ino
	send := func(name string, ino uint64) {
		t.Helper()
		cm, err := m.CreateMany(ctx, &weftv1.CreateManyRequest{Session: a.session, Files: []*weftv1.NewFile{
			{Caller: a.caller, Parent: dir, Name: name, Mode: 0o644, Ino: ino, TimeNs: time.Now().UnixNano()},
		}})
		if err != nil {
			t.Fatalf("create many %s: %v", name, err)
		}
		if r := cm.Results[0]; r.Errno != 0 {
			t.Fatalf("create many %s: errno %d: %s", name, r.Errno, r.Error)
		}
	}
	send("before", g.InoFirst) // the directory's layout is cached now
	for _, name := range []string{"x", "y"} {
		if _, err := m.Mkdir(ctx, &weftv1.MkdirRequest{Caller: a.caller, Parent: rootIno, Name: name, Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
	}
	y, err := m.Lookup(ctx, &weftv1.LookupRequest{Caller: a.caller, Parent: rootIno, Name: "y"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Rename(ctx, &weftv1.RenameRequest{Caller: a.caller, OldParent: rootIno, OldName: "x", NewParent: y.Attr.Ino, NewName: "x"}); err != nil {
		t.Fatal(err)
	}
	send("after", g.InoFirst+1)
}
