package chunk

import (
	"bytes"
	"errors"
	"os"
	"testing"
)

func TestDecode(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	id := ID{Ino: 0x44, Index: 3}
	want := pattern(4, 3*BlockSize+500)
	if _, err := tg.Write(id, 7, 0, want, MaxChunkSize, true); err != nil {
		t.Fatal(err)
	}
	// A rewrite of a synced block: its copy moves to another slot.
	p := pattern(5, 100)
	if _, err := tg.Write(id, 7, BlockSize+10, p, MaxChunkSize, false); err != nil {
		t.Fatal(err)
	}
	copy(want[BlockSize+10:], p)
	b, err := os.ReadFile(tg.inlinePath(id))
	if err != nil {
		t.Fatal(err)
	}
	d, err := Decode(b)
	if err != nil || d.Version != 2 || d.Chain != 7 || !bytes.Equal(d.Data, want) {
		t.Fatalf("decode: version %d chain %d, %d bytes equal %v, %v", d.Version, d.Chain, len(d.Data), bytes.Equal(d.Data, want), err)
	}
	b[inlineDataOff+5] ^= 1
	if _, err := Decode(b); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("decode of a damaged block: %v, want corruption", err)
	}
	if d, err := Decode(nil); err != nil || d.Length != 0 {
		t.Fatalf("decode of an empty file: %+v, %v", d, err)
	}
}

// FuzzDecode feeds Decode (and so the parsing of heads, block tables and
// synced records that every open of a chunk does) arbitrary files: it
// must answer, never panic, and never return more bytes than the length
// it reports.
func FuzzDecode(f *testing.F) {
	h := header{version: 3, chain: 1, length: 100}.encode()
	seed := append(h[:], make([]byte, entriesOff-headerSize+blockEntries)...)
	entry{gen: 3, sum: 1, n: 100}.encode(seed[entriesOff:])
	f.Add(seed)
	f.Add([]byte("weftch3"))
	f.Add(make([]byte, 100))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(b)
		if err == nil && int64(len(d.Data)) != d.Length {
			t.Fatalf("%d bytes for a length of %d", len(d.Data), d.Length)
		}
	})
}
