package meta

import (
	"context"
	"fmt"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestInvalidationOf(t *testing.T) {
	tests := []struct {
		name    string
		keys    [][]byte
		inodes  []uint64
		entries []cbEntry
	}{
		{"inode", [][]byte{inodeKey(7)}, []uint64{7}, nil},
		{"entry and its directory", [][]byte{dentryKey(3, "a/b")}, []uint64{3}, []cbEntry{{3, "a/b"}}},
		{"symlink and xattr", [][]byte{symlinkKey(9), xattrKey(10, "user.x")}, []uint64{9, 10}, nil},
		{"dedup", [][]byte{inodeKey(3), dentryKey(3, "x"), inodeKey(3)}, []uint64{3}, []cbEntry{{3, "x"}}},
		{"ignored", [][]byte{keyNextIno, openKey(4, "s"), sessionKey("s"), gcKey(5), parentKey(6), keyCallbackWriter}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := invalidationOf(tt.keys)
			if !slices.Equal(inv.inodes, tt.inodes) || !slices.Equal(inv.entries, tt.entries) {
				t.Errorf("got %v %v, want %v %v", inv.inodes, inv.entries, tt.inodes, tt.entries)
			}
		})
	}
}

// TestCallbackLimits checks the memory bounds: a session whose interest
// outgrows the limit, or whose stream falls behind, gets
// Invalidation.all instead of unbounded state.
func TestCallbackLimits(t *testing.T) {
	h := newCallbacks()
	h.maxInterest, h.maxPending = 3, 4
	cs, gen := h.attach("s")
	if inv, _ := h.take(cs, gen); !inv.GetAll() {
		t.Fatalf("first message %v, want all", inv)
	}
	h.register("s", 0, 1, 2, 3)
	h.publish(invalidation{inodes: []uint64{2}}, "")
	if inv, _ := h.take(cs, gen); !slices.Equal(inv.GetInodes(), []uint64{2}) || inv.All {
		t.Fatalf("after a change of 2: %v", inv)
	}
	h.register("s", 0, 4) // over the limit: reset, all
	if _, n := h.stats(); n != 1 {
		t.Errorf("%d interests after the reset, want 1", n)
	}
	if inv, _ := h.take(cs, gen); !inv.GetAll() {
		t.Fatalf("after overflowing the interest: %v, want all", inv)
	}
	h.maxInterest = 1000
	for i := range uint64(10) {
		h.register("s", 0, 100+i)
		h.publish(invalidation{inodes: []uint64{100 + i}}, "")
	}
	if inv, _ := h.take(cs, gen); !inv.GetAll() {
		t.Fatalf("stream behind by 10 changes: %v, want all", inv)
	}
	// The origin of a change is not called back; a read racing with a
	// change is.
	h.register("s", 0, 5)
	h.publish(invalidation{inodes: []uint64{5}}, "s")
	if inv, _ := h.take(cs, gen); inv != nil {
		t.Errorf("own change called back: %v", inv)
	}
	mark := h.mark()
	h.publish(invalidation{inodes: []uint64{6}}, "other")
	h.register("s", mark, 6)
	if inv, _ := h.take(cs, gen); !slices.Equal(inv.GetInodes(), []uint64{6}) {
		t.Errorf("inode changed between read and registration: %v, want [6]", inv)
	}
	h.forget("s", []uint64{5})
	h.publish(invalidation{inodes: []uint64{5}}, "")
	if inv, _ := h.take(cs, gen); inv != nil {
		t.Errorf("forgotten inode called back: %v", inv)
	}
	cs2, gen2 := h.attach("s")
	if _, ok := h.take(cs, gen); ok {
		t.Error("replaced stream still takes")
	}
	if inv, _ := h.take(cs2, gen2); !inv.GetAll() {
		t.Errorf("new stream starts with %v, want all", inv)
	}
}

// serveMeta serves s over gRPC on loopback and returns a client of it.
func serveMeta(t *testing.T, s *Service) weftv1.MetaClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Serve(ctx, lis)
	}()
	cc, err := rpc.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		cancel()
		<-done
	})
	return weftv1.NewMetaClient(cc)
}

// watcher is one session with its callback stream.
type watcher struct {
	t       *testing.T
	m       weftv1.MetaClient
	session string
	caller  *weftv1.Caller
	got     chan *weftv1.Invalidation
}

func watch(t *testing.T, m weftv1.MetaClient) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := m.OpenSession(ctx, &weftv1.OpenSessionRequest{Host: "test"})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := m.Watch(ctx, &weftv1.WatchRequest{Session: s.Session})
	if err != nil {
		t.Fatal(err)
	}
	w := &watcher{t: t, m: m, session: s.Session, caller: &weftv1.Caller{Session: s.Session}, got: make(chan *weftv1.Invalidation, 100)}
	go func() {
		for {
			inv, err := stream.Recv()
			if err != nil {
				close(w.got)
				return
			}
			w.got <- inv
		}
	}()
	if inv := w.next(); !inv.All {
		t.Fatalf("first callback %v, want all", inv)
	}
	return w
}

func (w *watcher) next() *weftv1.Invalidation {
	w.t.Helper()
	select {
	case inv, ok := <-w.got:
		if !ok {
			w.t.Fatal("callback stream ended")
		}
		return inv
	case <-time.After(10 * time.Second):
		w.t.Fatal("no callback within 10s")
	}
	return nil
}

// expect waits for a callback naming inode ino (0: none) and entry
// parent/name ("": none); callbacks about other things are skipped.
func (w *watcher) expect(what string, ino, parent uint64, name string) {
	w.t.Helper()
	for {
		inv := w.next()
		okIno := ino == 0 || slices.Contains(inv.Inodes, ino)
		okEntry := name == ""
		for _, e := range inv.Entries {
			okEntry = okEntry || e.Parent == parent && e.Name == name
		}
		if okIno && okEntry {
			return
		}
		if inv.All {
			w.t.Fatalf("%s: got all (%v)", what, inv)
		}
	}
}

func (w *watcher) getattr(ino uint64) *weftv1.Attr {
	w.t.Helper()
	r, err := w.m.GetAttr(context.Background(), &weftv1.GetAttrRequest{Ino: ino, Session: w.session})
	if err != nil {
		w.t.Fatal(err)
	}
	return r.Attr
}

// checkFeed runs namespace operations through session a on ma and checks
// that session b on mb, which cached the objects, is called back for each,
// and that a is not called back for its own changes.
func checkFeed(t *testing.T, ma, mb weftv1.MetaClient) {
	ctx := context.Background()
	a, b := watch(t, ma), watch(t, mb)
	// b caches "d" as missing, then the root (listing).
	if _, err := mb.Lookup(ctx, &weftv1.LookupRequest{Caller: b.caller, Parent: rootIno, Name: "d"}); err == nil {
		t.Fatal("lookup of d before it exists succeeded")
	}
	d, err := ma.Mkdir(ctx, &weftv1.MkdirRequest{Caller: a.caller, Parent: rootIno, Name: "d", Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	b.expect("mkdir", rootIno, rootIno, "d")
	if _, err := mb.ReadDir(ctx, &weftv1.ReadDirRequest{Caller: b.caller, Ino: d.Attr.Ino, Plus: true}); err != nil {
		t.Fatal(err)
	}
	fifo, err := ma.Create(ctx, &weftv1.CreateRequest{Caller: a.caller, Parent: d.Attr.Ino, Name: "p", Mode: syscall.S_IFIFO | 0o644, Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	b.expect("create", d.Attr.Ino, d.Attr.Ino, "p")
	b.getattr(fifo.Attr.Ino)
	if _, err := ma.SetAttr(ctx, &weftv1.SetAttrRequest{Caller: a.caller, Ino: fifo.Attr.Ino, Valid: uint32(weftv1.SetAttrValid_SETATTR_MODE), Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	b.expect("chmod", fifo.Attr.Ino, 0, "")
	if _, err := ma.Rename(ctx, &weftv1.RenameRequest{Caller: a.caller, OldParent: d.Attr.Ino, OldName: "p", NewParent: d.Attr.Ino, NewName: "q"}); err != nil {
		t.Fatal(err)
	}
	b.expect("rename (old name)", 0, d.Attr.Ino, "p")
	if _, err := ma.Unlink(ctx, &weftv1.RemoveRequest{Caller: a.caller, Parent: d.Attr.Ino, Name: "q"}); err != nil {
		t.Fatal(err)
	}
	b.expect("unlink", 0, d.Attr.Ino, "q")
	// b forgets d: changes in it are no longer called back, the root's
	// still are.
	if _, err := mb.Forget(ctx, &weftv1.ForgetRequest{Session: b.session, Inodes: []uint64{d.Attr.Ino}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ma.Mkdir(ctx, &weftv1.MkdirRequest{Caller: a.caller, Parent: d.Attr.Ino, Name: "x", Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	if _, err := ma.Mkdir(ctx, &weftv1.MkdirRequest{Caller: a.caller, Parent: rootIno, Name: "e", Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	inv := b.next()
	for _, e := range inv.Entries {
		if e.Parent == d.Attr.Ino {
			t.Errorf("callback about forgotten directory %d: %v", d.Attr.Ino, inv)
		}
	}
	// a cached the root too (its own lookups), but was never called back
	// for its own changes: its first callback is about b's change.
	if _, err := ma.Lookup(ctx, &weftv1.LookupRequest{Caller: a.caller, Parent: rootIno, Name: "d"}); err != nil {
		t.Fatal(err)
	}
	if _, err := mb.Mkdir(ctx, &weftv1.MkdirRequest{Caller: b.caller, Parent: rootIno, Name: "from-b", Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	inv = a.next()
	if len(inv.Entries) != 1 || inv.Entries[0].Name != "from-b" {
		t.Errorf("a's first callback %v, want only the entry from-b", inv)
	}
}

// TestCallbacksPebble checks the change feed and interest tracking of one
// meta service on the embedded engine.
func TestCallbacksPebble(t *testing.T) {
	m := serveMeta(t, openService(t, nil, nil))
	checkFeed(t, m, m)
}

// TestCallbacksEtcd checks that changes made through one meta service
// reach the sessions of another over the same etcd.
func TestCallbacksEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	m1 := serveMeta(t, openService(t, openEtcd(t, srv, "/cb/"), nil))
	m2 := serveMeta(t, openService(t, openEtcd(t, srv, "/cb/"), nil))
	checkFeed(t, m1, m2)
}

// BenchmarkCallbackPublish is the meta server's cost of one create's
// callbacks (the directory's inode and entry, the new inode) with two
// sessions watching the directory.
func BenchmarkCallbackPublish(b *testing.B) {
	h := newCallbacks()
	var streams [2]struct {
		cs  *cbSession
		gen uint64
	}
	for i := range streams {
		streams[i].cs, streams[i].gen = h.attach(fmt.Sprint("s", i))
		h.register(fmt.Sprint("s", i), 0, rootIno)
	}
	keys := make([][]byte, 0, 4)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		keys = append(keys[:0], inodeKey(rootIno), dentryKey(rootIno, fmt.Sprint(i)), inodeKey(uint64(i+100)), keyNextIno)
		h.publish(invalidationOf(keys), "origin")
		if i%64 == 0 {
			for _, s := range streams {
				h.take(s.cs, s.gen)
			}
		}
	}
}
