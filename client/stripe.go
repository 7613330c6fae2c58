package client

import (
	"fmt"
	"syscall"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// span is the part of a file byte range that falls into one chunk.
type span struct {
	index  uint64 // chunk index in the file
	off    uint64 // offset inside the chunk
	n      uint64 // bytes
	bufOff uint64 // offset of this piece in the caller's buffer
}

// spans cuts the file byte range [off, off+n) into per-chunk pieces, in file
// order. A zero chunkSize or n yields nothing.
func spans(off, n, chunkSize uint64) []span {
	if n == 0 || chunkSize == 0 {
		return nil
	}
	out := make([]span, 0, n/chunkSize+2)
	var done uint64
	for done < n {
		pos := off + done
		idx := pos / chunkSize
		in := pos % chunkSize
		take := min(chunkSize-in, n-done)
		out = append(out, span{index: idx, off: in, n: take, bufOff: done})
		done += take
	}
	return out
}

// chainFor returns the chain holding chunk index of a file with layout l:
// chains[index % len(chains)].
func chainFor(l *weftv1.Layout, index uint64) uint64 {
	return l.Chains[index%uint64(len(l.Chains))]
}

// checkLayout verifies that a regular file's layout can be used for I/O.
func checkLayout(ino uint64, l *weftv1.Layout) error {
	if l == nil || len(l.Chains) == 0 || l.ChunkSize == 0 {
		return fmt.Errorf("file %d has no usable layout (%v); the meta service should have assigned one at create: %w",
			ino, l, syscall.EIO)
	}
	return nil
}
