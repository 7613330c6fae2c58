package meta

import (
	"context"
	"syscall"
	"testing"
	"time"

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
