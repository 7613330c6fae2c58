package meta

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestWireAddress checks what session answers name as the lean path:
// the server's address (or its advertise address) with the Unix socket in
// the service's directory, and that batches are served on both the socket
// and the gRPC port.
func TestWireAddress(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"default", Config{}},
		{"advertise", Config{Advertise: "203.0.113.1:7000"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Dir, cfg.Logger, cfg.Cluster = t.TempDir(), quietLogger(), cluster.Config{Logger: quietLogger()}
			s, err := Open(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			sctx, stop := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- s.Serve(sctx, lis) }()
			defer func() {
				stop()
				if err := <-served; err != nil {
					t.Errorf("serve: %v", err)
				}
			}()
			cc, err := rpc.Dial(lis.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			mc := weftv1.NewMetaClient(cc)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			so, err := mc.OpenSession(ctx, &weftv1.OpenSessionRequest{Host: "test"}, grpc.WaitForReady(true))
			if err != nil {
				t.Fatal(err)
			}
			rs, err := mc.RenewSession(ctx, &weftv1.RenewSessionRequest{Session: so.Session})
			if err != nil {
				t.Fatal(err)
			}
			if rs.WireAddress != so.WireAddress {
				t.Errorf("renewal names %q, the opening %q", rs.WireAddress, so.WireAddress)
			}
			a := wire.ParseAddr(so.WireAddress)
			want := lis.Addr().String()
			if tc.cfg.Advertise != "" {
				want = tc.cfg.Advertise
			}
			if a.TCP != want || a.Unix == "" || a.ID == "" {
				t.Fatalf("lean path %q, want %s with a Unix socket and an identity", so.WireAddress, want)
			}
			body, _ := proto.Marshal(&weftv1.GetAttrRequest{Ino: rootIno})
			req := &weftv1.BatchRequest{Calls: []*weftv1.BatchCall{{Method: "GetAttr", Request: body}}}
			for _, addr := range []string{so.WireAddress, lis.Addr().String()} {
				w := wire.NewMetaClient(addr)
				resp, err := w.Batch(ctx, req)
				w.Close()
				if err != nil {
					t.Fatalf("batch on the lean path %s: %v", addr, err)
				}
				var ga weftv1.AttrResponse
				if err := batchOutcome(t, resp.Replies[0], &ga); err != nil || ga.Attr.Ino != rootIno {
					t.Fatalf("getattr of the root on the lean path %s: %v, %v", addr, ga.Attr, err)
				}
			}
		})
	}
}
