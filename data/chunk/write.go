package chunk

import (
	"fmt"
	"hash/crc32"

	"golang.org/x/sys/unix"
)

// Write writes data at offset off of the chunk through chain, creating it
// if needed, as the chunk's next version, which it returns. The chunk is
// cut into chunkSize-byte pieces of a file: a write past chunkSize fails
// with EINVAL. A write past the chunk's end extends it, the gap reading as
// zeros. With sync, the chunk (and a new file's directory entry) is on
// stable storage when Write returns.
func (t *Target) Write(id ID, chain uint64, off int64, data []byte, chunkSize int64, sync bool) (uint64, error) {
	l := t.Lock(id, chain)
	defer l.Unlock()
	info, err := l.Info()
	if err != nil {
		return 0, err
	}
	if len(data) == 0 {
		return info.Version, l.Write(off, data, chunkSize, info.Version, sync)
	}
	return info.Version + 1, l.Write(off, data, chunkSize, info.Version+1, sync)
}

// Write writes data at off (as Target.Write) and sets the chunk's version
// to version. An empty write changes nothing (with sync it syncs the file).
func (l *Locked) Write(off int64, data []byte, chunkSize int64, version uint64, sync bool) error {
	return l.WritePieces([]Piece{{Off: off, Data: data}}, chunkSize, version, sync)
}

// Piece is one range of a write of several pieces of a chunk.
type Piece struct {
	Off  int64
	Data []byte
}

// WritePieces is Write of several pieces at once, as one write that sets
// the chunk's version to version: every range is checked before anything
// is written, the pieces are applied in order (a later one wins where
// they overlap), and with sync the chunk is synced once, after the last.
// Pieces without data change nothing.
func (l *Locked) WritePieces(pieces []Piece, chunkSize int64, version uint64, sync bool) error {
	t, id := l.t, l.id
	total := 0
	for _, p := range pieces {
		if err := checkRange(id, p.Off, len(p.Data), chunkSize); err != nil {
			return fmt.Errorf("write to target %s: %w", t.dir, err)
		}
		total += len(p.Data)
	}
	if total == 0 {
		if sync {
			return t.SyncFile(id.Ino)
		}
		return nil
	}
	f, err := t.openChunk(id, true)
	if err != nil {
		return err
	}
	defer t.store.files.release(f)
	if err := t.check(f); err != nil {
		return err
	}
	prev := f.hdr.version
	lo, hi, err := t.apply(f, pieces, version, l.chain)
	if err != nil {
		// Reopened from the disk at its next use: the entries of this
		// unfinished mutation are newer than its header, so dropped.
		t.store.files.drop(func(k cacheKey) bool { return k == f.key })
		return err
	}
	t.noteWrite(id, prev, version)
	if !sync {
		if total >= startWritebackAt {
			if osf := f.file.OS(); osf != nil {
				// Start writing the bytes to the disk now (without
				// waiting), so the file's sync at close finds them written
				// instead of writing the whole file then.
				_ = unix.SyncFileRange(int(osf.Fd()), lo, hi-lo, unix.SYNC_FILE_RANGE_WRITE)
			}
		}
		return nil
	}
	return t.syncChunkAndEntries(f, id)
}

// startWritebackAt is the least write (not synced) whose bytes go to the
// disk at once rather than when the kernel gets to them.
const startWritebackAt = 256 << 10

// ioSegment is how much of a write or read goes to or from the file (and
// is checksummed) at a time: a quarter of the level-2 cache of common
// server cores, so the checksum reads what the copy has just brought into
// it.
const ioSegment = 256 << 10

// blockWrite is what a mutation writes of one block: bytes [from, to) of
// the block's new content go to slot slot, from data (the bytes from
// from on) or, when data is nil, from a buffer built for it. The new
// entry (sum still to extend over the bytes) goes to entry index ei.
type blockWrite struct {
	b        int64
	from, to int64
	slot     int8
	data     []byte
	sum      uint32 // CRC32C of the content before from (an append)
	ei       int
}

// apply writes pieces into chunk f (held exclusively) as version and
// commits them: the bytes, then the block table, then the header. It
// returns the range of the file its bytes went to.
//
// Where a block's new content goes (the durability argument):
//
//   - A block's newest entry (cur) is what readers see; its newest entry
//     written at or before the synced floor (dur) is what a power loss
//     keeps. Neither's bytes are ever written over while they are that.
//   - A write that only adds bytes past cur's count, in a slot where no
//     relied-on entry counts past it (an append), goes in place: cur and
//     dur still check after a crash, whatever part of it was written.
//   - Any other write builds the block's whole new content in a slot
//     neither relies on: of three, one is always free (slot 0 first, so
//     that chunks go back to one place when they can).
//   - The new entry goes to the entry index that does not hold dur (an
//     entry is 16 bytes in one sector: written whole or not at all), and
//     the header, written last, commits the mutation.
func (t *Target) apply(f *chunkFile, pieces []Piece, version, chain uint64) (lo, hi int64, err error) {
	id := f.key.id
	oldLen := f.hdr.length
	newLen := oldLen
	for _, p := range pieces {
		if len(p.Data) > 0 {
			newLen = max(newLen, p.Off+int64(len(p.Data)))
		}
	}
	for int64(len(f.ents)) < nblocks(newLen) {
		f.ents = append(f.ents, [2]entry{})
	}
	touched := touchedBlocks(pieces, oldLen, newLen)
	for _, b := range touched {
		if b*BlockSize >= oldLen {
			f.ents[b] = [2]entry{} // nothing of an earlier life of the chunk stays
		}
	}
	floor := t.syncedFloor(id)
	writes := make([]blockWrite, 0, len(touched))
	buf := blockPool.Get().(*[BlockSize]byte)
	defer blockPool.Put(buf)
	for _, b := range touched {
		w, err := t.planBlock(f, b, oldLen, newLen, pieces, floor, buf)
		if err != nil {
			return 0, 0, err
		}
		writes = append(writes, w)
	}
	lo, hi = int64(1)<<62, 0
	gen := version & genMask
	for i := 0; i < len(writes); {
		// A run of blocks whose bytes are contiguous both in the file and
		// in one piece's data goes in one write per segment.
		j := i + 1
		for j < len(writes) && contiguous(writes[j-1], writes[j]) {
			j++
		}
		if err := t.writeRun(f, writes[i:j]); err != nil {
			return 0, 0, err
		}
		for _, w := range writes[i:j] {
			if f.damaged[w.b] { // written whole: its old entries are gone
				f.ents[w.b] = [2]entry{}
				delete(f.damaged, w.b)
			}
			f.ents[w.b][w.ei] = entry{gen: gen, sum: w.sum, n: w.to, slot: w.slot}
			off := slotOff(w.b, w.slot)
			lo, hi = min(lo, off+w.from), max(hi, off+w.to)
		}
		i = j
	}
	// Entries of every block touched, and of blocks the chunk grows over
	// (they may hold entries of an earlier life of the chunk).
	first, last := touched[0], touched[len(touched)-1]
	if grown := nblocks(oldLen); nblocks(newLen) > grown {
		first, last = min(first, grown), max(last, nblocks(newLen)-1)
		for b := grown; b < nblocks(newLen); b++ {
			if !isTouched(touched, b) {
				f.ents[b] = [2]entry{}
			}
		}
	}
	if err := t.writeEntries(f, first, last); err != nil {
		return 0, 0, err
	}
	if err := t.writeHeader(f, header{version: version, chain: chain, length: newLen}); err != nil {
		return 0, 0, err
	}
	t.usedBytes.Add(newLen - oldLen)
	return lo, hi, nil
}

func isTouched(touched []int64, b int64) bool {
	for _, t := range touched {
		if t == b {
			return true
		}
	}
	return false
}

// touchedBlocks lists, in order, the blocks the pieces write, and the
// old last block if the chunk grows past it (its content gets zeros up
// to its new extent, so that it stays one whole copy).
func touchedBlocks(pieces []Piece, oldLen, newLen int64) []int64 {
	var out []int64
	add := func(b int64) {
		for i, x := range out {
			if x == b {
				return
			}
			if x > b {
				out = append(out[:i], append([]int64{b}, out[i:]...)...)
				return
			}
		}
		out = append(out, b)
	}
	for _, p := range pieces {
		if len(p.Data) == 0 {
			continue
		}
		for b := p.Off / BlockSize; b*BlockSize < p.Off+int64(len(p.Data)); b++ {
			add(b)
		}
	}
	if newLen > oldLen && oldLen%BlockSize != 0 {
		add(oldLen / BlockSize)
	}
	return out
}

// planBlock decides where block b's new content goes (see apply) and,
// unless one piece holds all of the bytes to write, builds them.
func (t *Target) planBlock(f *chunkFile, b, oldLen, newLen int64, pieces []Piece, floor uint64, buf *[BlockSize]byte) (blockWrite, error) {
	bs := b * BlockSize
	ext := extent(b, newLen)
	ci, di := -1, -1
	if bs < oldLen {
		ci, di = f.cur(b), f.durable(b, floor)
	}
	var cur entry
	if ci >= 0 {
		cur = f.ents[b][ci]
	}
	// Where the pieces start writing in the block.
	wlo := ext
	for _, p := range pieces {
		if s, e := max(p.Off, bs), min(p.Off+int64(len(p.Data)), bs+BlockSize); s < e {
			wlo = min(wlo, s-bs)
		}
	}
	w := blockWrite{b: b, to: ext}
	switch {
	case ci < 0:
		w.ei = 0
	case di == ci:
		w.ei = 1 - ci
	case di >= 0:
		w.ei = ci
	default:
		w.ei = 1 - ci
	}
	oldExt := extent(b, oldLen)
	appendOK := ci >= 0 && !f.damaged[b] && wlo >= cur.n && cur.n <= oldExt && (di < 0 || f.ents[b][di].slot != cur.slot || f.ents[b][di].n <= cur.n)
	if appendOK {
		w.from, w.slot, w.sum = cur.n, cur.slot, cur.sum
	} else {
		w.slot = 0
		for w.slot < slots && ci >= 0 && (w.slot == cur.slot || di >= 0 && w.slot == f.ents[b][di].slot) {
			w.slot++
		}
	}
	// Bytes [w.from, ext): straight from a piece if one covers them all.
	for i := len(pieces) - 1; i >= 0; i-- {
		p := pieces[i]
		if p.Off <= bs+w.from && p.Off+int64(len(p.Data)) >= bs+ext {
			if onlyPieceOver(pieces, i, bs+w.from, bs+ext) {
				w.data = p.Data[bs+w.from-p.Off : bs+ext-p.Off]
				return w, nil
			}
			break
		}
	}
	content := buf[:ext]
	clear(content)
	// Not all of it comes from one piece: the pieces may leave gaps, so
	// the block's old content is the base.
	if !appendOK {
		if err := t.damagedError(f, b); err != nil {
			return blockWrite{}, err
		}
	}
	if !appendOK && ci >= 0 {
		// Bytes of the old content stay: read them, checked, so that
		// corruption is never blessed with a fresh checksum. What the
		// copy holds past the old end reads as zeros.
		if err := t.readCopy(f, b, cur, buf[:cur.n]); err != nil {
			return blockWrite{}, err
		}
		clear(buf[min(cur.n, oldExt):ext])
	}
	for _, p := range pieces {
		if s, e := max(p.Off, bs), min(p.Off+int64(len(p.Data)), bs+ext); s < e {
			copy(content[s-bs:e-bs], p.Data[s-p.Off:e-p.Off])
		}
	}
	w.data = append([]byte(nil), content[w.from:ext]...)
	return w, nil
}

// onlyPieceOver reports that no piece after pieces[i] writes into [lo, hi).
func onlyPieceOver(pieces []Piece, i int, lo, hi int64) bool {
	for _, p := range pieces[i+1:] {
		if p.Off < hi && p.Off+int64(len(p.Data)) > lo && len(p.Data) > 0 {
			return false
		}
	}
	return true
}

// contiguous reports that b's bytes follow a's both in the file and in
// memory, so one write can carry both.
func contiguous(a, b blockWrite) bool {
	if a.to != BlockSize || b.from != 0 || a.slot != b.slot || b.b != a.b+1 || len(a.data) == 0 || len(b.data) == 0 {
		return false
	}
	return cap(a.data) > len(a.data) && &a.data[:len(a.data)+1][len(a.data)] == &b.data[0]
}

// writeRun writes the bytes of a run of contiguous block writes, a
// segment at a time, each checksummed right after it is written while
// its bytes are still in this core's cache (a whole megabyte written
// first and checksummed after was read back from memory: about 88
// against 35 us per MiB).
func (t *Target) writeRun(f *chunkFile, run []blockWrite) error {
	start := slotOff(run[0].b, run[0].slot) + run[0].from
	data := run[0].data
	if len(run) > 1 {
		n := 0
		for _, w := range run {
			n += len(w.data)
		}
		data = run[0].data[:n:n]
	}
	pos := 0 // index into run of the next block to checksum
	for so := 0; so < len(data); {
		se := min(so+ioSegment, len(data))
		if _, err := f.file.WriteAt(data[so:se], start+int64(so)); err != nil {
			return t.ioError(fmt.Sprintf("write %v", f.key.id), err)
		}
		// Checksum the blocks that end within what is written so far.
		done := 0
		for _, w := range run[:pos] {
			done += len(w.data)
		}
		for pos < len(run) && done+len(run[pos].data) <= se {
			w := &run[pos]
			w.sum = crc32.Update(w.sum, castagnoli, w.data)
			done += len(w.data)
			pos++
		}
		so = se
	}
	return nil
}
