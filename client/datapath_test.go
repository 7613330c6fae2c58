package client

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// countingData counts the requests a client sends to the data servers.
type countingData struct {
	dataServer
	c *dataCounts
}

type dataCounts struct {
	writes     atomic.Int64 // WriteChunk requests
	syncWrites atomic.Int64 // WriteChunk requests with sync
	syncFiles  atomic.Int64 // SyncFile requests
	readBytes  atomic.Int64 // bytes answered by ReadChunk
}

func (d countingData) countWrite(in *weftv1.WriteChunkRequest) {
	d.c.writes.Add(1)
	if in.GetSync() {
		d.c.syncWrites.Add(1)
	}
}

func (d countingData) WriteChunk(ctx context.Context, in *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error) {
	d.countWrite(in)
	return d.dataServer.WriteChunk(ctx, in)
}

func (d countingData) WritePieces(ctx context.Context, in *weftv1.WriteChunkRequest, pieces [][]byte) (*weftv1.WriteChunkResponse, error) {
	d.countWrite(in)
	return d.dataServer.WritePieces(ctx, in, pieces)
}

func (d countingData) SyncFile(ctx context.Context, in *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error) {
	d.c.syncFiles.Add(1)
	return d.dataServer.SyncFile(ctx, in)
}

func (d countingData) ReadChunkInto(ctx context.Context, in *weftv1.ReadChunkRequest, dst []byte) ([]byte, error) {
	data, err := d.dataServer.ReadChunkInto(ctx, in, dst)
	if err == nil {
		d.c.readBytes.Add(int64(len(data)))
	}
	return data, err
}

// countingClient is a test client whose data server requests are counted.
func countingClient(t *testing.T, tc *testCluster, cfg Config) (*Client, *dataCounts) {
	t.Helper()
	c := newTestClient(t, tc.metaAddr, cfg)
	counts := &dataCounts{}
	c.chains.connsMu.Lock()
	c.chains.wrap = func(dc dataServer) dataServer { return countingData{dc, counts} }
	c.chains.connsMu.Unlock()
	return c, counts
}

// TestCloseSyncsWithLastWrite checks what a close sends. With
// Config.CloseSync it sends the last write of each buffered chunk with
// sync and calls SyncFile only for chains holding chunks sent earlier
// without sync. Without (the default) it syncs nothing, and an fsync
// through a later open of the file syncs every chain the closed file
// wrote without sync.
func TestCloseSyncsWithLastWrite(t *testing.T) {
	const cs = 1 << 20
	layout := &weftv1.Layout{ChunkSize: cs, StripeCount: 2, Replicas: 1}
	tc := startCluster(t, layout, 2)
	tests := []struct {
		name          string
		writes        [][2]int // offset, length
		wantSyncWrite int64
		wantSyncFile  int64
		chains        int64 // chains written
	}{
		{"partial chunks on two chains", [][2]int{{0, 100 << 10}, {cs, 100 << 10}}, 2, 0, 2},
		{"two extents in one chunk", [][2]int{{0, 10 << 10}, {500 << 10, 10 << 10}}, 1, 0, 1},
		{"full chunk sent in the background", [][2]int{{0, cs}, {cs, 100 << 10}}, 1, 1, 2},
		{"only full chunks", [][2]int{{0, 2 * cs}}, 0, 2, 2},
	}
	rnd := rand.New(rand.NewPCG(7, 8))
	for _, closeSync := range []bool{true, false} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s/close-sync=%v", tt.name, closeSync), func(t *testing.T) {
				ctx := context.Background()
				c, counts := countingClient(t, tc, Config{CloseSync: closeSync})
				name := fmt.Sprintf("sync-%s-%v", tt.name, closeSync)
				f := create(t, c, name, syscall.O_WRONLY)
				var model []byte
				for _, w := range tt.writes {
					p := randomBytes(rnd, w[1])
					if _, err := f.WriteAt(ctx, p, int64(w[0])); err != nil {
						t.Fatal(err)
					}
					if end := w[0] + w[1]; end > len(model) {
						model = append(model, make([]byte, end-len(model))...)
					}
					copy(model[w[0]:], p)
				}
				if err := f.Release(ctx); err != nil {
					t.Fatal(err)
				}
				wantWrite, wantFile := tt.wantSyncWrite, tt.wantSyncFile
				if !closeSync {
					wantWrite, wantFile = 0, 0
				}
				if got := counts.syncWrites.Load(); got != wantWrite {
					t.Errorf("writes with sync: %d, want %d (of %d writes)", got, wantWrite, counts.writes.Load())
				}
				if got := counts.syncFiles.Load(); got != wantFile {
					t.Errorf("SyncFile requests: %d, want %d", got, wantFile)
				}
				g, _ := open(t, c, name, syscall.O_RDONLY)
				defer g.Release(ctx)
				if got := readAll(t, g, len(model), 128<<10); !bytes.Equal(got, model) {
					t.Fatal("file reads back wrong")
				}
				// An fsync through the new open syncs what the closed one
				// left unsynced, once.
				before := counts.syncFiles.Load()
				if err := g.Fsync(ctx); err != nil {
					t.Fatal(err)
				}
				want := int64(0)
				if !closeSync {
					want = tt.chains
				}
				if got := counts.syncFiles.Load() - before; got != want {
					t.Errorf("fsync after a close without sync sent %d SyncFile requests, want %d", got, want)
				}
				// Nothing written since: another flush and fsync sync nothing.
				before = counts.syncFiles.Load() + counts.syncWrites.Load()
				if err := g.Flush(ctx); err != nil {
					t.Fatal(err)
				}
				if err := g.Fsync(ctx); err != nil {
					t.Fatal(err)
				}
				if after := counts.syncFiles.Load() + counts.syncWrites.Load(); after != before {
					t.Errorf("flush without writes sent %d syncs", after-before)
				}
			})
		}
	}
}

// TestReadAheadAdaptive reads a 64 MiB file sequentially, in half
// records and at random, counting the bytes fetched from the data
// servers: a sequential reader fetches the file once with the window
// growing, the others fetch little more than they read.
func TestReadAheadAdaptive(t *testing.T) {
	const (
		size  = 64 << 20
		piece = 128 << 10 // what the kernel asks for
	)
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 4, Replicas: 1}
	tc := startCluster(t, layout, 4)
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(9, 10))
	model := randomBytes(rnd, size)
	w := newTestClient(t, tc.metaAddr, Config{})
	f := create(t, w, "big", syscall.O_WRONLY)
	if _, err := f.WriteAt(ctx, model, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}

	type access struct{ off, n int }
	sequential := func() (a []access) {
		for off := 0; off < size; off += piece {
			a = append(a, access{off, piece})
		}
		return a
	}
	halfRecords := func() (a []access) {
		for rec := 0; rec < size; rec += 8 << 20 {
			for off := rec; off < rec+4<<20; off += piece {
				a = append(a, access{off, piece})
			}
		}
		return a
	}
	interleaved := func() (a []access) { // four sequential readers at once
		for off := 0; off < size/4; off += piece {
			for k := range 4 {
				a = append(a, access{k*size/4 + off, piece})
			}
		}
		return a
	}
	// The kernel's requests of a whole-file reader, 1 MiB each, each pair
	// but the first arriving in reverse order (read-ahead requests are
	// served in parallel): one stream, whose window reaches 8 MiB after
	// 16 MiB.
	outOfOrder := func() (a []access) {
		a = append(a, access{0, 1 << 20})
		for off := 1 << 20; off < 17<<20; off += 2 << 20 {
			a = append(a, access{off + 1<<20, 1 << 20}, access{off, 1 << 20})
		}
		return a
	}
	random := func() (a []access) {
		for range 100 {
			a = append(a, access{rnd.IntN(size/4096-32) * 4096, piece})
		}
		return a
	}
	tests := []struct {
		name       string
		accesses   []access
		maxFetched float64 // fetched / bytes read
		minWindow  uint64  // largest window at least
	}{
		{"sequential", sequential(), 1.01, 4 << 20},
		{"half of each 8 MiB record", halfRecords(), 1.2, 0},
		// Each of the first three streams fetches up to a window past
		// its end, into bytes the next stream read already.
		{"four interleaved sequential readers", interleaved(), 1.15, 1 << 20},
		// 17 MiB read, and up to a whole window (8 MiB) fetched past the
		// end of a request that came ahead.
		{"first 17 MiB, requests out of order", outOfOrder(), 1.6, 8 << 20},
		{"random 128 KiB reads", random(), 1.05, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, counts := countingClient(t, tc, Config{})
			g, _ := open(t, c, "big", syscall.O_RDONLY)
			defer g.Release(ctx)
			buf := make([]byte, 1<<20)
			var read int
			for _, a := range tt.accesses {
				n, err := g.ReadAt(ctx, buf[:a.n], int64(a.off))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(buf[:n], model[a.off:a.off+n]) {
					t.Fatalf("read at %d: bytes differ", a.off)
				}
				read += n
			}
			// Fetches still under way count too.
			in := c.lookupInode(g.Ino())
			in.mu.Lock()
			maxWin := in.raState.maxWindow
			pending := append([]*raWindow(nil), in.ra...)
			in.mu.Unlock()
			for _, w := range pending {
				<-w.done
			}
			fetched := counts.readBytes.Load()
			t.Logf("read %d bytes, fetched %d (%.2fx, %.2f of the file), largest window %d KiB",
				read, fetched, float64(fetched)/float64(read), float64(fetched)/size, maxWin>>10)
			if float64(fetched) > tt.maxFetched*float64(read) {
				t.Errorf("fetched %d bytes for %d read: more than %.2fx", fetched, read, tt.maxFetched)
			}
			if fetched < int64(read) {
				t.Errorf("fetched %d bytes, less than the %d read", fetched, read)
			}
			if fetched > size*6/10 && read <= size/2 {
				t.Errorf("fetched %d bytes of a %d byte file for a reader of half of it", fetched, size)
			}
			if maxWin < tt.minWindow {
				t.Errorf("largest read-ahead window %d, want at least %d", maxWin, tt.minWindow)
			}
		})
	}
}

// Past a quarter of the write buffer, a writer's other buffered chunks go
// out in the background while it goes on writing (partial chunks that
// would otherwise wait for the flush); below it nothing is sent before
// the flush, and the chunk being written is not sent half done.
func TestBackgroundWriteBack(t *testing.T) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 4, Replicas: 1}
	tc := startCluster(t, layout, 2)
	c, counts := countingClient(t, tc, Config{WriteBufferBytes: 8 << 20})
	ctx := context.Background()
	f := create(t, c, "scattered", syscall.O_WRONLY)
	piece := make([]byte, 256<<10)
	// Below a quarter (2 MiB): a quarter of each of 7 chunks stays
	// buffered.
	for i := range 7 {
		if _, err := f.WriteAt(ctx, piece, int64(i)<<20); err != nil {
			t.Fatal(err)
		}
	}
	if n := counts.writes.Load(); n != 0 {
		t.Fatalf("%d chunk writes sent while 1.75 MiB were buffered, want none before the flush", n)
	}
	// Past it: the other chunks start going out.
	if _, err := f.WriteAt(ctx, piece, 20<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(ctx, piece, 21<<20); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "background sends", func() error {
		if n := counts.writes.Load(); n < 7 {
			return fmt.Errorf("%d chunk writes sent", n)
		}
		return nil
	})
	f.in.mu.Lock()
	_, current := f.in.dirty[21]
	f.in.mu.Unlock()
	if !current {
		t.Error("the chunk just written was sent half done")
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReadOverlaysUnsentWrites checks that a read of bytes this client
// wrote and no data server has acknowledged yet, buffered or on their way,
// returns them laid over the servers' copy without waiting for the
// write-back: a buffered write stays buffered, and a read of bytes whose
// send cannot finish still returns at once.
func TestReadOverlaysUnsentWrites(t *testing.T) {
	const cs = 1 << 20
	layout := &weftv1.Layout{ChunkSize: cs, StripeCount: 2, Replicas: 1}
	tc := startCluster(t, layout, 2)
	c, counts := countingClient(t, tc, Config{})
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(3, 4))
	model := randomBytes(rnd, 3*cs)
	f := create(t, c, "overlaid", syscall.O_RDWR)
	if _, err := f.WriteAt(ctx, model, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// check reads [off, off+n) against the model within a deadline.
	check := func(what string, off, n int) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		got := make([]byte, n)
		if _, err := f.ReadAt(rctx, got, int64(off)); err != nil {
			t.Fatalf("%s: read %d bytes at %d: %v", what, n, off, err)
		}
		if !bytes.Equal(got, model[off:off+n]) {
			t.Fatalf("%s: read %d bytes at %d: not what was written", what, n, off)
		}
	}
	write := func(off, n int) {
		t.Helper()
		p := randomBytes(rnd, n)
		copy(model[off:], p)
		if _, err := f.WriteAt(ctx, p, int64(off)); err != nil {
			t.Fatal(err)
		}
	}

	// Buffered: two small writes in chunk 1, reads across them and across
	// the chunk boundary.
	sent := counts.writes.Load()
	write(cs+1000, 8<<10)
	write(cs+300<<10, 100)
	check("inside a buffered write", cs+2000, 4<<10)
	check("across buffered writes and stored bytes", cs-5000, 400<<10)
	check("a whole chunk", cs, cs)
	if n := counts.writes.Load() - sent; n != 0 {
		t.Errorf("reads sent %d chunk writes, want none (the writes stay buffered)", n)
	}
	f.in.mu.Lock()
	buf := f.in.dirty[1]
	f.in.mu.Unlock()
	if buf == nil {
		t.Fatal("chunk 1's writes are no longer buffered after the reads")
	}

	// In flight: chunk 1's buffer is taken by a send that does not finish
	// (as when its data server hangs), and newer bytes are buffered on
	// top. Reads must not wait for it.
	stuck := &sendOp{done: make(chan struct{})}
	f.in.mu.Lock()
	delete(f.in.dirty, 1)
	stuck.buf, stuck.bytes = buf, buf.size
	f.in.inflight[1] = stuck
	f.in.mu.Unlock()
	write(cs+1000+4<<10, 8<<10) // half over the stuck bytes
	check("bytes of a send in flight", cs+1000, 4<<10)
	check("in flight, buffered and stored bytes", cs, 400<<10)

	// Let the stuck send go the normal way and check what the servers
	// hold after a flush.
	f.in.mu.Lock()
	delete(f.in.inflight, 1)
	stuck.buf = nil
	newer := f.in.dirty[1]
	newerSize := newer.size
	for _, e := range newer.extents {
		buf.write(e.off, e.data)
	}
	newer.release()
	f.in.dirty[1] = buf
	f.in.mu.Unlock()
	c.buffered.Add(buf.size - stuck.bytes - newerSize)
	close(stuck.done)
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g, _ := open(t, c, "overlaid", syscall.O_RDONLY)
	defer g.Release(ctx)
	if got := readAll(t, g, len(model), 256<<10); !bytes.Equal(got, model) {
		t.Fatal("after the flush the file is not what was written")
	}
}

// TestScatteredWritesOneRequestPerChunk checks that small writes scattered
// over a chunk go to the data server as one write of pieces, and that
// the file then holds them.
func TestScatteredWritesOneRequestPerChunk(t *testing.T) {
	const cs = 1 << 20
	layout := &weftv1.Layout{ChunkSize: cs, StripeCount: 2, Replicas: 1}
	tc := startCluster(t, layout, 2)
	c, counts := countingClient(t, tc, Config{})
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(9, 10))
	model := make([]byte, 2*cs)
	f := create(t, c, "scattered", syscall.O_WRONLY)
	for i := range 40 { // 20 pieces in each of two chunks, none adjacent
		off := (i%2)*cs + (i/2)*(48<<10) + rnd.IntN(16<<10)
		p := randomBytes(rnd, 8<<10)
		copy(model[off:], p)
		if _, err := f.WriteAt(ctx, p, int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := counts.writes.Load(); n != 2 {
		t.Errorf("%d chunk writes for 40 scattered writes over 2 chunks, want 2", n)
	}
	checkHolds(t, tc, "scattered", model)
}

// TestScatteredWritesGatherUnderPressure checks that past the background
// share of the write buffer, scattered small writes are not sent one by
// one: a chunk goes out once it holds a sixteenth of its size.
func TestScatteredWritesGatherUnderPressure(t *testing.T) {
	const cs = 1 << 20
	layout := &weftv1.Layout{ChunkSize: cs, StripeCount: 2, Replicas: 1}
	tc := startCluster(t, layout, 2)
	c, counts := countingClient(t, tc, Config{WriteBufferBytes: 1 << 20})
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(11, 12))
	const writes = 200
	f := create(t, c, "pressure", syscall.O_WRONLY)
	model := make([]byte, 8*cs)
	for range writes {
		off := rnd.IntN(8*cs/(4<<10)) * (4 << 10)
		p := randomBytes(rnd, 4<<10)
		copy(model[off:], p)
		if _, err := f.WriteAt(ctx, p, int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := counts.writes.Load(); n > writes/4 {
		t.Errorf("%d chunk writes for %d scattered 4 KiB writes past a quarter of a 1 MiB buffer, want at most %d", n, writes, writes/4)
	}
	checkHolds(t, tc, "pressure", model)
}

// checkHolds checks through a new client that file name holds model, up
// to model's last non-zero byte (the file's length).
func checkHolds(t *testing.T, tc *testCluster, name string, model []byte) {
	t.Helper()
	end := len(model)
	for end > 0 && model[end-1] == 0 {
		end--
	}
	g, _ := open(t, newTestClient(t, tc.metaAddr, Config{}), name, syscall.O_RDONLY)
	defer g.Release(context.Background())
	if got := readAll(t, g, end, 256<<10); !bytes.Equal(got, model[:end]) {
		t.Fatalf("%s does not hold what was written", name)
	}
}
