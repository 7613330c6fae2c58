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

// The checksum file of a chunk starts with a header:
//
//	0  8 bytes  magic "weftchk1"
//	8  uint64   version: +1 for every mutation of the chunk
//	16 uint64   chain id the chunk was last written through
//	24 uint32   length of the chunk's data in bytes
//	28 uint32   CRC32C of bytes 0..28
//
// then one little-endian CRC32C per block. Files written before versions
// existed have no header (checksums from offset 0); they read as version 0
// of no chain and get a header on their first mutation.
const headerSize = 32

var headerMagic = [8]byte{'w', 'e', 'f', 't', 'c', 'h', 'k', '1'}

var crc64Table = crc64.MakeTable(crc64.ECMA)

// header is what a chunk's checksum file says about the chunk.
type header struct {
	version uint64
	chain   uint64
	length  int64
	legacy  bool // no header in the file: checksums start at offset 0
}

// sumsOff is where the block checksums start in the checksum file.
func (h header) sumsOff() int64 {
	if h.legacy {
		return 0
	}
	return headerSize
}

func (h header) encode() [headerSize]byte {
	var b [headerSize]byte
	copy(b[:8], headerMagic[:])
	binary.LittleEndian.PutUint64(b[8:], h.version)
	binary.LittleEndian.PutUint64(b[16:], h.chain)
	binary.LittleEndian.PutUint32(b[24:], uint32(h.length))
	binary.LittleEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
	return b
}

// errBadHeader marks a checksum file whose header fails its own checksum.
var errBadHeader = errors.New("chunk header checksum mismatch")

// decodeHeader parses the start of a checksum file; dataSize is the length
// of the data file, taken as the chunk's length for files without header.
func decodeHeader(b []byte, dataSize int64) (header, error) {
	if len(b) < headerSize || !bytes.Equal(b[:8], headerMagic[:]) {
		return header{length: dataSize, legacy: true}, nil
	}
	if crc32.Checksum(b[:28], castagnoli) != binary.LittleEndian.Uint32(b[28:]) {
		return header{}, errBadHeader
	}
	return header{
		version: binary.LittleEndian.Uint64(b[8:]),
		chain:   binary.LittleEndian.Uint64(b[16:]),
		length:  int64(binary.LittleEndian.Uint32(b[24:])),
	}, nil
}

// readHeader reads the header of an open checksum file.
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
