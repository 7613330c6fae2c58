package chunk

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"hash/crc64"
)

// A chunk file (<index>.w) starts with its head:
//
//	0   7 bytes  magic "weftch3"
//	7   byte     where the data starts, in units of 64 KiB (32: 2 MiB)
//	8   uint64   version: +1 for every mutation of the chunk
//	16  uint64   chain id the chunk was last written through
//	24  uint32   length of the chunk's data in bytes
//	28  uint32   CRC32C of bytes 0..28
//	32  uint64   synced: the version the file was last known durable at
//	40  uint32   CRC32C of bytes 32..40 and of the chunk's id
//	44  20 bytes zero
//	64  the block table: two entries of 16 bytes per block
//
// The header (bytes 0..32) is the commit record of every mutation: it is
// written after the data and the entries, and entries newer than its
// version belong to a mutation that never committed and are ignored.
//
// A block's content is held in one of three places (slots): slot s of
// block b is at dataOff + s*slotStride + b*BlockSize. Each of a block's
// two entries says which slot holds a copy, how many bytes of it count,
// their CRC32C and the version that wrote it; the newest entry not newer
// than the header is the block's content (bytes past its count, up to
// the chunk's length, read as zeros; a block with no entry reads as
// zeros). A mutation never writes over a copy that an entry relies on
// while that entry is the block's newest, or its newest durable one (see
// write.go): with three slots one is always free for it. So after a crash
// of the process or of the machine every block has its old or its new
// content, and a check of the new copy against its checksum tells which.
//
// Entry layout:
//
//	0  6 bytes  version that wrote the copy (low 48 bits); 0: empty
//	6  uint16   low 16 bits of the CRC32C of the entry with these 2 bytes zero
//	8  uint32   CRC32C of the copy's bytes
//	12 uint16   number of bytes counted, minus one
//	14 byte     slot (0, 1 or 2)
//	15 byte     zero
//
// Slot 0 starts 2 MiB in: the space before is a hole, which takes no
// room, and the data's pages are aligned as in a file of their own, so
// the kernel reads them in large folios. A chunk written once is all in
// slot 0; the others hold blocks rewritten since.
const (
	headerSize   = 32
	syncedOff    = 32
	entriesOff   = 64
	entrySize    = 16
	blockEntries = 2 * entrySize

	// maxBlocks is the number of blocks of the largest chunk.
	maxBlocks = MaxChunkSize / BlockSize
	// headSize bounds a chunk file's head.
	headSize = entriesOff + maxBlocks*blockEntries

	// inlineDataOff is where slot 0 starts in a chunk file.
	inlineDataOff = 2 << 20
	// slotStride is the distance between the slots.
	slotStride = SlotStride
	// slots is how many places a block's copies have.
	slots = 3
	// dataOffUnit is the unit of the data offset in the header.
	dataOffUnit = 64 << 10

	// genMask keeps the bits of a version an entry records.
	genMask = 1<<48 - 1
)

var inlineMagic = [7]byte{'w', 'e', 'f', 't', 'c', 'h', '3'}

var crc64Table = crc64.MakeTable(crc64.ECMA)

// header is what a chunk's head says about the chunk.
type header struct {
	version uint64
	chain   uint64
	length  int64
}

func (h header) encode() [headerSize]byte {
	var b [headerSize]byte
	copy(b[:7], inlineMagic[:])
	b[7] = byte(inlineDataOff / dataOffUnit)
	binary.LittleEndian.PutUint64(b[8:], h.version)
	binary.LittleEndian.PutUint64(b[16:], h.chain)
	binary.LittleEndian.PutUint32(b[24:], uint32(h.length))
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return b
}

// errBadHeader marks a head that is not a chunk file's or fails its own
// checksum.
var errBadHeader = errors.New("chunk header checksum mismatch")

// decodeHeader parses a chunk file's header from b (at least headerSize
// bytes).
func decodeHeader(b []byte) (header, error) {
	if len(b) < headerSize || [7]byte(b[:7]) != inlineMagic || int64(b[7])*dataOffUnit != inlineDataOff {
		return header{}, errBadHeader
	}
	if crc32.Checksum(b[:28], castagnoli) != binary.LittleEndian.Uint32(b[28:]) {
		return header{}, errBadHeader
	}
	h := header{
		version: binary.LittleEndian.Uint64(b[8:]),
		chain:   binary.LittleEndian.Uint64(b[16:]),
		length:  int64(binary.LittleEndian.Uint32(b[24:])),
	}
	if h.length > MaxChunkSize {
		return header{}, errBadHeader
	}
	return h, nil
}

// unwritten reports that a head holds nothing at all: the file was
// created (a crash before its first write was durable), never committed.
func unwritten(b []byte) bool {
	for _, c := range b[:min(len(b), entriesOff)] {
		if c != 0 {
			return false
		}
	}
	return true
}

// encodeSynced is the synced record of chunk id: durable up to version v.
func encodeSynced(id ID, v uint64) [12]byte {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:], v)
	binary.LittleEndian.PutUint32(b[8:], syncedSum(id, b[:8]))
	return b
}

func syncedSum(id ID, v []byte) uint32 {
	var ids [16]byte
	binary.LittleEndian.PutUint64(ids[:], id.Ino)
	binary.LittleEndian.PutUint64(ids[8:], id.Index)
	return crc32.Update(crc32.Checksum(v, castagnoli), castagnoli, ids[:])
}

// decodeSynced parses the synced record of chunk id; a record that does
// not check (never written, or written for another chunk) is 0.
func decodeSynced(id ID, b []byte) uint64 {
	if len(b) < 12 || syncedSum(id, b[:8]) != binary.LittleEndian.Uint32(b[8:]) {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// entry describes a copy of a block.
type entry struct {
	gen  uint64 // version that wrote it (low 48 bits); 0: empty
	sum  uint32 // CRC32C of the n bytes
	n    int64  // bytes counted, 1..BlockSize
	slot int8   // 0, 1 or 2
}

func (e entry) empty() bool { return e.gen == 0 }

func (e entry) encode(b []byte) {
	clear(b[:entrySize])
	if e.empty() {
		return
	}
	binary.LittleEndian.PutUint64(b[0:], e.gen&genMask) // bytes 6..8 overwritten below
	binary.LittleEndian.PutUint32(b[8:], e.sum)
	binary.LittleEndian.PutUint16(b[12:], uint16(e.n-1))
	b[14] = byte(e.slot)
	b[6], b[7] = 0, 0
	binary.LittleEndian.PutUint16(b[6:], uint16(crc32.Checksum(b[:entrySize], castagnoli)))
}

// errBadEntry marks a table entry that fails its own check.
var errBadEntry = errors.New("chunk block table entry damaged")

func decodeEntry(b []byte) (entry, error) {
	var zero [entrySize]byte
	if [entrySize]byte(b[:entrySize]) == zero {
		return entry{}, nil
	}
	var c [entrySize]byte
	copy(c[:], b)
	c[6], c[7] = 0, 0
	if uint16(crc32.Checksum(c[:], castagnoli)) != binary.LittleEndian.Uint16(b[6:]) || b[14] >= slots || b[15] != 0 {
		return entry{}, errBadEntry
	}
	gen := binary.LittleEndian.Uint64(c[:]) & genMask
	if gen == 0 {
		return entry{}, errBadEntry
	}
	return entry{gen: gen, sum: binary.LittleEndian.Uint32(b[8:]), n: int64(binary.LittleEndian.Uint16(b[12:])) + 1,
		slot: int8(b[14])}, nil
}

// slotOff is where slot s of block b starts in a chunk file.
func slotOff(b int64, s int8) int64 {
	return inlineDataOff + int64(s)*slotStride + b*BlockSize
}

// entryOff is where entry i of block b is in a chunk file.
func entryOff(b int64, i int) int64 { return entriesOff + b*blockEntries + int64(i)*entrySize }

// nblocks is the number of blocks of a chunk of length bytes.
func nblocks(length int64) int64 { return (length + BlockSize - 1) / BlockSize }

// extent is the number of bytes of block b in a chunk of length bytes.
func extent(b, length int64) int64 { return max(min(BlockSize, length-b*BlockSize), 0) }

// zerosSum extends a CRC32C by n zero bytes.
func zerosSum(sum uint32, n int64) uint32 {
	for n > 0 {
		k := min(n, BlockSize)
		sum = crc32.Update(sum, castagnoli, zeroBlock[:k])
		n -= k
	}
	return sum
}

// Info describes a chunk held by a target.
type Info struct {
	ID      ID
	Exists  bool
	Version uint64 // +1 per mutation
	Chain   uint64 // chain the chunk was last written through; 0 if unknown
	Length  int64
	// Digest is a CRC-64 of the CRC32C of each block's content: with
	// equal versions, different digests mean different contents.
	Digest uint64
}

// digest is the Digest of a chunk whose block contents have the given
// CRC32C each.
func digest(sums []uint32) uint64 {
	b := make([]byte, 4*len(sums))
	for i, s := range sums {
		binary.LittleEndian.PutUint32(b[4*i:], s)
	}
	return crc64.Checksum(b, crc64Table)
}

// zeroBlock is BlockSize zeros.
var zeroBlock [BlockSize]byte
