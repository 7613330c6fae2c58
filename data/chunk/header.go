package chunk

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/crc64"
	"io"
	"os"
)

// A chunk file (<index>.w) starts with its head: a header
//
//	0  7 bytes  magic "weftch2"
//	7  byte     where the data starts, in units of 64 KiB
//	8  uint64   version: +1 for every mutation of the chunk
//	16 uint64   chain id the chunk was last written through
//	24 uint32   length of the chunk's data in bytes
//	28 uint32   CRC32C of bytes 0..28
//
// then one little-endian CRC32C per block (at most 4 KiB of them). The
// data starts at inlineDataOff, 2 MiB in: the space between is a hole,
// which takes no room, and the data's pages stay aligned as in a file of
// their own, so the kernel reads them in large folios (a data start of 4
// KiB made it read a cold 1 MiB chunk as two requests instead of one).
//
// Chunks written before that format are two files, <index> (the data
// alone) and <index>.crc, whose header has magic "weftchk1" in bytes 0..8
// and no data offset. Files written before versions existed have no
// header at all (checksums from offset 0); they read as version 0 of no
// chain. Both older forms are read as they are and rewritten as one file
// at their first mutation.
const headerSize = 32

var headerMagic = [8]byte{'w', 'e', 'f', 't', 'c', 'h', 'k', '1'}

// inlineMagic starts the header of a chunk file holding its checksums.
var inlineMagic = [7]byte{'w', 'e', 'f', 't', 'c', 'h', '2'}

// inlineDataOff is where a chunk file's data starts (see above).
const inlineDataOff = 2 << 20

// dataOffUnit is the unit of the data offset in a chunk file's header.
const dataOffUnit = 64 << 10

// headSize bounds a chunk file's head: the header and the checksums of
// the largest chunk.
const headSize = headerSize + crcBytes*(MaxChunkSize/BlockSize)

var crc64Table = crc64.MakeTable(crc64.ECMA)

// header is what a chunk's head (or checksum file) says about the chunk.
type header struct {
	version uint64
	chain   uint64
	length  int64
	legacy  bool // no header in the file: checksums start at offset 0
	// dataOff is where the data starts in a chunk file holding its
	// checksums; 0 for a chunk of two files.
	dataOff int64
}

// sumsOff is where the block checksums start in the chunk file's head or
// the checksum file.
func (h header) sumsOff() int64 {
	if h.legacy {
		return 0
	}
	return headerSize
}

func (h header) encode() [headerSize]byte {
	var b [headerSize]byte
	if h.dataOff > 0 {
		copy(b[:7], inlineMagic[:])
		b[7] = byte(h.dataOff / dataOffUnit)
	} else {
		copy(b[:8], headerMagic[:])
	}
	binary.LittleEndian.PutUint64(b[8:], h.version)
	binary.LittleEndian.PutUint64(b[16:], h.chain)
	binary.LittleEndian.PutUint32(b[24:], uint32(h.length))
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return b
}

// errBadHeader marks a header that fails its own checksum (or a chunk
// file's head that is not one).
var errBadHeader = errors.New("chunk header checksum mismatch")

// decodeHeader parses the start of a checksum file; dataSize is the length
// of the data file, taken as the chunk's length for files without header.
func decodeHeader(b []byte, dataSize int64) (header, error) {
	if len(b) < headerSize || !bytes.Equal(b[:8], headerMagic[:]) {
		return header{length: dataSize, legacy: true}, nil
	}
	return decodeFields(b, 0)
}

// decodeFields parses the fields after the magic of a header in b,
// checking its checksum.
func decodeFields(b []byte, dataOff int64) (header, error) {
	if crc32.Checksum(b[:28], castagnoli) != binary.LittleEndian.Uint32(b[28:]) {
		return header{}, errBadHeader
	}
	return header{
		version: binary.LittleEndian.Uint64(b[8:]),
		chain:   binary.LittleEndian.Uint64(b[16:]),
		length:  int64(binary.LittleEndian.Uint32(b[24:])),
		dataOff: dataOff,
	}, nil
}

// decodeHead parses the head of a chunk file holding its checksums, b
// being at least its first headerSize bytes.
func decodeHead(b []byte) (header, error) {
	if len(b) < headerSize || !bytes.Equal(b[:7], inlineMagic[:]) {
		return header{}, errBadHeader
	}
	dataOff := int64(b[7]) * dataOffUnit
	if dataOff < headSize {
		return header{}, errBadHeader
	}
	return decodeFields(b, dataOff)
}

// readHeader reads the header of an open checksum file (a chunk of the
// older form).
func readHeader(crc *os.File, dataSize int64) (header, error) {
	var b [headerSize]byte
	n, err := crc.ReadAt(b[:], 0)
	if err != nil && err != io.EOF {
		return header{}, err
	}
	return decodeHeader(b[:n], dataSize)
}

// Info describes a chunk held by a target.
type Info struct {
	ID      ID
	Exists  bool
	Version uint64 // +1 per mutation; 0 for a chunk written before versions existed
	Chain   uint64 // chain the chunk was last written through; 0 if unknown
	Length  int64
	// Digest is a CRC-64 of the chunk's block checksums: with equal
	// versions, different digests mean different contents.
	Digest uint64
}

func (t *Target) headerError(id ID, err error) error {
	if errors.Is(err, errBadHeader) {
		return t.corrupt(&CorruptionError{Target: t.dir, Chunk: id, Block: -1, Header: true})
	}
	return t.ioError(fmt.Sprintf("read header of %v", id), err)
}
