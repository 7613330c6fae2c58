package client

import (
	"testing"

	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestChunkIOOverUnixSocket checks that data servers on the client's host
// report a Unix socket with their lean data path address and that the
// client's chunk I/O goes through it, its data through the shared arena.
func TestChunkIOOverUnixSocket(t *testing.T) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 2, Replicas: 2}
	tc := startCluster(t, layout, 2)
	c := newTestClient(t, tc.metaAddr, Config{})
	writeReadBack(t, c, c, "unix")
	c.chains.connsMu.Lock()
	defer c.chains.connsMu.Unlock()
	if len(c.chains.wires) == 0 {
		t.Fatal("no lean data path clients")
	}
	for addr, w := range c.chains.wires {
		if a := wire.ParseAddr(addr); a.Unix == "" {
			t.Errorf("data server at %s reports no Unix socket", addr)
		}
		if w.Calls() > 0 && w.UnixConns() == 0 {
			t.Errorf("%d requests to %s, none through its Unix socket", w.Calls(), addr)
		}
		if w.Calls() > 0 && w.ShmCalls() == 0 {
			t.Errorf("%d requests to %s, none with its data in the shared arena", w.Calls(), addr)
		}
	}
}
