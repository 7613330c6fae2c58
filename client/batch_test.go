package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestConcurrentCallsBatch makes many namespace calls at once: they go to
// the meta service in batches, and each caller still gets its own answer
// (attributes, errno), as when sent alone.
func TestConcurrentCallsBatch(t *testing.T) {
	tc := startCluster(t, nil, 1)
	c := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	dir, err := c.Mkdir(ctx, root, 1, "d", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	const workers = 32
	for round := 0; c.conn.batch.batches.Load() == 0; round++ {
		if round == 20 {
			t.Fatal("32 concurrent callers never made a batch")
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, 4*workers)
		wins := atomic.Int64{}
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				name := fmt.Sprintf("f%d.%d", round, w)
				f, a, err := c.Create(ctx, root, dir.Ino, name, 0o644, syscall.O_RDWR, true)
				if err != nil {
					errs <- fmt.Errorf("create %s: %w", name, err)
					return
				}
				if got, err := c.Lookup(ctx, root, dir.Ino, name); err != nil || got.Ino != a.Ino {
					errs <- fmt.Errorf("lookup %s: %v, %v; created ino %d", name, got, err, a.Ino)
				}
				if err := f.Release(ctx); err != nil {
					errs <- err
				}
				// Pairs race for one name: one wins, the other gets EEXIST.
				shared := fmt.Sprintf("s%d.%d", round, w/2)
				if f, _, err := c.Create(ctx, root, dir.Ino, shared, 0o644, syscall.O_RDWR, true); err == nil {
					wins.Add(1)
					_ = f.Release(ctx)
				} else if !errors.Is(err, syscall.EEXIST) {
					errs <- fmt.Errorf("racing create of %s: %w, want EEXIST", shared, err)
				}
				if _, err := c.Lookup(ctx, root, dir.Ino, name+".missing"); !errors.Is(err, syscall.ENOENT) {
					errs <- fmt.Errorf("lookup of a missing name: %v, want ENOENT", err)
				}
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if wins.Load() != workers/2 {
			t.Fatalf("%d racing creates won, want %d", wins.Load(), workers/2)
		}
	}
	t.Logf("%d calls went in %d batches", c.conn.batch.batched.Load(), c.conn.batch.batches.Load())
	if c.conn.batch.lean.Load() == nil || c.conn.batch.leanCalls.Load() == 0 {
		t.Error("the meta service's lean path was not used")
	}
}

// TestLeanPathFallsBack: with the meta server's lean path gone (its
// listener closed), namespace calls go over gRPC and still succeed, and
// the client stops using the lean path until a session answer names it
// again.
func TestLeanPathFallsBack(t *testing.T) {
	tc := startCluster(t, nil, 1)
	c := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	w := c.conn.batch.lean.Load()
	if w == nil {
		t.Fatal("the session answer named no lean path")
	}
	if _, err := c.Mkdir(ctx, root, 1, "before", 0o755); err != nil {
		t.Fatal(err)
	}
	sent := c.conn.batch.leanCalls.Load()
	if sent == 0 {
		t.Fatal("mkdir did not go over the lean path")
	}
	// A lean path nobody serves: connections to it fail before sending.
	c.conn.learnWire(deadAddress(t))
	for i := range 5 {
		if _, err := c.Mkdir(ctx, root, 1, fmt.Sprintf("after%d", i), 0o755); err != nil {
			t.Fatalf("mkdir with the lean path down: %v", err)
		}
	}
	if c.conn.batch.lean.Load() != nil {
		t.Error("the client kept a lean path that does not answer")
	}
	for i := range 5 {
		if _, err := c.Lookup(ctx, root, 1, fmt.Sprintf("after%d", i)); err != nil {
			t.Errorf("lookup after the fall-back: %v", err)
		}
	}
}

// deadAddress is a loopback address nobody listens at.
func deadAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// oldMeta is a meta service from before batches: it answers GetAttr and
// knows no Batch.
type oldMeta struct {
	weftv1.UnimplementedMetaServer
	getattrs atomic.Int64
}

func (m *oldMeta) GetAttr(_ context.Context, req *weftv1.GetAttrRequest) (*weftv1.AttrResponse, error) {
	m.getattrs.Add(1)
	time.Sleep(time.Millisecond) // so that callers pile up behind one another
	if req.Ino == 0 {
		return nil, fserr.ToStatus(fmt.Errorf("getattr of inode 0: %w", syscall.ENOENT))
	}
	return &weftv1.AttrResponse{Attr: &weftv1.Attr{Ino: req.Ino}}, nil
}

// TestBatchesFallBackAlone checks that a client talking to a meta service
// without Batch sends its calls alone, with every answer intact.
func TestBatchesFallBackAlone(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := rpc.NewServer()
	old := &oldMeta{}
	weftv1.RegisterMetaServer(srv, old)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	m, err := newMetaConn([]string{lis.Addr().String()}, 5*time.Second, slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.close() })
	mc := weftv1.NewMetaClient(m)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ino := uint64(i % 10) // inode 0 fails
			r, err := mc.GetAttr(context.Background(), &weftv1.GetAttrRequest{Ino: ino})
			switch {
			case ino == 0 && !errors.Is(err, syscall.ENOENT):
				t.Errorf("getattr of inode 0: %v, want ENOENT", err)
			case ino != 0 && (err != nil || r.Attr.Ino != ino):
				t.Errorf("getattr of inode %d: %v, %v", ino, r, err)
			}
		}()
	}
	wg.Wait()
	if !m.batch.off.Load() {
		t.Error("the client did not notice that the meta service has no Batch")
	}
	if got := old.getattrs.Load(); got != 40 {
		t.Errorf("the meta service answered %d getattrs, want 40", got)
	}
}

// TestBatchedCallAppliedBefore: a call of a batch that the meta service
// answers "already applied" (an earlier try of the batch reached another
// meta server before it was cut off) gets the result read back, as a call
// sent alone would.
func TestBatchedCallAppliedBefore(t *testing.T) {
	tc := startCluster(t, nil, 1)
	c := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	made, err := c.Mkdir(ctx, root, 1, "made", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	st, err := proto.Marshal(status.New(codes.Aborted, "mkdir: "+alreadyApplied).Proto())
	if err != nil {
		t.Fatal(err)
	}
	reply := new(weftv1.AttrResponse)
	q := &queuedCall{ctx: ctx, name: "Mkdir", args: &weftv1.MkdirRequest{Caller: root, Parent: 1, Name: "made", Mode: 0o755}, reply: reply}
	if err := c.conn.batch.outcome(q, &weftv1.BatchReply{Status: st}); err != nil {
		t.Fatalf("outcome of an already applied mkdir: %v", err)
	}
	if reply.Attr.GetIno() != made.Ino {
		t.Errorf("read back inode %d, the mkdir made %d", reply.Attr.GetIno(), made.Ino)
	}
	// Another error keeps its errno.
	st, err = proto.Marshal(statusWithErrno(t, codes.AlreadyExists, "mkdir: exists", syscall.EEXIST).Proto())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.conn.batch.outcome(q, &weftv1.BatchReply{Status: st}); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("outcome of a failed mkdir: %v, want EEXIST", err)
	}
}

func statusWithErrno(t *testing.T, code codes.Code, msg string, e syscall.Errno) *status.Status {
	t.Helper()
	st, err := status.New(code, msg).WithDetails(&weftv1.Errno{Errno: uint32(e)})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// cutAfterAnswer is a TCP proxy to a lean path that lets requests through
// and breaks both connections as soon as the server starts to answer
// (after the preface): every call through it is applied by the server
// and cut off before its answer reaches the client.
func cutAfterAnswer(t *testing.T, upstream string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			down, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				down.Close()
				continue
			}
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := down.Read(buf)
					if n > 0 {
						up.Write(buf[:n])
					}
					if err != nil {
						up.Close()
						return
					}
				}
			}()
			go func() {
				defer down.Close()
				defer up.Close()
				pre := make([]byte, 8)
				if _, err := io.ReadFull(up, pre); err != nil {
					return
				}
				down.Write(pre)
				one := make([]byte, 1)
				up.Read(one) // the first byte of an answer: cut
			}()
		}
	}()
	return l.Addr().String()
}

// TestLeanPathCutOffRetriesOnce: with several meta servers, a call cut off
// on the lean path after the meta service applied it is sent again over
// gRPC with the same request id, so it is not applied twice: the mkdir
// and the rename succeed (their results read back) instead of failing
// with EEXIST and ENOENT.
func TestLeanPathCutOffRetriesOnce(t *testing.T) {
	tc := startCluster(t, nil, 1)
	// A second address makes the client send request ids; nobody is there.
	c := newTestClient(t, tc.metaAddr+","+deadAddress(t), Config{})
	ctx := context.Background()
	w := c.conn.batch.lean.Load()
	if w == nil {
		t.Fatal("the session answer named no lean path")
	}
	c.conn.learnWire(cutAfterAnswer(t, wire.ParseAddr(w.Addr()).TCP))
	d, err := c.Mkdir(ctx, root, 1, "cut", 0o755)
	if err != nil {
		t.Fatalf("mkdir cut off after it was applied: %v", err)
	}
	if got, err := c.Lookup(ctx, root, 1, "cut"); err != nil || got.Ino != d.Ino {
		t.Fatalf("lookup after the mkdir: %v, %v; mkdir answered inode %d", got, err, d.Ino)
	}
	c.conn.learnWire(cutAfterAnswer(t, wire.ParseAddr(w.Addr()).TCP))
	if err := c.Rename(ctx, root, 1, "cut", 1, "moved", 0); err != nil {
		t.Fatalf("rename cut off after it was applied: %v", err)
	}
	if _, err := c.Lookup(ctx, root, 1, "moved"); err != nil {
		t.Errorf("lookup of the renamed directory: %v", err)
	}
}
