package wire

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// memHandler stores chunks in memory; it has an identity, so clients use
// its Unix socket, and can read into the caller's buffer (AllocReader).
type memHandler struct {
	idHandler
	mu     sync.Mutex
	chunks map[uint64][]byte
	hold   chan struct{} // if set, reads wait for it
	// onWrite, if set, sees every write request.
	onWrite func(*weftv1.WriteChunkRequest)
}

func (h *memHandler) WriteChunk(_ context.Context, r *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error) {
	if h.onWrite != nil {
		h.onWrite(r)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.chunks[r.GetChunk().GetIndex()] = bytes.Clone(r.GetData())
	return &weftv1.WriteChunkResponse{}, nil
}

func (h *memHandler) ReadChunk(ctx context.Context, r *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error) {
	data, _, err := h.ReadChunkAlloc(ctx, r, func(n int) []byte { return make([]byte, n) })
	return &weftv1.ReadChunkResponse{Data: data}, err
}

func (h *memHandler) ReadChunkAlloc(_ context.Context, r *weftv1.ReadChunkRequest, alloc func(int) []byte) (data, buf []byte, err error) {
	if h.hold != nil {
		<-h.hold
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	d := h.chunks[r.GetChunk().GetIndex()]
	end := min(int(r.GetOffset())+int(r.GetLength()), len(d))
	if int(r.GetOffset()) >= end {
		return nil, nil, nil
	}
	buf = alloc(end - int(r.GetOffset()))
	copy(buf, d[r.GetOffset():end])
	return buf, buf, nil
}

func startShm(t *testing.T, h *memHandler) *Client {
	t.Helper()
	h.chunks = map[uint64][]byte{}
	sock := filepath.Join(socketDir(t), "wire.sock")
	tcp := serveBoth(t, h, sock)
	c := NewClient(Addr{TCP: tcp, Unix: sock, ID: h.id}.String(), 2)
	t.Cleanup(func() { c.Close() })
	return c
}

// Writes and reads over the Unix socket carry their data through the
// shared arena, whatever buffer the caller has, and the bytes arrive
// intact.
func TestSharedArenaRoundTrip(t *testing.T) {
	c := startShm(t, &memHandler{idHandler: idHandler{id: "shm-a", name: "a"}})
	ctx := context.Background()
	for i, n := range []int{1, 8 << 10, 64<<10 + 1, 1 << 20, 8 << 20} {
		data := make([]byte, n)
		for j := range data {
			data[j] = byte(j*13 + i)
		}
		if _, err := c.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Index: uint64(i)}, Data: data}); err != nil {
			t.Fatalf("write %d bytes: %v", n, err)
		}
		for _, dst := range [][]byte{nil, make([]byte, n+10), GetShared(n + 10)} {
			got, err := c.ReadChunkInto(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Index: uint64(i)}, Length: uint32(n + 10)}, dst)
			if err != nil {
				t.Fatalf("read %d bytes: %v", n, err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("read back %d bytes, want %d equal bytes", len(got), n)
			}
		}
	}
	if c.UnixConns() == 0 || c.ShmCalls() != c.Calls() {
		t.Fatalf("%d of %d requests through the arena (%d Unix socket connections), want all", c.ShmCalls(), c.Calls(), c.UnixConns())
	}
}

// With WEFT_WIRE_SHM=off the data goes through the socket.
func TestSharedArenaOff(t *testing.T) {
	t.Setenv(shmOffEnv, "off")
	c := startShm(t, &memHandler{idHandler: idHandler{id: "shm-b", name: "b"}})
	ctx := context.Background()
	if _, err := c.WriteChunk(ctx, &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{}, Data: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	got, err := c.ReadChunkInto(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{}, Length: 5}, nil)
	if err != nil || string(got) != "hello" {
		t.Fatalf("read %q, %v", got, err)
	}
	if c.UnixConns() == 0 || c.ShmCalls() != 0 {
		t.Fatalf("%d requests through the arena, %d Unix connections; want 0 and some", c.ShmCalls(), c.UnixConns())
	}
}

// A read its caller gave up on keeps its arena buffer until the server
// has answered: the server never fills memory handed out again.
func TestSharedArenaAbandonedRead(t *testing.T) {
	h := &memHandler{idHandler: idHandler{id: "shm-c", name: "c"}, hold: make(chan struct{})}
	c := startShm(t, h)
	h.chunks[0] = bytes.Repeat([]byte{0xAB}, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.ReadChunkInto(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{}, Length: 1 << 20}, nil); err == nil {
		t.Fatal("read finished though the server held it")
	}
	// While the server holds the read, the arena must not hand out the
	// buffer it will fill.
	var taken [][]byte
	for range 8 {
		b := GetShared(1 << 20)
		for i := range b {
			b[i] = 0x11
		}
		taken = append(taken, b)
	}
	close(h.hold)
	time.Sleep(100 * time.Millisecond) // the held read completes into its buffer
	for _, b := range taken {
		if i := bytes.IndexByte(b, 0xAB); i >= 0 {
			t.Fatalf("a buffer handed out while lent to the server was filled by it (byte %d)", i)
		}
		PutShared(b)
	}
}

// The server maps only sealed memfds: one that could shrink under it
// (SIGBUS) is refused.
func TestPeerArenaNeedsSeal(t *testing.T) {
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skip("no memfd:", err)
	}
	if err := unix.Ftruncate(fd, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := mapPeerArena(fd); err == nil {
		t.Fatal("an unsealed memfd was mapped")
	}
	a, err := newArena(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	dup, err := unix.Dup(a.fd)
	if err != nil {
		t.Fatal(err)
	}
	p, err := mapPeerArena(dup)
	if err != nil {
		t.Fatalf("sealed arena refused: %v", err)
	}
	defer p.unmap()
	if _, ok := p.slice(1<<20-10, 11); ok {
		t.Error("a slice past the arena's end was allowed")
	}
	if b, ok := p.slice(1<<20-10, 10); !ok || len(b) != 10 {
		t.Error("the arena's last bytes were refused")
	}
}

// Freed buffers keep their pages up to a bound; past it their pages go
// back to the system, and a buffer handed out again still works.
func TestArenaIdleBound(t *testing.T) {
	a, err := newArena(256 << 20)
	if err != nil {
		t.Skip("no arena:", err)
	}
	useAndFree(t, a, 128, 1<<20)
	if a.hot > maxIdleArena {
		t.Fatalf("%d idle bytes kept, bound %d", a.hot, maxIdleArena)
	}
	cold := 0
	for _, l := range a.cold {
		cold += len(l)
	}
	if cold != 128-maxIdleArena/(1<<20) {
		t.Fatalf("%d buffers had their pages dropped, want %d", cold, 128-maxIdleArena/(1<<20))
	}
	for range 128 {
		b := a.get(1 << 20)
		if b == nil {
			t.Fatal("freed buffers not reused")
		}
		b[0], b[len(b)-1] = 1, 2
	}
}

// A write of pieces arrives with its offsets, lengths and bytes as sent,
// over TCP (in the frame) and over the Unix socket (in the arena), with
// its bytes in one buffer (WriteChunk) or in one per piece (WritePieces).
func TestWriteOfPieces(t *testing.T) {
	var mu sync.Mutex
	var got *weftv1.WriteChunkRequest
	h := &memHandler{idHandler: idHandler{id: "pieces", name: "p"}}
	h.onWrite = func(r *weftv1.WriteChunkRequest) {
		mu.Lock()
		got = &weftv1.WriteChunkRequest{Offset: r.GetOffset(), Data: bytes.Clone(r.GetData()),
			PieceOffsets: r.GetPieceOffsets(), PieceLengths: r.GetPieceLengths()}
		mu.Unlock()
	}
	shm := startShm(t, h)
	tcp, _ := start(t, h, 1)
	want := &weftv1.WriteChunkRequest{Chunk: &weftv1.ChunkID{Index: 3}, Offset: weftv1.PiecesOffset,
		Data: []byte("aaaabbbbbbccc"), PieceOffsets: []uint64{0, 8 << 10, 1<<20 - 3}, PieceLengths: []uint32{4, 6, 3}}
	sends := []struct {
		name string
		send func(c *Client) error
	}{
		{"WriteChunk, bytes gathered", func(c *Client) error {
			_, err := c.WriteChunk(context.Background(), want)
			return err
		}},
		{"WritePieces, bytes of each piece apart", func(c *Client) error {
			req := &weftv1.WriteChunkRequest{Chunk: want.Chunk, Offset: want.Offset, PieceOffsets: want.PieceOffsets, PieceLengths: want.PieceLengths}
			_, err := c.WritePieces(context.Background(), req, [][]byte{[]byte("aaaa"), []byte("bbbbbb"), []byte("ccc")})
			return err
		}},
	}
	for name, c := range map[string]*Client{"unix socket": shm, "tcp": tcp} {
		for _, s := range sends {
			mu.Lock()
			got = nil
			mu.Unlock()
			if err := s.send(c); err != nil {
				t.Fatalf("%s, %s: %v", name, s.name, err)
			}
			mu.Lock()
			g := got
			mu.Unlock()
			if g.GetOffset() != weftv1.PiecesOffset || !bytes.Equal(g.GetData(), want.Data) ||
				!slices.Equal(g.GetPieceOffsets(), want.PieceOffsets) || !slices.Equal(g.GetPieceLengths(), want.PieceLengths) {
				t.Fatalf("%s, %s: arrived as offset %d, %q, pieces %v %v", name, s.name, g.GetOffset(), g.GetData(), g.GetPieceOffsets(), g.GetPieceLengths())
			}
		}
	}
	if shm.ShmCalls() == 0 {
		t.Error("the write of pieces over the Unix socket did not go through the arena")
	}
}

// A reserved buffer keeps, once freed, only the pages it was used up to:
// many large reservations holding a little data each stay idle within the
// bound without their pages being dropped.
func TestArenaIdleCountsUse(t *testing.T) {
	a, err := newArena(256 << 20)
	if err != nil {
		t.Skip("no arena:", err)
	}
	var bufs [][]byte
	for range 128 {
		b := a.getTouching(1<<20, 0)
		if b == nil {
			t.Fatal("arena full")
		}
		b = b[:8<<10]
		for i := range b {
			b[i] = 7
		}
		bufs = append(bufs, b)
	}
	for _, b := range bufs {
		a.put(b)
	}
	if a.hot != 128*(8<<10) {
		t.Fatalf("%d idle bytes counted for 128 buffers that used 8 KiB each, want %d", a.hot, 128*(8<<10))
	}
	for _, l := range a.cold {
		if len(l) != 0 {
			t.Fatalf("%d buffers had their pages dropped, want none", len(l))
		}
	}
}

// Past the bound, the buffers idle longest lose their pages, not the one
// freed now: after a workload of small buffers filled the idle memory,
// the large buffers of the next one keep their pages from one use to the
// next.
func TestArenaIdleDropsOldestFirst(t *testing.T) {
	a, err := newArena(512 << 20)
	if err != nil {
		t.Skip("no arena:", err)
	}
	const small = 64 << 10
	useAndFree(t, a, maxIdleArena/small, small)
	if a.hot != maxIdleArena {
		t.Fatalf("%d idle bytes kept, want the bound %d", a.hot, maxIdleArena)
	}
	large := arenaClass(1 << 20)
	for round := range 8 {
		b := a.get(1 << 20)
		if b == nil {
			t.Fatal("arena full")
		}
		for i := range b {
			b[i] = byte(round)
		}
		a.put(b)
		if n := len(a.cold[large]); n != 0 {
			t.Fatalf("round %d: %d buffers of 1 MiB had their pages dropped, want none (the small idle ones go first)", round, n)
		}
		if n := len(a.free[large]); n != 1 {
			t.Fatalf("round %d: %d idle buffers of 1 MiB, want 1 (reused)", round, n)
		}
	}
	if a.hot > maxIdleArena {
		t.Fatalf("%d idle bytes kept, bound %d", a.hot, maxIdleArena)
	}
	if got, want := len(a.cold[arenaClass(small)]), (1<<20)/small; got != want {
		t.Errorf("%d small buffers had their pages dropped, want %d (room for one 1 MiB buffer)", got, want)
	}
}

// useAndFree gets n buffers of size bytes from a, writes all of each,
// then gives them all back.
func useAndFree(t *testing.T, a *arena, n, size int) {
	t.Helper()
	var bufs [][]byte
	for range n {
		b := a.get(size)
		if b == nil {
			t.Fatal("arena full")
		}
		for i := range b {
			b[i] = 7
		}
		bufs = append(bufs, b)
	}
	for _, b := range bufs {
		a.put(b)
	}
}
