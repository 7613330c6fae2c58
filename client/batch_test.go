package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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
}

// TestFailoverToNextMetaServer: with the first meta server known
// unreachable, session and namespace calls go to the next one.
func TestFailoverToNextMetaServer(t *testing.T) {
	tc := startCluster(t, nil, 1)
	c := newTestClient(t, deadAddress(t)+","+tc.metaAddr, Config{})
	ctx := context.Background()
	for i := range 5 {
		if _, err := c.Mkdir(ctx, root, 1, fmt.Sprintf("d%d", i), 0o755); err != nil {
			t.Fatalf("mkdir with the first meta server down: %v", err)
		}
	}
	for i := range 5 {
		if _, err := c.Lookup(ctx, root, 1, fmt.Sprintf("d%d", i)); err != nil {
			t.Errorf("lookup: %v", err)
		}
	}
	if c.conn.batch.sent.Load() == 0 {
		t.Error("no batch was sent")
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
	q := &queuedCall{ctx: ctx, call: weftv1.MetaCallOf("Mkdir"), args: &weftv1.MkdirRequest{Caller: root, Parent: 1, Name: "made", Mode: 0o755}, reply: reply}
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

// cutOnce is a TCP proxy to a lean path that lets the requests of its
// first connection through and breaks it as soon as the server starts to
// answer (after the preface): a call through it is applied by the server
// and cut off before its answer reaches the client. Later connections
// pass through whole.
func cutOnce(t *testing.T, upstream string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for first := true; ; first = false {
			down, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", upstream)
			if err != nil {
				down.Close()
				continue
			}
			t.Cleanup(func() { down.Close(); up.Close() })
			go func() {
				io.Copy(up, down)
				up.Close()
			}()
			if !first {
				go func() {
					io.Copy(down, up)
					down.Close()
				}()
				continue
			}
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

// throughCutOnce makes c reach its meta server's lean path through a
// fresh cutOnce proxy.
func throughCutOnce(t *testing.T, c *Client, metaAddr string) {
	t.Helper()
	w := wire.NewMetaClient(cutOnce(t, metaAddr))
	c.conn.mu.Lock()
	old := c.conn.wires[metaAddr]
	c.conn.wires[metaAddr] = w
	c.conn.mu.Unlock()
	if old != nil {
		old.Close()
	}
}

// TestCutOffCallAppliedOnce: with several meta servers, a call cut off
// after the meta service applied it is sent again with the same request
// id, so it is not applied twice: the mkdir and the rename succeed (their
// results read back) instead of failing with EEXIST and ENOENT.
func TestCutOffCallAppliedOnce(t *testing.T) {
	tc := startCluster(t, nil, 1)
	// A second address makes the client send request ids; nobody is there.
	c := newTestClient(t, tc.metaAddr+","+deadAddress(t), Config{})
	ctx := context.Background()
	throughCutOnce(t, c, tc.metaAddr)
	d, err := c.Mkdir(ctx, root, 1, "cut", 0o755)
	if err != nil {
		t.Fatalf("mkdir cut off after it was applied: %v", err)
	}
	if got, err := c.Lookup(ctx, root, 1, "cut"); err != nil || got.Ino != d.Ino {
		t.Fatalf("lookup after the mkdir: %v, %v; mkdir answered inode %d", got, err, d.Ino)
	}
	throughCutOnce(t, c, tc.metaAddr)
	if err := c.Rename(ctx, root, 1, "cut", 1, "moved", 0); err != nil {
		t.Fatalf("rename cut off after it was applied: %v", err)
	}
	if _, err := c.Lookup(ctx, root, 1, "moved"); err != nil {
		t.Errorf("lookup of the renamed directory: %v", err)
	}
}

// TestGetAttrTakesCallbacks: a getattr names this client's session, so the
// meta service calls it back when another client changes the inode: a
// directory's attributes that this client got by getattr alone (no
// lookup) are not answered stale after another client's chmod.
func TestGetAttrTakesCallbacks(t *testing.T) {
	tc := startCluster(t, nil, 1)
	ctx := context.Background()
	a := newTestClient(t, tc.metaAddr, Config{OnInvalidate: func(*weftv1.Invalidation) {}, Testing: Testing{NoDelegations: true}})
	b := newTestClient(t, tc.metaAddr, Config{})
	deadline := time.Now().Add(10 * time.Second)
	for !a.CallbacksLive() {
		if time.Now().After(deadline) {
			t.Fatal("callbacks not live after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	d, err := b.Mkdir(ctx, root, 1, "d", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := a.GetAttr(ctx, d.Ino); err != nil || got.Mode&0o777 != 0o755 {
		t.Fatalf("getattr: %v, %v", got, err)
	}
	if _, err := b.SetAttr(ctx, &weftv1.SetAttrRequest{Caller: root, Ino: d.Ino,
		Valid: uint32(weftv1.SetAttrValid_SETATTR_MODE), Mode: 0o700}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		got, err := a.GetAttr(ctx, d.Ino)
		if err != nil {
			t.Fatal(err)
		}
		if got.Mode&0o777 == 0o700 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("getattr still answers mode %o 10 s after another client's chmod to 700", got.Mode&0o777)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
