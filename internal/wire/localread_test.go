package wire

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/data/chunk"
	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// fileHandler hands out chunk files of a directory for reading in place:
// chunk i is the file named i; index 7 answers a stale chain version,
// index 9 a bad copy when verified.
type fileHandler struct {
	idHandler
	dir   string
	lease time.Duration
}

func (h *fileHandler) OpenChunkRead(_ context.Context, r *weftv1.ReadChunkRequest, verify bool) (*LocalChunk, error) {
	switch idx := r.GetChunk().GetIndex(); {
	case idx == 7:
		return nil, status.Error(codes.FailedPrecondition, "stale chain version")
	case idx == 9 && verify:
		return nil, fserr.Wrap(syscall.EIO, "chunk 9: block 0 checksum mismatch")
	}
	f, err := os.Open(filepath.Join(h.dir, itoa(r.GetChunk().GetIndex())))
	if errors.Is(err, os.ErrNotExist) {
		return &LocalChunk{Lease: h.lease}, nil
	}
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	lc := &LocalChunk{Opened: chunk.Opened{File: f, Length: int64(len(data)), Version: 3}, Lease: h.lease}
	for off := 0; off < len(data); off += chunk.BlockSize {
		lc.Sums = append(lc.Sums, crc32.Checksum(data[off:min(off+chunk.BlockSize, len(data))], crc32.MakeTable(crc32.Castagnoli)))
	}
	return lc, nil
}

func (h *fileHandler) ReadLease() time.Duration { return h.lease }

func itoa(i uint64) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

// A client on the server's host gets a chunk's file (a descriptor that
// reads its bytes), checksums, version and lease; a missing chunk
// without a file; the server's refusals as the statuses of a read, on a
// connection that stays usable; and a client without the Unix socket
// ErrNotLocal.
func TestOpenChunkInPlace(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("weft in place "), 20000) // about 4.3 blocks
	if err := os.WriteFile(filepath.Join(dir, "1"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	h := &fileHandler{idHandler: idHandler{id: "local-a", name: "a"}, dir: dir, lease: 1500 * time.Millisecond}
	sock := filepath.Join(socketDir(t), "wire.sock")
	tcp := serveBoth(t, h, sock)
	c := NewClient(Addr{TCP: tcp, Unix: sock, ID: h.id}.String(), 2)
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	open := func(idx uint64, verify bool) (*LocalChunk, error) {
		return c.OpenChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5, Index: idx}, ChainId: 1, ChainVersion: 2}, verify)
	}

	lc, err := open(1, false)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, lc.Length)
	if _, err := lc.File.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the file handed out reads %d bytes (err %v), want the chunk's %d", len(got), err, len(data))
	}
	lc.File.Close()
	if lc.Version != 3 || len(lc.Sums) != 5 || lc.Lease != h.lease {
		t.Fatalf("version %d, %d checksums, lease %v; want 3, 5, %v", lc.Version, len(lc.Sums), lc.Lease, h.lease)
	}
	if !c.LeaseValid(ctx) {
		t.Fatal("lease not valid right after an open")
	}
	idleConn := func() *localConn {
		c.locMu.Lock()
		defer c.locMu.Unlock()
		if len(c.locIdle) != 1 {
			t.Fatalf("%d idle connections, want 1", len(c.locIdle))
		}
		return c.locIdle[0]
	}
	first := idleConn()

	tests := []struct {
		name   string
		idx    uint64
		verify bool
		check  func(*LocalChunk, error) bool
	}{
		{"missing chunk", 4, false, func(lc *LocalChunk, err error) bool { return err == nil && lc.File == nil && lc.Length == 0 }},
		{"stale chain version", 7, false, func(_ *LocalChunk, err error) bool { return status.Code(err) == codes.FailedPrecondition }},
		{"bad copy, verified", 9, true, func(_ *LocalChunk, err error) bool { return errors.Is(err, syscall.EIO) }},
		{"good chunk again", 1, true, func(lc *LocalChunk, err error) bool {
			if err != nil {
				return false
			}
			lc.File.Close()
			return lc.Length == int64(len(data))
		}},
	}
	for _, tt := range tests {
		lc, err := open(tt.idx, tt.verify)
		if !tt.check(lc, err) {
			t.Errorf("%s: got %+v, err %v", tt.name, lc, err)
		}
	}
	if idleConn() != first {
		t.Error("the connection was replaced after refusals the server answered")
	}

	// An expired lease is renewed at once.
	c.leaseUntil.Store(time.Now().Add(-time.Second).UnixNano())
	if !c.LeaseValid(ctx) {
		t.Fatal("an expired lease was not renewed")
	}

	tcpOnly := NewClient(tcp, 1)
	t.Cleanup(func() { tcpOnly.Close() })
	if _, err := tcpOnly.OpenChunk(ctx, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Index: 1}}, false); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("open over TCP only: %v, want ErrNotLocal", err)
	}
}

// Opens sent together get each its own answer, in the order asked, with
// the descriptor of its own chunk even where answers without one (a
// missing chunk, a refusal) come between, on a connection that stays
// usable.
func TestOpenChunksTogether(t *testing.T) {
	dir := t.TempDir()
	contents := map[uint64][]byte{}
	for _, idx := range []uint64{1, 2, 5, 8} {
		contents[idx] = bytes.Repeat([]byte{byte('a' + idx)}, int(idx)*50000)
		if err := os.WriteFile(filepath.Join(dir, itoa(idx)), contents[idx], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := &fileHandler{idHandler: idHandler{id: "local-b", name: "b"}, dir: dir, lease: time.Second}
	sock := filepath.Join(socketDir(t), "wire.sock")
	tcp := serveBoth(t, h, sock)
	c := NewClient(Addr{TCP: tcp, Unix: sock, ID: h.id}.String(), 2)
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	order := []uint64{4, 1, 7, 2, 3, 5, 8, 7, 1}
	var reqs []*weftv1.ReadChunkRequest
	for _, idx := range order {
		reqs = append(reqs, &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: 5, Index: idx}, ChainId: 1, ChainVersion: 2})
	}
	for round := range 2 { // the second on the connection the first left idle
		outs, errs := c.OpenChunks(ctx, reqs)
		for i, idx := range order {
			want, exists := contents[idx]
			switch {
			case idx == 7:
				if status.Code(errs[i]) != codes.FailedPrecondition {
					t.Errorf("round %d, chunk %d: %v, want the server's refusal", round, idx, errs[i])
				}
			case errs[i] != nil:
				t.Errorf("round %d, chunk %d: %v", round, idx, errs[i])
			case !exists:
				if outs[i].File != nil {
					t.Errorf("round %d, chunk %d: a file for a missing chunk", round, idx)
				}
			default:
				got := make([]byte, outs[i].Length)
				if outs[i].File == nil {
					t.Errorf("round %d, chunk %d: no file", round, idx)
					continue
				}
				if _, err := outs[i].File.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
					t.Errorf("round %d, chunk %d: the file handed out is not the chunk's (%d bytes, err %v)", round, idx, len(got), err)
				}
				outs[i].File.Close()
			}
		}
		c.locMu.Lock()
		idle := len(c.locIdle)
		c.locMu.Unlock()
		if idle != 1 {
			t.Fatalf("round %d: %d idle connections after the opens, want 1", round, idle)
		}
	}
}
