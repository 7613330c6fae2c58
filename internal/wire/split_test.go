package wire

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestSplitOnePort: gRPC and the lean protocol served on one port, each
// connection to the server of its protocol, many of each at once; a
// connection that says nothing is closed once it closes; closing both
// sides closes the port.
func TestSplitOnePort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	other, lean := Split(l, slog.New(slog.DiscardHandler))
	if other.Addr().String() != addr || lean.Addr().String() != addr {
		t.Fatalf("addresses %s and %s, want %s", other.Addr(), lean.Addr(), addr)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go gs.Serve(other)
	h := &testHandler{write: func(ctx context.Context, r *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error) {
		return &weftv1.WriteChunkResponse{NeedFullChunk: len(r.Data) == 1000}, nil
	}}
	ws := NewServer(h, slog.New(slog.DiscardHandler))
	go ws.Serve(lean)

	// A connection that closes without a byte, and one that sends only
	// part of a preface and closes: neither holds anything up.
	for _, b := range [][]byte{nil, []byte("we")} {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		nc.Write(b)
		nc.Close()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	wc := NewClient(addr, 4)
	defer wc.Close()
	errs := make(chan error, 16)
	for range 8 {
		go func() {
			_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			errs <- err
		}()
		go func() {
			resp, err := wc.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 1}, Data: make([]byte, 1000)})
			if err == nil && !resp.NeedFullChunk {
				t.Errorf("lean write answered %v", resp)
			}
			errs <- err
		}()
	}
	for range 16 {
		if err := <-errs; err != nil {
			t.Errorf("call on the shared port: %v", err)
		}
	}

	gs.Stop()
	if _, err := net.Dial("tcp", addr); err != nil {
		t.Fatalf("the port closed with the gRPC side only: %v", err)
	}
	ws.Close(time.Second)
	if nc, err := net.Dial("tcp", addr); err == nil {
		nc.Close()
		t.Fatal("the port is still open after both sides closed")
	}
}
