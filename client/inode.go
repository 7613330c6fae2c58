package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// inode is the client's state of one open regular file, shared by every
// File of that inode opened through the same Client: the write-back
// buffer, the sends in flight, the size as this client knows it, and the
// failed background sends (wberr.go): their errors, reported once to
// each File's next write and next fsync or close, and the bytes they
// lost.
type inode struct {
	c   *Client
	ino uint64

	// commitMu orders length changes sent to the meta service (commits,
	// truncates): a commit that snapshot the length before a truncate
	// must not reach the meta service after it and grow the file back.
	commitMu sync.Mutex

	mu       sync.Mutex
	layout   *weftv1.Layout
	metaSize uint64 // file length as last heard from the meta service
	// metaMtimeNs is the mtime last heard from the meta service: fresh
	// attributes with another length or mtime mean someone changed the
	// file, and what this client read of it may be stale.
	metaMtimeNs int64
	attrGen     uint64 // bumps when metaSize is set by a commit or truncate
	dirty       map[uint64]*chunkBuf
	inflight    map[uint64]*sendOp // latest send per chunk index
	unsynced    map[uint64]uint64  // chunk index -> chain, written without sync since its chain's last SyncFile
	// syncAll: chunks of the file may have been written without sync by
	// an earlier open and forgotten (unsynced.go): the next durable flush
	// syncs every chain of the layout.
	syncAll bool
	errs    errSeq      // failed write-backs, reported once to each File (wberr.go)
	lost    []byteRange // bytes whose write-back failed, sorted, not overlapping

	localEnd     uint64 // end of the furthest write not yet committed
	writeSeq     uint64 // counts writes
	committedSeq uint64 // writeSeq covered by the last CommitWrite
	mtimeNs      int64  // time of the last write
	caller       *weftv1.Caller
	opens        int
	// pending is the create of a file made here under a delegation with
	// a layout from the grant, until the meta service has it: its first
	// commit goes with the create if that is not sent yet.
	pending *pendingCreate

	ra      []*raWindow // read-ahead windows, oldest first; cleared by writes
	raState raState     // the read-ahead stream
	local   localState  // chunks read in place (localread.go); cleared with the windows
}

// sendOp is one chunk buffer on its way to a data server. A send of a chunk
// waits for the previous send of the same chunk (prev), so the server
// applies writes to a chunk in the order they were made.
type sendOp struct {
	done  chan struct{}
	prev  *sendOp   // guarded by the inode's mutex; nil once this send is done
	buf   *chunkBuf // the bytes on their way; nil (and given back) once done, under the inode's mutex
	bytes int64
	err   error
}

func (in *inode) sizeLocked() uint64 { return max(in.metaSize, in.localEnd) }

func (in *inode) writtenLocked() bool { return in.writeSeq != in.committedSeq }

// startSendLocked hands buf (chunk idx) to a background sender. With
// sync, the last write of the buffer asks the data servers to make the
// chunk durable (on every live replica), which spares a SyncFile.
func (in *inode) startSendLocked(idx uint64, buf *chunkBuf, sync bool) *sendOp {
	// The server's copy is about to change: let go of it open in place
	// (its checksums would no longer match); it is opened again once the
	// send is done.
	in.dropWrittenLocked(idx)
	op := &sendOp{done: make(chan struct{}), prev: in.inflight[idx], buf: buf, bytes: buf.size}
	in.inflight[idx] = op
	layout := in.layout
	go in.send(op, layout, idx, buf, sync)
	return op
}

func (in *inode) send(op *sendOp, layout *weftv1.Layout, idx uint64, buf *chunkBuf, sync bool) {
	in.mu.Lock()
	prev := op.prev
	in.mu.Unlock()
	if prev != nil {
		<-prev.done
	}
	chain := chainFor(layout, idx)
	var err error
	// Small extents (scattered small writes) go together as writes of
	// pieces; large ones each as a write of its own, straight from its
	// buffer. The last request carries sync. failed is the extents not
	// stored: those of the request that failed and of the ones after it.
	var small, large, failed []extent
	for _, e := range buf.extents {
		if len(e.data) < minRoomyExtent && len(buf.extents) > 1 {
			small = append(small, e)
		} else {
			large = append(large, e)
		}
	}
	for i := 0; i < len(small); i += maxPiecesPerWrite {
		group := small[i:min(i+maxPiecesPerWrite, len(small))]
		if err == nil {
			last := sync && len(large) == 0 && i+len(group) == len(small)
			err = in.c.writeChunkPieces(in.c.bg, in.ino, layout, idx, group, last)
		}
		if err != nil {
			failed = append(failed, group...)
		}
	}
	for i, e := range large {
		if err == nil {
			err = in.c.writeChunk(in.c.bg, in.ino, layout, idx, e.off, e.data, sync && i == len(large)-1)
		}
		if err != nil {
			failed = append(failed, e)
		}
	}
	in.mu.Lock()
	base := idx * uint64(layout.GetChunkSize())
	for _, e := range buf.extents {
		// Stored (or about to be marked lost again below): a failed
		// send's bytes written again are no longer lost.
		in.clearLostLocked(base+e.off, base+e.end())
	}
	// Readers overlay the bytes of sends still in flight (overlayLocked):
	// they go back under the mutex, once nobody can reach them.
	buf.release() // the lean data path keeps what a server may still read
	op.buf, op.prev = nil, nil
	if in.inflight[idx] == op {
		delete(in.inflight, idx)
	}
	if err != nil {
		for _, e := range failed {
			// Sends of a chunk are ordered: a later send of these bytes,
			// written again meanwhile, clears them when it is stored.
			in.addLostLocked(base+e.off, base+e.end())
		}
		in.recordErrLocked(writeBackError(in.ino, idx, err))
		in.c.log.Error("write-back of buffered data failed; its bytes are lost: the next write, and the next fsync or close, of each open file reports it",
			"ino", in.ino, "chunk", idx, "err", err)
	} else if sync {
		// The synced write came after every earlier send of the chunk
		// (sends of a chunk are ordered): the chunk file is durable.
		delete(in.unsynced, idx)
	} else {
		in.unsynced[idx] = chain
	}
	in.mu.Unlock()
	if err != nil {
		in.c.noteLost(in.ino)
	}
	in.c.buffered.Add(-op.bytes)
	op.err = err
	close(op.done)
}

// write buffers p at file offset off (or at the end of the file as this
// client knows it, for appendMode) and returns the offset used.
func (in *inode) write(p []byte, off uint64, appendMode bool, caller *weftv1.Caller, seen *errCursor) (uint64, error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if seen != nil {
		if err := in.takeErrLocked(&seen.write); err != nil {
			return off, err
		}
	}
	if err := checkLayout(in.ino, in.layout); err != nil {
		return off, err
	}
	if appendMode {
		off = in.sizeLocked()
	}
	in.dropWindowsLocked()
	cs := uint64(in.layout.ChunkSize)
	for _, s := range spans(off, uint64(len(p)), cs) {
		buf := in.dirty[s.index]
		if buf == nil {
			buf = &chunkBuf{chunkSize: cs}
			in.dirty[s.index] = buf
		}
		in.c.buffered.Add(buf.write(s.off, p[s.bufOff:s.bufOff+s.n]))
		if buf.full(cs) {
			delete(in.dirty, s.index)
			in.startSendLocked(s.index, buf, false)
		}
	}
	in.clearLostLocked(off, off+uint64(len(p)))
	in.localEnd = max(in.localEnd, off+uint64(len(p)))
	in.writeSeq++
	if len(in.lost) > 0 && off+uint64(len(p)) > in.barrierLocked() {
		in.errs.pastAt = in.writeSeq
	}
	in.mtimeNs = time.Now().UnixNano()
	if caller != nil {
		in.caller = caller
	}
	return off, nil
}

// sendAll starts sending every buffered chunk and waits until all sends
// of this inode started so far are done. Errors of the sends are left in
// in.err. With sync, the last write of each chunk carries sync.
func (in *inode) sendAll(ctx context.Context, sync bool) error {
	in.mu.Lock()
	for idx, buf := range in.dirty {
		delete(in.dirty, idx)
		in.startSendLocked(idx, buf, sync)
	}
	ops := in.sendsLocked()
	in.mu.Unlock()
	return waitOps(ctx, ops)
}

// sendsLocked returns the sends under way (the latest of each chunk).
func (in *inode) sendsLocked() []*sendOp {
	ops := make([]*sendOp, 0, len(in.inflight))
	for _, op := range in.inflight {
		ops = append(ops, op)
	}
	return ops
}

// backgroundMinShare: a chunk goes out in the background only once it
// buffers at least this share of its size, so that scattered small writes
// gather into writes of many pieces instead of going out one by one.
const backgroundMinShare = 16

// sendOthers starts sending, without waiting, every buffered chunk that
// holds at least 1/backgroundMinShare of its size, but those that file
// range [off, off+n) touches (a writer is likely to go on writing them).
func (in *inode) sendOthers(off, n uint64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	cs := uint64(in.layout.GetChunkSize())
	if cs == 0 || len(in.dirty) == 0 {
		return
	}
	first, last := off/cs, (off+max(n, 1)-1)/cs
	for idx, buf := range in.dirty {
		if (idx >= first && idx <= last) || uint64(buf.size) < cs/backgroundMinShare {
			continue
		}
		delete(in.dirty, idx)
		in.startSendLocked(idx, buf, false)
	}
}

func waitOps(ctx context.Context, ops []*sendOp) error {
	for _, op := range ops {
		select {
		case <-op.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// read fills p from file offset off, clipped to the file's size; it
// returns the number of bytes read (0 at or past the end).
func (in *inode) read(ctx context.Context, p []byte, off uint64) (int, error) {
	sp, layout, n, ov, err := in.planRead(len(p), off)
	if err != nil || n == 0 {
		return 0, err
	}
	return int(n), in.readOverlaid(ctx, layout, sp, ov, p)
}

// readView is read, but where the range lies in one read-ahead window it
// returns that window's bytes instead of copying them into p, with the
// function that lets go of them (nil when the data is in p).
func (in *inode) readView(ctx context.Context, p []byte, off uint64) ([]byte, func(), error) {
	sp, layout, n, ov, err := in.planRead(len(p), off)
	if err != nil || n == 0 {
		return nil, nil, err
	}
	if len(sp) == 1 && ov == nil {
		s := sp[0]
		if v, release, ok := in.localRead(ctx, layout, s, p); ok {
			return v, release, nil
		}
		if v, release := in.windowView(ctx, s); release != nil {
			return v, release, nil
		}
		if s.n >= minViewRead {
			// Read into a pooled buffer and answer from it.
			buf, err := in.c.readChunkOwned(ctx, in.ino, layout, s.index, s.off, int(s.n))
			if err != nil {
				return nil, nil, err
			}
			return buf, func() { wire.PutBuffer(buf) }, nil
		}
	}
	return p[:n], nil, in.readOverlaid(ctx, layout, sp, ov, p)
}

// minViewRead is the least read that readView answers from a buffer of
// its own rather than copying into the caller's.
const minViewRead = 16 << 10

// planRead clips a read of want bytes at off to the file's size, splits
// it into chunk spans and starts read-ahead. n is 0 at or past the end of
// the file. Where a span overlaps this client's writes that no data
// server has acknowledged yet (buffered or in flight), ov holds copies of
// those bytes per span (nil: none anywhere), to lay over what the servers
// return: a read never waits for write-back.
func (in *inode) planRead(want int, off uint64) (sp []span, layout *weftv1.Layout, n uint64, ov [][]extent, err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if err := checkLayout(in.ino, in.layout); err != nil {
		return nil, nil, 0, nil, err
	}
	size, layout := in.sizeLocked(), in.layout
	if off >= size || want == 0 {
		return nil, nil, 0, nil, nil
	}
	n = min(uint64(want), size-off)
	sp = spans(off, n, uint64(layout.ChunkSize))
	for i, s := range sp {
		o := in.overlayLocked(s.index, s.off, s.off+s.n)
		if o != nil {
			if ov == nil {
				ov = make([][]extent, len(sp))
			}
			ov[i] = o
		}
		if len(in.lost) > 0 {
			base := s.index * uint64(layout.ChunkSize)
			if r, ok := in.lostInLocked(base+s.off, base+s.off+s.n, o, base); ok {
				return nil, nil, 0, nil, in.lostReadError(r)
			}
		}
	}
	in.readAheadLocked(layout, size, off, n)
	return sp, layout, n, ov, nil
}

// overlayLocked returns copies of the bytes in chunk range [off, end) of
// chunk idx that this client wrote and no data server has acknowledged:
// those of sends in flight, oldest first, then the buffered ones, so that
// laying them over a server's copy in order gives the newest bytes. nil
// when there are none.
func (in *inode) overlayLocked(idx, off, end uint64) []extent {
	var layers [][]extent
	if b := in.dirty[idx]; b != nil {
		layers = append(layers, b.extents)
	}
	for op := in.inflight[idx]; op != nil; op = op.prev {
		if op.buf != nil {
			layers = append(layers, op.buf.extents)
		}
	}
	var out []extent
	for i := len(layers) - 1; i >= 0; i-- { // oldest first
		for _, e := range layers[i] {
			lo, hi := max(e.off, off), min(e.end(), end)
			if lo < hi {
				out = append(out, extent{off: lo, data: append([]byte(nil), e.data[lo-e.off:hi-e.off]...)})
			}
		}
	}
	return out
}

// covers reports whether extents ov (in any order, overlapping or not)
// cover all of [off, end).
func covers(ov []extent, off, end uint64) bool {
	sorted := slices.SortedFunc(slices.Values(ov), func(a, b extent) int { return cmp.Compare(a.off, b.off) })
	for _, e := range sorted {
		if e.off > off {
			return false
		}
		off = max(off, e.end())
		if off >= end {
			return true
		}
	}
	return off >= end
}

// readOverlaid reads spans sp into p from the data servers, except those
// that ov covers completely, and lays ov over what was read.
func (in *inode) readOverlaid(ctx context.Context, layout *weftv1.Layout, sp []span, ov [][]extent, p []byte) error {
	if ov == nil {
		return in.readSpans(ctx, layout, sp, p)
	}
	var fetch []span
	for i, s := range sp {
		if !covers(ov[i], s.off, s.off+s.n) {
			fetch = append(fetch, s)
		}
	}
	if err := in.readSpans(ctx, layout, fetch, p); err != nil {
		return err
	}
	for i, s := range sp {
		for _, e := range ov[i] {
			copy(p[s.bufOff+(e.off-s.off):], e.data)
		}
	}
	return nil
}

// readSpans fills p with spans sp, in parallel when there are several.
func (in *inode) readSpans(ctx context.Context, layout *weftv1.Layout, sp []span, p []byte) error {
	if len(sp) == 1 {
		s := sp[0]
		return in.readPiece(ctx, layout, s, p[s.bufOff:s.bufOff+s.n])
	}
	errs := make([]error, len(sp))
	var wg sync.WaitGroup
	for i, s := range sp {
		wg.Go(func() {
			errs[i] = in.readPiece(ctx, layout, s, p[s.bufOff:s.bufOff+s.n])
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// writeChunk sends one piece of a chunk to the head of its chain.
func (c *Client) writeChunk(ctx context.Context, ino uint64, l *weftv1.Layout, idx, off uint64, data []byte, sync bool) error {
	return c.sendChunkWrite(ctx, ino, l, idx, fmt.Sprintf("write chunk %d of file %d", idx, ino),
		&weftv1.WriteChunkRequest{Offset: off, Data: data, Sync: sync})
}

// sendChunkWrite sends req, a write to chunk idx of file ino with its
// offset, data and sync set, to the head of the chunk's chain (what names
// it in errors); the rest of the request is filled in here.
func (c *Client) sendChunkWrite(ctx context.Context, ino uint64, l *weftv1.Layout, idx uint64, what string, req *weftv1.WriteChunkRequest) error {
	return c.sendChunkWritePieces(ctx, ino, l, idx, what, req, nil)
}

// sendChunkWritePieces is sendChunkWrite of a write of pieces whose bytes
// are pieces (req.Data unset) when pieces is not nil.
func (c *Client) sendChunkWritePieces(ctx context.Context, ino uint64, l *weftv1.Layout, idx uint64, what string, req *weftv1.WriteChunkRequest, pieces [][]byte) error {
	chain := chainFor(l, idx)
	req.Chunk, req.ChainId, req.ChunkSize = &weftv1.ChunkID{Ino: ino, Index: idx}, chain, l.ChunkSize
	return c.onChain(ctx, chain, what, func(ctx context.Context, dc dataServer, version uint64) error {
		req.ChainVersion = version // attempts run one after another
		var err error
		if pieces != nil {
			_, err = dc.WritePieces(ctx, req, pieces)
		} else {
			_, err = dc.WriteChunk(ctx, req)
		}
		return err
	})
}

// maxPiecesPerWrite bounds the pieces of one chunk write.
const maxPiecesPerWrite = 1024

// writeChunkPieces sends extents of one chunk to the head of its chain as
// one write of pieces (one RPC, one chunk version).
func (c *Client) writeChunkPieces(ctx context.Context, ino uint64, l *weftv1.Layout, idx uint64, extents []extent, sync bool) error {
	offs := make([]uint64, len(extents))
	lens := make([]uint32, len(extents))
	pieces := make([][]byte, len(extents))
	for i, e := range extents {
		offs[i], lens[i], pieces[i] = e.off, uint32(len(e.data)), e.data
	}
	return c.sendChunkWritePieces(ctx, ino, l, idx, fmt.Sprintf("write %d pieces of chunk %d of file %d", len(extents), idx, ino),
		&weftv1.WriteChunkRequest{Offset: weftv1.PiecesOffset, Sync: sync, PieceOffsets: offs, PieceLengths: lens}, pieces)
}

// errNotRegular is returned for data operations on a File that is not a
// regular file.
var errNotRegular = fmt.Errorf("not a regular file: %w", syscall.EINVAL)
