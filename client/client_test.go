package client

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

var root = &weftv1.Caller{Uid: 0, Gid: 0}

func smallStripes() *weftv1.Layout {
	return &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 3, Replicas: 1}
}

func create(t *testing.T, c *Client, name string, flags uint32) *File {
	t.Helper()
	f, attr, err := c.Create(context.Background(), root, 1, name, 0o644, flags, true)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	if attr.Size != 0 {
		t.Fatalf("new file %s has size %d", name, attr.Size)
	}
	return f
}

// writeFile creates name holding data and closes it; it returns the
// closed file (for its inode and layout).
func writeFile(t *testing.T, c *Client, name string, data []byte) *File {
	t.Helper()
	ctx := context.Background()
	f := create(t, c, name, syscall.O_WRONLY)
	if _, err := f.WriteAt(ctx, data, 0); err != nil {
		t.Fatalf("write %s: %v", name, err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatalf("close %s: %v", name, err)
	}
	return f
}

func open(t *testing.T, c *Client, name string, flags uint32) (*File, *weftv1.Attr) {
	t.Helper()
	ctx := context.Background()
	a, err := c.Lookup(ctx, root, 1, name)
	if err != nil {
		t.Fatalf("lookup %s: %v", name, err)
	}
	f, attr, err := c.Open(ctx, root, a.Ino, flags)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	return f, attr
}

func readAll(t *testing.T, f *File, size int, piece int) []byte {
	t.Helper()
	out := make([]byte, 0, size)
	buf := make([]byte, piece)
	for off := 0; ; {
		n, err := f.ReadAt(context.Background(), buf, int64(off))
		if err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
		if n == 0 {
			return out
		}
		out = append(out, buf[:n]...)
		off += n
	}
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestStripedRoundTrip writes a 10 MiB file of a size that is not a
// multiple of the chunk size in uneven pieces through one client and reads
// it back through another.
func TestStripedRoundTrip(t *testing.T) {
	tc := startCluster(t, smallStripes(), 3)
	w := newTestClient(t, tc.metaAddr, Config{})
	r := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(1, 2))
	want := randomBytes(rnd, 10<<20+12345)

	f := create(t, w, "big", syscall.O_WRONLY)
	chains := map[uint64]bool{}
	for _, ch := range f.in.layout.Chains {
		chains[ch] = true
	}
	if len(chains) != 3 {
		t.Fatalf("file striped over chains %v, want 3 distinct", f.in.layout.Chains)
	}
	for off := 0; off < len(want); {
		n := min(1+rnd.IntN(300<<10), len(want)-off)
		if _, err := f.WriteAt(ctx, want[off:off+n], int64(off)); err != nil {
			t.Fatal(err)
		}
		off += n
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g, attr := open(t, r, "big", syscall.O_RDONLY)
	defer g.Release(ctx)
	if attr.Size != uint64(len(want)) {
		t.Fatalf("size %d, want %d", attr.Size, len(want))
	}
	for _, piece := range []int{128 << 10, 1 << 20, 100003} {
		if got := readAll(t, g, len(want), piece); !bytes.Equal(got, want) {
			t.Fatalf("read back in %d byte pieces: %d bytes differ from what was written (%d)", piece, len(got), len(want))
		}
	}
}

// TestCloseToOpen checks that buffered writes are visible within the
// writing client at once and to another client after the writer's flush.
func TestCloseToOpen(t *testing.T) {
	tc := startCluster(t, smallStripes(), 3)
	w := newTestClient(t, tc.metaAddr, Config{})
	r := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	f := create(t, w, "f", syscall.O_RDWR)
	defer f.Release(ctx)
	data := []byte("hello, weft")
	if _, err := f.WriteAt(ctx, data, 100); err != nil {
		t.Fatal(err)
	}
	a, err := w.GetAttr(ctx, f.Ino())
	if err != nil {
		t.Fatal(err)
	}
	if a.Size != 111 {
		t.Errorf("writer sees size %d before flush, want 111", a.Size)
	}
	buf := make([]byte, 200)
	n, err := f.ReadAt(ctx, buf, 0)
	if err != nil || n != 111 || !bytes.Equal(buf[100:111], data) || !bytes.Equal(buf[:100], make([]byte, 100)) {
		t.Errorf("writer reads %d bytes %q, %v", n, buf[:n], err)
	}
	if a, err := r.GetAttr(ctx, f.Ino()); err != nil || a.Size != 0 {
		t.Errorf("other client sees size %d (%v) before the writer's flush, want 0", a.GetSize(), err)
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	g, attr := open(t, r, "f", syscall.O_RDONLY)
	defer g.Release(ctx)
	if attr.Size != 111 {
		t.Errorf("after flush, other client opens size %d, want 111", attr.Size)
	}
	n, err = g.ReadAt(ctx, buf, 0)
	if err != nil || n != 111 || !bytes.Equal(buf[100:111], data) {
		t.Errorf("other client reads %d bytes %q, %v", n, buf[:n], err)
	}
}

// TestAgainstModel runs random writes, reads, truncates and flushes through
// two handles of one file and checks every read against a byte slice.
func TestAgainstModel(t *testing.T) {
	tc := startCluster(t, smallStripes(), 3)
	c := newTestClient(t, tc.metaAddr, Config{WriteBufferBytes: 512 << 10})
	ctx := context.Background()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 7))
	f1 := create(t, c, "model", syscall.O_RDWR)
	defer f1.Release(ctx)
	f2, _ := open(t, c, "model", syscall.O_RDWR)
	defer f2.Release(ctx)
	const chunk = 64 << 10
	var model []byte
	for step := range 400 {
		f := f1
		if rnd.IntN(2) == 0 {
			f = f2
		}
		switch op := rnd.IntN(20); {
		case op < 10:
			off := rnd.IntN(6 * chunk)
			if rnd.IntN(3) == 0 {
				off = (rnd.IntN(6)+1)*chunk - rnd.IntN(100)
			}
			p := randomBytes(rnd, 1+rnd.IntN(2*chunk))
			if _, err := f.WriteAt(ctx, p, int64(off)); err != nil {
				t.Fatalf("step %d: write: %v", step, err)
			}
			if need := off + len(p); need > len(model) {
				model = append(model, make([]byte, need-len(model))...)
			}
			copy(model[off:], p)
		case op < 16:
			off := rnd.IntN(7 * chunk)
			buf := make([]byte, 1+rnd.IntN(3*chunk))
			n, err := f.ReadAt(ctx, buf, int64(off))
			if err != nil {
				t.Fatalf("step %d: read: %v", step, err)
			}
			want := []byte{}
			if off < len(model) {
				want = model[off:min(len(model), off+len(buf))]
			}
			if !bytes.Equal(buf[:n], want) {
				t.Fatalf("step %d: read %d bytes at %d: got %d bytes, differing from the model's %d", step, len(buf), off, n, len(want))
			}
		case op < 18:
			size := rnd.IntN(6 * chunk)
			if _, err := c.SetAttr(ctx, &weftv1.SetAttrRequest{
				Caller: root, Ino: f.Ino(), Valid: uint32(weftv1.SetAttrValid_SETATTR_SIZE), Size: uint64(size),
			}); err != nil {
				t.Fatalf("step %d: truncate: %v", step, err)
			}
			if size < len(model) {
				model = model[:size]
			} else {
				model = append(model, make([]byte, size-len(model))...)
			}
		default:
			if err := f.Flush(ctx); err != nil {
				t.Fatalf("step %d: flush: %v", step, err)
			}
		}
		if got := c.buffered.Load(); got > 512<<10+2*chunk+int64(len(model)) {
			t.Fatalf("step %d: %d bytes buffered, over the limit", step, got)
		}
		a, err := c.GetAttr(ctx, f.Ino())
		if err != nil || a.Size != uint64(len(model)) {
			t.Fatalf("step %d: size %d (%v), want %d", step, a.GetSize(), err, len(model))
		}
	}
	if err := f1.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	other := newTestClient(t, tc.metaAddr, Config{})
	g, attr := open(t, other, "model", syscall.O_RDONLY)
	defer g.Release(ctx)
	if attr.Size != uint64(len(model)) {
		t.Fatalf("other client: size %d, want %d", attr.Size, len(model))
	}
	if got := readAll(t, g, len(model), 100000); !bytes.Equal(got, model) {
		t.Fatal("other client reads different bytes than the model")
	}
}

func TestAppendAndFallocate(t *testing.T) {
	tc := startCluster(t, smallStripes(), 3)
	c := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	f := create(t, c, "log", syscall.O_WRONLY|syscall.O_APPEND)
	defer f.Release(ctx)
	g, _ := open(t, c, "log", syscall.O_WRONLY|syscall.O_APPEND)
	defer g.Release(ctx)
	for i, h := range []*File{f, g, f} {
		if _, err := h.WriteAt(ctx, []byte{'a' + byte(i)}, 0); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 10)
	rd, _ := open(t, c, "log", syscall.O_RDONLY)
	defer rd.Release(ctx)
	if n, err := rd.ReadAt(ctx, buf, 0); err != nil || string(buf[:n]) != "abc" {
		t.Errorf("appended %q, %v; want abc", buf[:n], err)
	}

	tests := []struct {
		name      string
		mode      uint32
		off, n    uint64
		wantSize  uint64
		wantErr   error
		zeroStart uint64
		zeroEnd   uint64
	}{
		{"grow", 0, 0, 200 << 10, 200 << 10, nil, 0, 0},
		{"keep size", FallocKeepSize, 0, 1 << 20, 200 << 10, nil, 0, 0},
		{"punch hole", FallocPunchHole | FallocKeepSize, 1, 150 << 10, 200 << 10, nil, 1, 150<<10 + 1},
		{"zero range", FallocZeroRange | FallocKeepSize, 100, 1 << 20, 200 << 10, nil, 100, 200 << 10},
		{"zero range grows", FallocZeroRange, 150 << 10, 100 << 10, 250 << 10, nil, 150 << 10, 250 << 10},
		{"collapse range unsupported", 0x8, 0, 10, 250 << 10, syscall.EOPNOTSUPP, 0, 0},
	}
	w, _ := open(t, c, "log", syscall.O_RDWR)
	defer w.Release(ctx)
	fill := bytes.Repeat([]byte{'x'}, 200<<10)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.zeroEnd > 0 {
				if _, err := w.WriteAt(ctx, fill, 0); err != nil {
					t.Fatal(err)
				}
			}
			err := w.Fallocate(ctx, tt.mode, tt.off, tt.n)
			if !errors.Is(err, tt.wantErr) && !(err == nil && tt.wantErr == nil) {
				t.Fatalf("fallocate: %v, want %v", err, tt.wantErr)
			}
			if err := w.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			a, err := c.GetAttr(ctx, w.Ino())
			if err != nil || a.Size != tt.wantSize {
				t.Fatalf("size %d (%v), want %d", a.GetSize(), err, tt.wantSize)
			}
			if tt.zeroEnd > 0 {
				got := readAll(t, w, int(a.Size), 1<<20)
				want := make([]byte, a.Size)
				copy(want, fill)
				clear(want[tt.zeroStart:tt.zeroEnd])
				if !bytes.Equal(got, want) {
					t.Error("punched range does not read as zeros with the rest intact")
				}
			}
		})
	}
}

// TestDataServerDown checks that a flush to a chain whose server is gone
// fails with EIO after the unavailable timeout, and that the error of a
// background send is reported by the next flush.
func TestDataServerDown(t *testing.T) {
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 1, Replicas: 1}, 1)
	c := newTestClient(t, tc.metaAddr, Config{UnavailableTimeout: 1500 * time.Millisecond})
	ctx := context.Background()
	f := create(t, c, "f", syscall.O_WRONLY)
	tc.stopData(0)
	if _, err := f.WriteAt(ctx, make([]byte, 64<<10), 0); err != nil {
		t.Fatalf("buffered write: %v", err)
	}
	start := time.Now()
	err := f.Flush(ctx)
	if !errors.Is(err, syscall.EIO) {
		t.Fatalf("flush with the data server down: %v, want EIO", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("flush took %v to fail", d)
	}
	t.Logf("flush error: %v", err)
	// A close reports it until an fsync of the file has, once.
	if err := f.Flush(ctx); !errors.Is(err, syscall.EIO) {
		t.Errorf("second close before any fsync: %v, want EIO", err)
	}
	if err := f.Fsync(ctx); !errors.Is(err, syscall.EIO) {
		t.Errorf("first fsync: %v, want EIO", err)
	}
	if err := f.Fsync(ctx); err != nil {
		t.Errorf("the error was reported twice to fsync: %v", err)
	}
	if err := f.Flush(ctx); err != nil {
		t.Errorf("close after an fsync reported the error: %v", err)
	}
	f.Release(ctx)
}

// TestDataServerRestart checks that a write waiting for a data server that
// is down goes through once the server is back on a new address.
func TestDataServerRestart(t *testing.T) {
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 64 << 10, StripeCount: 1, Replicas: 1}, 1)
	c := newTestClient(t, tc.metaAddr, Config{UnavailableTimeout: 30 * time.Second})
	ctx := context.Background()
	f := create(t, c, "f", syscall.O_RDWR)
	defer f.Release(ctx)
	tc.stopData(0)
	want := bytes.Repeat([]byte("w"), 100<<10)
	if _, err := f.WriteAt(ctx, want, 0); err != nil {
		t.Fatal(err)
	}
	restarted := make(chan struct{})
	go func() {
		time.Sleep(time.Second)
		tc.startData(0)
		close(restarted)
	}()
	if err := f.Flush(ctx); err != nil {
		t.Fatalf("flush across a data server restart: %v", err)
	}
	<-restarted
	if got := readAll(t, f, len(want), 1<<20); !bytes.Equal(got, want) {
		t.Fatal("data written across the restart reads back wrong")
	}
}

// TestReadAhead reads a file sequentially in kernel-sized pieces (served
// from read-ahead windows) while the same client overwrites parts of it.
func TestReadAhead(t *testing.T) {
	tc := startCluster(t, &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 2, Replicas: 1}, 2)
	c := newTestClient(t, tc.metaAddr, Config{})
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(5, 6))
	model := randomBytes(rnd, 4<<20+777)
	f := create(t, c, "ra", syscall.O_RDWR)
	defer f.Release(ctx)
	if _, err := f.WriteAt(ctx, model, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	g, _ := open(t, c, "ra", syscall.O_RDWR)
	defer g.Release(ctx)
	buf := make([]byte, 128<<10)
	for off := 0; off < len(model); off += len(buf) {
		if off%(384<<10) == 0 {
			// Overwrite a piece ahead of the reader, inside a window
			// that is likely fetched already.
			at := min(off+200<<10, len(model)-10)
			p := randomBytes(rnd, 10)
			if _, err := f.WriteAt(ctx, p, int64(at)); err != nil {
				t.Fatal(err)
			}
			copy(model[at:], p)
		}
		n, err := g.ReadAt(ctx, buf, int64(off))
		if err != nil {
			t.Fatal(err)
		}
		if want := model[off:min(len(model), off+len(buf))]; !bytes.Equal(buf[:n], want) {
			t.Fatalf("read at %d: %d bytes differ from the model's %d", off, n, len(want))
		}
	}
}

func TestMetaUnreachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	start := time.Now()
	_, err = New(context.Background(), Config{MetaAddr: addr, UnavailableTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "weft meta") {
		t.Fatalf("New with no meta service: %v, want an error saying to check `weft meta`", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v to fail", d)
	}
	t.Log(err)
}

// TestMetaRestart checks that a client rides over a restart of the meta
// service: calls made while it is down wait for it.
func TestMetaRestart(t *testing.T) {
	tc := startCluster(t, smallStripes(), 3)
	c := newTestClient(t, tc.metaAddr, Config{UnavailableTimeout: 30 * time.Second})
	ctx := context.Background()
	f := create(t, c, "before", syscall.O_WRONLY)
	if _, err := f.WriteAt(ctx, []byte("data"), 0); err != nil {
		t.Fatal(err)
	}
	tc.stopMeta()
	go func() {
		time.Sleep(time.Second)
		tc.startMeta()
	}()
	if err := f.Release(ctx); err != nil {
		t.Fatalf("close across a meta restart: %v", err)
	}
	g, attr := open(t, c, "before", syscall.O_RDONLY)
	defer g.Release(ctx)
	if attr.Size != 4 {
		t.Errorf("size after the restart %d, want 4", attr.Size)
	}
	h := create(t, c, "after", syscall.O_WRONLY)
	h.Release(ctx)
}
