package client

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"

	"google.golang.org/grpc"

	"github.com/weft-fs/weft/internal/testcluster"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// pathCounts counts chunk requests by the path they took.
type pathCounts struct {
	wire, grpc atomic.Int64
}

// pathCounting counts a data client's chunk requests as wire or gRPC ones
// by the client it wraps.
type pathCounting struct {
	weftv1.DataClient
	c *pathCounts
}

func (p pathCounting) count() {
	if _, ok := p.DataClient.(wire.DataClient); ok {
		p.c.wire.Add(1)
	} else {
		p.c.grpc.Add(1)
	}
}

func (p pathCounting) WriteChunk(ctx context.Context, in *weftv1.WriteChunkRequest, opts ...grpc.CallOption) (*weftv1.WriteChunkResponse, error) {
	p.count()
	return p.DataClient.WriteChunk(ctx, in, opts...)
}

func (p pathCounting) ReadChunk(ctx context.Context, in *weftv1.ReadChunkRequest, opts ...grpc.CallOption) (*weftv1.ReadChunkResponse, error) {
	p.count()
	return p.DataClient.ReadChunk(ctx, in, opts...)
}

func (p pathCounting) SyncFile(ctx context.Context, in *weftv1.SyncFileRequest, opts ...grpc.CallOption) (*weftv1.SyncFileResponse, error) {
	p.count()
	return p.DataClient.SyncFile(ctx, in, opts...)
}

// writeReadBack writes files of several sizes through c and reads them
// back through a second client.
func writeReadBack(t *testing.T, c, r *Client, prefix string) {
	t.Helper()
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(21, 22))
	for i, size := range []int{1, 100 << 10, 3<<20 + 12345} {
		name := fmt.Sprintf("%s-%d", prefix, i)
		model := randomBytes(rnd, size)
		f := create(t, c, name, syscall.O_WRONLY)
		if _, err := f.WriteAt(ctx, model, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
		g, _ := open(t, r, name, syscall.O_RDONLY)
		if got := readAll(t, g, size, 128<<10); !bytes.Equal(got, model) {
			t.Fatalf("%s reads back wrong", name)
		}
		g.Release(ctx)
	}
}

// TestChunkIOOverWire checks that with data servers that have a lean data
// path, every chunk read, write and sync takes it, and none gRPC.
func TestChunkIOOverWire(t *testing.T) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 2, Replicas: 2}
	tc := startCluster(t, layout, 2)
	c, counts := pathCountingClient(t, tc.metaAddr)
	writeReadBack(t, c, c, "wire")
	if counts.wire.Load() == 0 || counts.grpc.Load() != 0 {
		t.Errorf("chunk requests: %d over the lean data path, %d over gRPC; want all over the lean data path",
			counts.wire.Load(), counts.grpc.Load())
	}
	if got, want := c.chains.wireCalls(), uint64(counts.wire.Load()); got != want {
		t.Errorf("the lean data path clients sent %d requests, want %d", got, want)
	}
}

// TestChunkIOMixedPaths runs a replicated cluster where data server 0 has
// no lean data path (as an older version, or with it turned off): chunk
// I/O to it goes over gRPC, to the other over the lean data path, and
// writes forwarded between them in either direction work.
func TestChunkIOMixedPaths(t *testing.T) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 4, Replicas: 2}
	o := testcluster.Options{DataServers: 2, Layout: layout,
		// A server behind a front has no lean data path (testcluster):
		// no wire address is reported.
		Front: func(i int, addr string) (string, func()) {
			if i == 0 {
				return addr, nil
			}
			return "", nil
		}}
	if testing.Verbose() {
		o.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	srv := testcluster.Start(t, o)
	c, counts := pathCountingClient(t, srv.MetaAddr())
	r := newTestClient(t, srv.MetaAddr(), Config{})
	writeReadBack(t, c, r, "mixed")
	if counts.wire.Load() == 0 || counts.grpc.Load() == 0 {
		t.Errorf("chunk requests: %d over the lean data path, %d over gRPC; want both",
			counts.wire.Load(), counts.grpc.Load())
	}
}

// pathCountingClient is a test client whose chunk requests are counted by
// path.
func pathCountingClient(t *testing.T, metaAddr string) (*Client, *pathCounts) {
	t.Helper()
	c := newTestClient(t, metaAddr, Config{})
	counts := &pathCounts{}
	c.chains.connsMu.Lock()
	c.chains.wrap = func(dc weftv1.DataClient) weftv1.DataClient { return pathCounting{dc, counts} }
	c.chains.connsMu.Unlock()
	return c, counts
}
