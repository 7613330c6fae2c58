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
	"testing"

	"github.com/weft-fs/weft/internal/disk"
)

// crashSeedEnv replays one seed of TestCrashAtAnyPoint.
const crashSeedEnv = "WEFT_CRASH_SEED"

// chunkStates is what a chunk may hold after a crash: its content as of
// its last sync (nil: absent or empty) and every content acknowledged,
// or in flight, since.
type chunkStates [][]byte

// crashModel follows the chunks of a run.
type crashModel struct {
	states map[ID]chunkStates
	cur    map[ID][]byte
}

func (m *crashModel) latest(id ID) []byte { return m.cur[id] }

// acked records a mutation of id to content c; durable says it was synced
// (the chunk holds c, or later content, whatever happens).
func (m *crashModel) acked(id ID, c []byte, durable bool) {
	c = append([]byte(nil), c...)
	m.cur[id] = c
	if durable {
		m.states[id] = chunkStates{c}
		return
	}
	m.states[id] = append(m.states[id], c)
}

func (m *crashModel) synced(id ID) { m.states[id] = chunkStates{m.cur[id]} }

// check reads every chunk of a store opened on what the crash left: no
// read may fail, the length must be one the chunk had, and each block
// must hold its content of one of the chunk's states.
func (m *crashModel) check(tg *Target) error {
	for id, states := range m.states {
		full, err := tg.ReadFull(id)
		if err != nil {
			if os.Getenv("WEFT_CRASH_TRACE") != "" {
				b, _ := disk.ReadFile(tg.fs, tg.inlinePath(id))
				f := &chunkFile{key: cacheKey{tg, id}}
				synced, stale := tg.parseHead(f, b)
				fmt.Printf("head: %+v synced %d stale %v ents %+v\n", f.hdr, synced, stale, f.ents)
			}
			return fmt.Errorf("%v: read after the crash: %w", id, err)
		}
		got := full.Data
		okLen := false
		for _, s := range states {
			okLen = okLen || len(s) == len(got)
		}
		if !okLen {
			if os.Getenv("WEFT_CRASH_TRACE") != "" {
				ents, err := tg.fs.ReadDir(tg.inoDir(id.Ino))
				for _, e := range ents {
					info, _ := e.Info()
					fmt.Printf("file %s size %d\n", e.Name(), info.Size())
				}
				b, _ := disk.ReadFile(tg.fs, tg.inlinePath(id))
				f := &chunkFile{key: cacheKey{tg, id}}
				synced, stale := tg.parseHead(f, b)
				fmt.Printf("dir err %v; head: %+v synced %d stale %v ents %+v\n", err, f.hdr, synced, stale, f.ents)
			}
			return fmt.Errorf("%v: %d bytes after the crash, a length it never had (%d states)", id, len(got), len(states))
		}
		for b := range nblocks(int64(len(got))) {
			lo, hi := b*BlockSize, min((b+1)*BlockSize, int64(len(got)))
			found := false
			for _, s := range states {
				want := make([]byte, hi-lo)
				if lo < int64(len(s)) {
					copy(want, s[lo:min(hi, int64(len(s)))])
				}
				if bytes.Equal(got[lo:hi], want) {
					found = true
					break
				}
			}
			if !found {
				return fmt.Errorf("%v: block %d after the crash holds none of its %d contents", id, b, len(states))
			}
		}
		// What was recovered is durable now.
		m.cur[id] = got
		m.states[id] = chunkStates{got}
	}
	return nil
}

// TestCrashAtAnyPoint runs random mutations of a few chunks (writes,
// overwrites, appends, writes of pieces, with and without sync, syncs,
// truncations, deletes and replacements) on a file system in memory,
// crashes it after a random number of changes (a power loss keeps any
// part of what was not synced), opens the store again on what is left
// and checks that every chunk reads without error, with every block
// holding its old or its new content, and everything synced intact;
// then goes on from there and crashes again.
func TestCrashAtAnyPoint(t *testing.T) {
	seeds := 80
	if testing.Short() {
		seeds = 20
	}
	if s := os.Getenv("WEFT_CRASH_SEEDS"); s != "" { // make soak runs more
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("%s: %v", "WEFT_CRASH_SEEDS", err)
		}
		seeds = n
	}
	first := uint64(1)
	if s := os.Getenv(crashSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		first, seeds = v, 1
	}
	for seed := first; seed < first+uint64(seeds); seed++ {
		if err := crashRun(seed); err != nil {
			t.Fatalf("seed %d (replay with %s=%d): %v", seed, crashSeedEnv, seed, err)
		}
	}
}

func crashRun(seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0xc4a5))
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	const chunkSize = 256 << 10
	ids := []ID{{Ino: 5, Index: 0}, {Ino: 5, Index: 1}, {Ino: 0x105, Index: 0}}
	m := &crashModel{states: map[ID]chunkStates{}, cur: map[ID][]byte{}}
	for _, id := range ids {
		m.states[id] = chunkStates{nil}
	}
	fsys := disk.NewMem(0)
	for round := range 4 {
		s, err := Open([]string{"/t"}, Options{FS: fsys, Logger: logger, MaxOpenChunks: 1 + rng.IntN(3)})
		if err != nil {
			return fmt.Errorf("round %d: open: %w", round, err)
		}
		tg := s.Targets()[0]
		if os.Getenv("NOSPARE") != "" {
			tg.spare.off = true
		}
		if round > 0 {
			if err := m.check(tg); err != nil {
				return fmt.Errorf("round %d: %w", round, err)
			}
		}
		fsys.CrashAfter(rng.IntN(400), rand.New(rand.NewPCG(seed, uint64(round))))
		for op := 0; ; op++ {
			err := crashStep(rng, tg, m, ids, chunkSize)
			if errors.Is(err, disk.ErrCrashed) {
				break
			}
			if err != nil {
				return fmt.Errorf("round %d, op %d: %w", round, op, err)
			}
			for _, id := range ids {
				full, err := tg.ReadFull(id)
				if errors.Is(err, disk.ErrCrashed) {
					break
				}
				if err != nil || !bytes.Equal(full.Data, m.latest(id)) {
					for i := range full.Data {
						if i < len(m.latest(id)) && full.Data[i] != m.latest(id)[i] {
							f := tg.store.files.get(cacheKey{tg, id})
							fmt.Printf("first difference at %d (block %d); ents %+v\n", i, i/BlockSize, f.ents)
							tg.store.files.release(f)
							break
						}
					}
					return fmt.Errorf("round %d, op %d: %v reads %d bytes, %v; want the %d bytes written", round, op, id, len(full.Data), err, len(m.latest(id)))
				}
			}
			if op > 2000 {
				return fmt.Errorf("round %d: no crash after %d operations", round, op)
			}
		}
		fsys = fsys.Image()
	}
	return nil
}

// crashStep runs one random operation and records it in the model; an
// operation cut by the crash is recorded as possibly done.
func crashStep(rng *rand.Rand, tg *Target, m *crashModel, ids []ID, chunkSize int64) error {
	id := ids[rng.IntN(len(ids))]
	cur := m.latest(id)
	sync := rng.IntN(4) == 0
	// Offsets and lengths near block and page boundaries.
	pos := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return int64(rng.IntN(int(chunkSize)))
		case 1:
			return min(int64(len(cur)), chunkSize-1)
		case 2:
			return int64(rng.IntN(int(chunkSize/BlockSize))) * BlockSize
		}
		return max(int64(rng.IntN(int(chunkSize/BlockSize)))*BlockSize+int64(rng.IntN(9))-4, 0)
	}
	length := func(off int64) int64 {
		n := []int64{1, 100, 4096, BlockSize, BlockSize + 1, 3 * BlockSize, int64(rng.IntN(int(chunkSize)))}[rng.IntN(7)]
		return max(min(n, chunkSize-off), 1)
	}
	apply := func(c []byte, off int64, data []byte) []byte {
		c = append([]byte(nil), c...)
		if end := off + int64(len(data)); end > int64(len(c)) {
			c = append(c, make([]byte, end-int64(len(c)))...)
		}
		copy(c[off:], data)
		return c
	}
	done := func(next []byte, err error, durable bool) error {
		if err != nil && !errors.Is(err, disk.ErrCrashed) {
			return err
		}
		m.acked(id, next, durable && err == nil)
		return err
	}
	r := rng.IntN(20)
	if os.Getenv("WEFT_CRASH_TRACE") != "" {
		fmt.Printf("op r=%d id=%v curlen=%d sync=%v floor=%d\n", r, id, len(cur), sync, tg.syncedFloor(id))
	}
	switch {
	case r < 10: // a write
		off := pos()
		data := make([]byte, length(off))
		for i := range data {
			data[i] = byte(rng.IntN(255) + 1)
		}
		_, err := tg.Write(id, 1, off, data, chunkSize, sync)
		return done(apply(cur, off, data), err, sync)
	case r < 13: // a write of pieces
		l := tg.Lock(id, 1)
		info, err := l.Info()
		if err != nil {
			l.Unlock()
			return err
		}
		next := cur
		var pieces []Piece
		for range 1 + rng.IntN(4) {
			off := pos()
			data := bytes.Repeat([]byte{byte(rng.IntN(255) + 1)}, int(min(length(off), 3000)))
			pieces = append(pieces, Piece{Off: off, Data: data})
			next = apply(next, off, data)
		}
		err = l.WritePieces(pieces, chunkSize, info.Version+1, sync)
		l.Unlock()
		return done(next, err, sync)
	case r < 15: // a sync
		err := tg.SyncFile(id.Ino)
		if err == nil {
			for _, other := range ids {
				// A sync makes written chunks durable, not deletes.
				if other.Ino == id.Ino && m.latest(other) != nil {
					m.synced(other)
				}
			}
		}
		return err
	case r < 17: // a truncation of the file (durable on return)
		size := int64(rng.IntN(int(2 * chunkSize)))
		err := tg.TruncateFile(id.Ino, 1, size, chunkSize)
		if os.Getenv("WEFT_CRASH_TRACE") != "" {
			fmt.Printf("truncate ino %d to %d: %v\n", id.Ino, size, err)
		}
		for _, other := range ids {
			if other.Ino != id.Ino {
				continue
			}
			c := m.latest(other)
			start := int64(other.Index) * chunkSize
			switch {
			case start >= size && c != nil:
				c = nil
			case start < size && start+int64(len(c)) > size:
				c = c[:size-start]
			default:
				continue // untouched
			}
			if err == nil {
				m.acked(other, c, true)
			} else if errors.Is(err, disk.ErrCrashed) {
				m.acked(other, c, false)
			}
		}
		return err
	case r < 18: // a delete (not synced: the chunk may come back)
		lf := tg.LockFile(id.Ino, 1)
		err := lf.Delete()
		lf.Unlock()
		for _, other := range ids {
			if other.Ino == id.Ino && (err == nil || errors.Is(err, disk.ErrCrashed)) {
				m.acked(other, nil, false)
			}
		}
		return err
	default: // a replacement with a whole copy (durable on return)
		l := tg.Lock(id, 1)
		info, err := l.Info()
		if err != nil {
			l.Unlock()
			return err
		}
		data := bytes.Repeat([]byte{byte(rng.IntN(255) + 1)}, rng.IntN(int(chunkSize)))
		err = l.Replace(Full{Version: info.Version + 1, Exists: true, Data: data})
		l.Unlock()
		return done(data, err, true)
	}
}
