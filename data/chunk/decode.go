package chunk

import "hash/crc32"

// Decoded is the content of a chunk file as a target reads it.
type Decoded struct {
	Version uint64
	Chain   uint64
	Length  int64
	// Data is the chunk's bytes, each block checked against its entry.
	Data []byte
}

// Decode reads the content of a chunk file from its bytes b (the whole
// file, as os.ReadFile gives it), for tools and tests that look at a
// target's files without a store: the newest committed copy of each
// block, checked. A file holding nothing (created, never written) is an
// empty chunk. A damaged head or a block that fails its checksum is a
// *CorruptionError (with the header's fields in d when the header is
// good). It does not recover what a crash left (see Target.load): copies
// newer than the last sync are taken as they are.
func Decode(b []byte) (Decoded, error) {
	t := &Target{dir: "(decoded)"}
	f := &chunkFile{key: cacheKey{t, ID{}}}
	head := b[:min(len(b), headSize)]
	if len(head) >= headerSize {
		if h, err := decodeHeader(head); err == nil {
			want := entriesOff + nblocks(h.length)*blockEntries
			if int64(len(head)) < want {
				// Entries past the end of the file read as zeros.
				head = append(append([]byte(nil), head...), make([]byte, want-int64(len(head)))...)
			}
		}
	}
	t.parseHead(f, head)
	if f.bad != nil {
		return Decoded{}, f.bad
	}
	d := Decoded{Version: f.hdr.version, Chain: f.hdr.chain, Length: f.hdr.length, Data: make([]byte, f.hdr.length)}
	for blk := range nblocks(f.hdr.length) {
		if f.damaged[blk] {
			return d, &CorruptionError{Target: t.dir, Block: blk, Missing: true}
		}
		i := f.cur(blk)
		if i < 0 {
			continue
		}
		e := f.ents[blk][i]
		copyBytes := make([]byte, e.n)
		if off := slotOff(blk, e.slot); off < int64(len(b)) {
			copy(copyBytes, b[off:min(off+e.n, int64(len(b)))])
		}
		if got := crc32.Checksum(copyBytes, castagnoli); got != e.sum {
			return d, &CorruptionError{Target: t.dir, Block: blk, Stored: e.sum, Computed: got}
		}
		copy(d.Data[blk*BlockSize:min((blk+1)*BlockSize, f.hdr.length)], copyBytes)
	}
	return d, nil
}
