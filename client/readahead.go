package client

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Read-ahead follows up to raStreams read streams per open inode (several
// readers of one file). A read that continues a stream (starts about where
// its last read ended, see continues: the kernel delivers reads a little
// out of order) adds to the bytes the stream read; any other read
// starts a new stream in place of the least recently used one, whose
// windows are dropped. The window is a power of two near an eighth of
// what the stream has read so far — nothing below raMinWindow, at most
// Config.ReadAheadBytes — so it doubles as a sequential reader goes on,
// while a reader that reads part of each record and skips the rest gets
// little read ahead past each part. A stream from the start of the file,
// while no other stream has begun since the file was opened (nothing says
// the reader skips), gets half of what it has read instead, as the
// kernel's read-ahead ramps: a whole-file reader reaches the largest
// window after twice its size instead of eight times, and a reader that
// skips pays for it once, with one window past its first part. When less
// than half a window is fetched ahead of the reader, the client fetches
// up to a whole window ahead, in pieces of at most raMaxPiece that never
// cross a chunk: the pieces of different chunks, and so of different
// chains, are in flight in parallel. A piece is dropped once its last
// byte is read.
const (
	raMinWindow = 128 << 10
	raMaxPiece  = 4 << 20
	raSlack     = 256 << 10
	raGrowth    = 8 // the window is about the stream's length / raGrowth
	raGrowth0   = 2 // the same for a file's first stream from its start, until a second begins
	raStreams   = 4 // streams followed per inode
)

// raStream is one read stream of an inode.
type raStream struct {
	next   uint64 // file offset where the stream's last read ended
	start  uint64 // file offset of the stream's first read
	seq    uint64 // bytes read by the stream
	end    uint64 // file offset up to which pieces were fetched
	window uint64 // current window
	used   uint64 // inode's read count at the stream's last read
}

// raState is the read-ahead state of an inode.
type raState struct {
	streams   []*raStream
	reads     uint64 // reads so far, to find the least recently used stream
	maxWindow uint64 // largest window since the inode was opened
	skipped   bool   // a second stream has begun since the file was opened by its first opener
	// limit is the largest window allowed so far (farScale), which the
	// number of windows kept follows.
	limit int64
}

// continues reports whether a read of [off, off+n) continues a stream
// whose reads so far end at next. The kernel sends a file's read-ahead as
// several requests at once, and they reach the client in any order: a
// read may come one request ahead of the stream's end (a request of its
// size not yet here), or one behind it (the one that came ahead moved the
// end), each give or take raSlack.
func continues(next, off, n uint64) bool {
	return off <= next+n+raSlack && off+2*n+raSlack >= next
}

// streamLocked returns the stream a read of [off, off+n) continues, or a
// new one in place of the least recently used.
func (in *inode) streamLocked(off, n uint64) *raStream {
	st := &in.raState
	st.reads++
	var lru *raStream
	for _, s := range st.streams {
		if continues(s.next, off, n) {
			s.seq += n
			s.next = max(s.next, off+n)
			s.used = st.reads
			return s
		}
		if lru == nil || s.used < lru.used {
			lru = s
		}
	}
	s := &raStream{next: off + n, seq: n, used: st.reads, start: off}
	if len(st.streams) > 0 {
		st.skipped = true
	}
	if len(st.streams) < raStreams {
		st.streams = append(st.streams, s)
		return s
	}
	keep := in.ra[:0]
	for _, w := range in.ra {
		if w.s != lru {
			keep = append(keep, w)
		} else {
			w.release()
		}
	}
	clear(in.ra[len(keep):])
	in.ra = keep
	*lru = *s
	return lru
}

// raWindow is one fetched (or being fetched) piece of a chunk. Its
// buffer comes from the pool of package wire and goes back there when
// the last reference is dropped: the
// inode's list of windows holds one, the fetch one until it is done, and
// every reader copying out of it one.
type raWindow struct {
	s    *raStream
	idx  uint64 // chunk index
	off  uint64 // chunk offset of data[0]
	n    uint64 // length of the piece
	data []byte // set when done
	done chan struct{}
	err  error
	buf  []byte // the pooled buffer (data, or unused after an error)
	refs atomic.Int32
	held *atomic.Int64 // the client's count of bytes in windows (Client.raHeld)
}

// release drops a reference to w, giving its buffer back with the last.
func (w *raWindow) release() {
	if w.refs.Add(-1) != 0 {
		return
	}
	w.held.Add(-int64(w.n))
	if w.buf != nil {
		wire.PutBuffer(w.buf)
		w.buf, w.data = nil, nil
	}
}

// growth returns the divisor of stream s's window (see raGrowth0).
func (st *raState) growth(s *raStream) uint64 {
	if s.start == 0 && !st.skipped {
		return raGrowth0
	}
	return raGrowth
}

// Far from the data servers a stream has at most one window in flight
// per round trip, so the window bounds its rate: 8 MiB per 20 ms is 400
// MB/s at most. The largest window therefore grows with the round trip
// of the data server a stream reads from, Config.ReadAheadBytes for
// each farRoundTrip of it, up to farMaxScale times and farMaxWindow:
// with the default, 32 MiB at 20 ms and 64 MiB at 40 ms or more. Near
// servers (a round trip under 2 farRoundTrip) leave it as it is.
const (
	farRoundTrip = 5 * time.Millisecond
	farMaxScale  = 8
	farMaxWindow = 256 << 20
)

// farScale is how many times Config.ReadAheadBytes a stream's window may
// reach when its data server is rt away (0: not known).
func farScale(rt time.Duration) int64 {
	return min(max(int64(rt/farRoundTrip), 1), farMaxScale)
}

// raWindowFor returns the window of a stream that has read seq bytes and
// grows by growth, capped to limit (0: read-ahead off).
func raWindowFor(seq, growth uint64, limit int64) uint64 {
	if limit <= 0 {
		return 0
	}
	w := seq / growth
	if w < raMinWindow {
		return 0
	}
	p := uint64(raMinWindow)
	for p*2 <= w {
		p *= 2
	}
	return min(p, uint64(limit))
}

// readAheadLocked records a read of file range [off, off+n) (the file
// being size bytes long) in the stream and fetches ahead of it as the
// window says. Called with in.mu held.
func (in *inode) readAheadLocked(layout *weftv1.Layout, size, off, n uint64) {
	limit := in.c.cfg.ReadAheadBytes
	if limit <= 0 {
		return
	}
	st := in.streamLocked(off, n)
	growth := in.raState.growth(st)
	w := raWindowFor(st.seq, growth, limit)
	if w*2 > uint64(limit) {
		// The stream has reached the configured limit: only now may the
		// data servers' round trip matter (no lookup on other reads).
		if ch := in.c.chains.get(chainFor(layout, (off+n)/uint64(layout.ChunkSize))); ch != nil {
			if far := farScale(in.c.chains.nearestRoundTrip(ch)); far > 1 {
				limit = max(limit, min(limit*far, farMaxWindow))
				in.raState.limit = max(in.raState.limit, limit)
				w = raWindowFor(st.seq, growth, limit)
			}
		}
	}
	if st.seq > n {
		in.openAheadLocked(layout, size, off+n)
		if w > 0 && in.c.localReads() {
			in.prefetchLocked(layout, off+n, min(size, off+n+w))
		}
	}
	st.window = w
	in.raState.maxWindow = max(in.raState.maxWindow, w)
	if w == 0 {
		return
	}
	start := max(st.end, off+n)
	if start >= size || start >= off+n+w/2 {
		return
	}
	target := min(size, off+n+w)
	cs := uint64(layout.ChunkSize)
	piece := min(w, raMaxPiece)
	p := start
	for p < target {
		idx := p / cs
		e := min(target, (idx+1)*cs, p+piece)
		if in.settledLocked(idx) && !in.mayReadLocallyLocked(layout, idx) {
			if !in.c.mayFetchAhead(e - p) {
				break // the next read goes on from here
			}
			in.fetchLocked(layout, st, idx, p-idx*cs, e-idx*cs)
		}
		p = e
	}
	st.end = p
}

// raBudgetWindows bounds the bytes of all read-ahead windows of a client
// together, in windows of Config.ReadAheadBytes (256 MiB with the
// default): windows are bounded per stream, and there may be many
// streams, far ones with larger windows (farScale).
const raBudgetWindows = 32

// raiseTo makes v at least x.
func raiseTo(v *atomic.Int64, x int64) {
	for cur := v.Load(); x > cur; cur = v.Load() {
		if v.CompareAndSwap(cur, x) {
			return
		}
	}
}

// mayFetchAhead reports whether a window of n more bytes fits the
// client's read-ahead budget. With nothing fetched, any window does, so
// that a budget smaller than a window still lets a reader read ahead.
func (c *Client) mayFetchAhead(n uint64) bool {
	held := c.raHeld.Load()
	return held == 0 || held+int64(n) <= c.raBudget
}

// dropReadAheadLocked forgets every window and the stream (after a write,
// a truncate, or at open: what the data servers hold may have changed).
func (in *inode) dropReadAheadLocked() {
	in.dropLocalLocked()
	in.dropWindowsLocked()
}

// dropWindowsLocked forgets every window and the stream.
func (in *inode) dropWindowsLocked() {
	for _, w := range in.ra {
		w.release()
	}
	in.ra = nil
	in.raState = raState{maxWindow: in.raState.maxWindow, skipped: in.raState.skipped, limit: in.raState.limit}
}

// settledLocked reports whether chunk idx has no buffered or in-flight
// writes: only then does what the data server holds stay valid for a
// window (a write after the window is made drops the windows).
func (in *inode) settledLocked(idx uint64) bool {
	return in.dirty[idx] == nil && in.inflight[idx] == nil
}

// maxWindowsLocked is how many windows an inode keeps: per stream, enough
// for one and a half of the largest window in pieces of the layout's size.
func (in *inode) maxWindowsLocked(layout *weftv1.Layout) int {
	limit := uint64(max(in.c.cfg.ReadAheadBytes, in.raState.limit, raMinWindow))
	piece := min(uint64(layout.ChunkSize), raMaxPiece, limit)
	return len(in.raState.streams) * int(min(2*limit/max(piece, 1)+4, 1024))
}

// fetchLocked starts fetching the window [off, end) of chunk idx.
func (in *inode) fetchLocked(layout *weftv1.Layout, st *raStream, idx, off, end uint64) {
	w := &raWindow{s: st, idx: idx, off: off, n: end - off, done: make(chan struct{}), held: &in.c.raHeld}
	w.refs.Store(2) // the list's and the fetch's
	raiseTo(&in.c.raPeak, in.c.raHeld.Add(int64(w.n)))
	if len(in.ra) >= in.maxWindowsLocked(layout) {
		in.ra[0].release()
		in.ra = in.ra[1:]
	}
	in.ra = append(in.ra, w)
	go func() {
		buf, err := in.c.readChunkOwned(in.c.bg, in.ino, layout, idx, off, int(end-off))
		w.buf = buf
		if err == nil {
			w.data = buf
		}
		w.err = err
		close(w.done)
		w.release()
	}()
}

// windowsForLocked returns windows that together cover chunk range
// [off, off+n) of chunk idx, in order; nil if they do not.
func (in *inode) windowsForLocked(idx, off, n uint64) []*raWindow {
	var ws []*raWindow
	for cur := off; cur < off+n; {
		var found *raWindow
		for _, w := range in.ra {
			if w.idx == idx && w.off <= cur && cur < w.off+w.n {
				found = w
				break
			}
		}
		if found == nil {
			return nil
		}
		ws = append(ws, found)
		cur = found.off + found.n
	}
	return ws
}

// dropWindowLocked forgets w.
func (in *inode) dropWindowLocked(w *raWindow) {
	for i, x := range in.ra {
		if x == w {
			in.ra = append(in.ra[:i], in.ra[i+1:]...)
			w.release()
			return
		}
	}
}

// windowView returns the bytes of span s from the one read-ahead window
// that holds them all, once fetched, and the function that lets go of
// them; a nil function if no window holds s or its fetch failed.
func (in *inode) windowView(ctx context.Context, s span) ([]byte, func()) {
	in.mu.Lock()
	ws := in.windowsForLocked(s.index, s.off, s.n)
	if len(ws) != 1 {
		in.mu.Unlock()
		return nil, nil
	}
	w := ws[0]
	w.refs.Add(1)
	in.mu.Unlock()
	select {
	case <-w.done:
	case <-ctx.Done():
		w.release()
		return nil, nil // readPiece reports it
	}
	if w.err != nil {
		w.release()
		return nil, nil
	}
	if s.off+s.n >= w.off+w.n {
		in.mu.Lock()
		in.dropWindowLocked(w)
		in.mu.Unlock()
	}
	return w.data[s.off-w.off : s.off-w.off+s.n], w.release
}

// readPiece fills dst from chunk idx at chunk offset off, from read-ahead
// windows when they cover it.
func (in *inode) readPiece(ctx context.Context, layout *weftv1.Layout, s span, dst []byte) error {
	if data, release, ok := in.localRead(ctx, layout, s, dst); ok {
		if len(data) > 0 && &data[0] != &dst[0] {
			copy(dst, data)
		}
		if release != nil {
			release()
		}
		return nil
	}
	in.mu.Lock()
	ws := in.windowsForLocked(s.index, s.off, s.n)
	for _, w := range ws {
		w.refs.Add(1)
	}
	in.mu.Unlock()
	if ws != nil {
		defer func() {
			for _, w := range ws {
				w.release()
			}
		}()
		ok := true
		for _, w := range ws {
			select {
			case <-w.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			ok = ok && w.err == nil
		}
		in.mu.Lock()
		for _, w := range ws {
			if !ok || s.off+s.n >= w.off+w.n {
				in.dropWindowLocked(w)
			}
		}
		in.mu.Unlock()
		if ok {
			for _, w := range ws {
				lo := max(s.off, w.off)
				hi := min(s.off+s.n, w.off+w.n)
				copy(dst[lo-s.off:hi-s.off], w.data[lo-w.off:])
			}
			return nil
		}
	}
	return in.c.readChunk(ctx, in.ino, layout, s.index, s.off, dst)
}
