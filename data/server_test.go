package data

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// testClient is a real client of a test server: gRPC for the Data
// service, the lean protocol (on the same port) for chunk I/O.
type testClient struct {
	weftv1.DataClient
	*wire.Client
}

type testServer struct {
	srv    *Server
	addr   string
	wire   string // the lean data path address
	client testClient
	logs   *syncBuffer
	done   chan error
	cancel context.CancelFunc
	once   sync.Once
}

// startServer runs a real data server on 127.0.0.1:0 whose meta service is
// unreachable, and a real client of it.
func startServer(t testing.TB, cfg Config) *testServer {
	t.Helper()
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	if cfg.MetaAddr == "" {
		cfg.MetaAddr = deadAddr(t)
	}
	srv, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{srv: srv, addr: lis.Addr().String(), logs: logs, done: make(chan error, 1), cancel: cancel}
	go func() { ts.done <- srv.Serve(ctx, lis) }()
	cc, err := rpc.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ts.client = testClient{weftv1.NewDataClient(cc), wire.NewClient(ts.addr, 0)}
	t.Cleanup(func() {
		cc.Close()
		ts.client.Client.Close()
		ts.stop(t)
	})
	for deadline := time.Now().Add(10 * time.Second); ts.srv.WireAddr() == ""; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server reports no lean data path address")
		}
	}
	ts.wire = ts.srv.WireAddr()
	return ts
}

func (ts *testServer) stop(t testing.TB) {
	t.Helper()
	ts.once.Do(func() {
		ts.cancel()
		select {
		case err := <-ts.done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return after cancel")
		}
	})
}

func TestDataService(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, Config{Dir: dir, Targets: []string{filepath.Join(dir, "t1"), filepath.Join(dir, "t2")}})
	ctx := context.Background()
	c := ts.client

	// No chain table yet: Unavailable.
	_, err := c.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5}, ChainId: 1, ChainVersion: 1, Data: []byte("x"), ChunkSize: 1 << 20})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("write before chain table: %v, want Unavailable", err)
	}

	ts.srv.SetTargetIDs([]uint64{11, 12})
	ts.srv.SetChains(&weftv1.ChainTable{Version: 3, Chains: []*weftv1.Chain{
		{Id: 1, Version: 2, Members: []*weftv1.ChainMember{{TargetId: 11}}},
		{Id: 2, Version: 1, Members: []*weftv1.ChainMember{{TargetId: 12}}},
		{Id: 3, Version: 1, Members: []*weftv1.ChainMember{{TargetId: 99}}},
	}})
	data := bytes.Repeat([]byte("weft"), 50000) // 200000 bytes: several blocks
	const chunkSize = 1 << 20
	tests := []struct {
		name     string
		call     func() ([]byte, error)
		wantData []byte
		wantCode codes.Code
		wantErr  syscall.Errno
	}{
		{name: "write", call: func() ([]byte, error) {
			_, err := c.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5, Index: 0}, ChainId: 1, ChainVersion: 2, Offset: 100, Data: data, ChunkSize: chunkSize, Sync: true})
			return nil, err
		}},
		{name: "read back", wantData: data[1000:2000], call: func() ([]byte, error) {
			r, err := c.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5}, ChainId: 1, ChainVersion: 2, Offset: 1100, Length: 1000})
			return r.GetData(), err
		}},
		{name: "read past end is short", wantData: data[len(data)-10:], call: func() ([]byte, error) {
			r, err := c.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5}, ChainId: 1, ChainVersion: 2, Offset: uint64(100 + len(data) - 10), Length: 4096})
			return r.GetData(), err
		}},
		{name: "missing chunk reads empty", wantData: nil, call: func() ([]byte, error) {
			r, err := c.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5, Index: 1}, ChainId: 2, ChainVersion: 1, Length: 4096})
			return r.GetData(), err
		}},
		{name: "stale chain version", wantCode: codes.FailedPrecondition, call: func() ([]byte, error) {
			r, err := c.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5}, ChainId: 1, ChainVersion: 1, Length: 10})
			return r.GetData(), err
		}},
		{name: "chain without local member", wantCode: codes.FailedPrecondition, call: func() ([]byte, error) {
			_, err := c.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5}, ChainId: 3, ChainVersion: 1, Data: data, ChunkSize: chunkSize})
			return nil, err
		}},
		{name: "unknown chain", wantCode: codes.FailedPrecondition, call: func() ([]byte, error) {
			_, err := c.SyncFile(ctx, &weftv1.SyncFileRequest{Ino: 5, ChainId: 42, ChainVersion: 1})
			return nil, err
		}},
		{name: "write past chunk size", wantErr: syscall.EINVAL, call: func() ([]byte, error) {
			_, err := c.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5}, ChainId: 1, ChainVersion: 2, Offset: chunkSize - 1, Data: data, ChunkSize: chunkSize})
			return nil, err
		}},
		{name: "sync", call: func() ([]byte, error) {
			_, err := c.SyncFile(ctx, &weftv1.SyncFileRequest{Ino: 5, ChainId: 1, ChainVersion: 2})
			return nil, err
		}},
		{name: "truncate", call: func() ([]byte, error) {
			_, err := c.TruncateFile(ctx, &weftv1.TruncateFileRequest{Ino: 5, Size: 150, ChunkSize: chunkSize, ChainId: 1, ChainVersion: 2})
			return nil, err
		}},
		{name: "read after truncate", wantData: data[:50], call: func() ([]byte, error) {
			r, err := c.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5}, ChainId: 1, ChainVersion: 2, Offset: 100, Length: 1000})
			return r.GetData(), err
		}},
		{name: "write on second target", call: func() ([]byte, error) {
			_, err := c.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5, Index: 1}, ChainId: 2, ChainVersion: 1, Data: data, ChunkSize: chunkSize})
			return nil, err
		}},
		{name: "delete", call: func() ([]byte, error) {
			_, err := c.DeleteFile(ctx, &weftv1.DeleteFileRequest{Ino: 5})
			return nil, err
		}},
		{name: "deleted from every target", wantData: nil, call: func() ([]byte, error) {
			r1, err := c.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5}, ChainId: 1, ChainVersion: 2, Length: 10})
			if err != nil {
				return nil, err
			}
			r2, err := c.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5, Index: 1}, ChainId: 2, ChainVersion: 1, Length: 10})
			return append(r1.GetData(), r2.GetData()...), err
		}},
	}
	for _, tc := range tests {
		got, err := tc.call()
		switch {
		case tc.wantCode != codes.OK:
			if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), "stale chain version") {
				t.Errorf("%s: %v, want %v stale chain version", tc.name, err, tc.wantCode)
			}
		case tc.wantErr != 0:
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("%s: %v, want %v", tc.name, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !bytes.Equal(got, tc.wantData):
			t.Errorf("%s: got %d bytes, want %d", tc.name, len(got), len(tc.wantData))
		}
	}
}

func TestCorruptChunkGivesEIO(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, Config{Dir: dir})
	ts.srv.SetTargetIDs([]uint64{1})
	ts.srv.SetChains(&weftv1.ChainTable{Chains: []*weftv1.Chain{{Id: 7, Version: 1, Members: []*weftv1.ChainMember{{TargetId: 1}}}}})
	ctx := context.Background()
	chunkID := &weftv1.ChunkID{Ino: 0x1ab, Index: 4}
	if _, err := ts.client.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: chunkID, ChainId: 7, ChainVersion: 1, Data: bytes.Repeat([]byte{7}, 100000), ChunkSize: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "chunks", "ab", "1ab", "4.w")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[dataOffset(t, b)+70000] ^= 1
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = ts.client.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: chunkID, ChainId: 7, ChainVersion: 1, Offset: 65536, Length: 10000})
	if !errors.Is(err, syscall.EIO) || !strings.Contains(err.Error(), "block 1") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("read of corrupt chunk: %v, want EIO naming block 1 and the target", err)
	}
	if _, err := ts.client.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: chunkID, ChainId: 7, ChainVersion: 1, Length: 10000}); err != nil {
		t.Fatalf("read of intact block: %v", err)
	}
}

func TestMetaUnreachableIsLoggedOnce(t *testing.T) {
	dir := t.TempDir()
	meta := deadAddr(t)
	ts := startServer(t, Config{Dir: dir, MetaAddr: meta})
	time.Sleep(1500 * time.Millisecond) // several retries
	ts.stop(t)
	logs := ts.logs.String()
	t.Log(logs)
	want := "cannot reach meta service at " + meta
	if n := strings.Count(logs, want); n != 1 {
		t.Fatalf("%q logged %d times, want once; logs:\n%s", want, n, logs)
	}
	if !strings.Contains(logs, "retrying every 1s") {
		t.Errorf("log does not say it retries:\n%s", logs)
	}
}

func TestIdentityIsStable(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "disk1")
	var ids []string
	for range 2 {
		srv, err := Open(Config{Dir: dir, Targets: []string{target}, MetaAddr: "127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, srv.serverUUID+" "+srv.targetUUIDs[0])
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if ids[0] != ids[1] || len(ids[0]) != 73 {
		t.Fatalf("identities changed or malformed across restarts: %q", ids)
	}
	for _, p := range []string{filepath.Join(dir, "server.id"), filepath.Join(target, "target.id")} {
		if _, err := os.Stat(p); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no dir", Config{MetaAddr: "127.0.0.1:1"}, "no state directory"},
		{"no meta", Config{Dir: t.TempDir()}, "no meta service address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Open(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want error containing %q", err, tc.want)
			}
		})
	}
}
