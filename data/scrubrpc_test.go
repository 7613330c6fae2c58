package data

import (
	"bytes"
	"context"
	"testing"

	"github.com/weft-fs/weft/data/chunk"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// The Scrub RPC runs a full pass at once and answers with its counts: a
// bad copy is found and repaired from a peer before it answers.
func TestScrubRPC(t *testing.T) {
	c := newChainCluster(t, 3, nil)
	ctx := context.Background()
	id := chunk.ID{Ino: 0x52, Index: 0}
	data := bytes.Repeat([]byte("scrub"), 50000)
	c.mustWrite(0, id.Ino, id.Index, 0, data)
	flipFileByte(t, c.target(1).Dir(), id, 123456)

	scrub := func(server int) *weftv1.ScrubResponse {
		t.Helper()
		resp, err := c.servers[server].client.Scrub(ctx, &weftv1.ScrubRequest{})
		if err != nil {
			t.Fatalf("Scrub on server %d: %v", server, err)
		}
		return resp
	}
	if got := scrub(0); got.Chunks != 1 || got.Bytes != uint64(len(data)) || got.Errors != 0 || got.Repaired != 0 {
		t.Errorf("scrub of a good copy: %v, want 1 chunk of %d bytes, nothing bad", got, len(data))
	}
	if got := scrub(1); got.Chunks != 1 || got.Errors != 1 || got.Repaired != 1 {
		t.Errorf("scrub of a bad copy: %v, want 1 chunk, 1 bad, 1 repaired", got)
	}
	c.checkIdentical(t, 0, 1, 2)
	if got := scrub(1); got.Chunks != 1 || got.Errors != 0 || got.Repaired != 0 {
		t.Errorf("scrub after the repair: %v, want 1 chunk, nothing bad", got)
	}

	empty := startServer(t, Config{Dir: t.TempDir(), ScrubRate: -1})
	if got, err := empty.client.Scrub(ctx, &weftv1.ScrubRequest{}); err != nil || got.Chunks != 0 || got.Bytes != 0 {
		t.Errorf("scrub of an empty server: %v, %v", got, err)
	}
}
