package client

import (
	"sort"

	"github.com/weft-fs/weft/internal/wire"
)

// extent is a run of buffered bytes inside one chunk, starting at off.
type extent struct {
	off  uint64
	data []byte
}

func (e extent) end() uint64 { return e.off + uint64(len(e.data)) }

// chunkBuf holds the buffered (not yet sent) bytes of one chunk as sorted,
// non-overlapping, non-adjacent extents: a write that touches or overlaps
// existing extents is merged with them, so sequential small writes grow one
// extent. A chunkBuf is not safe for concurrent use (its inode's mutex
// guards it) and owns its byte slices: once it is handed to a sender nobody
// writes into it again.
type chunkBuf struct {
	extents []extent
	size    int64 // total buffered bytes
	// chunkSize, if set, lets a large new extent take room up to the
	// chunk's end, so that a sequential writer grows it in place.
	chunkSize uint64
}

// minRoomyExtent is the least write whose new extent takes room up to
// the chunk's end (at most maxExtentRoom): smaller ones (small files,
// scattered writes) take room for themselves and grow by append.
const (
	minRoomyExtent = 64 << 10
	maxExtentRoom  = 4 << 20
)

// newExtent returns a pooled buffer (wire.GetBuffer) holding p for a new
// extent at chunk offset off.
func (b *chunkBuf) newExtent(off uint64, p []byte) []byte {
	room := len(p)
	if len(p) >= minRoomyExtent && b.chunkSize > off {
		room = max(room, int(min(b.chunkSize-off, maxExtentRoom)))
	}
	buf := wire.GetBuffer(room)[:len(p)]
	copy(buf, p)
	return buf
}

// release gives back the buffers of every extent; b is empty afterwards.
func (b *chunkBuf) release() {
	for _, e := range b.extents {
		wire.PutBuffer(e.data)
	}
	b.extents, b.size = nil, 0
}

// write copies p into the buffer at chunk offset off and returns by how
// many bytes the buffered total grew.
func (b *chunkBuf) write(off uint64, p []byte) int64 {
	if len(p) == 0 {
		return 0
	}
	end := off + uint64(len(p))
	// First extent that ends at or after off (touching counts) and the
	// first that starts after end: extents [i, j) merge with the write.
	i := sort.Search(len(b.extents), func(k int) bool { return b.extents[k].end() >= off })
	j := sort.Search(len(b.extents), func(k int) bool { return b.extents[k].off > end })
	before := b.size
	switch {
	case i >= j:
		data := b.newExtent(off, p)
		b.extents = append(b.extents, extent{})
		copy(b.extents[i+1:], b.extents[i:])
		b.extents[i] = extent{off: off, data: data}
		b.size += int64(len(p))
		return b.size - before
	case j == i+1 && b.extents[i].off <= off:
		// One extent that starts at or before the write: overwrite in
		// place or grow it at its end (amortized by append).
		e := &b.extents[i]
		if end <= e.end() {
			copy(e.data[off-e.off:], p)
			return 0
		}
		old := int64(len(e.data))
		e.data = append(e.data[:off-e.off], p...)
		b.size += int64(len(e.data)) - old
		return b.size - before
	}
	start := min(off, b.extents[i].off)
	last := max(end, b.extents[j-1].end())
	data := make([]byte, last-start)
	var removed int64
	for _, e := range b.extents[i:j] {
		copy(data[e.off-start:], e.data)
		removed += int64(len(e.data))
		wire.PutBuffer(e.data)
	}
	copy(data[off-start:], p)
	b.extents = append(b.extents[:i+1], b.extents[j:]...)
	b.extents[i] = extent{off: start, data: data}
	b.size += int64(len(data)) - removed
	return b.size - before
}

// full reports whether the buffer covers the whole chunk.
func (b *chunkBuf) full(chunkSize uint64) bool {
	return len(b.extents) == 1 && b.extents[0].off == 0 && uint64(len(b.extents[0].data)) >= chunkSize
}

// truncate drops every buffered byte at chunk offset size or beyond and
// returns how many bytes were dropped.
func (b *chunkBuf) truncate(size uint64) int64 {
	before := b.size
	keep := b.extents[:0]
	b.size = 0
	for _, e := range b.extents {
		if e.off >= size {
			wire.PutBuffer(e.data)
			continue
		}
		if e.end() > size {
			e.data = e.data[:size-e.off]
		}
		keep = append(keep, e)
		b.size += int64(len(e.data))
	}
	b.extents = keep
	return before - b.size
}
