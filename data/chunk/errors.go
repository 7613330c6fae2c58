package chunk

import (
	"errors"
	"fmt"
	"syscall"
)

// ErrCorrupt marks every error that reports a block whose bytes do not match
// its stored checksum: errors.Is(err, ErrCorrupt). Such errors also wrap
// syscall.EIO, which is what a reader of the file sees.
var ErrCorrupt = errors.New("chunk data corrupt")

// CorruptionError reports a block of a chunk whose checksum does not match
// its bytes, or whose checksum is missing.
type CorruptionError struct {
	Target   string // target directory
	Chunk    ID
	Block    int64  // block number inside the chunk (BlockSize bytes each)
	Stored   uint32 // checksum kept in the .crc file
	Computed uint32 // checksum of the bytes on disk
	Missing  bool   // the .crc file holds no checksum for the block
}

func (e *CorruptionError) Error() string {
	if e.Missing {
		return fmt.Sprintf("%v on target %s: block %d has no checksum (.crc file too short): data unverifiable",
			e.Chunk, e.Target, e.Block)
	}
	return fmt.Sprintf("%v on target %s: block %d checksum mismatch (stored %08x, computed %08x): data corrupt on disk",
		e.Chunk, e.Target, e.Block, e.Stored, e.Computed)
}

// Unwrap makes errors.Is(err, ErrCorrupt) and errors.Is(err, syscall.EIO)
// both hold.
func (e *CorruptionError) Unwrap() []error { return []error{ErrCorrupt, syscall.EIO} }
