package data

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// BenchmarkChunkProtocol compares the two network protocols a data server
// speaks for chunk I/O, on loopback TCP: gRPC and the lean framing of
// internal/wire, and the lean framing on the server's Unix socket (as a
// client on the same host uses it): 1 MiB writes (64 chunks in turn, not
// synced) and 1 MiB reads of one chunk. data/README.md ("Why one
// protocol") quotes it.
func BenchmarkChunkProtocol(b *testing.B) {
	dir := b.TempDir()
	ts := startServer(b, Config{Dir: dir, Targets: []string{filepath.Join(dir, "t1")}})
	ts.srv.SetTargetIDs([]uint64{11})
	ts.srv.SetChains(&weftv1.ChainTable{Version: 1, Chains: []*weftv1.Chain{
		{Id: 1, Version: 1, Members: []*weftv1.ChainMember{{TargetId: 11}}},
	}})
	w := wire.NewClient(ts.addr, 0) // the same port, TCP as gRPC
	defer w.Close()
	u := wire.NewClient(ts.wire, 0) // the Unix socket
	defer u.Close()
	type protocol struct {
		name  string
		write func(ctx context.Context, r *weftv1.WriteChunkRequest) error
		read  func(ctx context.Context, r *weftv1.ReadChunkRequest) ([]byte, error)
	}
	protocols := []protocol{
		{"grpc",
			func(ctx context.Context, r *weftv1.WriteChunkRequest) error {
				_, err := ts.client.WriteChunk(ctx, r)
				return err
			},
			func(ctx context.Context, r *weftv1.ReadChunkRequest) ([]byte, error) {
				resp, err := ts.client.ReadChunk(ctx, r)
				return resp.GetData(), err
			}},
	}
	for _, c := range []struct {
		name string
		w    *wire.Client
	}{{"lean", w}, {"lean-unix", u}} {
		protocols = append(protocols, protocol{c.name,
			func(ctx context.Context, r *weftv1.WriteChunkRequest) error {
				_, err := c.w.WriteChunk(ctx, r)
				return err
			},
			func(ctx context.Context, r *weftv1.ReadChunkRequest) ([]byte, error) {
				resp, err := c.w.ReadChunk(ctx, r)
				return resp.GetData(), err
			}})
	}
	const size = 1 << 20
	data := bytes.Repeat([]byte{7}, size)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, p := range protocols {
		ino := uint64(100 + i)
		b.Run(p.name+"/write", func(b *testing.B) {
			b.SetBytes(size)
			for n := range b.N {
				if err := p.write(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: ino, Index: uint64(n % 64)},
					ChainId: 1, ChainVersion: 1, Data: data, ChunkSize: size}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(p.name+"/read", func(b *testing.B) {
			b.SetBytes(size)
			for range b.N {
				got, err := p.read(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: ino}, ChainId: 1, ChainVersion: 1, Length: size})
				if err != nil || len(got) != size {
					b.Fatalf("read: %d bytes, %v", len(got), err)
				}
			}
		})
	}
}
