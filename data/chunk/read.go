package chunk

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/weft-fs/weft/internal/pagecache"
)

// blockPool holds BlockSize buffers for read-modify-write of partial blocks.
var blockPool = sync.Pool{New: func() any { return new([BlockSize]byte) }}

// headPool holds buffers for a whole head.
var headPool = sync.Pool{New: func() any { return new([headSize]byte) }}

// readCopy reads the e.n bytes of block b's copy e into buf, checked
// against its checksum.
func (t *Target) readCopy(f *chunkFile, b int64, e entry, buf []byte) error {
	m, err := f.file.ReadAt(buf[:e.n], slotOff(b, e.slot))
	if err != nil && err != io.EOF {
		return t.ioError(fmt.Sprintf("read %v", f.key.id), err)
	}
	clear(buf[m:e.n]) // past the end of the file: zeros, as a hole
	return t.checkBlock(f, b, e, buf[:e.n], int64(m))
}

// checkBlock checks the bytes of block b's copy e against its checksum;
// read is how many of them the file held (the rest read as zeros).
func (t *Target) checkBlock(f *chunkFile, b int64, e entry, data []byte, read int64) error {
	got := crc32.Checksum(data, castagnoli)
	switch {
	case got == e.sum:
		return nil
	case read < e.n:
		return t.corrupt(&CorruptionError{Target: t.dir, Chunk: f.key.id, Block: b, Truncated: true,
			Length: b*BlockSize + read, Want: b*BlockSize + e.n})
	}
	return t.corrupt(&CorruptionError{Target: t.dir, Chunk: f.key.id, Block: b, Stored: e.sum, Computed: got})
}

// readBlocks reads buf from the chunk starting at block first (buf is
// whole blocks, except that it may end at the chunk's end) and checks
// every block against its checksum. Blocks whose copies sit next to each
// other in the file are read together, a segment at a time, each checked
// right after it is read while its bytes are in this core's cache.
func (t *Target) readBlocks(f *chunkFile, buf []byte, first int64) error {
	last := first + nblocks(int64(len(buf))) - 1
	for b := first; b <= last; {
		if err := t.damagedError(f, b); err != nil {
			return err
		}
		i := f.cur(b)
		if i < 0 {
			clear(buf[(b-first)*BlockSize : min((b-first+1)*BlockSize, int64(len(buf)))])
			b++
			continue
		}
		e := f.ents[b][i]
		if avail := min(BlockSize, int64(len(buf))-(b-first)*BlockSize); e.n > avail {
			// A copy counting bytes past the chunk's end (its length was
			// cut since, and a crash kept the older entry): check it
			// whole, keep what is inside.
			tmp := blockPool.Get().(*[BlockSize]byte)
			err := t.readCopy(f, b, e, tmp[:])
			copy(buf[(b-first)*BlockSize:], tmp[:avail])
			blockPool.Put(tmp)
			if err != nil {
				return err
			}
			b++
			continue
		}
		// A run of whole copies in one slot, one after the other.
		end := b + 1
		for end <= last && (end-b)*BlockSize < ioSegment {
			if f.ents[end-1][f.cur(end-1)].n != BlockSize {
				break
			}
			if j := f.cur(end); j < 0 || f.ents[end][j].slot != e.slot || f.damaged[end] {
				break
			}
			end++
		}
		lo := (b - first) * BlockSize
		hi := min((end-1-first)*BlockSize+f.ents[end-1][f.cur(end-1)].n, int64(len(buf)))
		m, err := f.file.ReadAt(buf[lo:hi], slotOff(b, e.slot))
		if err != nil && err != io.EOF {
			return t.ioError(fmt.Sprintf("read %v", f.key.id), err)
		}
		clear(buf[lo+int64(m) : hi]) // past the end of the file: zeros, as a hole
		for blk := b; blk < end; blk++ {
			ce := f.ents[blk][f.cur(blk)]
			bo := (blk - first) * BlockSize
			if err := t.checkBlock(f, blk, ce, buf[bo:bo+ce.n], min(max(lo+int64(m)-bo, 0), ce.n)); err != nil {
				return err
			}
			// Bytes past the copy's count read as zeros.
			clear(buf[bo+ce.n : min(bo+BlockSize, int64(len(buf)))])
		}
		b = end
	}
	return nil
}

func (t *Target) corrupt(e *CorruptionError) error {
	t.store.log.Error("chunk checksum mismatch: data on disk is corrupt",
		"ino", e.Chunk.Ino, "index", e.Chunk.Index, "target", e.Target, "block", e.Block,
		"stored", fmt.Sprintf("%08x", e.Stored), "computed", fmt.Sprintf("%08x", e.Computed), "missing", e.Missing,
		"header", e.Header, "truncated", e.Truncated)
	return e
}

// Read returns up to length bytes of the chunk from offset off, verifying
// the checksum of every block touched. The result is shorter than length
// (possibly empty) where the chunk ends or does not exist: the rest reads
// as zeros. A checksum mismatch fails with a *CorruptionError (wrapping
// syscall.EIO), never with wrong data.
func (t *Target) Read(id ID, off int64, length int) ([]byte, error) {
	data, _, err := t.ReadInto(id, off, length, nil)
	return data, err
}

// ReadInto is Read into a buffer of alloc (which need not be zeroed; nil:
// a new one): data is the part of buf asked for. Only the blocks the range
// touches are read and verified. buf is nil when nothing was read; else
// the caller owns it (and may give it back to where alloc took it from)
// even when err is set.
func (t *Target) ReadInto(id ID, off int64, length int, alloc func(n int) []byte) (data, buf []byte, err error) {
	if err := checkRange(id, off, length, MaxChunkSize); err != nil {
		return nil, nil, fmt.Errorf("read from target %s: %w", t.dir, err)
	}
	if length == 0 {
		return nil, nil, nil
	}
	defer t.chunkLocks.lock(id, false)()
	f, err := t.openChunk(id, false)
	if err != nil || f == nil {
		return nil, nil, err
	}
	defer t.store.files.release(f)
	if err := t.check(f); err != nil {
		return nil, nil, err
	}
	if off >= f.size() {
		return nil, nil, nil
	}
	end := min(off+int64(length), f.size())
	first := off / BlockSize
	alignedStart := first * BlockSize
	alignedEnd := min(((end-1)/BlockSize+1)*BlockSize, f.size())
	if alloc == nil {
		buf = make([]byte, alignedEnd-alignedStart)
	} else {
		buf = alloc(int(alignedEnd - alignedStart))
	}
	if alignedEnd-alignedStart >= minReadIn {
		t.readInCold(f, alignedStart, alignedEnd)
	}
	if err := t.readBlocks(f, buf, first); err != nil {
		return nil, buf, err
	}
	return buf[off-alignedStart : end-alignedStart], buf, nil
}

// minReadIn is the least read for which a cold range is first read into
// the page cache in large folios (readInCold).
const minReadIn = 128 << 10

// readInOff is set once the kernel turned out to lack MADV_POPULATE_READ.
var readInOff atomic.Bool

// readInCold reads bytes [lo, hi) of the chunk's slot A into the page
// cache in large folios when they are not there yet, before a read
// copies them out: the kernel's own read-ahead of a file opened afresh
// (every chunk read once is one) reads single pages, which this
// machine's disk served at a third of the speed (see pagecache). Cold
// 64 MiB reads through the servers (--local-reads=false) went from 1,158
// to 1,336 MB/s with one reader and from 1,579 to 1,758 with four. A
// target on a tmpfs has nothing to read in.
func (t *Target) readInCold(f *chunkFile, lo, hi int64) {
	osf := f.file.OS()
	if t.inMemory || readInOff.Load() || osf == nil {
		return
	}
	t.populate(int(osf.Fd()), inlineDataOff+lo, inlineDataOff+hi, inlineDataOff+lo)
}

// populate reads bytes [lo, hi) of the file open as fd into the page
// cache if they are cold (the page of byte probe is not there), and
// counts it.
func (t *Target) populate(fd int, lo, hi, probe int64) {
	read, err := pagecache.PopulateIfColdAt(fd, lo, hi, probe)
	if errors.Is(err, pagecache.ErrNoPopulate) {
		readInOff.Store(true)
	}
	if read {
		t.readIns.Add(1)
	}
}

// readInBackground reads bytes [lo, hi) of the chunk open as fd, its
// bytes starting at base in the file, widened to whole blocks (what a
// reader in place reads and checks) and cut at size, into the page cache
// in large folios if they are cold, without waiting, when they are
// minReadIn or more or the whole chunk (a small random read is left to
// the kernel, as in Read): a chunk opened for a reader's first read
// otherwise goes to the disk twice in turn, for its checksums and then,
// once the client has the descriptor, for the data (one cold 1 MiB file:
// about 0.3 ms apart). The read works on a descriptor of its own, as the
// server closes fd once it is handed out.
func (t *Target) readInBackground(fd int, base, lo, hi, size int64) {
	lo = max(lo, 0) / BlockSize * BlockSize
	hi = min((hi+BlockSize-1)/BlockSize*BlockSize, size)
	whole := lo == 0 && hi == size
	if t.inMemory || readInOff.Load() || lo >= hi || (hi-lo < minReadIn && !whole) {
		return
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return
	}
	go func() {
		defer unix.Close(dup)
		t.populate(dup, base+lo, base+hi, base+lo)
	}()
}

// ErrNotInPlace is returned by OpenForRead for a chunk with a block that
// is not one whole copy (a hole, a copy shorter than its block) or a
// target whose files have no descriptors: it is read through the server
// instead.
var ErrNotInPlace = errors.New("chunk cannot be read in place: read it through its data server")

// OpenForRead opens chunk id for a client on this host to read in place:
// its file (read-only; nil if the chunk does not exist), where its bytes
// start in it, its length, version and block checksums, read together
// under the chunk's read lock so they describe one version. With verify
// every block is read and checked first: a bad copy fails with a
// *CorruptionError, as a read of it would. Bytes [wantLo, wantHi) of the
// chunk, those the client reads first (none if empty), are read into the
// page cache in the background while the checksums are read, so the disk
// has both requests at once. A chunk that is not in place (see
// chunkFile.inPlace) fails with ErrNotInPlace.
func (t *Target) OpenForRead(id ID, verify bool, wantLo, wantHi int64) (Opened, error) {
	defer t.chunkLocks.lock(id, false)()
	if !verify {
		if o, ok := t.openForReadDirect(id, wantLo, wantHi); ok {
			return o, nil
		}
	}
	f, err := t.openChunk(id, false)
	if err != nil || f == nil {
		return Opened{}, err
	}
	defer t.store.files.release(f)
	if err := t.check(f); err != nil {
		return Opened{}, err
	}
	if verify && f.size() > 0 {
		buf := blockPool.Get().(*[BlockSize]byte)
		defer blockPool.Put(buf)
		for b := range nblocks(f.size()) {
			if err := t.readBlocks(f, buf[:extent(b, f.size())], b); err != nil {
				return Opened{}, err
			}
		}
	}
	osf := f.file.OS()
	if osf == nil || !f.inPlace() {
		return Opened{}, fmt.Errorf("open %v on target %s: %w", id, t.dir, ErrNotInPlace)
	}
	slots, end := f.slotsOf()
	if st, err := osf.Stat(); err != nil {
		return Opened{}, t.ioError(fmt.Sprintf("stat %v", id), err)
	} else if st.Size() < end && f.size() > 0 {
		return Opened{}, t.corrupt(&CorruptionError{Target: t.dir, Chunk: id, Block: max(st.Size()-inlineDataOff, 0) / BlockSize,
			Truncated: true, Length: max(st.Size()-inlineDataOff, 0), Want: f.size()})
	}
	sums := make([]uint32, nblocks(f.size()))
	for b := range sums {
		sums[b] = f.ents[b][f.cur(int64(b))].sum
	}
	// A descriptor of its own, read-only, of the same file.
	fd, err := syscall.Open(fmt.Sprintf("/proc/self/fd/%d", osf.Fd()), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return Opened{}, t.ioError(fmt.Sprintf("open %v for reading", id), err)
	}
	var st syscall.Stat_t
	merr := syscall.Fstat(fd, &st)
	if merr == nil {
		merr = markHandedOut(fd, st.Mode)
	}
	if merr != nil {
		syscall.Close(fd)
		return Opened{}, t.ioError(fmt.Sprintf("open %v for reading", id), merr)
	}
	return Opened{File: os.NewFile(uintptr(fd), osf.Name()), DataOffset: inlineDataOff, Length: f.size(),
		Version: f.hdr.version, Sums: sums, Slots: slots}, nil
}

// openForReadDirect is OpenForRead's way for a plain chunk, without the
// file cache: the chunk file opened read-only (the descriptor the client
// gets) and its head read in one pread. It is about half the system
// calls of opening the chunk for writing, reopening it read-only and
// evicting another chunk from the cache, and a sequential reader in
// place opens one chunk per chunk size it reads. ok is false for anything
// but a plain chunk that needs no recovery and whose head is good
// (missing, damaged, not plain, or any error): the cached way handles,
// repairs and reports those. Bytes [wantLo, wantHi) are read in meanwhile
// (readInBackground). Called with the chunk's read lock held.
func (t *Target) openForReadDirect(id ID, wantLo, wantHi int64) (Opened, bool) {
	if t.fs != osFS {
		return Opened{}, false
	}
	path := t.inlinePath(id)
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return Opened{}, false
	}
	keep := false
	defer func() {
		if !keep {
			syscall.Close(fd)
		}
	}()
	var st syscall.Stat_t
	if syscall.Fstat(fd, &st) != nil || markHandedOut(fd, st.Mode) != nil {
		return Opened{}, false
	}
	t.readInBackground(fd, inlineDataOff, wantLo, wantHi, max(min(st.Size-inlineDataOff, MaxChunkSize), 0))
	buf := headPool.Get().(*[headSize]byte)
	defer headPool.Put(buf)
	// The head of a chunk of up to 126 blocks is in its first page: read
	// that, and the rest only if the header says there is more.
	n, err := syscall.Pread(fd, buf[:4096], 0)
	if err != nil || n < headerSize {
		return Opened{}, false
	}
	if h, herr := decodeHeader(buf[:n]); herr == nil && n == 4096 {
		if want := int(entriesOff + nblocks(h.length)*blockEntries); want > n {
			m, err := syscall.Pread(fd, buf[n:want], int64(n))
			if err != nil {
				return Opened{}, false
			}
			n += m
		}
	}
	f := &chunkFile{key: cacheKey{t, id}}
	synced, stale := t.parseHead(f, buf[:n])
	if f.bad != nil || len(stale) > 0 || synced < f.hdr.version && !t.unsyncedHas(id) || !f.inPlace() {
		return Opened{}, false
	}
	slots, end := f.slotsOf()
	if f.size() > 0 && st.Size < end {
		return Opened{}, false
	}
	sums := make([]uint32, nblocks(f.size()))
	for b := range sums {
		sums[b] = f.ents[b][f.cur(int64(b))].sum
	}
	keep = true
	return Opened{File: os.NewFile(uintptr(fd), path), DataOffset: inlineDataOff, Length: f.size(),
		Version: f.hdr.version, Sums: sums, Slots: slots}, true
}
