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

// lostCluster is one data server holding chains of one replica, and a
// client that fails I/O on a chain 1 s after its server went away.
func lostCluster(t *testing.T) (*testCluster, *Client) {
	t.Helper()
	layout := &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 1, Replicas: 1}
	tc := startClusterOpts(t, layout, 1, clusterOpts{failureTimeout: testFailureTimeout})
	c := newTestClient(t, tc.metaAddr, Config{OnUnavailable: OnUnavailableFail, UnavailableTimeout: time.Second})
	return tc, c
}

// loseChunk stops the data server, writes a whole chunk at off through f
// (sent in the background, where it fails), waits until the failure is
// recorded and starts the server again; it returns once a read through a
// fresh client works again.
func loseChunk(t *testing.T, tc *testCluster, c *Client, f *File, off int64, name string) {
	t.Helper()
	ctx := context.Background()
	tc.stopData(0)
	if _, err := f.WriteAt(ctx, bytes.Repeat([]byte{0xee}, 1<<20), off); err != nil {
		t.Fatalf("write of the chunk to lose: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		f.in.mu.Lock()
		recorded := len(f.in.lost) > 0
		f.in.mu.Unlock()
		if recorded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the background send of the chunk did not fail")
		}
		time.Sleep(50 * time.Millisecond)
	}
	tc.startData(0)
	r := newTestClient(t, tc.metaAddr, Config{})
	for {
		g, _ := open(t, r, name, syscall.O_RDONLY)
		_, err := g.ReadAt(ctx, make([]byte, 10), 0)
		g.Release(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the data server is not back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The writer's client learns the server's new addresses now (it
	// would when its chain's outage is over).
	if err := c.chains.refresh(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestWriteBackErrorReportedOnce: a chunk whose write-back fails (its
// only data server down past the client's unavailable timeout) is
// reported once to each open file's next write and once to its next
// fsync, as Linux's errseq; a file that already reported it by fsync
// closes without error, one that did not fails its closes; reads of
// the lost bytes fail instead of returning zeros; and the length
// committed stops where the lost bytes begin, for this client and any
// other.
func TestWriteBackErrorReportedOnce(t *testing.T) {
	tc, c := lostCluster(t)
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(41, 42))
	first := randomBytes(rnd, 1<<20)
	f := create(t, c, "lost", syscall.O_RDWR)
	g, _ := open(t, c, "lost", syscall.O_RDWR) // a second open file of the inode
	if _, err := f.WriteAt(ctx, first, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(ctx); err != nil {
		t.Fatal(err)
	}
	loseChunk(t, tc, c, f, 1<<20, "lost")

	// Reads of the lost bytes fail; those before them read back.
	if _, err := f.ReadAt(ctx, make([]byte, 4096), 1<<20+100); !errors.Is(err, syscall.EIO) {
		t.Errorf("read of lost bytes: %v, want EIO", err)
	}
	if got := readN(t, f, 0, 1<<20); !bytes.Equal(got, first) {
		t.Error("the bytes stored before the loss read back wrong")
	}

	small := []byte("after")
	for _, w := range []struct {
		name string
		file *File
	}{{"f", f}, {"g", g}} {
		if _, err := w.file.WriteAt(ctx, small, 0); !errors.Is(err, syscall.EIO) {
			t.Errorf("%s: first write after the loss: %v, want EIO", w.name, err)
		}
		for i := range 3 {
			if _, err := w.file.WriteAt(ctx, small, 0); err != nil {
				t.Errorf("%s: write %d after the error was reported: %v", w.name, i+2, err)
			}
		}
	}
	if err := f.Fsync(ctx); !errors.Is(err, syscall.EIO) {
		t.Errorf("f: first fsync after the loss: %v, want EIO", err)
	}
	if err := f.Fsync(ctx); err != nil {
		t.Errorf("f: second fsync: %v, want nil (reported once)", err)
	}
	if err := f.Flush(ctx); err != nil {
		t.Errorf("f: close after its fsync reported the loss: %v", err)
	}
	// Each close of g reports it (dup and fork make several closes of
	// one open file) until an fsync of g has.
	for i := range 2 {
		if err := g.Flush(ctx); !errors.Is(err, syscall.EIO) {
			t.Errorf("g: close %d without an fsync that reported the loss: %v, want EIO", i+1, err)
		}
	}
	if err := g.Fsync(ctx); !errors.Is(err, syscall.EIO) {
		t.Errorf("g: first fsync: %v, want EIO", err)
	}
	if err := g.Flush(ctx); err != nil {
		t.Errorf("g: close after its fsync reported the loss: %v", err)
	}

	// The length stops where the lost bytes begin.
	want := append(append([]byte(nil), small...), first[len(small):]...)
	f.Release(ctx)
	g.Release(ctx)
	o := newTestClient(t, tc.metaAddr, Config{})
	h, attr := open(t, o, "lost", syscall.O_RDONLY)
	defer h.Release(ctx)
	if attr.Size != 1<<20 {
		t.Fatalf("committed length %d, want %d (where the lost bytes begin)", attr.Size, 1<<20)
	}
	if got := readAll(t, h, 1<<20, 256<<10); !bytes.Equal(got, want) {
		t.Error("the file reads back wrong")
	}
}

// TestWriteBackErrorWritesPastLostBytes: a writer that goes on past
// bytes it lost never makes them part of the file: its fsync reports the
// loss once, the length stays where the lost bytes begin, and a later
// fsync after more writes past them reports that those cannot be shown
// either (once). Writing the lost bytes again makes the whole file good.
func TestWriteBackErrorWritesPastLostBytes(t *testing.T) {
	tc, c := lostCluster(t)
	ctx := context.Background()
	rnd := rand.New(rand.NewPCG(43, 44))
	data := randomBytes(rnd, 4<<20)
	f := create(t, c, "past", syscall.O_RDWR)
	if _, err := f.WriteAt(ctx, data[:1<<20], 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(ctx); err != nil {
		t.Fatal(err)
	}
	loseChunk(t, tc, c, f, 1<<20, "past")
	if _, err := f.WriteAt(ctx, data[2<<20:3<<20], 2<<20); !errors.Is(err, syscall.EIO) {
		t.Fatalf("first write after the loss: %v, want EIO", err)
	}
	if _, err := f.WriteAt(ctx, data[2<<20:3<<20], 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(ctx); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync with writes past lost bytes: %v, want EIO", err)
	}
	if err := f.Fsync(ctx); err != nil {
		t.Fatalf("second fsync: %v", err)
	}
	if _, err := f.WriteAt(ctx, data[3<<20:], 3<<20); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write after the fsync recorded more bytes it cannot show: %v, want EIO", err)
	}
	if _, err := f.WriteAt(ctx, data[3<<20:], 3<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(ctx); !errors.Is(err, syscall.EIO) {
		t.Fatalf("fsync after more writes past the lost bytes: %v, want EIO", err)
	}
	o := newTestClient(t, tc.metaAddr, Config{})
	if h, attr := open(t, o, "past", syscall.O_RDONLY); attr.Size != 1<<20 {
		t.Fatalf("committed length %d with lost bytes at 1 MiB", attr.Size)
	} else {
		h.Release(ctx)
	}
	// Written again: the whole file is there.
	if _, err := f.WriteAt(ctx, data[1<<20:2<<20], 1<<20); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write after the last fsync recorded more bytes it cannot show: %v, want EIO", err)
	}
	if _, err := f.WriteAt(ctx, data[1<<20:2<<20], 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(ctx); err != nil {
		t.Fatalf("fsync once the lost bytes are written again: %v", err)
	}
	if err := f.Release(ctx); err != nil {
		t.Fatal(err)
	}
	h, attr := open(t, o, "past", syscall.O_RDONLY)
	defer h.Release(ctx)
	if attr.Size != 4<<20 {
		t.Fatalf("length %d after the lost bytes were written again, want %d", attr.Size, 4<<20)
	}
	if got := readAll(t, h, 4<<20, 1<<20); !bytes.Equal(got, data) {
		t.Error("the file reads back wrong")
	}
}

// TestWriteBackErrorCloseCutsFile: a file closed with writes past lost
// bytes is cut at them on the data servers, so that growing it later
// reads zeros there, not bytes that were never part of it.
func TestWriteBackErrorCloseCutsFile(t *testing.T) {
	tc, c := lostCluster(t)
	ctx := context.Background()
	f := create(t, c, "cut", syscall.O_RDWR)
	head := bytes.Repeat([]byte{0x11}, 1<<20)
	if _, err := f.WriteAt(ctx, head, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Fsync(ctx); err != nil {
		t.Fatal(err)
	}
	loseChunk(t, tc, c, f, 1<<20, "cut")
	if _, err := f.WriteAt(ctx, []byte{1}, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("first write after the loss: %v, want EIO", err)
	}
	past := bytes.Repeat([]byte{0x22}, 1<<20)
	if _, err := f.WriteAt(ctx, past, 2<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Flush(ctx); !errors.Is(err, syscall.EIO) {
		t.Fatalf("close: %v, want EIO", err)
	}
	f.Release(ctx) // reports the loss again (a mount only logs it): no fsync saw it
	o := newTestClient(t, tc.metaAddr, Config{})
	g, attr := open(t, o, "cut", syscall.O_RDWR)
	if attr.Size != 1<<20 {
		t.Fatalf("length %d, want %d", attr.Size, 1<<20)
	}
	if _, err := g.WriteAt(ctx, []byte{3}, 4<<20); err != nil {
		t.Fatal(err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	h, _ := open(t, o, "cut", syscall.O_RDONLY)
	defer h.Release(ctx)
	got := readAll(t, h, 4<<20+1, 1<<20)
	want := append(append(head, make([]byte, 3<<20)...), 3)
	if !bytes.Equal(got, want) {
		t.Errorf("grown file reads back wrong: first difference at %d", firstDifference(got, want))
	}
}

// readN reads n bytes at off through f.
func readN(t *testing.T, f *File, off int64, n int) []byte {
	t.Helper()
	buf := make([]byte, n)
	got, err := f.ReadAt(context.Background(), buf, off)
	if err != nil {
		t.Fatalf("read %d bytes at %d: %v", n, off, err)
	}
	return buf[:got]
}

// firstDifference is the first index where a and b differ.
func firstDifference(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestLostRanges checks the lost byte ranges of an inode against a model
// (a byte map) over random adds and clears: merged, sorted, and what
// lostInLocked and barrierLocked report.
func TestLostRanges(t *testing.T) {
	const size = 4096
	rnd := rand.New(rand.NewPCG(45, 46))
	for round := range 200 {
		in := &inode{metaSize: uint64(rnd.IntN(size))}
		model := make([]bool, size)
		for range 20 {
			lo := uint64(rnd.IntN(size))
			hi := min(lo+uint64(rnd.IntN(300)), size)
			add := rnd.IntN(3) > 0
			if add {
				in.addLostLocked(lo, hi)
			} else {
				in.clearLostLocked(lo, hi)
			}
			for i := lo; i < hi; i++ {
				model[i] = add
			}
		}
		for i := 1; i < len(in.lost); i++ {
			if in.lost[i-1].hi >= in.lost[i].lo {
				t.Fatalf("round %d: ranges not merged or sorted: %v", round, in.lost)
			}
		}
		barrier := ^uint64(0)
		for i := in.metaSize; i < size; i++ {
			if model[i] {
				barrier = i
				break
			}
		}
		if got := in.barrierLocked(); got != barrier {
			t.Fatalf("round %d: barrier %d, want %d (meta size %d, lost %v)", round, got, barrier, in.metaSize, in.lost)
		}
		for range 20 {
			lo := uint64(rnd.IntN(size))
			hi := min(lo+1+uint64(rnd.IntN(300)), size)
			want := -1
			for i := lo; i < hi; i++ {
				if model[i] {
					want = int(i)
					break
				}
			}
			r, ok := in.lostInLocked(lo, hi, nil, 0)
			if ok != (want >= 0) || (ok && r.lo != uint64(want)) {
				t.Fatalf("round %d: lostIn(%d, %d) = %v %v, want first lost byte %d", round, lo, hi, r, ok, want)
			}
		}
	}
}
