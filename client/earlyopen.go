package client

import (
	"sync"
	"syscall"

	"google.golang.org/protobuf/proto"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Opening a file's first chunk beside its open. A cold read of a small
// file costs a lookup, an open (both meta calls) and the open of its chunk
// in place (a data server call) before its bytes can be read; the last
// needs only the file's layout, which the lookup already brought. So an
// open for reading of a file whose layout this client heard lately starts
// opening the chunk holding the file's start (or its only chunk) at
// once, while the meta service answers the open: the chunk is open, or
// nearly, when the first read comes. Only files of 128 KiB or less (in
// one chunk), which the data server reads in whole meanwhile, as their
// first read would; a program that opens such files without reading them
// costs a chunk open each. Larger files are left to their reads: the
// first read's open names the span it reads (so a reader of a little of
// a large file reads no more of the disk), and a reader of several
// chunks opens them in rounds (localread.go).
//
// The chunk is opened when the open begins, so it holds every write
// closed before the open (close-to-open holds). A layout heard earlier
// that turns out to differ from the one the open answers (a file emptied
// and given a new layout) drops what was opened.

// earlyMax is the largest file whose chunk is opened early, and read in
// whole: no more than the kernel's least read-ahead brings in at its first
// read.
const earlyMax = 128 << 10

// maxLayoutHints bounds the layouts remembered; past it the set starts
// again empty.
const maxLayoutHints = 1 << 16

// layoutHint is what a lookup or getattr told of a regular file.
type layoutHint struct {
	layout *weftv1.Layout
	size   uint64
}

// layoutHints are the layouts and lengths of regular files heard lately,
// forgotten by callbacks naming them.
type layoutHints struct {
	mu    sync.Mutex
	hints map[uint64]layoutHint
}

// note remembers a's layout and length if it is a regular file with both,
// of at most earlyMax bytes (larger files are not opened early).
func (h *layoutHints) note(a *weftv1.Attr) {
	if a.GetLayout() == nil || a.Mode&syscall.S_IFMT != syscall.S_IFREG || a.Size == 0 || a.Size > earlyMax {
		return
	}
	h.mu.Lock()
	if h.hints == nil || len(h.hints) >= maxLayoutHints {
		h.hints = make(map[uint64]layoutHint)
	}
	h.hints[a.Ino] = layoutHint{layout: a.Layout, size: a.Size}
	h.mu.Unlock()
}

// get returns the hint of ino, if any.
func (h *layoutHints) get(ino uint64) (layoutHint, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hint, ok := h.hints[ino]
	return hint, ok
}

// invalidate forgets what a callback names.
func (h *layoutHints) invalidate(inv *weftv1.Invalidation) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if inv.All {
		h.hints = nil
		return
	}
	for _, ino := range inv.Inodes {
		delete(h.hints, ino)
	}
}

// openEarly starts, for an open for reading of ino, the open in place of
// the chunk holding the file's start, if this client heard the file's
// layout lately and can read it in place. It returns the file's state
// with the open counted (the caller hands it on, or drops it with
// dropRef if the open fails), or nil.
func (c *Client) openEarly(ino uint64, flags uint32) *inode {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0 {
		return nil
	}
	hint, ok := c.layoutHints.get(ino)
	if !ok || !c.localReads() || hint.layout.ChunkSize == 0 || len(hint.layout.Chains) == 0 || hint.size > uint64(hint.layout.ChunkSize) {
		// A file of several chunks: its reader opens them in rounds. A
		// larger one: where it is read first is not known, and that
		// read's open has the server read in what it asks.
		return nil
	}
	in := c.acquire(&weftv1.Attr{Ino: ino, Layout: hint.layout, Size: hint.size})
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.dirty) > 0 || len(in.inflight) > 0 || in.writtenLocked() {
		return in // this client writes it: reads will overlay, leave it to them
	}
	ch, w, ok := in.localSourceLocked(hint.layout, 0)
	if !ok || in.local.pending[0] != nil || in.findLocalLocked(0, ch) != nil {
		return in
	}
	// The whole file is read in meanwhile: its first read brings it in
	// anyway.
	in.openLocalLocked(hint.layout, ch, w, 0, false, false, span{n: hint.size})
	c.earlyOpens.Add(1)
	return in
}

// adoptEarly takes the meta service's answer to an open that openEarly
// began: the state gets the file's attributes, and what was opened early
// is dropped if the layout differs from the one heard.
func (in *inode) adoptEarly(attr *weftv1.Attr) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if !proto.Equal(in.layout, attr.Layout) {
		in.dropReadAheadLocked()
	}
	if attr.Layout != nil {
		in.layout = attr.Layout
	}
	in.metaSize, in.metaMtimeNs = attr.Size, attr.MtimeNs
}

// EarlyOpens reports how many chunks were opened beside their file's open.
func (c *Client) EarlyOpens() uint64 { return c.earlyOpens.Load() }
