package chunk

import (
	"fmt"
	"hash/crc32"
	"os"
)

// Opened is a chunk opened for a client on this host to read in place
// (OpenForRead): what of its file's format the client needs, so that the
// format is known here only.
type Opened struct {
	// File is the chunk's file, read-only; nil if the chunk does not
	// exist.
	File *os.File
	// DataOffset is where the chunk's bytes start in File.
	DataOffset int64
	Length     int64
	Version    uint64
	// Sums holds the CRC32C of each block.
	Sums []uint32
	// Slots holds the slot of each block (nil: all in slot 0): block b is
	// at DataOffset + Slots[b]*SlotStride + b*BlockSize.
	Slots []uint8
}

// Check reports whether o is one a server may hand out: a checksum for
// every block of its length, every block in a slot that exists. A client
// checks what it received before reading with it.
func (o *Opened) Check() error {
	if o.Length < 0 || o.Length > MaxChunkSize {
		return fmt.Errorf("chunk opened in place with length %d", o.Length)
	}
	if want := nblocks(o.Length); int64(len(o.Sums)) != want {
		return fmt.Errorf("chunk of %d bytes opened in place with %d checksums", o.Length, len(o.Sums))
	}
	if o.Slots != nil && len(o.Slots) != len(o.Sums) {
		return fmt.Errorf("chunk opened in place with %d slots for %d blocks", len(o.Slots), len(o.Sums))
	}
	for b, s := range o.Slots {
		if s >= slots {
			return fmt.Errorf("block %d of a chunk opened in place in slot %d", b, s)
		}
	}
	return nil
}

// slot returns the slot of block b.
func (o *Opened) slot(b int64) uint8 {
	if o.Slots == nil || b >= int64(len(o.Slots)) {
		return 0
	}
	return o.Slots[b]
}

// readSegment is how much ReadVerified preads before checking it: a
// multiple of the block size that stays in a core's level-2 cache.
const readSegment = 4 * BlockSize

// ReadVerified reads the chunk's bytes from from (a multiple of
// BlockSize) into buf, which ends at the chunk's length or at a block
// boundary, and checks each block against its checksum. It reports false
// when a block does not match or the file is shorter than o says (it
// changed under the reader): read it through the server then.
func (o *Opened) ReadVerified(buf []byte, from int64) bool {
	if from%BlockSize != 0 || from < 0 || from+int64(len(buf)) > o.Length {
		return false
	}
	first := from / BlockSize
	// A segment at a time, so the checksums read what pread has just
	// brought into this core's cache (a whole MiB read first was checked
	// from memory).
	for so := int64(0); so < int64(len(buf)); so += readSegment {
		se := min(so+readSegment, int64(len(buf)))
		for ro := so; ro < se; {
			// A run of blocks in one slot, read at once.
			b := first + ro/BlockSize
			re := ro + BlockSize - ro%BlockSize
			for re < se && o.slot(first+re/BlockSize) == o.slot(b) {
				re += BlockSize
			}
			re = min(re, se)
			off := o.DataOffset + int64(o.slot(b))*SlotStride + b*BlockSize + ro%BlockSize
			if n, _ := o.File.ReadAt(buf[ro:re], off); int64(n) < re-ro {
				return false
			}
			ro = re
		}
		for lo := so; lo < se; lo += BlockSize {
			b := first + lo/BlockSize
			block := buf[lo:min(lo+BlockSize, se)]
			if b >= int64(len(o.Sums)) || crc32.Checksum(block, castagnoli) != o.Sums[b] {
				return false
			}
		}
	}
	return true
}

// FileRanges calls fn with the ranges of File that hold the chunk's bytes
// [lo, hi), in order: one range per run of blocks in the same slot.
func (o *Opened) FileRanges(lo, hi int64, fn func(flo, fhi int64)) {
	for b := lo / BlockSize; b*BlockSize < hi; {
		e := b + 1
		for e*BlockSize < hi && o.slot(e) == o.slot(b) {
			e++
		}
		base := o.DataOffset + int64(o.slot(b))*SlotStride
		fn(base+max(lo, b*BlockSize), base+min(hi, e*BlockSize))
		b = e
	}
}
