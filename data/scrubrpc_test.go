package data

import (
	"bytes"
	"context"
	"os"
	"strings"
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
	// A copy whose header is damaged (its chain unknown on this target)
	// comes back with the chain it belongs to.
	damageHeader(t, c.target(2).Dir(), id)
	c.target(2).Verify(id) // reread from the disk
	if got := scrub(2); got.Errors != 1 || got.Repaired != 1 {
		t.Errorf("scrub of a copy with a damaged header: %v, want 1 bad, 1 repaired", got)
	}
	if info, err := c.target(2).Stat(id); err != nil || info.Chain != testChain {
		t.Errorf("repaired copy: %+v, %v; want chain %d in its header", info, err, testChain)
	}
	c.checkIdentical(t, 0, 1, 2)

	empty := startServer(t, Config{Dir: t.TempDir(), ScrubRate: -1})
	if got, err := empty.client.Scrub(ctx, &weftv1.ScrubRequest{}); err != nil || got.Chunks != 0 || got.Bytes != 0 {
		t.Errorf("scrub of an empty server: %v, %v", got, err)
	}
}

// A bad copy with no other replica to repair it from is named in the
// answer, with what is wrong and why it stays.
func TestScrubNamesWhatItCannotRepair(t *testing.T) {
	c := newChainCluster(t, 1, nil)
	id := chunk.ID{Ino: 0x53, Index: 2}
	c.mustWrite(0, id.Ino, id.Index, 0, bytes.Repeat([]byte("alone"), 30000))
	flipFileByte(t, c.target(0).Dir(), id, 777)
	resp, err := c.servers[0].client.Scrub(context.Background(), &weftv1.ScrubRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Errors != 1 || resp.Repaired != 0 || len(resp.Unrepaired) != 1 {
		t.Fatalf("scrub: %v, want 1 bad copy, not repaired and listed", resp)
	}
	u := resp.Unrepaired[0]
	if u.GetChunk().GetIno() != id.Ino || u.GetChunk().GetIndex() != id.Index || u.GetTargetDir() != c.target(0).Dir() ||
		!strings.Contains(u.GetProblem(), "checksum mismatch") || !strings.Contains(u.GetReason(), "no other serving member") {
		t.Errorf("unrepaired copy %v: want the chunk, its target, the checksum mismatch and the missing replica", u)
	}
}

// damageHeader flips a byte of a chunk file's header on a target.
func damageHeader(t *testing.T, targetDir string, id chunk.ID) {
	t.Helper()
	path := chunkFilePath(targetDir, id)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[17] ^= 0x10 // the chain id
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
