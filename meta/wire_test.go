package meta

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestWireAddress checks what session answers name as the lean path:
// by default an address (with the Unix socket in the service's directory)
// that serves batches as gRPC does; nothing with it off, or with an
// advertise address and no wire advertise address.
func TestWireAddress(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    Config
		served bool
	}{
		{"default", Config{}, true},
		{"off", Config{WireListen: WireOff}, false},
		{"advertise without wire advertise", Config{Advertise: "203.0.113.1:7000"}, false},
		{"wire advertise", Config{Advertise: "203.0.113.1:7000", WireAdvertise: "203.0.113.1:7001"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Dir, cfg.Logger, cfg.Cluster = t.TempDir(), quietLogger(), cluster.Config{Logger: quietLogger()}
			s, err := Open(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			mc := serveMeta(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			so, err := mc.OpenSession(ctx, &weftv1.OpenSessionRequest{Host: "test"})
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
			switch {
			case tc.cfg.WireAdvertise != "":
				if a.TCP != tc.cfg.WireAdvertise {
					t.Fatalf("lean path %q, want the wire advertise address %s", so.WireAddress, tc.cfg.WireAdvertise)
				}
				return
			case !tc.served:
				if so.WireAddress != "" {
					t.Fatalf("lean path %q, want none", so.WireAddress)
				}
				return
			case a.Unix == "" || a.ID == "":
				t.Fatalf("lean path %q names no Unix socket", so.WireAddress)
			}
			body, _ := proto.Marshal(&weftv1.GetAttrRequest{Ino: rootIno})
			req := &weftv1.BatchRequest{Calls: []*weftv1.BatchCall{{Method: "GetAttr", Request: body}}}
			for _, addr := range []string{so.WireAddress, a.TCP} {
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
