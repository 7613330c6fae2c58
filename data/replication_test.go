package data

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/data/chunk"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestChainReplicatesMutations(t *testing.T) {
	c := newChainCluster(t, 3, nil)
	ctx := context.Background()
	head := c.servers[0].client
	tests := []struct {
		name string
		op   func() error
	}{
		{"write", func() error { return c.write(0, 100, 0, 0, bytes.Repeat([]byte("a"), 200000)) }},
		{"overwrite unaligned", func() error { return c.write(0, 100, 0, 70000, bytes.Repeat([]byte("b"), 1000)) }},
		{"write of pieces", func() error {
			_, err := head.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 100},
				ChainId: testChain, ChainVersion: c.curVersion(), ChunkSize: 1 << 20,
				Offset: weftv1.PiecesOffset, Data: []byte("p1p1pp2"), PieceOffsets: []uint64{10, 250000}, PieceLengths: []uint32{4, 3}})
			return err
		}},
		{"second chunk", func() error { return c.write(0, 100, 1, 5000, bytes.Repeat([]byte("c"), 300000)) }},
		{"other file", func() error { return c.write(0, 101, 0, 0, []byte("gone soon")) }},
		{"sync write", func() error {
			_, err := head.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 100, Index: 2},
				ChainId: testChain, ChainVersion: c.curVersion(), Data: []byte("durable"), ChunkSize: 1 << 20, Sync: true})
			return err
		}},
		{"sync file", func() error {
			_, err := head.SyncFile(ctx, &weftv1.SyncFileRequest{Ino: 100, ChainId: testChain, ChainVersion: c.curVersion()})
			return err
		}},
		{"truncate", func() error {
			_, err := head.TruncateFile(ctx, &weftv1.TruncateFileRequest{Ino: 100, Size: 1<<20 + 100000, ChunkSize: 1 << 20,
				ChainId: testChain, ChainVersion: c.curVersion()})
			return err
		}},
		{"delete in chain", func() error {
			_, err := head.DeleteFile(ctx, &weftv1.DeleteFileRequest{Ino: 101, ChainId: testChain, ChainVersion: c.curVersion()})
			return err
		}},
	}
	for _, tc := range tests {
		if err := tc.op(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		c.checkIdentical(t, 0, 1, 2)
	}
	if n := c.checkIdentical(t, 0, 1, 2); n != 2 {
		t.Fatalf("%d chunks left in the chain, want 2 (inode 100 chunks 0 and 1)", n)
	}
	for i := range 3 {
		info, err := c.target(i).Stat(chunk.ID{Ino: 100, Index: 1})
		if err != nil || info.Version != 2 || info.Length != 100000 {
			t.Fatalf("server %d: chunk 1 after write and truncate: %+v, %v; want version 2, 100000 bytes", i, info, err)
		}
	}
	r, err := c.servers[2].client.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 100}, ChainId: testChain,
		ChainVersion: c.curVersion(), Offset: 70000, Length: 1000})
	if err != nil || !bytes.Equal(r.GetData(), bytes.Repeat([]byte("b"), 1000)) {
		t.Fatalf("read from the tail: %v", err)
	}
	for _, p := range []struct {
		off  uint64
		want string
	}{{8, "aap1p1aa"}, {199998, "aa"}, {249999, "\x00pp2"}} {
		r, err := c.servers[2].client.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 100}, ChainId: testChain,
			ChainVersion: c.curVersion(), Offset: p.off, Length: uint32(len(p.want))})
		if err != nil || string(r.GetData()) != p.want {
			t.Fatalf("read %d bytes at %d from the tail after a write of pieces: %q, %v; want %q", len(p.want), p.off, r.GetData(), err, p.want)
		}
	}
	if info, err := c.target(2).Stat(chunk.ID{Ino: 100}); err != nil || info.Version != 3 {
		t.Fatalf("chunk 0 on the tail after three writes (one of pieces): %+v, %v; want version 3", info, err)
	}

	err = c.write(1, 100, 0, 0, []byte("x"))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "not the chain head") {
		t.Fatalf("client write to a middle member: %v, want FailedPrecondition not the chain head", err)
	}
	c.setStates(stateServing, stateServing, stateSyncing)
	_, err = c.servers[2].client.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 100}, ChainId: testChain,
		ChainVersion: c.curVersion(), Length: 10})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "syncing") {
		t.Fatalf("read from a syncing member: %v, want FailedPrecondition", err)
	}
}

func TestWriteFailsWhileMemberDown(t *testing.T) {
	c := newChainCluster(t, 3, nil)
	c.mustWrite(0, 5, 0, 0, []byte("before"))
	c.stop(2)
	err := c.write(0, 5, 0, 0, []byte("during"))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "data server 3 ("+c.servers[2].addr+")") {
		t.Fatalf("write with the tail down: %v, want Unavailable naming data server 3", err)
	}
	// The manager takes the member out: writes go on without it.
	c.setStates(stateServing, stateServing, stateOffline)
	c.mustWrite(0, 5, 0, 0, []byte("after"))
	c.checkIdentical(t, 0, 1)
}

func TestStaleChainVersionRefused(t *testing.T) {
	c := newChainCluster(t, 3, nil)
	ctx := context.Background()
	old := c.curVersion()
	tests := []struct {
		name    string
		install func() // table changes the test makes before writing
		version func() uint64
	}{
		{"client behind", func() { c.setStates(stateServing, stateServing, stateServing) }, func() uint64 { return old }},
		{"next member behind", func() {
			c.mu.Lock()
			c.version++
			c.installLocked(c.version, []int{0, 2})
			c.mu.Unlock()
		}, c.curVersion},
		{"next member ahead", func() {
			c.mu.Lock()
			c.installLocked(c.version+1, []int{1})
			c.mu.Unlock()
		}, c.curVersion},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.install()
			_, err := c.servers[0].client.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 9},
				ChainId: testChain, ChainVersion: tc.version(), Data: []byte("x"), ChunkSize: 1 << 20})
			if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "stale chain version") {
				t.Fatalf("got %v, want FailedPrecondition stale chain version", err)
			}
		})
	}
}

func TestForwardedWriteNeedsFullChunk(t *testing.T) {
	c := newChainCluster(t, 3, nil)
	id := chunk.ID{Ino: 0x2c, Index: 3}
	c.mustWrite(0, id.Ino, id.Index, 0, bytes.Repeat([]byte{1}, 150000))
	tests := []struct {
		name    string
		diverge func(t *testing.T)
	}{
		{"member ahead by a write of its own", func(t *testing.T) {
			if _, err := c.target(1).Write(id, testChain, 10, []byte("rogue"), 1<<20, false); err != nil {
				t.Fatal(err)
			}
		}},
		{"member behind", func(t *testing.T) {
			l := c.target(2).Lock(id, testChain)
			defer l.Unlock()
			if err := l.Replace(chunk.Full{Version: 1, Exists: true, Data: []byte("old")}); err != nil {
				t.Fatal(err)
			}
		}},
		{"member missing the chunk", func(t *testing.T) {
			l := c.target(1).Lock(id, testChain)
			defer l.Unlock()
			if err := l.Replace(chunk.Full{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"member with a corrupt block", func(t *testing.T) {
			flipFileByte(t, c.target(2).Dir(), id, 100)
		}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.diverge(t)
			c.mustWrite(0, id.Ino, id.Index, 50, bytes.Repeat([]byte{byte(i + 2)}, 20))
			c.checkIdentical(t, 0, 1, 2)
		})
	}
}

// flipFileByte corrupts byte pos of a chunk's data on a target (in its
// chunk file, after the head).
func flipFileByte(t *testing.T, targetDir string, id chunk.ID, pos int) {
	t.Helper()
	path := chunkFilePath(targetDir, id)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[dataOffset(t, b)+pos] ^= 0x20
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// dataOffset returns where the data starts in chunk file b: byte 7 of
// its header, in 64 KiB.
func dataOffset(t *testing.T, b []byte) int {
	t.Helper()
	if len(b) < 32 || string(b[:7]) != "weftch3" {
		t.Fatalf("not a chunk file (%d bytes)", len(b))
	}
	return int(b[7]) << 16
}

// chunkFilePath is the path of a chunk's file on a target.
func chunkFilePath(targetDir string, id chunk.ID) string {
	return targetDir + "/chunks/" + hex2(id.Ino%256) + "/" + strconvHex(id.Ino) + "/" + strconvDec(id.Index) + ".w"
}

func TestCorruptCopyRepairedFromPeer(t *testing.T) {
	c := newChainCluster(t, 3, nil)
	ctx := context.Background()
	id := chunk.ID{Ino: 0x31, Index: 0}
	data := bytes.Repeat([]byte("weft"), 60000)
	c.mustWrite(0, id.Ino, id.Index, 0, data)
	tests := []struct {
		name    string
		server  int
		corrupt func(t *testing.T, path string)
		detect  func(t *testing.T, server int)
	}{
		{"bit rot found by scrub", 1, func(t *testing.T, path string) { flipFileByte(t, c.target(1).Dir(), id, 70000) }, scrubDetects(c, 1)},
		{"truncated file found by scrub", 2, func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			if err := os.Truncate(path, int64(dataOffset(t, b))+3*chunk.BlockSize); err != nil {
				t.Fatal(err)
			}
		}, scrubDetects(c, 1)},
		{"damaged header found by scrub", 1, func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			b[9] ^= 1
			os.WriteFile(path, b, 0o644)
		}, scrubDetects(c, 1)},
		{"bit rot found by a read", 0, func(t *testing.T, path string) { flipFileByte(t, c.target(0).Dir(), id, 5) },
			func(t *testing.T, server int) {
				_, err := c.servers[server].client.ReadChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: id.Ino},
					ChainId: testChain, ChainVersion: c.curVersion(), Length: 100})
				if !errors.Is(err, syscall.EIO) {
					t.Fatalf("read of a corrupt copy: %v, want EIO", err)
				}
				waitFor(t, "background repair", 5*time.Second, func() bool {
					_, err := c.target(server).Verify(id)
					return err == nil
				})
			}},
		{"bit rot under a write at the head", 0, func(t *testing.T, path string) { flipFileByte(t, c.target(0).Dir(), id, 9) },
			func(t *testing.T, server int) {
				err := c.write(0, id.Ino, id.Index, 3, []byte("ab"))
				if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "being repaired") {
					t.Fatalf("write into a corrupt block at the head: %v, want Unavailable (retry)", err)
				}
				waitFor(t, "the write to succeed after the repair", 5*time.Second, func() bool {
					return c.write(0, id.Ino, id.Index, 3, []byte("ab")) == nil
				})
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.corrupt(t, chunkFilePath(c.target(tc.server).Dir(), id))
			tc.detect(t, tc.server)
			c.checkIdentical(t, 0, 1, 2)
			if logs := c.servers[tc.server].logs.String(); !strings.Contains(logs, "repaired chunk 0 of inode 49 on target") {
				t.Fatalf("no repair logged:\n%s", logs)
			}
		})
	}
	var repaired uint64
	for _, ts := range c.servers {
		for _, r := range ts.srv.targetReports() {
			repaired += r.GetScrubRepaired()
		}
	}
	if repaired != 5 {
		t.Fatalf("targets report %d repairs, want 5", repaired)
	}
}

// scrubDetects runs a scrub pass on the server and expects it to find and
// repair exactly `want` bad copies.
func scrubDetects(c *chainCluster, want int) func(t *testing.T, server int) {
	return func(t *testing.T, server int) {
		res, err := c.servers[server].srv.Scrub(context.Background())
		if err != nil || res.Errors != want || res.Repaired != want || res.Chunks != 1 {
			t.Fatalf("scrub: %+v, %v; want %d bad and repaired of 1 chunk", res, err, want)
		}
	}
}

func TestChainMembersOnOneServer(t *testing.T) {
	dir := t.TempDir()
	ts := startServer(t, Config{Dir: dir, Targets: []string{dir + "/a", dir + "/b"}, ScrubRate: -1})
	ts.srv.SetTargetIDs([]uint64{21, 22})
	ts.srv.SetChains(&weftv1.ChainTable{Version: 1, Chains: []*weftv1.Chain{{Id: 4, Version: 1, Members: []*weftv1.ChainMember{
		{TargetId: 22, ServerId: 1, Address: ts.addr, WireAddress: ts.wire, State: stateServing},
		{TargetId: 21, ServerId: 1, Address: ts.addr, WireAddress: ts.wire, State: stateServing},
	}}}})
	id := &weftv1.ChunkID{Ino: 77, Index: 1}
	if _, err := ts.client.WriteChunk(context.Background(), &weftv1.WriteChunkRequest{Chunk: id, ChainId: 4, ChainVersion: 1,
		Data: []byte("both disks"), ChunkSize: 1 << 20, Sync: true}); err != nil {
		t.Fatal(err)
	}
	for _, tg := range ts.srv.store.Targets() {
		got, err := tg.ReadFull(chunk.ID{Ino: 77, Index: 1})
		if err != nil || got.Version != 1 || string(got.Data) != "both disks" {
			t.Fatalf("target %s: version %d %q, %v", tg.Dir(), got.Version, got.Data, err)
		}
	}
}

// TestWriteOfPiecesRefused checks that a write of pieces whose table does
// not match its data, or that lies outside the chunk, is refused with
// InvalidArgument before anything is written.
func TestWriteOfPiecesRefused(t *testing.T) {
	c := newChainCluster(t, 2, nil)
	ctx := context.Background()
	c.mustWrite(0, 7, 0, 0, bytes.Repeat([]byte("k"), 1000))
	tests := []struct {
		name string
		off  uint64
		data string
		offs []uint64
		lens []uint32
	}{
		{"more offsets than lengths", weftv1.PiecesOffset, "abcd", []uint64{0, 2}, []uint32{4}},
		{"lengths past the data", weftv1.PiecesOffset, "abcd", []uint64{0, 8}, []uint32{2, 3}},
		{"data left over", weftv1.PiecesOffset, "abcdef", []uint64{0, 8}, []uint32{2, 2}},
		{"piece past the chunk", weftv1.PiecesOffset, "abcd", []uint64{0, 1<<20 - 1}, []uint32{2, 2}},
		{"offset not the pieces mark", 0, "abcd", []uint64{0, 8}, []uint32{2, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.servers[0].client.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Ino: 7},
				ChainId: testChain, ChainVersion: c.curVersion(), ChunkSize: 1 << 20,
				Offset: tt.off, Data: []byte(tt.data), PieceOffsets: tt.offs, PieceLengths: tt.lens})
			// A range outside the chunk is the chunk store's EINVAL.
			if c := status.Code(err); c != codes.InvalidArgument && (err == nil || !strings.Contains(err.Error(), "invalid argument")) {
				t.Fatalf("got %v (%v), want InvalidArgument or EINVAL", c, err)
			}
			for i := range 2 {
				info, err := c.target(i).Stat(chunk.ID{Ino: 7})
				if err != nil || info.Version != 1 || info.Length != 1000 {
					t.Fatalf("server %d after a refused write: %+v, %v; want version 1, 1000 bytes", i, info, err)
				}
			}
		})
	}
}
