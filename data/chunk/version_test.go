package chunk

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"
)

func TestVersionsCountMutations(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	id := ID{Ino: 12, Index: 1}
	const cs = 256 * kib
	steps := []struct {
		name        string
		op          func() error
		wantVersion uint64
		wantLen     int64
		wantExists  bool
	}{
		{"create", func() error { _, err := tg.Write(id, 3, 0, pattern(1, 100*kib), cs, false); return err }, 1, 100 * kib, true},
		{"overwrite", func() error { _, err := tg.Write(id, 3, 10, pattern(2, 10), cs, true); return err }, 2, 100 * kib, true},
		{"empty write", func() error { _, err := tg.Write(id, 3, 0, nil, cs, true); return err }, 2, 100 * kib, true},
		{"truncate past the chunk", func() error { return tg.TruncateFile(12, 3, 2*cs, cs) }, 2, 100 * kib, true},
		{"truncate in another chain", func() error { return tg.TruncateFile(12, 4, cs+10, cs) }, 2, 100 * kib, true},
		{"shorten", func() error { return tg.TruncateFile(12, 3, cs+10, cs) }, 3, 10, true},
		{"delete in another chain", func() error { lf := tg.LockFile(12, 4); defer lf.Unlock(); return lf.Delete() }, 3, 10, true},
		{"delete", func() error { lf := tg.LockFile(12, 3); defer lf.Unlock(); return lf.Delete() }, 0, 0, false},
	}
	for _, st := range steps {
		if err := st.op(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		info, err := tg.Stat(id)
		if err != nil || info.Exists != st.wantExists || info.Version != st.wantVersion || info.Length != st.wantLen {
			t.Fatalf("%s: %+v, %v; want version %d, %d bytes, exists %v", st.name, info, err, st.wantVersion, st.wantLen, st.wantExists)
		}
		if st.wantExists && info.Chain != 3 {
			t.Fatalf("%s: chain %d, want 3", st.name, info.Chain)
		}
	}
	if _, err := os.Stat(tg.inoDir(12)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("directory of a file without chunks left behind: %v", err)
	}
}

func TestReplace(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	id := ID{Ino: 3, Index: 2}
	if _, err := tg.Write(id, 1, 0, pattern(1, 300*kib), MaxChunkSize, false); err != nil {
		t.Fatal(err)
	}
	for _, full := range []Full{
		{Version: 7, Exists: true, Data: pattern(2, 100*kib+1)},
		{Version: 9, Exists: true, Data: nil},
		{Version: 10, Exists: true, Data: pattern(3, 2*BlockSize)},
		{Exists: false},
	} {
		l := tg.Lock(id, 1)
		err := l.Replace(full)
		l.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		got, err := tg.ReadFull(id)
		if err != nil || got.Exists != full.Exists || got.Version != full.Version || !bytes.Equal(got.Data, full.Data) {
			t.Fatalf("after replace with version %d (%d bytes): %v version %d, %d bytes, %v",
				full.Version, len(full.Data), got.Exists, got.Version, len(got.Data), err)
		}
		if full.Exists {
			checkChunk(t, tg, id, full.Data)
		}
		u, _ := tg.Usage()
		if wantChunks := map[bool]uint64{true: 1, false: 0}[full.Exists]; u.Chunks != wantChunks || u.UsedBytes != uint64(len(full.Data)) {
			t.Fatalf("usage after replace: %+v", u)
		}
	}
}

func TestListByChainInListOrder(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	var want []ID
	for _, ino := range []uint64{0x305, 5, 0x105, 7, 0x1ff} {
		for idx := range uint64(3) {
			id := ID{Ino: ino, Index: idx * 5}
			chain := uint64(1 + (ino+idx)%2)
			if _, err := tg.Write(id, chain, 0, []byte("x"), 64*kib, false); err != nil {
				t.Fatal(err)
			}
			if chain == 1 {
				want = append(want, id)
			}
		}
	}
	sortIDs(want)
	all, more, err := tg.List(1, nil, 1000)
	if err != nil || more {
		t.Fatal(err, more)
	}
	var paged []Info
	var after *ID
	for {
		page, more, err := tg.List(1, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, page...)
		if !more {
			break
		}
		after = &page[len(page)-1].ID
	}
	for _, got := range [][]Info{all, paged} {
		if len(got) != len(want) {
			t.Fatalf("listed %d chunks, want %d", len(got), len(want))
		}
		for i, in := range got {
			if in.ID != want[i] || in.Version != 1 || in.Length != 1 || in.Digest == 0 {
				t.Fatalf("entry %d: %+v, want %v", i, in, want[i])
			}
		}
	}
}

func sortIDs(ids []ID) {
	for i := range ids {
		for j := i + 1; j < len(ids); j++ {
			if CompareListOrder(ids[j], ids[i]) < 0 {
				ids[i], ids[j] = ids[j], ids[i]
			}
		}
	}
}

func TestDamagedChunkFilesDetected(t *testing.T) {
	tests := []struct {
		name   string
		damage func(path string) error
		check  func(*CorruptionError) bool
	}{
		{"data cut on a block boundary", func(p string) error { return os.Truncate(p, inlineDataOff+BlockSize) },
			func(e *CorruptionError) bool { return e.Truncated && e.Length == BlockSize }},
		{"data cut inside a block", func(p string) error { return os.Truncate(p, inlineDataOff+1000) },
			func(e *CorruptionError) bool { return e.Truncated }},
		{"header", func(p string) error {
			b, _ := os.ReadFile(p)
			b[20] ^= 4
			return os.WriteFile(p, b, 0o644)
		}, func(e *CorruptionError) bool { return e.Header }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, tg := openTestStore(t, Options{})
			id := ID{Ino: 8, Index: 0}
			if _, err := tg.Write(id, 1, 0, pattern(1, 3*BlockSize), MaxChunkSize, false); err != nil {
				t.Fatal(err)
			}
			if err := tc.damage(tg.inlinePath(id)); err != nil {
				t.Fatal(err)
			}
			_, err := tg.Verify(id)
			var ce *CorruptionError
			if !errors.As(err, &ce) || !tc.check(ce) || !errors.Is(err, syscall.EIO) {
				t.Fatalf("verify: %v", err)
			}
			if _, err := tg.Read(id, 2*BlockSize, 10); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("read of a damaged chunk: %v, want corruption", err)
			}
		})
	}
}

func TestBytesPastTheLengthAreIgnored(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	id := ID{Ino: 8, Index: 1}
	data := pattern(1, BlockSize+10)
	if _, err := tg.Write(id, 1, 0, data, MaxChunkSize, false); err != nil {
		t.Fatal(err)
	}
	// An extending write that reached the file but was never committed.
	f, _ := os.OpenFile(tg.inlinePath(id), os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte("never acknowledged"))
	f.Close()
	if n, err := tg.Verify(id); err != nil || n != int64(len(data)) {
		t.Fatalf("verify: %d, %v", n, err)
	}
	checkChunk(t, tg, id, data)
	if _, err := tg.Write(id, 1, int64(len(data))+100, []byte("z"), MaxChunkSize, false); err != nil {
		t.Fatal(err)
	}
	want := append(append(append([]byte(nil), data...), make([]byte, 100)...), 'z')
	checkChunk(t, tg, id, want)
}

// TestUnwrittenChunkFiles checks the files a crash right after a chunk's
// create can leave: one shorter than a header is removed when the target
// opens; one whose head was never written (its size or bytes reached the
// disk, its head did not) is an empty chunk, not corruption.
func TestUnwrittenChunkFiles(t *testing.T) {
	dir := t.TempDir()
	s, err := Open([]string{dir}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	tg := s.Targets()[0]
	short, zeroHead := ID{Ino: 0x21, Index: 0}, ID{Ino: 0x21, Index: 1}
	for _, id := range []ID{short, zeroHead} {
		if _, err := tg.Write(id, 1, 0, pattern(1, 1000), MaxChunkSize, true); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	if err := os.Truncate(tg.inlinePath(short), 10); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(tg.inlinePath(zeroHead), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(make([]byte, 4096), 0)
	f.Close()
	s, err = Open([]string{dir}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tg = s.Targets()[0]
	if _, err := os.Stat(tg.inlinePath(short)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("file shorter than a header still there after open: %v", err)
	}
	if info, err := tg.Stat(zeroHead); err != nil || !info.Exists || info.Length != 0 || info.Version != 0 {
		t.Errorf("chunk whose head was never written: %+v, %v; want an empty chunk", info, err)
	}
	if n, err := tg.Verify(zeroHead); err != nil || n != 0 {
		t.Errorf("verify of a chunk whose head was never written: %d, %v", n, err)
	}
	if got, err := tg.Read(zeroHead, 0, 100); err != nil || len(got) != 0 {
		t.Errorf("read: %d bytes, %v", len(got), err)
	}
	if u, _ := tg.Usage(); u.Chunks != 1 {
		t.Errorf("usage: %+v, want one chunk left", u)
	}
}
