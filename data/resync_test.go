package data

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/data/chunk"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func TestResyncCopiesOnlyChangedChunks(t *testing.T) {
	tests := []struct {
		name       string
		concurrent bool
	}{
		{"quiet chain", false},
		{"writes during the pass", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			meta := startStubMeta(t, 100, 20000)
			c := newChainCluster(t, 3, meta)
			meta.mu.Lock()
			meta.onSynced = func(req *weftv1.ReportSyncedRequest) {
				if req.GetTargetId() == 12 && req.GetChainVersion() == c.curVersion() {
					c.setStates(stateServing, stateServing, stateServing)
				}
			}
			meta.mu.Unlock()
			ctx := context.Background()
			head := c.servers[0].client
			// 20 chunks every member has.
			for ino := uint64(200); ino < 204; ino++ {
				for idx := range uint64(5) {
					c.mustWrite(0, ino, idx, 0, bytes.Repeat([]byte{byte(ino + idx)}, 100000))
				}
			}
			c.checkIdentical(t, 0, 1, 2)

			// Server 2 goes away; the chain changes without it.
			c.setStates(stateServing, stateServing, stateOffline)
			for _, idx := range []uint64{0, 1, 2} {
				c.mustWrite(0, 200, idx, 500, []byte("changed while away"))
			}
			c.mustWrite(0, 201, 7, 0, []byte("new chunk"))
			c.mustWrite(0, 210, 0, 0, []byte("new file"))
			if _, err := head.DeleteFile(ctx, &weftv1.DeleteFileRequest{Ino: 203, ChainId: testChain, ChainVersion: c.curVersion()}); err != nil {
				t.Fatal(err)
			}
			if _, err := head.TruncateFile(ctx, &weftv1.TruncateFileRequest{Ino: 202, Size: 2<<20 + 1000, ChunkSize: 1 << 20,
				ChainId: testChain, ChainVersion: c.curVersion()}); err != nil {
				t.Fatal(err)
			}
			// What server 2 wrote alone before it noticed: a chunk the chain
			// did not change, one it changed to the same version, and one it
			// never had.
			away := c.target(2)
			for _, w := range []chunk.ID{{Ino: 200, Index: 4}, {Ino: 200, Index: 0}, {Ino: 204, Index: 0}} {
				if _, err := away.Write(w, testChain, 0, []byte("rogue"), 1<<20, false); err != nil {
					t.Fatal(err)
				}
			}
			// 3 overwritten + 2 new + 5 deleted + 3 truncated (1 cut, 2
			// deleted) + 2 rogue (the third rogue chunk was also overwritten).
			const wantCopied = 15

			var writer sync.WaitGroup
			stop := make(chan struct{})
			model := map[chunk.ID][]byte{}
			if tc.concurrent {
				// Slow the pass down so that writes overlap it.
				c.servers[2].srv.syncRate = newTokenBucket(1 << 20)
				writer.Go(func() { concurrentWriter(t, c, stop, model) })
			}
			c.setStates(stateServing, stateServing, stateSyncing)
			if tc.concurrent {
				waitFor(t, "resync progress in the heartbeat report", 10*time.Second, func() bool {
					for _, r := range c.servers[2].srv.targetReports() {
						for _, p := range r.GetSyncs() {
							if p.GetChainId() == testChain && p.GetBytesDone() > 0 && p.GetBytesLeft() > 0 {
								return true
							}
						}
					}
					return false
				})
			}
			waitFor(t, "server 2 to be serving again", 20*time.Second, func() bool {
				c.mu.Lock()
				defer c.mu.Unlock()
				return c.states[2] == stateServing
			})
			close(stop)
			writer.Wait()
			n := c.checkIdentical(t, 0, 1, 2)
			copied := c.servers[2].srv.resyncedChunks.Load()
			t.Logf("%d chunks in the chain, %d copied by the resync", n, copied)
			if !tc.concurrent && copied != wantCopied {
				t.Fatalf("resync copied %d chunks, want exactly the %d that changed", copied, wantCopied)
			}
			if copied > wantCopied+uint64(len(model)) {
				t.Fatalf("resync copied %d chunks, more than the %d changed and %d written meanwhile", copied, wantCopied, len(model))
			}
			for id, want := range model {
				got, err := c.target(2).ReadFull(id)
				if err != nil || !bytes.Equal(got.Data, want) {
					t.Fatalf("%v on the resynced member: %d bytes, %v; want the last acknowledged write", id, len(got.Data), err)
				}
			}
			meta.mu.Lock()
			reports := len(meta.synced)
			meta.mu.Unlock()
			if reports == 0 {
				t.Fatal("member never reported synced")
			}
		})
	}
}

// concurrentWriter writes through the head until stop, retrying refused
// writes as a client does, and records the last acknowledged content of
// every chunk it wrote.
func concurrentWriter(t *testing.T, c *chainCluster, stop chan struct{}, model map[chunk.ID][]byte) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		id := chunk.ID{Ino: 200 + uint64(rng.IntN(3)), Index: uint64(rng.IntN(6))}
		if rng.IntN(4) == 0 {
			id = chunk.ID{Ino: 300 + uint64(i), Index: 0}
		}
		data := []byte(fmt.Sprintf("write %d to %v", i, id))
		base := model[id]
		for attempt := 0; ; attempt++ {
			err := c.write(0, id.Ino, id.Index, 0, data)
			if err == nil {
				break
			}
			if code := status.Code(err); (code != codes.FailedPrecondition && code != codes.Unavailable) || attempt > 100 {
				t.Errorf("write %v: %v", id, err)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		full := append([]byte(nil), base...)
		if len(full) < len(data) {
			full = append(full, make([]byte, len(data)-len(full))...)
		}
		copy(full, data)
		if base == nil {
			// Chunks written before this goroutine: read the full content.
			got, err := c.target(0).ReadFull(id)
			if err != nil {
				t.Error(err)
				return
			}
			full = got.Data
		}
		model[id] = full
		time.Sleep(2 * time.Millisecond)
	}
}

func TestFencedWhenCutOffFromMeta(t *testing.T) {
	meta := startStubMeta(t, 50, 400)
	c := newChainCluster(t, 1, meta)
	waitFor(t, "heartbeats", 5*time.Second, func() bool {
		meta.mu.Lock()
		defer meta.mu.Unlock()
		return meta.heartbeats > 1
	})
	c.mustWrite(0, 1, 0, 0, []byte("in touch"))
	meta.setCut(true)
	time.Sleep(400 * time.Millisecond)
	read := func() error {
		_, err := c.servers[0].client.ReadChunk(context.Background(), &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 1},
			ChainId: testChain, ChainVersion: c.curVersion(), Length: 10})
		return err
	}
	for name, op := range map[string]func() error{
		"write": func() error { return c.write(0, 1, 0, 0, []byte("cut off")) },
		"read":  read,
	} {
		if err := op(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "cut off from the meta service") {
			t.Fatalf("%s while cut off: %v, want Unavailable", name, err)
		}
	}
	meta.setCut(false)
	waitFor(t, "the server to serve again", 5*time.Second, func() bool { return read() == nil })
	c.mustWrite(0, 1, 0, 0, []byte("back"))
}
