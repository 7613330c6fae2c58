package client

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestChunkIOOverUnixSocket checks that data servers on the client's host
// report a Unix socket with their lean data path address and that the
// client's chunk I/O goes through it.
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

// writeReadBack writes files of several sizes through c and reads them
// back through a second client.
func writeReadBack(t *testing.T, c, r *Client, prefix string) {
	t.Helper()
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(21, 22))
	for i, size := range []int{1, 100 << 10, 3<<20 + 12345} {
		name := fmt.Sprintf("%s-%d", prefix, i)
		model := randomBytes(rnd, size)
		f := create(t, c, name, syscall.O_WRONLY)
		if _, err := f.WriteAt(ctx, model, 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Release(ctx); err != nil {
			t.Fatal(err)
		}
		g, _ := open(t, r, name, syscall.O_RDONLY)
		if got := readAll(t, g, size, 128<<10); !bytes.Equal(got, model) {
			t.Fatalf("%s reads back wrong", name)
		}
		g.Release(ctx)
	}
}
