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
	Stored   uint32 // checksum kept in the block table
	Computed uint32 // checksum of the bytes on disk
	Missing  bool   // the block's entries in the block table are damaged
	// Header: the chunk file's header (version, length) is damaged.
	Header bool
	// Truncated: the chunk file holds Length bytes where Want are expected.
	Truncated    bool
	Length, Want int64
}

func (e *CorruptionError) Error() string {
	if e.Header {
		return fmt.Sprintf("%v on target %s: header of the chunk file is damaged: chunk unverifiable", e.Chunk, e.Target)
	}
	if e.Truncated {
		return fmt.Sprintf("%v on target %s: chunk file cut short at block %d (%d bytes, %d expected): data lost on disk",
			e.Chunk, e.Target, e.Block, e.Length, e.Want)
	}
	if e.Missing {
		return fmt.Sprintf("%v on target %s: block %d has no valid checksum (block table damaged): data unverifiable",
			e.Chunk, e.Target, e.Block)
	}
	return fmt.Sprintf("%v on target %s: block %d checksum mismatch (stored %08x, computed %08x): data corrupt on disk",
		e.Chunk, e.Target, e.Block, e.Stored, e.Computed)
}

// Unwrap makes errors.Is(err, ErrCorrupt) and errors.Is(err, syscall.EIO)
// both hold.
func (e *CorruptionError) Unwrap() []error { return []error{ErrCorrupt, syscall.EIO} }
