package chunk

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const kib = 1 << 10

// pattern returns n recognizable non-zero bytes derived from seed.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*31+i*7)%251 + 1
	}
	return b
}

func openTestStore(t *testing.T, opts Options) (*Store, *Target) {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s, err := Open([]string{t.TempDir()}, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, s.Targets()[0]
}

// model is the expected content of one chunk.
type model []byte

func (m *model) write(off int, data []byte) {
	if end := off + len(data); end > len(*m) {
		*m = append(*m, make([]byte, end-len(*m))...)
	}
	copy((*m)[off:], data)
}

// checkChunk verifies the chunk's bytes, its length and every checksum in
// its file's head against the model.
func checkChunk(t *testing.T, tg *Target, id ID, want model) {
	t.Helper()
	got, err := tg.Read(id, 0, MaxChunkSize)
	if err != nil {
		t.Fatalf("read %v: %v", id, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%v: content differs from model (got %d bytes, want %d)", id, len(got), len(want))
	}
	file, err := os.ReadFile(tg.inlinePath(id))
	if len(want) == 0 && (errors.Is(err, os.ErrNotExist) || len(file) < headerSize) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	f := &chunkFile{key: cacheKey{tg, id}}
	_, stale := tg.parseHead(f, file)
	if f.bad != nil || len(f.damaged) > 0 || len(stale) > 0 || f.hdr.length != int64(len(want)) {
		t.Fatalf("%v: head %+v (bad %v, damaged %v, stale %v); want length %d", id, f.hdr, f.bad, f.damaged, stale, len(want))
	}
	for b := range nblocks(int64(len(want))) {
		block := want[b*BlockSize : min((b+1)*BlockSize, int64(len(want)))]
		if got, _ := f.contentSum(b); got != crc32.Checksum(block, castagnoli) {
			exp := crc32.Checksum(block, castagnoli)
			t.Fatalf("%v: block %d checksum %08x, want %08x", id, b, got, exp)
		}
		i := f.cur(b)
		if i < 0 {
			continue
		}
		// The copy the entry names holds what it says.
		e := f.ents[b][i]
		off := slotOff(b, e.slot)
		if int64(len(file)) < off+e.n || crc32.Checksum(file[off:off+e.n], castagnoli) != e.sum {
			t.Fatalf("%v: block %d: the copy in slot %d does not match its entry", id, b, e.slot)
		}
	}
}

type writeOp struct {
	off, n int
}

func TestWriteRead(t *testing.T) {
	const chunkSize = 1 << 20
	tests := []struct {
		name   string
		writes []writeOp
	}{
		{"small at start", []writeOp{{0, 100}}},
		{"inside one block", []writeOp{{1000, 3000}}},
		{"across a block boundary", []writeOp{{BlockSize - 10, 20}}},
		{"across several blocks", []writeOp{{100, 3*BlockSize + 5}}},
		{"block aligned", []writeOp{{BlockSize, 2 * BlockSize}}},
		{"whole chunk", []writeOp{{0, chunkSize}}},
		{"last byte of the chunk", []writeOp{{chunkSize - 1, 1}}},
		{"sparse gap in empty chunk", []writeOp{{200 * kib, 10}}},
		{"gap after partial block", []writeOp{{0, 10}, {100 * kib, 10}}},
		{"gap after partial block into same block", []writeOp{{0, 10}, {1000, 10}}},
		{"gap from block boundary", []writeOp{{0, BlockSize}, {3 * BlockSize, 7}}},
		{"overwrite middle", []writeOp{{0, 300 * kib}, {70 * kib, 5}}},
		{"overwrite unaligned span", []writeOp{{0, 300 * kib}, {BlockSize - 3, 2*BlockSize + 6}}},
		{"overwrite aligned blocks", []writeOp{{0, 300 * kib}, {BlockSize, BlockSize}}},
		{"overwrite and extend", []writeOp{{0, 100 * kib}, {90 * kib, 50 * kib}}},
		{"extend partial last block", []writeOp{{0, 100}, {100, 100}, {200, BlockSize}}},
		{"write before existing data", []writeOp{{500 * kib, 10}, {0, 10}}},
	}
	_, tg := openTestStore(t, Options{})
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := ID{Ino: uint64(100 + i), Index: 3}
			var m model
			for j, w := range tc.writes {
				data := pattern(j+1, w.n)
				if _, err := tg.Write(id, 1, int64(w.off), data, chunkSize, false); err != nil {
					t.Fatalf("write %d: %v", j, err)
				}
				m.write(w.off, data)
				checkChunk(t, tg, id, m)
			}
			for _, r := range []struct{ off, n int }{
				{0, 1}, {BlockSize - 1, 2}, {len(m) - 1, 10}, {len(m), 10}, {len(m) + 5, 10}, {len(m) / 2, len(m)},
			} {
				got, err := tg.Read(id, int64(r.off), r.n)
				if err != nil {
					t.Fatalf("read [%d,+%d): %v", r.off, r.n, err)
				}
				lo, hi := min(r.off, len(m)), min(r.off+r.n, len(m))
				if !bytes.Equal(got, m[lo:hi]) {
					t.Fatalf("read [%d,+%d): got %d bytes, differing from model", r.off, r.n, len(got))
				}
			}
		})
	}
}

func TestWriteOutsideChunkFails(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	id := ID{Ino: 1, Index: 0}
	tests := []struct {
		name      string
		off       int64
		n         int
		chunkSize int64
	}{
		{"past chunk size", 60 * kib, 8 * kib, 64 * kib},
		{"starts at chunk size", 64 * kib, 1, 64 * kib},
		{"negative offset", -1, 1, 64 * kib},
		{"no chunk size", 0, 1, 0},
		{"chunk size too big", 0, 1, 2 * MaxChunkSize},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tg.Write(id, 1, tc.off, make([]byte, tc.n), tc.chunkSize, false)
			if !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("got %v, want EINVAL", err)
			}
		})
	}
	if _, err := os.Stat(tg.inlinePath(id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("refused writes created the chunk: %v", err)
	}
}

func TestReadMissingChunk(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	got, err := tg.Read(ID{Ino: 7, Index: 9}, 0, 4096)
	if err != nil || len(got) != 0 {
		t.Fatalf("missing chunk: got %d bytes, %v; want empty read", len(got), err)
	}
}

func TestTruncateFile(t *testing.T) {
	const chunkSize = 256 * kib
	const ino = 42
	// Chunks 0..3 full, chunk 4 partial (100 KiB + 3), chunk 6 sparse.
	fileSize := 4*chunkSize + 100*kib + 3
	tests := []struct {
		name string
		size int
	}{
		{"to zero", 0},
		{"inside first block", 10},
		{"on a block boundary", chunkSize + BlockSize},
		{"unaligned in a middle chunk", 2*chunkSize + 3*BlockSize + 17},
		{"on a chunk boundary", 3 * chunkSize},
		{"inside the last chunk", 4*chunkSize + 70*kib},
		{"to the current length", fileSize},
		{"up", 10 * chunkSize},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, tg := openTestStore(t, Options{})
			file := make(model, 0)
			for idx := range 5 {
				n := chunkSize
				if idx == 4 {
					n = 100*kib + 3
				}
				data := pattern(idx, n)
				if _, err := tg.Write(ID{ino, uint64(idx)}, 1, 0, data, chunkSize, false); err != nil {
					t.Fatal(err)
				}
				file.write(idx*chunkSize, data)
			}
			if _, err := tg.Write(ID{ino, 6}, 1, 0, pattern(6, 10), chunkSize, false); err != nil {
				t.Fatal(err)
			}
			if err := tg.TruncateFile(ino, 1, int64(tc.size), chunkSize); err != nil {
				t.Fatal(err)
			}
			var chunks, used uint64
			for idx := range 7 {
				id := ID{ino, uint64(idx)}
				var want model
				switch {
				case idx == 6 && tc.size > 6*chunkSize:
					want = pattern(6, 10)
				case idx < 5:
					lo := idx * chunkSize
					hi := min((idx+1)*chunkSize, len(file), max(tc.size, lo))
					want = file[lo:hi]
				}
				checkChunk(t, tg, id, want)
				_, err := os.Stat(tg.inlinePath(id))
				exists := err == nil
				if wantExists := uint64(idx)*chunkSize < uint64(tc.size) && (idx < 5 || idx == 6); exists != wantExists {
					t.Errorf("%v exists = %v, want %v", id, exists, wantExists)
				}
				if exists {
					chunks++
					used += uint64(len(want))
				}
			}
			u, err := tg.Usage()
			if err != nil {
				t.Fatal(err)
			}
			if u.Chunks != chunks || u.UsedBytes != used {
				t.Errorf("usage: %d chunks, %d bytes; want %d, %d", u.Chunks, u.UsedBytes, chunks, used)
			}
		})
	}
}

func TestTruncateThenExtend(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	id := ID{Ino: 5, Index: 0}
	var m model
	m.write(0, pattern(1, 3*BlockSize))
	if _, err := tg.Write(id, 1, 0, m, MaxChunkSize, false); err != nil {
		t.Fatal(err)
	}
	if err := tg.TruncateFile(5, 1, BlockSize+100, MaxChunkSize); err != nil {
		t.Fatal(err)
	}
	m = m[:BlockSize+100]
	checkChunk(t, tg, id, m)
	// Writing past the new end must read zeros in between, not old bytes.
	m.write(2*BlockSize+50, pattern(2, 10))
	if _, err := tg.Write(id, 1, 2*BlockSize+50, pattern(2, 10), MaxChunkSize, false); err != nil {
		t.Fatal(err)
	}
	checkChunk(t, tg, id, m)
}

func TestDeleteFile(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	for idx := range 3 {
		if _, err := tg.Write(ID{9, uint64(idx)}, 1, 0, pattern(idx, 1000), 64*kib, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tg.Write(ID{10, 0}, 1, 0, pattern(1, 500), 64*kib, false); err != nil {
		t.Fatal(err)
	}
	if err := tg.DeleteFile(9); err != nil {
		t.Fatal(err)
	}
	if err := tg.DeleteFile(12345); err != nil {
		t.Fatalf("delete of a file without chunks: %v", err)
	}
	if _, err := os.Stat(tg.inoDir(9)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("inode directory still there: %v", err)
	}
	for idx := range 3 {
		if got, err := tg.Read(ID{9, uint64(idx)}, 0, 1000); err != nil || len(got) != 0 {
			t.Fatalf("deleted chunk %d reads %d bytes, %v", idx, len(got), err)
		}
	}
	checkChunk(t, tg, ID{10, 0}, pattern(1, 500))
	u, _ := tg.Usage()
	if u.Chunks != 1 || u.UsedBytes != 500 {
		t.Fatalf("usage after delete: %+v", u)
	}
}

func TestCorruptionIsDetected(t *testing.T) {
	size := 3*BlockSize + 1000
	tests := []struct {
		name      string
		file      string // "data" or "crc" (the checksums in the head)
		pos       int
		readOff   int
		readLen   int
		wantBlock int64
	}{
		{"first byte", "data", 0, 0, 10, 0},
		{"middle block read across", "data", BlockSize + 5, BlockSize - 10, 20, 1},
		{"partial last block", "data", 3*BlockSize + 999, 3 * BlockSize, 1, 3},
		{"whole read", "data", 2*BlockSize + 7, 0, size, 2},
		{"checksum in the block table", "crc", entriesOff + 2*blockEntries + 9, 2 * BlockSize, 1, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			s, tg := openTestStore(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			id := ID{Ino: 77, Index: 2}
			data := pattern(3, size)
			if _, err := tg.Write(id, 1, 0, data, MaxChunkSize, false); err != nil {
				t.Fatal(err)
			}
			pos := inlineDataOff + tc.pos
			if tc.file == "crc" {
				pos = tc.pos
			}
			flipByte(t, tg.inlinePath(id), pos)
			tg.store.files.drop(func(cacheKey) bool { return true }) // read the head again
			_, err := tg.Read(id, int64(tc.readOff), tc.readLen)
			if !errors.Is(err, syscall.EIO) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("read of corrupt block: %v, want EIO", err)
			}
			var ce *CorruptionError
			if !errors.As(err, &ce) || ce.Block != tc.wantBlock || ce.Chunk != id || ce.Target != tg.Dir() {
				t.Fatalf("error %v does not name block %d of %v on %s", err, tc.wantBlock, id, tg.Dir())
			}
			for _, want := range []string{"checksum mismatch", "ino=77", "index=2", "block=" + fmt.Sprint(tc.wantBlock), tg.Dir()} {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("log %q lacks %q", logs.String(), want)
				}
			}
			// A partial write into the bad block must not bless it.
			bs := int(tc.wantBlock) * BlockSize
			if _, err := tg.Write(id, 1, int64(bs+1), []byte{1}, MaxChunkSize, false); !errors.Is(err, syscall.EIO) {
				t.Fatalf("partial write into corrupt block: %v, want EIO", err)
			}
			// Other blocks still read.
			other := (tc.wantBlock + 1) % 4
			if _, err := tg.Read(id, other*BlockSize, 10); err != nil {
				t.Fatalf("read of a good block: %v", err)
			}
			_ = s
		})
	}
}

func flipByte(t *testing.T, path string, pos int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[pos] ^= 0x40
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentWritersToOneChunk(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	id := ID{Ino: 3, Index: 1}
	const writers, rounds, span = 8, 20, 37 * kib // unaligned ranges sharing blocks
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for r := range rounds {
				n := 1 + rng.IntN(span)
				if r == rounds-1 {
					n = span
				}
				if _, err := tg.Write(id, 1, int64(w*span), pattern(w, n), MaxChunkSize, r%5 == 0); err != nil {
					t.Error(err)
					return
				}
				if _, err := tg.Read(id, int64(w*span), n); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	var m model
	for w := range writers {
		m.write(w*span, pattern(w, span))
	}
	checkChunk(t, tg, id, m)
}

func TestUsageSurvivesReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open([]string{dir}, Options{MaxOpenChunks: 2})
	if err != nil {
		t.Fatal(err)
	}
	tg := s.Targets()[0]
	var want uint64
	for i := range 10 {
		n := 1000 * (i + 1)
		if _, err := tg.Write(ID{uint64(i % 3), uint64(i)}, 1, 0, pattern(i, n), 64*kib, i%2 == 0); err != nil {
			t.Fatal(err)
		}
		want += uint64(n)
	}
	for i := range 3 {
		if err := tg.SyncFile(uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if len(tg.unsynced) != 0 || len(tg.newEntries) != 0 {
		t.Fatalf("after sync: unsynced %v, unsynced directories %v", tg.unsynced, tg.newEntries)
	}
	if n := s.files.lru.Len(); n > 2 {
		t.Fatalf("%d chunks open, want at most 2", n)
	}
	if _, err := Open([]string{dir}, Options{}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second open of a target in use: %v", err)
	}
	s.Close()
	s, err = Open([]string{dir}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	u, err := s.Targets()[0].Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.Chunks != 10 || u.UsedBytes != want || u.TotalBytes == 0 || u.FreeBytes == 0 {
		t.Fatalf("usage after reopen: %+v, want 10 chunks, %d bytes", u, want)
	}
	checkChunk(t, s.Targets()[0], ID{2, 5}, pattern(5, 6000))
}

func TestFullTargetMessage(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	err := tg.ioError("write chunk 1 of inode 2", &os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC})
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "target "+tg.Dir()+" is full (") ||
		!strings.Contains(err.Error(), "free space or add a target") {
		t.Fatalf("got %v", err)
	}
}

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{{0, "0 B"}, {1023, "1023 B"}, {12 << 20, "12.0 MiB"}, {3 << 30, "3.0 GiB"}} {
		if got := formatBytes(tc.n); got != tc.want {
			t.Errorf("formatBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func BenchmarkWrite1MiB(b *testing.B) {
	s, err := Open([]string{b.TempDir()}, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tg := s.Targets()[0]
	data := pattern(1, 1<<20)
	b.SetBytes(int64(len(data)))
	for i := 0; b.Loop(); i++ {
		if _, err := tg.Write(ID{1, uint64(i % 64)}, 1, 0, data, 1<<20, false); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRead1MiB(b *testing.B) {
	s, err := Open([]string{b.TempDir()}, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tg := s.Targets()[0]
	data := pattern(1, 1<<20)
	for i := range 16 {
		if _, err := tg.Write(ID{1, uint64(i)}, 1, 0, data, 1<<20, false); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(data)))
	for i := 0; b.Loop(); i++ {
		if _, err := tg.Read(ID{1, uint64(i % 16)}, 0, 1<<20); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteNew1MiB writes chunks that do not exist yet (the common
// case: files written once), deleting them in batches.
func BenchmarkWriteNew1MiB(b *testing.B) {
	s, err := Open([]string{b.TempDir()}, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	tg := s.Targets()[0]
	data := pattern(1, 1<<20)
	b.SetBytes(int64(len(data)))
	for i := 0; b.Loop(); i++ {
		ino := uint64(i/64 + 1)
		if _, err := tg.Write(ID{ino, uint64(i % 64)}, 1, 0, data, 1<<20, false); err != nil {
			b.Fatal(err)
		}
		if i%64 == 63 {
			if err := tg.DeleteFile(ino); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestSyncIdle checks that chunks written without a sync are synced once
// they are idle long enough, and only then.
func TestSyncIdle(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	id := ID{Ino: 9, Index: 0}
	if _, err := tg.Write(id, 1, 0, pattern(1, 5000), MaxChunkSize, false); err != nil {
		t.Fatal(err)
	}
	if err := tg.SyncIdle(time.Hour); err != nil || !tg.unsyncedHas(id) {
		t.Fatalf("a chunk written just now was synced as idle: %v", err)
	}
	if err := tg.SyncIdle(0); err != nil || tg.unsyncedHas(id) {
		t.Fatalf("an idle chunk was not synced: %v", err)
	}
	b, err := os.ReadFile(tg.inlinePath(id))
	if err != nil {
		t.Fatal(err)
	}
	if got := decodeSynced(id, b[syncedOff:]); got != 1 {
		t.Errorf("synced record %d after the sync, want 1", got)
	}
}
