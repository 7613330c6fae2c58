package client

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Reads in place from data servers on this host return the file's bytes,
// follow this client's writes at once and other clients' at the next
// open (close-to-open), never return a bad copy, and leave the read path
// through the servers for chunks that cannot be read in place.
func TestReadInPlace(t *testing.T) {
	const chunk = 1 << 20
	layout := &weftv1.Layout{ChunkSize: chunk, StripeCount: 2, Replicas: 1}
	tc := startCluster(t, layout, 2)
	ctx := context.Background()
	a := newTestClient(t, tc.metaAddr, Config{})
	b := newTestClient(t, tc.metaAddr, Config{})
	rnd := rand.New(rand.NewPCG(11, 12))
	const size = 3*chunk + 12345
	model := randomBytes(rnd, size)
	f := create(t, a, "inplace", syscall.O_RDWR)
	if _, err := f.WriteAt(ctx, model, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}

	check := func(step string, g *File, off, n int) {
		t.Helper()
		got := make([]byte, n)
		m, err := g.ReadAt(ctx, got, int64(off))
		if err != nil {
			t.Fatalf("%s: read %d at %d: %v", step, n, off, err)
		}
		want := model[off:min(off+n, size)]
		if !bytes.Equal(got[:m], want) {
			t.Fatalf("%s: read %d at %d: wrong bytes", step, n, off)
		}
	}

	g, _ := open(t, a, "inplace", syscall.O_RDWR)
	before := a.LocalReadBytes()
	for off := 0; off < size; off += 128 << 10 {
		check("sequential read", g, off, 128<<10)
	}
	for range 50 {
		check("random read", g, rnd.IntN(size), 1+rnd.IntN(200<<10))
	}
	check("read across chunks", g, chunk-5000, 10000)
	if a.LocalReadBytes() == before {
		t.Fatal("nothing was read in place from the data servers on this host")
	}

	// This client's own write is seen by its next read.
	patch := randomBytes(rnd, 100<<10)
	if _, err := g.WriteAt(ctx, patch, chunk+chunk/2); err != nil {
		t.Fatal(err)
	}
	copy(model[chunk+chunk/2:], patch)
	check("read after own write", g, chunk, chunk)

	// Another client's write: a read before reopening returns the old or
	// the new bytes of each block, never an error; after reopening, the
	// new ones.
	old := bytes.Clone(model[:64<<10])
	patch2 := randomBytes(rnd, 64<<10)
	h, _ := open(t, b, "inplace", syscall.O_WRONLY)
	if _, err := h.WriteAt(ctx, patch2, 0); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 64<<10)
	if _, err := g.ReadAt(ctx, got, 0); err != nil {
		t.Fatalf("read while another client wrote: %v", err)
	}
	if !bytes.Equal(got, old) && !bytes.Equal(got, patch2) {
		t.Fatal("read while another client wrote: neither the old nor the new bytes")
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	copy(model, patch2)
	g, _ = open(t, a, "inplace", syscall.O_RDONLY)
	check("read after reopening", g, 0, 256<<10)
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A bad copy on disk is never returned: with one replica the read
	// fails with EIO; the other chunks still read.
	ino := f.Ino()
	ms := tc.members(chainFor(f.in.layout, 2))
	corrupt(t, tc.chunkPath(ms[0], ino, 2))
	g, _ = open(t, a, "inplace", syscall.O_RDONLY)
	defer g.Release(ctx)
	buf := make([]byte, chunk)
	if n, err := g.ReadAt(ctx, buf, 2*chunk); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of a chunk whose only copy is bad: %d bytes, err %v; want EIO", n, err)
	}
	check("read of a good chunk next to a bad one", g, chunk, chunk)
	tc.fsckFindsOnlyCorruptChunks()
}

// A chunk with writes still buffered in this client is read with them
// laid over the server's older copy: a read beside the buffered bytes,
// then one over them, both see the file as written (a sparse chunk the
// writes start; found by the exerciser).
func TestReadInPlaceBesideBufferedWrites(t *testing.T) {
	const chunk = 256 << 10
	layout := &weftv1.Layout{ChunkSize: chunk, StripeCount: 4, Replicas: 1}
	tc := startCluster(t, layout, 2)
	c := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	f := create(t, c, "beside", syscall.O_RDWR)
	model := make([]byte, 2*chunk)
	rnd := rand.New(rand.NewPCG(13, 14))
	for _, w := range []struct{ off, n int }{{chunk + 158986, 90000}, {chunk / 3, 5000}} {
		data := randomBytes(rnd, w.n)
		copy(model[w.off:], data)
		if _, err := f.WriteAt(ctx, data, int64(w.off)); err != nil {
			t.Fatal(err)
		}
	}
	size := int64(chunk + 158986 + 90000) // the end of the last write
	for off := int64(0); off < size; off += 128 << 10 {
		p := make([]byte, 128<<10)
		v, release, err := f.ReadView(ctx, p, off)
		if err != nil {
			t.Fatal(err)
		}
		if want := model[off:min(off+int64(len(p)), size)]; !bytes.Equal(v, want) {
			i := 0
			for i < len(v) && i < len(want) && v[i] == want[i] {
				i++
			}
			t.Fatalf("read of 128 KiB at %d: %d bytes, want %d, first difference at %d", off, len(v), len(want), off+int64(i))
		}
		if release != nil {
			release()
		}
	}
}

// Reads in place obey the data server's fencing: once the server has
// lost the meta service long enough to stop serving (its chains may go
// on without it), the client no longer reads its files either, but
// fails as a read through the server would.
func TestReadInPlaceStopsWhenServerFenced(t *testing.T) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 1, Replicas: 1}
	tc := startClusterOpts(t, layout, 1, clusterOpts{failureTimeout: testFailureTimeout})
	c := newTestClient(t, tc.metaAddr, Config{UnavailableTimeout: time.Second})
	ctx := context.Background()
	data := randomBytes(rand.New(rand.NewPCG(15, 16)), 2<<20)
	f := create(t, c, "fenced", syscall.O_RDWR)
	if _, err := f.WriteAt(ctx, data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(ctx); err != nil { // nothing left to sync when the client closes
		t.Fatal(err)
	}
	buf := make([]byte, len(data))
	if _, err := f.ReadAt(ctx, buf, 0); err != nil || !bytes.Equal(buf, data) {
		t.Fatalf("read before the cut: %v", err)
	}
	inPlace := c.LocalReadBytes()
	if inPlace == 0 {
		t.Fatal("nothing was read in place")
	}
	tc.stopMeta()
	time.Sleep(testFailureTimeout) // the server fences itself after half of it
	if n, err := f.ReadAt(ctx, buf, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read from a fenced data server: %d bytes, err %v; want EIO", n, err)
	}
	if c.LocalReadBytes() != inPlace {
		t.Fatalf("%d more bytes read in place from a fenced data server", c.LocalReadBytes()-inPlace)
	}
	tc.startMeta() // the client closes its session at the end
}

// A reader that keeps a file open and follows it as another client
// appends (tail -f) reads the appended bytes once it knows the new
// length, also from a chunk it had open in place before they came.
func TestReadInPlaceFollowsAppends(t *testing.T) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 1, Replicas: 1}
	tc := startCluster(t, layout, 1)
	ctx := context.Background()
	a := newTestClient(t, tc.metaAddr, Config{})
	b := newTestClient(t, tc.metaAddr, Config{})
	rnd := rand.New(rand.NewPCG(17, 18))
	first, more := randomBytes(rnd, 300<<10), randomBytes(rnd, 100<<10)
	w := create(t, b, "growing", syscall.O_WRONLY)
	if _, err := w.WriteAt(ctx, first, 0); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r, _ := open(t, a, "growing", syscall.O_RDONLY)
	defer r.Release(ctx)
	buf := make([]byte, len(first))
	if _, err := r.ReadAt(ctx, buf, 0); err != nil || !bytes.Equal(buf, first) {
		t.Fatalf("first read: %v", err)
	}
	if _, err := w.WriteAt(ctx, more, int64(len(first))); err != nil {
		t.Fatal(err)
	}
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if attr, err := a.GetAttr(ctx, r.Ino()); err != nil || attr.Size != uint64(len(first)+len(more)) {
		t.Fatalf("reader's stat: %v, %v", attr, err)
	}
	got := make([]byte, len(more))
	if n, err := r.ReadAt(ctx, got, int64(len(first))); err != nil || n != len(more) || !bytes.Equal(got, more) {
		t.Fatalf("read of the appended bytes: %d bytes, err %v, equal %v", n, err, bytes.Equal(got, more))
	}
	if a.LocalReadBytes() == 0 {
		t.Fatal("nothing was read in place")
	}
}

// Reads of chunks whose writes this client only buffers are read in
// place with the buffered bytes laid over them (the server's copy does
// not change until they are sent), so mixed small reads and writes do not
// cost a request to the server per read; once the writes are sent and
// acknowledged, reads see them from the server's new copy.
func TestReadInPlaceUnderBufferedWrites(t *testing.T) {
	const chunk = 1 << 20
	layout := &weftv1.Layout{ChunkSize: chunk, StripeCount: 2, Replicas: 1}
	tc := startCluster(t, layout, 2)
	c := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(21, 22))
	const size = 4 * chunk
	model := randomBytes(rnd, size)
	f := create(t, c, "mixed", syscall.O_RDWR)
	if _, err := f.WriteAt(ctx, model, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g, _ := open(t, c, "mixed", syscall.O_RDWR)
	defer g.Release(ctx)
	const rec = 8 << 10
	check := func(step string, off int) {
		t.Helper()
		got := make([]byte, rec)
		if _, err := g.ReadAt(ctx, got, int64(off)); err != nil {
			t.Fatalf("%s: read at %d: %v", step, off, err)
		}
		if !bytes.Equal(got, model[off:off+rec]) {
			t.Fatalf("%s: read at %d: wrong bytes", step, off)
		}
	}
	before := c.LocalReadBytes()
	var read uint64
	written := map[int]bool{} // records buffered: a read of one needs no data server
	// Fewer writes per chunk than go out in the background.
	for i := range 40 {
		off := rnd.IntN(size/rec) * rec
		if i%2 == 0 {
			data := randomBytes(rnd, rec)
			copy(model[off:], data)
			if _, err := g.WriteAt(ctx, data, int64(off)); err != nil {
				t.Fatal(err)
			}
			written[off] = true
			off = off/chunk*chunk + rnd.IntN(chunk/rec)*rec // somewhere in the written chunk
		}
		check("mixed", off)
		if !written[off] {
			read += rec
		}
	}
	if got := c.LocalReadBytes() - before; got != read {
		t.Errorf("%d bytes read in place under buffered writes, want all %d read from the servers' copies", got, read)
	}
	if err := g.Fsync(ctx); err != nil {
		t.Fatal(err)
	}
	for off := 0; off < size; off += rec {
		check("after the writes were sent", off)
	}
}

// TestReadInPlaceOpensAround checks that a reader that opens a chunk on
// demand (a random reader: read-ahead does not lead it) gets the file's
// other chunks opened with it, one round per data server, so its reads
// of them wait for no further round trip; and that a file of more chunks
// than the bound is not opened whole.
func TestReadInPlaceOpensAround(t *testing.T) {
	const chunk = 64 << 10 // the least chunk size: a file at the bound is 32 MiB
	layout := &weftv1.Layout{ChunkSize: chunk, StripeCount: 2, Replicas: 1}
	tc := startCluster(t, layout, 2)
	ctx := context.Background()
	const bound = openAroundChunks
	c := newTestClient(t, tc.metaAddr, Config{ReadAheadBytes: -1})
	rounds := func() uint64 { return openRounds(c) }
	rnd := rand.New(rand.NewPCG(21, 22))
	for _, tt := range []struct {
		name       string
		chunks     int
		maxRounds  uint64 // open rounds for one read of every chunk
		openAround bool
	}{
		{"small file", 16, 1 + 2, true},
		{"file at the bound", bound, 1 + 2, true},
		{"file past the bound", bound + 2, bound + 2, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			size := tt.chunks * chunk
			model := randomBytes(rnd, size)
			f := create(t, c, tt.name, syscall.O_RDWR)
			if _, err := f.WriteAt(ctx, model, 0); err != nil {
				t.Fatal(err)
			}
			if err := f.Release(ctx); err != nil {
				t.Fatal(err)
			}
			g, _ := open(t, c, tt.name, syscall.O_RDONLY)
			defer g.Release(ctx)
			before := rounds()
			got := make([]byte, 8<<10)
			read := func(idx int) {
				t.Helper()
				off := idx*chunk + rnd.IntN(chunk-len(got))
				if _, err := g.ReadAt(ctx, got, int64(off)); err != nil {
					t.Fatalf("read at %d: %v", off, err)
				}
				if !bytes.Equal(got, model[off:off+len(got)]) {
					t.Fatalf("read at %d: wrong bytes", off)
				}
			}
			read(tt.chunks / 2)
			// Let the opens started around the first read finish.
			deadline := time.Now().Add(5 * time.Second)
			for {
				g.in.mu.Lock()
				pending := len(g.in.local.pending)
				g.in.mu.Unlock()
				if pending == 0 || time.Now().After(deadline) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			for _, idx := range rnd.Perm(tt.chunks) {
				read(idx)
			}
			n := rounds() - before
			if n > tt.maxRounds {
				t.Errorf("%d rounds of opens to read each of %d chunks once; want at most %d", n, tt.chunks, tt.maxRounds)
			}
			if !tt.openAround && n < uint64(tt.chunks) {
				t.Errorf("%d rounds of opens for %d chunks of a file past the bound; want one per chunk (not opened whole)", n, tt.chunks)
			}
			if c.LocalReadBytes() == 0 {
				t.Fatal("nothing read in place")
			}
		})
	}
}

// A sequential reader from the start of a file, read-ahead on, has the
// file's chunks opened in a round per data server around its first read,
// not one at a time ahead of it (its window grows from the first read).
func TestReadInPlaceSequentialOpensInRounds(t *testing.T) {
	const (
		chunk  = 1 << 20
		chunks = 16
	)
	layout := &weftv1.Layout{ChunkSize: chunk, StripeCount: 2, Replicas: 1}
	tc := startCluster(t, layout, 2)
	ctx := context.Background()
	c := newTestClient(t, tc.metaAddr, Config{})
	model := randomBytes(rand.New(rand.NewPCG(23, 24)), chunks*chunk)
	f := create(t, c, "seq", syscall.O_RDWR)
	if _, err := f.WriteAt(ctx, model, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rounds := func() uint64 { return openRounds(c) }
	g, _ := open(t, c, "seq", syscall.O_RDONLY)
	defer g.Release(ctx)
	before := rounds()
	buf := make([]byte, 1<<20)
	// The kernel's requests: half a MiB first, then a MiB at a time.
	for off := 0; off < len(model); {
		n := len(buf)
		if off == 0 {
			n = 512 << 10
		}
		n = min(n, len(model)-off)
		if _, err := g.ReadAt(ctx, buf[:n], int64(off)); err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		if !bytes.Equal(buf[:n], model[off:off+n]) {
			t.Fatalf("read at %d: wrong bytes", off)
		}
		off += n
	}
	if c.LocalReadBytes() == 0 {
		t.Fatal("nothing read in place")
	}
	// The first chunk on demand, then the others around it: one round
	// per data server.
	if n := rounds() - before; n > 1+2 {
		t.Errorf("%d rounds of opens for a sequential read of %d chunks; want at most 3", n, chunks)
	}
}

// openRounds is the number of rounds of requests that opened chunks in
// place, over all of c's data servers.
func openRounds(c *Client) uint64 {
	c.chains.connsMu.Lock()
	defer c.chains.connsMu.Unlock()
	var n uint64
	for _, w := range c.chains.wires {
		n += w.OpenRounds()
	}
	return n
}

// A file whose blocks were rewritten after they were synced (their new
// copies in other places of the chunk files) is still read in place,
// each block from where it now is.
func TestReadInPlaceAfterRewrites(t *testing.T) {
	const chunk = 1 << 20
	layout := &weftv1.Layout{ChunkSize: chunk, StripeCount: 1, Replicas: 1}
	tc := startCluster(t, layout, 1)
	ctx := context.Background()
	a := newTestClient(t, tc.metaAddr, Config{})
	rnd := rand.New(rand.NewPCG(21, 22))
	const size = 2*chunk + 777
	model := randomBytes(rnd, size)
	f := create(t, a, "rewritten", syscall.O_RDWR)
	if _, err := f.WriteAt(ctx, model, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(ctx); err != nil {
		t.Fatal(err)
	}
	// Rewrites of synced blocks, each flushed by a sync.
	for range 6 {
		off := rnd.IntN(size - 8000)
		p := randomBytes(rnd, 1+rnd.IntN(8000))
		if _, err := f.WriteAt(ctx, p, int64(off)); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
		if err := f.Fsync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g, _ := open(t, a, "rewritten", syscall.O_RDONLY)
	before := a.LocalReadBytes()
	got := make([]byte, size)
	for off := 0; off < size; off += 64 << 10 {
		n, err := g.ReadAt(ctx, got[off:min(off+64<<10, size)], int64(off))
		if err != nil || n != min(64<<10, size-off) {
			t.Fatalf("read at %d: %d bytes, %v", off, n, err)
		}
	}
	if !bytes.Equal(got, model) {
		t.Fatal("the file read back differs from what was written")
	}
	if a.LocalReadBytes()-before < size/2 {
		t.Fatalf("%d of %d bytes read in place: rewritten chunks went through the servers", a.LocalReadBytes()-before, size)
	}
}
