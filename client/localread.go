package client

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/weft-fs/weft/data/chunk"
	"github.com/weft-fs/weft/internal/pagecache"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Reads in place (see internal/wire/localread.go for the protocol).
//
// A chunk whose chain has a serving member on a data server of this host
// is read straight from that server's file: the client asks the server
// once for the file (a descriptor, the chunk's length and its block
// checksums), then answers reads with pread from it after checking the
// checksums of the blocks they touch, so a read costs no request to the
// server and no copy through it. Read-ahead opens the chunks ahead of a
// sequential reader instead of fetching them.
//
// An open chunk is used while its chain is at the version it was opened
// under and its server's lease runs (the server says how long it is sure
// to be serving; the lease is renewed in the background), and until a
// write of this client to it, a truncate, or an open of the file drops
// it (close-to-open, as for read-ahead), and at the file's last close. An
// inode keeps at most maxLocalChunks (the least recently read go first),
// the client at most maxLocalOpen. A block whose checksum does not match
// (a write from another client since, or a bad copy) makes the client
// open the chunk again with the server checking the whole of it (a bad
// copy is then reported, repaired if it can be, and refused with EIO); a
// second mismatch, or any failure, sends the chunk's reads through the
// servers for localRetryAfter.

// maxLocalChunks bounds the chunks an inode keeps open in place.
const maxLocalChunks = 1024

// maxLocalOpen bounds the chunks a client keeps open in place (each a
// descriptor): 8,192, or half the process's descriptor limit if that is
// less (Go raises the soft limit to the hard one at start).
var maxLocalOpen = localOpenBound()

// localOpenBound returns maxLocalOpen for this process.
func localOpenBound() int64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur/2 >= 8192 {
		return 8192
	}
	return int64(max(lim.Cur/2, 64))
}

// localRetryAfter is how long a chunk that could not be read in place is
// read through its server before the client tries again.
const localRetryAfter = time.Second

// localChunk is a chunk of a data server on this host, open in place.
type localChunk struct {
	idx     uint64
	chain   uint64
	version uint64       // chain version it was opened under
	w       *wire.Client // its data server's
	// fileSize is the file's length as the client knew it when the
	// chunk was opened.
	fileSize uint64
	c        *Client
	// Opened is the chunk's file (read-only; nil for a missing chunk)
	// and what the format says of where its blocks are.
	chunk.Opened
	refs atomic.Int32 // the inode's list and each reader
	used uint64       // localState.tick at its last read
	// advised is how far into the chunk the kernel was asked to read
	// the file into its cache (prefetchLocked).
	advised int64
	// inMemory is set when the file is on a file system that keeps its
	// files in memory (tmpfs): nothing to prefetch.
	inMemory bool
}

// release drops a reference, closing the file with the last.
func (lc *localChunk) release() {
	if lc.refs.Add(-1) == 0 && lc.File != nil {
		lc.File.Close()
		lc.File = nil
		lc.c.localOpen.Add(-1)
	}
}

// localState is an inode's chunks read in place.
type localState struct {
	chunks  map[uint64]*localChunk   // by chunk index
	gen     uint64                   // bumps when chunks are dropped (opens racing with a drop are not kept)
	tick    uint64                   // counts reads, for localChunk.used
	avoid   map[uint64]uint64        // chunk index -> unix nanos until which it is read through the server
	pending map[uint64]chan struct{} // opens under way, closed when done
	// adviseTo is the file offset up to which the last sequential read
	// wanted the page cache filled (prefetchLocked): a chunk opened ahead
	// is prefetched up to there when its open completes.
	adviseTo uint64
}

// localReads reports whether this client reads in place at all.
func (c *Client) localReads() bool {
	return !c.cfg.NoLocalReads && wire.LocalReadsWanted() && c.chains.wrap == nil
}

// LocalReadBytes is the number of bytes read in place so far.
func (c *Client) LocalReadBytes() uint64 { return c.localBytes.Load() }

// localMember returns a serving member of ch whose data server may be on
// this host, with its lean data path client; nil if none.
func (t *chainTable) localMember(ch *weftv1.Chain) (*weftv1.ChainMember, *wire.Client) {
	for _, m := range ch.Members {
		if !serving(m) || m.WireAddress == "" {
			continue
		}
		if w := t.wireClient(m.WireAddress); w.MaybeLocal() {
			return m, w
		}
	}
	return nil, nil
}

// mayReadLocallyLocked reports whether chunk idx will likely be read in
// place: read-ahead fetches nothing for it. It does not open the chunk:
// openAheadLocked and the open around a reader's first read open chunks
// a round per data server. Opening here, one chunk at a time, got ahead
// of both once a file's first stream had a window from its first read
// (raGrowth0): the reader's first read then found its chunk opening, so
// nothing was opened around it, and every chunk cost a round trip of
// its own. Called with in.mu held.
func (in *inode) mayReadLocallyLocked(layout *weftv1.Layout, idx uint64) bool {
	_, _, ok := in.localSourceLocked(layout, idx)
	return ok
}

// localSourceLocked returns the chain of chunk idx and the data server
// of this host to read it from in place; ok is false when it is not to be
// read in place. Called with in.mu held.
func (in *inode) localSourceLocked(layout *weftv1.Layout, idx uint64) (ch *weftv1.Chain, w *wire.Client, ok bool) {
	c := in.c
	if !c.localReads() || in.avoidedLocked(idx) || c.localOpen.Load() >= maxLocalOpen {
		return nil, nil, false
	}
	if ch = c.chains.get(chainFor(layout, idx)); ch == nil {
		return nil, nil, false
	}
	m, w := c.chains.localMember(ch)
	return ch, w, m != nil
}

// localAhead is how far ahead of a sequential reader chunks are opened
// in place: far enough that the open (a round trip to the server) is
// done before the reader gets there, whatever the read-ahead window.
const localAhead = 8 << 20

// openAheadLocked opens in place the chunks of the localAhead bytes from
// file offset from (a sequential reader's next read) that are not open
// yet. Called with in.mu held.
func (in *inode) openAheadLocked(layout *weftv1.Layout, size, from uint64) {
	if !in.c.localReads() {
		return
	}
	cs := uint64(layout.ChunkSize)
	end := min(size, from+localAhead)
	// Chunks are opened in bursts: none while those of the next
	// localAhead/4 are open or opening, then all up to localAhead, so
	// that each data server gets several opens in one round.
	burst := false
	for idx := from / cs; idx*cs < min(end, from+localAhead/4); idx++ {
		if in.local.chunks[idx] == nil && in.local.pending[idx] == nil {
			burst = true
			break
		}
	}
	if !burst {
		return
	}
	in.openRangeLocked(layout, from/cs, (end+cs-1)/cs, noChunk)
}

// noChunk is a chunk index no file has.
const noChunk = ^uint64(0)

// openRangeLocked opens ahead, in the background, the chunks with index
// in [first, last) but skip that are neither open nor opening nor being
// written by this client and have a data server on this host: those of
// one server in one round of requests. Called with in.mu held.
func (in *inode) openRangeLocked(layout *weftv1.Layout, first, last, skip uint64) {
	var groups map[*wire.Client][]*localOpening
	for idx := first; idx < last; idx++ {
		if idx == skip || in.local.chunks[idx] != nil || in.local.pending[idx] != nil || in.sendingLocked(idx) {
			continue
		}
		ch, w, ok := in.localSourceLocked(layout, idx)
		if !ok {
			continue
		}
		if groups == nil {
			groups = make(map[*wire.Client][]*localOpening)
		}
		op := in.startLocalOpenLocked(layout, ch, w, idx, true)
		if start := idx * uint64(layout.ChunkSize); in.local.adviseTo > start {
			// The reader's window reaches into it: the server reads
			// that part in while it opens the chunk.
			op.want = span{index: idx, n: min(in.local.adviseTo-start, uint64(layout.ChunkSize))}
		}
		groups[w] = append(groups[w], op)
	}
	for w, ops := range groups {
		go in.openAheadTogether(w, ops)
	}
}

// openAroundChunks is the most chunks a file may have for a reader that
// opened one of them in place on demand (a random reader) to have all the
// others opened in the background, so no later read waits for an open: a
// 512 MiB file of 1 MiB chunks, a descriptor each.
const openAroundChunks = 512

// openAroundLocked opens in place, in the background, the other chunks
// of a file of at most openAroundChunks chunks that are not open yet,
// those of one data server in one round: a reader that had to open a
// chunk on demand (it reads somewhere read-ahead did not lead it, a
// random reader) would otherwise wait for a round trip at the first read
// of each chunk. An open costs the server one descriptor and the chunk's
// checksums (on a cold disk, a small read each), no data. They count as
// opened ahead: the part a sequential reader's window covers when one
// completes is prefetched. A sequential reader gains too (its first read
// is an open on demand): with every chunk open early, prefetches never
// wait for an open. Called with in.mu held.
func (in *inode) openAroundLocked(layout *weftv1.Layout, idx uint64) {
	cs := uint64(layout.ChunkSize)
	size := in.sizeLocked()
	n := (size + cs - 1) / cs
	if n > openAroundChunks || len(in.local.chunks)+len(in.local.pending) >= int(n) {
		return
	}
	in.openRangeLocked(layout, 0, n, idx)
}

// avoidedLocked reports whether chunk idx is read through the server for
// now.
func (in *inode) avoidedLocked(idx uint64) bool {
	until, ok := in.local.avoid[idx]
	return ok && time.Now().UnixNano() < int64(until)
}

// avoidLocal makes chunk idx go through the server for a while.
func (in *inode) avoidLocal(idx uint64) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.avoidLocalLocked(idx)
}

// avoidLocalLocked is avoidLocal with in.mu held.
func (in *inode) avoidLocalLocked(idx uint64) {
	if in.local.avoid == nil {
		in.local.avoid = make(map[uint64]uint64)
	}
	in.local.avoid[idx] = uint64(time.Now().Add(localRetryAfter).UnixNano())
}

// dropLocalLocked lets go of every open chunk (with the read-ahead
// windows: after a write, a truncate, at open and at the last close).
// Opens under way are not kept when they finish.
func (in *inode) dropLocalLocked() {
	for _, lc := range in.local.chunks {
		lc.release()
	}
	clear(in.local.chunks)
	in.local.gen++
	in.local.avoid = nil
	in.local.pending = nil
	in.local.adviseTo = 0
}

// sendingLocked reports whether writes of this client to chunk idx are
// on their way to the data servers (the server's copy is changing).
func (in *inode) sendingLocked(idx uint64) bool {
	return in.inflight[idx] != nil
}

// dropWrittenLocked forgets chunk idx and an open of it under way: a
// send of this client's writes changes it.
func (in *inode) dropWrittenLocked(idx uint64) {
	if lc := in.local.chunks[idx]; lc != nil {
		in.dropChunkLocked(lc)
	}
	delete(in.local.pending, idx)
}

// dropLeastUsedLocked forgets the quarter of the open chunks read
// longest ago: one pass over the list per maxLocalChunks/4 opens, not one
// per open (a sequential reader of a large file opens a chunk per chunk
// size it reads, and passed the bound long ago).
func (in *inode) dropLeastUsedLocked() {
	all := make([]*localChunk, 0, len(in.local.chunks))
	for _, lc := range in.local.chunks {
		all = append(all, lc)
	}
	slices.SortFunc(all, func(a, b *localChunk) int { return cmp.Compare(a.used, b.used) })
	for _, lc := range all[:max(len(all)/4, 1)] {
		in.dropChunkLocked(lc)
	}
}

// dropChunkLocked forgets lc.
func (in *inode) dropChunkLocked(lc *localChunk) {
	if in.local.chunks[lc.idx] == lc {
		delete(in.local.chunks, lc.idx)
		lc.release()
	}
}

// findLocalLocked returns the open chunk idx if it is still good to read
// from chain ch at its current version; one that is not is dropped.
func (in *inode) findLocalLocked(idx uint64, ch *weftv1.Chain) *localChunk {
	lc := in.local.chunks[idx]
	if lc == nil {
		return nil
	}
	if lc.chain == ch.Id && lc.version == ch.Version && lc.fileSize == in.sizeLocked() && lc.w.LeaseFresh(in.c.bg) {
		return lc
	}
	// A new chain version, an expired lease, or a length another client
	// committed since (a reader following a growing file must see what
	// was appended): open it again.
	in.dropChunkLocked(lc)
	return nil
}

// openLocalLocked starts opening chunk idx in place from w's server (a
// member of ch) and returns the channel closed when it is done; the
// chunk is then in the inode's list, unless the open failed or the list
// was dropped meanwhile.
//
// With ahead (opened ahead of a sequential reader), the part of the
// chunk the reader's read-ahead window already covers is prefetched
// (prefetchLocked).
func (in *inode) openLocalLocked(layout *weftv1.Layout, ch *weftv1.Chain, w *wire.Client, idx uint64, verify, ahead bool, want span) chan struct{} {
	op := in.startLocalOpenLocked(layout, ch, w, idx, ahead)
	op.want = want
	go func() {
		ctx, cancel := context.WithTimeout(in.c.bg, localOpenTimeout)
		defer cancel()
		opened, err := w.OpenChunk(ctx, op.request(in.ino), verify)
		in.finishLocalOpen(op, opened, err)
	}()
	return op.done
}

// localOpening is an open of a chunk in place under way.
type localOpening struct {
	layout   *weftv1.Layout
	ch       *weftv1.Chain // the chain, at the version the open asks for
	w        *wire.Client
	idx      uint64
	chain    uint64
	gen      uint64 // localState.gen when it started
	fileSize uint64 // the file's length as the client knew it then
	ahead    bool
	want     span          // the part of the chunk the reader reads first, if known
	done     chan struct{} // in localState.pending while under way
}

// request is the open's request for a chunk of file ino.
func (op *localOpening) request(ino uint64) *weftv1.ReadChunkRequest {
	return &weftv1.ReadChunkRequest{Chunk: &weftv1.ChunkID{Ino: ino, Index: op.idx}, ChainId: op.chain, ChainVersion: op.ch.Version,
		Offset: op.want.off, Length: uint32(min(op.want.n, math.MaxUint32))}
}

// startLocalOpenLocked records an open of chunk idx from w's server (a
// member of ch) as under way; finishLocalOpen ends it.
func (in *inode) startLocalOpenLocked(layout *weftv1.Layout, ch *weftv1.Chain, w *wire.Client, idx uint64, ahead bool) *localOpening {
	if in.local.pending == nil {
		in.local.pending = make(map[uint64]chan struct{})
	}
	op := &localOpening{layout: layout, ch: ch, w: w, idx: idx, chain: chainFor(layout, idx),
		gen: in.local.gen, fileSize: in.sizeLocked(), ahead: ahead, done: make(chan struct{})}
	in.local.pending[idx] = op.done
	return op
}

// openAheadTogether opens chunks opened ahead of a reader, those of one
// data server in one round of requests (wire.Client.OpenChunks).
func (in *inode) openAheadTogether(w *wire.Client, ops []*localOpening) {
	ctx, cancel := context.WithTimeout(in.c.bg, localOpenTimeout)
	defer cancel()
	reqs := make([]*weftv1.ReadChunkRequest, len(ops))
	for i, op := range ops {
		reqs[i] = op.request(in.ino)
	}
	outs, errs := w.OpenChunks(ctx, reqs)
	for i, op := range ops {
		in.finishLocalOpen(op, outs[i], errs[i])
	}
}

// finishLocalOpen ends op with its outcome: the chunk goes into the
// inode's list, unless the open failed or the list was dropped meanwhile.
func (in *inode) finishLocalOpen(op *localOpening, opened *wire.LocalChunk, err error) {
	defer close(op.done)
	c, idx := in.c, op.idx
	in.mu.Lock()
	defer in.mu.Unlock()
	current := in.local.gen == op.gen && in.local.pending[idx] == op.done && !in.sendingLocked(idx)
	if current {
		delete(in.local.pending, idx)
	}
	if err != nil {
		if isCode(err, codes.FailedPrecondition) {
			go c.chains.refreshIfStale(c.bg, op.chain, op.ch.Version)
		} else if in.local.gen == op.gen {
			in.avoidLocalLocked(idx) // read through the server for a while
		}
		return
	}
	lc := &localChunk{idx: idx, chain: op.chain, version: op.ch.Version, w: op.w, c: c, fileSize: op.fileSize,
		Opened: opened.Opened}
	if lc.File != nil {
		c.localOpen.Add(1)
		lc.inMemory = pagecache.InMemory(lc.File)
	}
	lc.refs.Store(1) // the list's
	if !current {
		lc.release() // dropped meanwhile (a write, a truncate): may be older than what readers must see
		return
	}
	if start := idx * uint64(op.layout.ChunkSize); op.ahead && lc.File != nil && !lc.inMemory && in.local.adviseTo > start {
		// The reader's window already reaches into it.
		if hi := min(int64(in.local.adviseTo-start), lc.Length); hi > 0 {
			lc.advised = hi
			lc.refs.Add(1)
			runPrefetches([]prefetch{{lc, 0, hi}})
		}
	}
	if old := in.local.chunks[idx]; old != nil {
		in.dropChunkLocked(old) // the verified open replaces it
	}
	if len(in.local.chunks) >= maxLocalChunks {
		in.dropLeastUsedLocked()
	}
	if in.local.chunks == nil {
		in.local.chunks = make(map[uint64]*localChunk)
	}
	in.local.tick++
	lc.used = in.local.tick
	in.local.chunks[idx] = lc
}

// localOpenTimeout bounds opening a chunk in place.
const localOpenTimeout = 5 * time.Second

// localChunkFor returns chunk idx open in place, with a reference for
// the caller; nil if it cannot be read in place. With verify it is
// opened anew, the server checking all of it first. want is the span
// the caller reads: a chunk opened for it has the server read it in
// meanwhile.
func (in *inode) localChunkFor(ctx context.Context, layout *weftv1.Layout, idx uint64, verify bool, want span) *localChunk {
	c := in.c
	chain := chainFor(layout, idx)
	for range 3 {
		ch := c.chains.get(chain)
		if ch == nil {
			return nil
		}
		in.mu.Lock()
		if in.avoidedLocked(idx) || in.sendingLocked(idx) {
			// Writes of this client to the chunk are on their way: the
			// server's copy is changing, read through it. Writes only
			// buffered leave it as it is: it is read in place and the
			// reader lays them over it (planRead's overlay).
			in.mu.Unlock()
			return nil
		}
		done := in.local.pending[idx]
		if done == nil {
			if lc := in.findLocalLocked(idx, ch); lc != nil {
				if !verify {
					in.local.tick++
					lc.used = in.local.tick
					lc.refs.Add(1)
					in.mu.Unlock()
					return lc
				}
				in.dropChunkLocked(lc)
			}
			m, w := c.chains.localMember(ch)
			if m == nil || c.localOpen.Load() >= maxLocalOpen {
				in.mu.Unlock()
				return nil
			}
			done = in.openLocalLocked(layout, ch, w, idx, verify, false, want)
			if !verify {
				in.openAroundLocked(layout, idx)
			}
			verify = false
		}
		in.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// localRead reads span s in place when it can: the bytes, and the
// function that lets go of them (nil when they are in p, which holds s.n
// bytes); ok is false when the read must go through a server. The blocks
// the span touches are read whole (into a pooled buffer, or p when the
// span is block-aligned) and checked.
func (in *inode) localRead(ctx context.Context, layout *weftv1.Layout, s span, p []byte) (data []byte, release func(), ok bool) {
	if !in.c.localReads() {
		return nil, nil, false
	}
	for attempt := range 2 {
		lc := in.localChunkFor(ctx, layout, s.index, attempt > 0, s)
		if lc == nil {
			break
		}
		data, release, ok := lc.read(s, p)
		if !ok {
			// The copy did not match its checksums: open it again.
			in.mu.Lock()
			in.dropChunkLocked(lc)
			in.mu.Unlock()
		}
		lc.release()
		if ok {
			in.c.localBytes.Add(s.n)
			return data, release, true
		}
	}
	in.avoidLocal(s.index)
	return nil, nil, false
}

// read reads span s of the chunk, verified; ok is false when the bytes
// do not match their checksums (or the file is shorter than it was).
func (lc *localChunk) read(s span, p []byte) (data []byte, release func(), ok bool) {
	end := min(int64(s.off+s.n), lc.Length)
	if int64(s.off) >= end {
		clear(p[:s.n])
		return p[:s.n], nil, true
	}
	from := int64(s.off) / chunk.BlockSize * chunk.BlockSize
	to := min((end+chunk.BlockSize-1)/chunk.BlockSize*chunk.BlockSize, lc.Length)
	var buf []byte
	if from == int64(s.off) && to == end && int64(len(p)) >= to-from {
		buf = p[:to-from]
	} else {
		buf = wire.GetBuffer(int(to - from))
		release = func() { wire.PutBuffer(buf) }
	}
	if !lc.ReadVerified(buf, from) {
		// Cut short under us, or damaged: the server path says what is
		// there.
		if release != nil {
			release()
		}
		return nil, nil, false
	}
	data = buf[int64(s.off)-from : end-from]
	if end == int64(s.off+s.n) {
		return data, release, true
	}
	// The span reaches past the chunk's end: zeros there, in p.
	n := copy(p, data)
	clear(p[n:s.n])
	if release != nil {
		release()
	}
	return p[:s.n], nil, true
}
