package wire

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// testHandler is a Handler whose behaviour each test sets.
type testHandler struct {
	write func(ctx context.Context, r *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error)
	read  func(ctx context.Context, r *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error)
	sync  func(ctx context.Context, r *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error)
}

func (h *testHandler) WriteChunk(ctx context.Context, r *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error) {
	return h.write(ctx, r)
}

func (h *testHandler) ReadChunk(ctx context.Context, r *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error) {
	return h.read(ctx, r)
}

func (h *testHandler) SyncFile(ctx context.Context, r *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error) {
	return h.sync(ctx, r)
}

// trackingListener remembers accepted connections so a test can cut them.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackingListener) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
}

// start serves h on a loopback port and returns a client of it with
// conns connections.
func start(t *testing.T, h Handler, conns int) (*Client, *trackingListener) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := &trackingListener{Listener: l}
	s := NewServer(h, slog.New(slog.DiscardHandler))
	go s.Serve(tl)
	c := NewClient(l.Addr().String(), conns)
	t.Cleanup(func() {
		c.Close()
		s.Close(time.Second)
	})
	return c, tl
}

func TestFraming(t *testing.T) {
	w := &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 1<<40 + 3, Index: 7}, ChainId: 9, ChainVersion: 11,
		Offset: 4096, Sync: true, ChunkSize: 1 << 20, Forwarded: true, ChunkVersion: 13, TargetId: 15}
	r := &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 2, Index: 3}, ChainId: 4, ChainVersion: 5, Offset: 6, Length: 7}
	s := &weftv1.SyncFileRequest{Ino: 8, ChainId: 9, ChainVersion: 10, Forwarded: true, TargetId: 12}
	var b [maxFixedMeta]byte
	putWrite(b[:], w)
	if got := getWrite(b[:], nil); got.String() != w.String() {
		t.Errorf("write fields: got %v, want %v", got, w)
	}
	putRead(b[:], r)
	if got := getRead(b[:]); got.String() != r.String() {
		t.Errorf("read fields: got %v, want %v", got, r)
	}
	putSync(b[:], s)
	if got := getSync(b[:]); got.String() != s.String() {
		t.Errorf("sync fields: got %v, want %v", got, s)
	}
	for _, h := range []header{
		{op: opWriteChunk, metaLen: writeMetaLen, payloadLen: 8 << 20, id: 1<<63 + 5, timeoutMs: 30000},
		{op: opResponse, metaLen: 200, id: 1},
	} {
		var hb [headerLen]byte
		h.put(hb[:])
		got, err := parseHeader(hb[:])
		if err != nil || got != h {
			t.Errorf("header %+v: parsed %+v, %v", h, got, err)
		}
	}
	var hb [headerLen]byte
	header{op: opWriteChunk, payloadLen: MaxPayload + 1}.put(hb[:])
	if _, err := parseHeader(hb[:]); !errors.Is(err, errProtocol) {
		t.Errorf("oversized payload parsed: %v", err)
	}
	hb[1] = 99
	if _, err := parseHeader(hb[:]); !errors.Is(err, errProtocol) {
		t.Errorf("unknown frame version parsed: %v", err)
	}
}

func TestBufferPool(t *testing.T) {
	for _, n := range []int{1, 4096, 4097, 1 << 20, 3<<20 + 5} {
		b := GetBuffer(n)
		if len(b) != n || cap(b) < n {
			t.Errorf("GetBuffer(%d): len %d cap %d", n, len(b), cap(b))
		}
		PutBuffer(b)
	}
}

// TestRoundTrip writes, reads into a buffer and syncs, with payloads of
// several sizes, and checks every field and byte arrives.
func TestRoundTrip(t *testing.T) {
	var mu sync.Mutex
	stored := map[uint64][]byte{}
	var synced *weftv1.SyncFileRequest
	h := &testHandler{
		write: func(_ context.Context, r *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error) {
			mu.Lock()
			defer mu.Unlock()
			stored[r.GetChunk().GetIndex()] = bytes.Clone(r.GetData())
			return &weftv1.WriteChunkResponse{NeedFullChunk: r.GetForwarded()}, nil
		},
		read: func(_ context.Context, r *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error) {
			mu.Lock()
			defer mu.Unlock()
			d := stored[r.GetChunk().GetIndex()]
			return &weftv1.ReadChunkResponse{Data: d[r.GetOffset():min(int(r.GetOffset())+int(r.GetLength()), len(d))]}, nil
		},
		sync: func(_ context.Context, r *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error) {
			mu.Lock()
			synced = r
			mu.Unlock()
			return &weftv1.SyncFileResponse{}, nil
		},
	}
	c, _ := start(t, h, 1)
	ctx := context.Background()
	for i, n := range []int{0, 1, 8 << 10, 1 << 20, 8 << 20} {
		data := make([]byte, n)
		for j := range data {
			data[j] = byte(j*7 + i)
		}
		resp, err := c.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Index: uint64(i)}, Data: data, Forwarded: i%2 == 1})
		if err != nil {
			t.Fatalf("write %d bytes: %v", n, err)
		}
		if resp.GetNeedFullChunk() != (i%2 == 1) {
			t.Errorf("need_full_chunk = %v for write %d", resp.GetNeedFullChunk(), i)
		}
		dst := make([]byte, n+10)
		got, err := c.ReadChunkInto(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Index: uint64(i)}, Length: uint32(n + 10)}, dst)
		if err != nil {
			t.Fatalf("read %d bytes: %v", n, err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("read back %d bytes, want %d equal bytes", len(got), n)
		}
		if n > 0 && &got[0] != &dst[0] {
			t.Errorf("read of %d bytes not received into the caller's buffer", n)
		}
	}
	if _, err := c.SyncFile(ctx, &weftv1.SyncFileRequest{Ino: 5, ChainId: 6, Forwarded: true}); err != nil {
		t.Fatal(err)
	}
	if synced.GetIno() != 5 || synced.GetChainId() != 6 || !synced.GetForwarded() {
		t.Errorf("sync arrived as %v", synced)
	}
	if c.Calls() != 11 {
		t.Errorf("Calls() = %d, want 11", c.Calls())
	}
}

// TestPipelining sends many requests on one connection; the handler holds
// them all until every one has arrived, so they must be in flight at once,
// and answers them in reverse order.
func TestPipelining(t *testing.T) {
	const n = 32
	var mu sync.Mutex
	arrived := 0
	all := make(chan struct{})
	order := make([]chan struct{}, n)
	for i := range order {
		order[i] = make(chan struct{})
	}
	h := &testHandler{read: func(ctx context.Context, r *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error) {
		mu.Lock()
		arrived++
		if arrived == n {
			close(all)
		}
		mu.Unlock()
		<-all
		i := r.GetOffset()
		if i+1 < n {
			<-order[i+1] // the next one answered first
		}
		defer close(order[i])
		return &weftv1.ReadChunkResponse{Data: []byte(fmt.Sprintf("answer %d", i))}, nil
	}}
	c, _ := start(t, h, 1)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			resp, err := c.ReadChunk(context.Background(), &weftv1.ReadChunkRequest{Offset: uint64(i)})
			if err == nil && string(resp.GetData()) != fmt.Sprintf("answer %d", i) {
				err = fmt.Errorf("request %d got %q", i, resp.GetData())
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// TestErrors checks that errors arrive as the gRPC client returns them:
// statuses with their codes, errnos through fserr.
func TestErrors(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		wantCode  codes.Code // for errors without errno
		wantErrno syscall.Errno
	}{
		{"stale chain", status.Error(codes.FailedPrecondition, "stale chain version: refresh"), codes.FailedPrecondition, 0},
		{"unavailable", status.Error(codes.Unavailable, "cut off"), codes.Unavailable, 0},
		{"enospc", fmt.Errorf("write chunk: %w", syscall.ENOSPC), 0, syscall.ENOSPC},
		{"eio", fmt.Errorf("checksum mismatch: %w", syscall.EIO), 0, syscall.EIO},
		{"plain", errors.New("boom"), codes.Internal, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &testHandler{write: func(context.Context, *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error) {
				return nil, tt.err
			}}
			c, _ := start(t, h, 1)
			_, err := c.WriteChunk(context.Background(), &weftv1.WriteChunkRequest{Data: []byte("x")})
			if err == nil {
				t.Fatal("no error")
			}
			if tt.wantErrno != 0 {
				if !errors.Is(err, tt.wantErrno) {
					t.Errorf("error %v does not wrap %v", err, tt.wantErrno)
				}
				if e, ok := fserr.Errno(err); !ok || e != tt.wantErrno {
					t.Errorf("fserr.Errno = %v, %v", e, ok)
				}
				if err.Error() != tt.err.Error() {
					t.Errorf("message %q, want %q", err.Error(), tt.err.Error())
				}
				return
			}
			if got := status.Code(err); got != tt.wantCode {
				t.Errorf("code %v, want %v (%v)", got, tt.wantCode, err)
			}
			if st, _ := status.FromError(err); st.Message() != status.Convert(tt.err).Message() && tt.wantCode != codes.Internal {
				t.Errorf("message %q", st.Message())
			}
		})
	}
}

// TestCancel gives up on a request: the caller gets Canceled at once, the
// server's handler sees its context cancelled, and the connection keeps
// working.
func TestCancel(t *testing.T) {
	started := make(chan struct{}, 1)
	cancelled := make(chan struct{})
	h := &testHandler{
		sync: func(ctx context.Context, _ *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error) {
			started <- struct{}{}
			<-ctx.Done()
			close(cancelled)
			return nil, ctx.Err()
		},
		read: func(context.Context, *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error) {
			return &weftv1.ReadChunkResponse{Data: []byte("ok")}, nil
		},
	}
	c, _ := start(t, h, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	_, err := c.SyncFile(ctx, &weftv1.SyncFileRequest{})
	if status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled request: %v, want Canceled", err)
	}
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the server's handler was not cancelled")
	}
	resp, err := c.ReadChunk(context.Background(), &weftv1.ReadChunkRequest{})
	if err != nil || string(resp.GetData()) != "ok" {
		t.Fatalf("request after a cancel: %v, %v", resp, err)
	}

	// A deadline travels to the server.
	h.sync = func(ctx context.Context, _ *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error) {
		if _, ok := ctx.Deadline(); !ok {
			return nil, errors.New("no deadline on the server")
		}
		return &weftv1.SyncFileResponse{}, nil
	}
	dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
	defer dcancel()
	if _, err := c.SyncFile(dctx, &weftv1.SyncFileRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestBrokenConnection cuts the connection while requests wait: they fail
// with Unavailable (what the client's retry logic takes as "server
// unreachable"), and the next request connects again.
func TestBrokenConnection(t *testing.T) {
	const n = 4
	release := make(chan struct{})
	var arrived sync.WaitGroup
	arrived.Add(n)
	h := &testHandler{read: func(ctx context.Context, r *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error) {
		if r.GetOffset() == 1 {
			arrived.Done()
			<-release
		}
		return &weftv1.ReadChunkResponse{Data: []byte("ok")}, nil
	}}
	c, tl := start(t, h, 2)
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.ReadChunk(context.Background(), &weftv1.ReadChunkRequest{Offset: 1})
			errs <- err
		}()
	}
	arrived.Wait()
	tl.cut()
	for range n {
		if err := <-errs; status.Code(err) != codes.Unavailable {
			t.Errorf("request on a cut connection: %v, want Unavailable", err)
		}
	}
	close(release)
	for range 2 * DefaultConns {
		if _, err := c.ReadChunk(context.Background(), &weftv1.ReadChunkRequest{}); err != nil {
			t.Fatalf("request after reconnecting: %v", err)
		}
	}
}

// TestUnreachable: a server that is not there is Unavailable.
func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	c := NewClient(addr, 1)
	defer c.Close()
	_, err = c.WriteChunk(context.Background(), &weftv1.WriteChunkRequest{Data: []byte("x")})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("write to a dead address: %v, want Unavailable", err)
	}
}

// TestBadPreface: the server closes a connection that does not speak the
// protocol.
func TestBadPreface(t *testing.T) {
	h := &testHandler{}
	c, _ := start(t, h, 1)
	nc, err := net.Dial("tcp", c.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [8]byte
	if n, err := nc.Read(b[:]); err == nil {
		t.Fatalf("server answered %q to a foreign protocol", b[:n])
	}
}

// TestCloseDrains closes the server while a request is under way: the
// request is answered, then the connection closes and new requests fail
// with Unavailable.
func TestCloseDrains(t *testing.T) {
	started := make(chan struct{})
	release := make(chan struct{})
	h := &testHandler{sync: func(context.Context, *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error) {
		close(started)
		<-release
		return &weftv1.SyncFileResponse{}, nil
	}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(h, slog.New(slog.DiscardHandler))
	go s.Serve(l)
	c := NewClient(l.Addr().String(), 1)
	defer c.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := c.SyncFile(context.Background(), &weftv1.SyncFileRequest{})
		errc <- err
	}()
	<-started
	closed := make(chan struct{})
	go func() {
		s.Close(time.Minute)
		close(closed)
	}()
	close(release)
	if err := <-errc; err != nil {
		t.Errorf("request under way at Close: %v", err)
	}
	<-closed
	if _, err := c.SyncFile(context.Background(), &weftv1.SyncFileRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("request after Close: %v, want Unavailable", err)
	}
}
