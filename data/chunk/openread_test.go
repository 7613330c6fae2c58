package chunk

import (
	"bytes"
	"errors"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"testing"
)

// TestOpenForRead checks what a client reading in place is given for a
// chunk in every state its files can be found in, whether the chunk was
// cached by the store or not: the same answers either way, a plain chunk
// opened without the file cache, and anything damaged refused as a read
// of it would be.
func TestOpenForRead(t *testing.T) {
	const size = 3*BlockSize + 1000
	data := pattern(5, size)
	var want []uint32
	for off := 0; off < size; off += BlockSize {
		want = append(want, crc32.Checksum(data[off:min(off+BlockSize, size)], castagnoli))
	}
	id := ID{Ino: 9, Index: 1}
	const chunkSize = 1 << 20
	dataOff := int64(inlineDataOff)
	tests := []struct {
		name        string
		write       bool
		older       bool // written in the older form of two files, with a header
		noHeader    bool // ... without one
		damage      func(t *testing.T, tg *Target)
		wantFile    bool
		wantLen     int64
		wantVersion uint64
		wantCorrupt bool
		direct      bool // opened without the file cache
	}{
		{name: "plain", write: true, wantFile: true, wantLen: size, wantVersion: 1, direct: true},
		{name: "missing"},
		{name: "data cut short", write: true, wantCorrupt: true, damage: func(t *testing.T, tg *Target) {
			if err := os.Truncate(tg.inlinePath(id), dataOff+size-100); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "unfinished tail", write: true, wantFile: true, wantLen: size, wantVersion: 1, damage: func(t *testing.T, tg *Target) {
			f, err := os.OpenFile(tg.inlinePath(id), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.Write(make([]byte, 5000))
			f.Close()
		}},
		{name: "bad header", write: true, wantCorrupt: true, damage: func(t *testing.T, tg *Target) { flipByte(t, tg.inlinePath(id), 9) }},
	}
	for _, tt := range tests {
		for _, cached := range []bool{false, true} {
			name := tt.name + "/uncached"
			if cached {
				name = tt.name + "/cached"
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				opts := Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
				s, err := Open([]string{dir}, opts)
				if err != nil {
					t.Fatal(err)
				}
				tg := s.Targets()[0]
				if tt.write {
					if _, err := tg.Write(id, 1, 0, data, chunkSize, false); err != nil {
						t.Fatal(err)
					}
				}
				s.Close()
				if tt.damage != nil {
					tt.damage(t, tg)
				}
				s, err = Open([]string{dir}, opts)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				tg = s.Targets()[0]
				if cached {
					tg.Read(id, 0, 1) // puts the chunk in the file cache (an error is the test's below)
				}
				o, err := tg.OpenForRead(id, false, 0, 0)
				f, length, version, sums := o.File, o.Length, o.Version, o.Sums
				if f != nil {
					defer f.Close()
				}
				var ce *CorruptionError
				if tt.wantCorrupt {
					if !errors.As(err, &ce) {
						t.Fatalf("error %v, want a corruption error", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if (f != nil) != tt.wantFile {
					t.Fatalf("file %v, want one: %v", f, tt.wantFile)
				}
				if !tt.wantFile {
					return
				}
				if length != tt.wantLen || version != tt.wantVersion {
					t.Errorf("length %d version %d, want %d and %d", length, version, tt.wantLen, tt.wantVersion)
				}
				if len(sums) != len(want) {
					t.Fatalf("%d checksums, want %d", len(sums), len(want))
				}
				for i := range sums {
					if sums[i] != want[i] {
						t.Errorf("checksum %d: %08x, want %08x", i, sums[i], want[i])
					}
				}
				got := make([]byte, length)
				if _, err := f.ReadAt(got, o.DataOffset); err != nil || !bytes.Equal(got, data) {
					t.Errorf("read through the descriptor: %v, bytes equal: %v", err, bytes.Equal(got, data))
				}
				if _, err := f.WriteAt([]byte{1}, 0); err == nil {
					t.Error("the descriptor given to a reader can write")
				}
				inCache := tg.store.files.get(cacheKey{tg, id})
				if inCache != nil {
					tg.store.files.release(inCache)
				}
				if !cached && tt.direct && inCache != nil {
					t.Error("a plain chunk went through the file cache")
				}
			})
		}
	}
}

// TestOpenForReadRewrittenBlocks checks a chunk whose blocks were
// rewritten (their copies in other slots of the file): it is opened in
// place, and each block read where Slots says matches its checksum and
// what was written.
func TestOpenForReadRewrittenBlocks(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	id := ID{Ino: 0x31, Index: 0}
	want := pattern(1, 5*BlockSize+300)
	if _, err := tg.Write(id, 1, 0, want, MaxChunkSize, true); err != nil {
		t.Fatal(err)
	}
	// Rewrite blocks 1 and 3, twice, with no sync between: their copies
	// move to the other slots.
	for round := range 2 {
		for _, b := range []int64{1, 3} {
			p := pattern(10+round+int(b), 1000)
			if _, err := tg.Write(id, 1, b*BlockSize+500, p, MaxChunkSize, false); err != nil {
				t.Fatal(err)
			}
			copy(want[b*BlockSize+500:], p)
		}
	}
	o, err := tg.OpenForRead(id, false, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer o.File.Close()
	if o.Slots == nil || o.Slots[1] == 0 || o.Slots[3] == 0 || o.Slots[0] != 0 {
		t.Fatalf("slots %v: want blocks 1 and 3 out of slot 0", o.Slots)
	}
	for b := range int64(len(o.Sums)) {
		n := min(BlockSize, int64(len(want))-b*BlockSize)
		got := make([]byte, n)
		if _, err := o.File.ReadAt(got, o.DataOffset+int64(o.Slots[b])*SlotStride+b*BlockSize); err != nil {
			t.Fatal(err)
		}
		if crc32.Checksum(got, castagnoli) != o.Sums[b] || !bytes.Equal(got, want[b*BlockSize:b*BlockSize+n]) {
			t.Fatalf("block %d read in place from slot %d: not what was written", b, o.Slots[b])
		}
	} // What a client does with it: ReadVerified, the whole chunk and
	// from block 2 on; a damaged copy is refused.
	if err := o.Check(); err != nil {
		t.Fatal(err)
	}
	for _, from := range []int64{0, 2 * BlockSize} {
		got := make([]byte, int64(len(want))-from)
		if !o.ReadVerified(got, from) || !bytes.Equal(got, want[from:]) {
			t.Fatalf("ReadVerified from %d: refused or not what was written", from)
		}
	}
	var ranges int
	o.FileRanges(0, int64(len(want)), func(flo, fhi int64) { ranges++ })
	if ranges != 5 { // blocks 0, 1, 2, 3, 4: slots alternate
		t.Errorf("FileRanges gave %d ranges, want 5", ranges)
	}
	bad := o
	bad.Sums = append([]uint32(nil), o.Sums...)
	bad.Sums[3]++
	if bad.ReadVerified(make([]byte, len(want)), 0) {
		t.Error("ReadVerified accepted a block that does not match its checksum")
	}
}

// TestOpenedCheck checks what a client accepts of an open's answer.
func TestOpenedCheck(t *testing.T) {
	for _, tt := range []struct {
		name string
		o    Opened
		ok   bool
	}{
		{"empty", Opened{}, true},
		{"one block", Opened{Length: 10, Sums: []uint32{1}}, true},
		{"slots", Opened{Length: BlockSize + 1, Sums: []uint32{1, 2}, Slots: []uint8{0, 2}}, true},
		{"too few sums", Opened{Length: BlockSize + 1, Sums: []uint32{1}}, false},
		{"too many sums", Opened{Length: 1, Sums: []uint32{1, 2}}, false},
		{"slot out of range", Opened{Length: 1, Sums: []uint32{1}, Slots: []uint8{3}}, false},
		{"slots not per block", Opened{Length: 1, Sums: []uint32{1}, Slots: []uint8{0, 1}}, false},
		{"too long", Opened{Length: MaxChunkSize + 1}, false},
	} {
		if err := tt.o.Check(); (err == nil) != tt.ok {
			t.Errorf("%s: Check = %v, want ok %v", tt.name, err, tt.ok)
		}
	}
}
