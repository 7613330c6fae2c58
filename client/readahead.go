package client

import (
	"context"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Read-ahead: a read that starts on a window boundary of a chunk and asks
// for less than the window fetches the whole window (up to the chunk's end
// and the file's end) and the window after it; the reads that follow are
// served from them. Sequential readers (the kernel reads 128 KiB at a time)
// thus cost one request per window with the next one under way; random
// readers rarely start on a boundary and fetch only what they read.
const (
	readAheadWindow = 1 << 20
	maxReadAheads   = 4 // windows kept per inode
)

// raWindow is one fetched (or being fetched) window of a chunk.
type raWindow struct {
	idx  uint64 // chunk index
	off  uint64 // chunk offset of data[0]
	n    uint64 // length of the window
	data []byte // set when done
	done chan struct{}
	err  error
}

func (w *raWindow) covers(idx, off, n uint64) bool {
	return w.idx == idx && w.off <= off && off+n <= w.off+w.n
}

// windowFor returns a window covering chunk range [off, off+n) of chunk
// idx, starting its fetch if the read qualifies; nil if the piece is to be
// read directly. size is the file size the read was clipped to. Called
// with in.mu held.
func (in *inode) windowForLocked(layout *weftv1.Layout, size, idx, off, n uint64) *raWindow {
	for _, w := range in.ra {
		if w.covers(idx, off, n) {
			return w
		}
	}
	cs := uint64(layout.ChunkSize)
	win := min(cs, readAheadWindow)
	if off%win != 0 || n >= win || !in.settledLocked(idx) {
		return nil
	}
	end := min(off+win, cs, size-idx*cs)
	if end <= off+n {
		return nil
	}
	w := in.fetchLocked(layout, idx, off, end)
	// Fetch the window after this one too, so that the next request is
	// under way while this window is read.
	nidx, noff := idx, off+win
	if noff >= cs {
		nidx, noff = idx+1, 0
	}
	if start := nidx*cs + noff; start < size && in.settledLocked(nidx) {
		nend := min(noff+win, cs, size-nidx*cs)
		in.fetchLocked(layout, nidx, noff, nend)
	}
	return w
}

// settledLocked reports whether chunk idx has no buffered or in-flight
// writes: only then does what the data server holds stay valid for a
// window (a write after the window is made drops the windows).
func (in *inode) settledLocked(idx uint64) bool {
	return in.dirty[idx] == nil && in.inflight[idx] == nil
}

// fetchLocked returns the window [off, end) of chunk idx, starting its
// fetch unless it is already there.
func (in *inode) fetchLocked(layout *weftv1.Layout, idx, off, end uint64) *raWindow {
	for _, w := range in.ra {
		if w.covers(idx, off, end-off) {
			return w
		}
	}
	w := &raWindow{idx: idx, off: off, n: end - off, done: make(chan struct{})}
	if len(in.ra) >= maxReadAheads {
		in.ra = in.ra[1:]
	}
	in.ra = append(in.ra, w)
	go func() {
		w.data, w.err = in.c.fetchChunk(in.c.bg, in.ino, layout, idx, off, int(end-off))
		close(w.done)
	}()
	return w
}

// dropWindowLocked forgets w once its last byte was read.
func (in *inode) dropWindowLocked(w *raWindow) {
	for i, x := range in.ra {
		if x == w {
			in.ra = append(in.ra[:i], in.ra[i+1:]...)
			return
		}
	}
}

// readPiece fills dst from chunk idx at chunk offset off, through a
// read-ahead window when there is or should be one.
func (in *inode) readPiece(ctx context.Context, layout *weftv1.Layout, size uint64, s span, dst []byte) error {
	in.mu.Lock()
	w := in.windowForLocked(layout, size, s.index, s.off, s.n)
	in.mu.Unlock()
	if w != nil {
		select {
		case <-w.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if w.err == nil {
			copy(dst, w.data[s.off-w.off:])
			if s.off+s.n == w.off+w.n {
				in.mu.Lock()
				in.dropWindowLocked(w)
				in.mu.Unlock()
			}
			return nil
		}
		in.mu.Lock()
		in.dropWindowLocked(w)
		in.mu.Unlock()
	}
	return in.c.readChunk(ctx, in.ino, layout, s.index, s.off, dst)
}
