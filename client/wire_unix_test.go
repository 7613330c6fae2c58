package client

import (
	"bytes"
	"context"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

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

// ReadView answers from the client's own buffers (read-ahead windows and
// buffers the data server filled in place) with the file's bytes, and
// those buffers go back only when released.
func TestReadViewReadsRight(t *testing.T) {
	for _, inPlace := range []bool{false, true} {
		t.Run(map[bool]string{false: "through the servers", true: "in place"}[inPlace], func(t *testing.T) {
			testReadView(t, inPlace)
		})
	}
}

// testReadView reads views of a file through the data servers, or in
// place from their files.
func testReadView(t *testing.T, inPlace bool) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 2, Replicas: 1}
	tc := startCluster(t, layout, 2)
	c := newTestClient(t, tc.metaAddr, Config{NoLocalReads: !inPlace})
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(5, 6))
	const size = 5<<20 + 777
	model := randomBytes(rnd, size)
	f := create(t, c, "views", syscall.O_WRONLY)
	if _, err := f.WriteAt(ctx, model, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		offsets   func(i int) int64
		n         int
		wantViews bool
	}{
		{"sequential 128 KiB (read-ahead windows)", func(i int) int64 { return int64(i) * 128 << 10 }, 128 << 10, true},
		{"random 256 KiB", func(int) int64 { return rnd.Int64N(size) }, 256 << 10, true},
		{"random 8 KiB", func(int) int64 { return rnd.Int64N(size) }, 8 << 10, false},
		{"across a chunk boundary", func(i int) int64 { return int64(i+1)<<20 - 1000 }, 64 << 10, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, _ := open(t, c, "views", syscall.O_RDONLY)
			defer g.Release(ctx)
			p := make([]byte, tt.n)
			var views int
			for i := range 40 {
				off := tt.offsets(i)
				if off >= size {
					break
				}
				data, release, err := g.ReadView(ctx, p, off)
				if err != nil {
					t.Fatalf("read %d at %d: %v", tt.n, off, err)
				}
				want := model[off:min(off+int64(tt.n), size)]
				if !bytes.Equal(data, want) {
					t.Fatalf("read %d at %d: wrong bytes", tt.n, off)
				}
				if release != nil {
					views++
					release()
				}
			}
			if tt.wantViews && views == 0 && !inPlace {
				t.Errorf("no read of %d bytes was answered from the client's buffers", tt.n)
			}
		})
	}
	if got := c.LocalReadBytes(); (got > 0) != inPlace {
		t.Errorf("%d bytes read in place, in place = %v", got, inPlace)
	}
}

// The shared arena's buffers come back once files are closed: write
// buffers after their sends, read-ahead windows at the last close.
func TestArenaBuffersComeBack(t *testing.T) {
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 2, Replicas: 1}
	tc := startCluster(t, layout, 2)
	c := newTestClient(t, tc.metaAddr, Config{NoLocalReads: true})
	ctx := context.Background()
	before := wire.ArenaInUse()
	model := randomBytes(rand.New(rand.NewPCG(7, 8)), 6<<20)
	for round := range 3 {
		f := create(t, c, "arena-"+itoa(round), syscall.O_WRONLY)
		for off := 0; off < len(model); off += 200 << 10 {
			if _, err := f.WriteAt(ctx, model[off:min(off+200<<10, len(model))], int64(off)); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
		g, _ := open(t, c, "arena-"+itoa(round), syscall.O_RDONLY)
		// Read on until a read-ahead window is out, and close then.
		p := make([]byte, 128<<10)
		held := false
		for off := 0; off < len(model) && !held; off += len(p) {
			if n, err := g.ReadAt(ctx, p, int64(off)); err != nil || !bytes.Equal(p[:n], model[off:off+n]) {
				t.Fatalf("read at %d: %d bytes, %v, or wrong bytes", off, n, err)
			}
			g.in.mu.Lock()
			held = len(g.in.ra) > 0
			g.in.mu.Unlock()
		}
		if !held {
			t.Fatal("a sequential reader got no read-ahead window")
		}
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for wire.ArenaInUse() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes of the shared arena still in use after every file was closed (%d before)", wire.ArenaInUse(), before)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
