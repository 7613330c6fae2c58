package chunk

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// modelSeedEnv replays a seed of TestRandomizedAgainstModel.
const modelSeedEnv = "WEFT_CHUNK_SEED"

// modelChunk is what a chunk should hold.
type modelChunk struct {
	data    []byte
	version uint64
}

// modelWorker mutates its own chunks (one chain, on one target) at random
// and checks every answer of the store against its model. Workers of one
// target share inode numbers but not chunks: worker slot s of n uses the
// indexes i with i%n == s, as the chains of a striped file do.
type modelWorker struct {
	t         *Target
	chain     uint64
	inos      []uint64
	slot, n   int
	chunkSize int64
	nChunks   int // chunks per file this worker may use
	wholeFile bool
	rng       *rand.Rand
	log       []string // last operations, for failure reports
	chunks    map[ID]*modelChunk
}

func (w *modelWorker) record(format string, args ...any) {
	w.log = append(w.log, fmt.Sprintf(format, args...))
	if len(w.log) > 12 {
		w.log = w.log[1:]
	}
}

// index returns the index of the k-th chunk of the worker in a file.
func (w *modelWorker) index(k int) uint64 { return uint64(k*w.n + w.slot) }

func (w *modelWorker) randomID() ID {
	return ID{Ino: w.inos[w.rng.IntN(len(w.inos))], Index: w.index(w.rng.IntN(w.nChunks))}
}

// pos returns an offset in [0, limit], gathered around block boundaries and
// the chunk's current length, where partial blocks are merged and cut.
func (w *modelWorker) pos(length, limit int64) int64 {
	var p int64
	switch w.rng.IntN(6) {
	case 0:
		p = 0
	case 1, 2:
		p = int64(w.rng.IntN(int(limit/BlockSize)+1))*BlockSize + int64(w.rng.IntN(7)) - 3
	case 3:
		p = length + int64(w.rng.IntN(9)) - 4
	case 4:
		p = length + int64(w.rng.IntN(2*BlockSize)) - BlockSize
	default:
		p = w.rng.Int64N(limit + 1)
	}
	return min(max(p, 0), limit)
}

func (w *modelWorker) length(room int64) int64 {
	var n int64
	switch w.rng.IntN(4) {
	case 0:
		n = 1 + w.rng.Int64N(100)
	case 1:
		n = BlockSize + int64(w.rng.IntN(7)) - 3
	default:
		n = 1 + w.rng.Int64N(room)
	}
	return min(max(n, 1), room)
}

func (w *modelWorker) bytes(n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(w.rng.Uint32())
	}
	return b
}

func (w *modelWorker) fail(format string, args ...any) error {
	return fmt.Errorf("%s (chain %d, target %s); last operations:\n  %s",
		fmt.Sprintf(format, args...), w.chain, w.t.dir, strings.Join(w.log, "\n  "))
}

func (w *modelWorker) step() error {
	id := w.randomID()
	m := w.chunks[id]
	var length int64
	if m != nil {
		length = int64(len(m.data))
	}
	switch r := w.rng.IntN(100); {
	case r < 40:
		off := w.pos(length, w.chunkSize-1)
		n := w.length(w.chunkSize - off)
		data, sync := w.bytes(n), w.rng.IntN(6) == 0
		w.record("write %v at %d, %d bytes (length %d), sync %v", id, off, n, length, sync)
		v, err := w.t.Write(id, w.chain, off, data, w.chunkSize, sync)
		if err != nil {
			return w.fail("write %v: %v", id, err)
		}
		if m == nil {
			m = &modelChunk{}
			w.chunks[id] = m
		}
		if end := int(off) + len(data); end > len(m.data) {
			m.data = append(m.data, make([]byte, end-len(m.data))...)
		}
		copy(m.data[off:], data)
		m.version++
		if v != m.version {
			return w.fail("write %v returned version %d, want %d", id, v, m.version)
		}
	case r < 60:
		size := int64(id.Index)*w.chunkSize + w.pos(length, w.chunkSize)
		if w.rng.IntN(4) == 0 {
			size = w.rng.Int64N(int64(w.index(w.nChunks))*w.chunkSize + 1)
		}
		w.record("truncate inode %d to %d", id.Ino, size)
		if err := w.t.TruncateFile(id.Ino, w.chain, size, w.chunkSize); err != nil {
			return w.fail("truncate inode %d to %d: %v", id.Ino, size, err)
		}
		for cid, c := range w.chunks {
			start := int64(cid.Index) * w.chunkSize
			switch {
			case cid.Ino != id.Ino:
			case start >= size:
				delete(w.chunks, cid)
			case start+int64(len(c.data)) > size:
				c.data = c.data[:size-start]
				c.version++
			}
		}
	case r < 68:
		// A chunk holding data has a version of at least 1.
		full := Full{Exists: w.rng.IntN(5) != 0, Version: 1 + w.rng.Uint64N(1000)}
		if full.Exists {
			full.Data = w.bytes(w.rng.Int64N(w.chunkSize + 1))
		}
		w.record("replace %v with version %d, %d bytes, exists %v", id, full.Version, len(full.Data), full.Exists)
		l := w.t.Lock(id, w.chain)
		err := l.Replace(full)
		l.Unlock()
		if err != nil {
			return w.fail("replace %v: %v", id, err)
		}
		if full.Exists {
			w.chunks[id] = &modelChunk{data: full.Data, version: full.Version}
		} else {
			delete(w.chunks, id)
		}
	case r < 72:
		w.record("delete inode %d (whole file %v)", id.Ino, w.wholeFile)
		var err error
		if w.wholeFile {
			err = w.t.DeleteFile(id.Ino)
		} else {
			lf := w.t.LockFile(id.Ino, w.chain)
			err = lf.Delete()
			lf.Unlock()
		}
		if err != nil {
			return w.fail("delete inode %d: %v", id.Ino, err)
		}
		for cid := range w.chunks {
			if cid.Ino == id.Ino {
				delete(w.chunks, cid)
			}
		}
	case r < 78:
		w.record("sync inode %d", id.Ino)
		if err := w.t.SyncFile(id.Ino); err != nil {
			return w.fail("sync inode %d: %v", id.Ino, err)
		}
	case r < 81:
		w.record("verify %v", id)
		if n, err := w.t.Verify(id); err != nil || n != length {
			return w.fail("verify %v: %d bytes, %v; want %d", id, n, err, length)
		}
	case r < 86:
		w.record("read full %v", id)
		full, err := w.t.ReadFull(id)
		if err != nil || full.Exists != (m != nil) || (m != nil && (full.Version != m.version || !bytes.Equal(full.Data, m.data))) {
			return w.fail("read full %v: exists %v, version %d, %d bytes, %v; want %s", id, full.Exists, full.Version,
				len(full.Data), err, w.describe(m))
		}
	default:
		off := w.pos(length, w.chunkSize-1)
		n := w.length(w.chunkSize - off)
		w.record("read %v at %d, %d bytes", id, off, n)
		got, err := w.t.Read(id, off, int(n))
		var want []byte
		if off < length {
			want = m.data[off:min(off+n, length)]
		}
		if err != nil || !bytes.Equal(got, want) {
			return w.fail("read %v at %d, %d bytes: %s, %v; want %d bytes", id, off, n, w.differ(got, want), err, len(want))
		}
		info, err := w.t.Stat(id)
		if err != nil || info.Exists != (m != nil) || (m != nil && (info.Version != m.version || info.Length != length)) {
			return w.fail("stat %v: %+v, %v; want %s", id, info, err, w.describe(m))
		}
	}
	return nil
}

func (w *modelWorker) describe(m *modelChunk) string {
	if m == nil {
		return "no chunk"
	}
	return fmt.Sprintf("version %d, %d bytes", m.version, len(m.data))
}

func (w *modelWorker) differ(got, want []byte) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("%d bytes, first difference at %d", len(got), i)
		}
	}
	return fmt.Sprintf("%d bytes", len(got))
}

// checkAll compares every chunk of the worker's files on disk (bytes,
// checksums, header) with the model, and finds no chunk the model lacks.
func (w *modelWorker) checkAll(t *testing.T, tg *Target) {
	t.Helper()
	for _, ino := range w.inos {
		ids, err := tg.fileChunks(ino)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			if int(id.Index)%w.n == w.slot && w.chunks[id] == nil {
				t.Errorf("%v exists on target %s, not in the model", id, tg.dir)
			}
		}
	}
	for id, m := range w.chunks {
		checkChunk(t, tg, id, m.data)
		if info, err := tg.Stat(id); err != nil || !info.Exists || info.Version != m.version || info.Chain != w.chain {
			t.Errorf("stat %v: %+v, %v; want version %d of chain %d", id, info, err, m.version, w.chain)
		}
		if n, err := tg.Verify(id); err != nil || n != int64(len(m.data)) {
			t.Errorf("verify %v: %d bytes, %v", id, n, err)
		}
	}
}

// modelSeed returns the seed of a run: modelSeedEnv if set, else the clock.
func modelSeed(t *testing.T) uint64 {
	t.Helper()
	if s := os.Getenv(modelSeedEnv); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", modelSeedEnv, s, err)
		}
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// TestRandomizedAgainstModel runs seeded random writes, truncates (cutting
// and then extending chunks again), replaces, deletes, syncs, verifies and
// reads on chunks of a few files, from several goroutines at once, with a
// cache of open files small enough that chunks are evicted and reopened
// while in use, and checks every answer and finally every chunk on disk
// (also after reopening the store) against a model. Other goroutines sync,
// verify, read and list the same files meanwhile: none of that may fail or
// disturb the chunks. Replay a failure with WEFT_CHUNK_SEED.
func TestRandomizedAgainstModel(t *testing.T) {
	tests := []struct {
		name            string
		targets         int
		workersPerTgt   int
		inos, nChunks   int
		chunkSize       int64
		maxOpen, ops    int
		wholeFileDelete bool
		background      int
	}{
		{name: "one writer, roomy cache", targets: 1, workersPerTgt: 1, inos: 2, nChunks: 4,
			chunkSize: 4 * BlockSize, maxOpen: 512, ops: 800, wholeFileDelete: true},
		{name: "one writer, cache of one chunk", targets: 1, workersPerTgt: 1, inos: 3, nChunks: 3,
			chunkSize: 3*BlockSize + 1000, maxOpen: 1, ops: 800, wholeFileDelete: true, background: 2},
		{name: "chunks of several write segments", targets: 1, workersPerTgt: 1, inos: 2, nChunks: 3,
			chunkSize: 3*ioSegment + 5*BlockSize/2 + 777, maxOpen: 512, ops: 300, wholeFileDelete: true},
		{name: "chains sharing files on two targets, tiny cache", targets: 2, workersPerTgt: 3, inos: 2, nChunks: 3,
			chunkSize: 4 * BlockSize, maxOpen: 3, ops: 400, background: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			seed := modelSeed(t)
			t.Logf("seed %d (replay with %s=%d)", seed, modelSeedEnv, seed)
			dirs := make([]string, tc.targets)
			for i := range dirs {
				dirs[i] = t.TempDir()
			}
			opts := Options{MaxOpenChunks: tc.maxOpen, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			s, err := Open(dirs, opts)
			if err != nil {
				t.Fatal(err)
			}
			var workers []*modelWorker
			for ti, tg := range s.Targets() {
				for slot := range tc.workersPerTgt {
					w := &modelWorker{
						t: tg, chain: uint64(100 + ti*tc.workersPerTgt + slot), slot: slot, n: tc.workersPerTgt,
						chunkSize: tc.chunkSize, nChunks: tc.nChunks, wholeFile: tc.wholeFileDelete,
						rng:    rand.New(rand.NewPCG(seed, uint64(ti*tc.workersPerTgt+slot))),
						chunks: make(map[ID]*modelChunk),
					}
					for k := range tc.inos {
						w.inos = append(w.inos, uint64(0x100*k+7)) // one hash directory
					}
					workers = append(workers, w)
				}
			}
			var stop atomic.Bool
			var bg sync.WaitGroup
			bgErrs := make([]error, tc.background)
			for b := range tc.background {
				bg.Go(func() { bgErrs[b] = background(workers, seed+uint64(b), &stop) })
			}
			errs := make([]error, len(workers))
			var wg sync.WaitGroup
			for i, w := range workers {
				wg.Go(func() {
					for op := range tc.ops {
						if err := w.step(); err != nil {
							errs[i] = fmt.Errorf("seed %d (%s=%d), worker %d, op %d: %w", seed, modelSeedEnv, seed, i, op, err)
							return
						}
					}
				})
			}
			wg.Wait()
			stop.Store(true)
			bg.Wait()
			if err := errors.Join(append(errs, bgErrs...)...); err != nil {
				s.Close()
				t.Fatal(err)
			}
			check := func(s *Store, when string) {
				t.Helper()
				for ti, tg := range s.Targets() {
					var chunks, used uint64
					for _, w := range workers[ti*tc.workersPerTgt : (ti+1)*tc.workersPerTgt] {
						w.checkAll(t, tg)
						for _, m := range w.chunks {
							chunks++
							used += uint64(len(m.data))
						}
					}
					if u, err := tg.Usage(); err != nil || u.Chunks != chunks || u.UsedBytes != used {
						t.Errorf("%s: usage of target %d: %d chunks, %d bytes, %v; want %d chunks, %d bytes",
							when, ti, u.Chunks, u.UsedBytes, err, chunks, used)
					}
				}
				if t.Failed() {
					t.Fatalf("%s: chunks differ from the model (seed %d, replay with %s=%d)", when, seed, modelSeedEnv, seed)
				}
			}
			check(s, "after the run")
			s.Close()
			s, err = Open(dirs, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for i, w := range workers {
				w.t = s.Targets()[i/tc.workersPerTgt]
			}
			check(s, "after reopening")
		})
	}
}

// background syncs, verifies, reads and lists the workers' files until
// stop, as the data server's SyncFile, scrub, reads and resync listings do
// alongside writes. Nothing of it may fail: every chunk is consistent
// whenever it is not held for a mutation.
func background(workers []*modelWorker, seed uint64, stop *atomic.Bool) error {
	rng := rand.New(rand.NewPCG(seed, 0xbac))
	for !stop.Load() {
		w := workers[rng.IntN(len(workers))]
		tg := w.t
		ino := w.inos[rng.IntN(len(w.inos))]
		id := ID{Ino: ino, Index: uint64(rng.IntN(w.nChunks * w.n))}
		var err error
		switch rng.IntN(5) {
		case 0:
			err = tg.SyncFile(ino)
		case 1:
			_, err = tg.Verify(id)
		case 2:
			_, err = tg.Read(id, rng.Int64N(w.chunkSize), 1+rng.IntN(2*BlockSize))
		case 3:
			_, err = tg.ReadFull(id)
		default:
			_, _, err = tg.List(w.chain, nil, 100)
		}
		if err != nil {
			return fmt.Errorf("background operation on %v of target %s: %w", id, tg.dir, err)
		}
	}
	return nil
}

// TestEvictedFilesStayOpenWhileInUse reads a few chunks from many
// goroutines through a cache of one open chunk, while others verify them
// (which drops and reopens the cached files) and sync them: every read
// finds its files open and the right bytes, so an evicted or dropped file
// is closed only by its last user.
func TestEvictedFilesStayOpenWhileInUse(t *testing.T) {
	_, tg := openTestStore(t, Options{MaxOpenChunks: 1})
	const chunks, rounds = 3, 300
	want := make([][]byte, chunks)
	for i := range chunks {
		want[i] = pattern(i, 2*BlockSize+i)
		if _, err := tg.Write(ID{Ino: 9, Index: uint64(i)}, 1, 0, want[i], MaxChunkSize, false); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for r := range rounds {
				i := (g + r) % chunks
				id := ID{Ino: 9, Index: uint64(i)}
				var err error
				switch g % 4 {
				case 0:
					_, err = tg.Verify(id)
				case 1:
					err = tg.SyncFile(9)
				default:
					var got []byte
					if got, err = tg.Read(id, 0, MaxChunkSize); err == nil && !bytes.Equal(got, want[i]) {
						err = fmt.Errorf("read %v: %d bytes differ from those written", id, len(got))
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestCreateRacesWithDeleteOfAnotherChain creates chunks of one file in
// one chain (by writes and by Replace) while the file's chunks of another
// chain are deleted, which removes the file's directory whenever it is
// empty: creating a chunk must not fail because the directory went away
// under it.
func TestCreateRacesWithDeleteOfAnotherChain(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	const ino, rounds = 0x33, 300
	var wg sync.WaitGroup
	for chain := uint64(1); chain <= 3; chain++ {
		wg.Go(func() {
			id := ID{Ino: ino, Index: chain}
			for r := range rounds {
				var err error
				switch {
				case chain == 1 && r%2 == 0:
					l := tg.Lock(id, chain)
					err = l.Replace(Full{Version: uint64(r + 1), Exists: true, Data: pattern(r, 100)})
					l.Unlock()
				case chain == 2 && r%2 == 0:
					_, err = tg.Write(id, chain, 0, pattern(r, 100), MaxChunkSize, r%4 == 0)
				default:
					lf := tg.LockFile(ino, chain)
					err = lf.Delete()
					lf.Unlock()
				}
				if err != nil {
					t.Errorf("chain %d, round %d: %v", chain, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
