package chunk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/weft-fs/weft/internal/pagecache"
)

// zeroBlock is BlockSize zeros, for checksumming gaps without a buffer.
var zeroBlock [BlockSize]byte

// blockPool holds BlockSize buffers for read-modify-write of partial blocks.
var blockPool = sync.Pool{New: func() any { return new([BlockSize]byte) }}

// chunkPath is the path of chunk id's data file in the older form of
// two files (its checksum file adds ".crc").
func (t *Target) chunkPath(id ID) string {
	return filepath.Join(t.inoDir(id.Ino), strconv.FormatUint(id.Index, 10))
}

// inlineSuffix ends the name of a chunk file holding its checksums.
const inlineSuffix = ".w"

// inlinePath is the path of chunk id's file.
func (t *Target) inlinePath(id ID) string { return t.chunkPath(id) + inlineSuffix }

// openChunk returns the chunk's open files with a cache reference taken
// (release with t.store.files.release), or nil if the chunk does not exist
// and create is false. The caller holds the chunk's lock (exclusively if
// create is true).
func (t *Target) openChunk(id ID, create bool) (*chunkFile, error) {
	key := cacheKey{t, id}
	if f := t.store.files.get(key); f != nil {
		return f, nil
	}
	if f, err := t.openInline(key); f != nil || err != nil {
		return f, err
	}
	path := t.chunkPath(id)
	data, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if !create {
			return nil, nil
		}
		return t.createInline(key)
	}
	if err != nil {
		return nil, t.ioError(fmt.Sprintf("open %v", id), err)
	}
	crc, err := os.OpenFile(path+".crc", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		data.Close()
		return nil, t.ioError(fmt.Sprintf("open checksums of %v", id), err)
	}
	f := &chunkFile{key: key, data: data, crc: crc}
	if err := t.loadHeader(f, id); err != nil {
		f.close()
		return nil, err
	}
	return t.store.files.add(f), nil
}

// createInline creates the file of chunk key.id and adds it to the cache.
func (t *Target) createInline(key cacheKey) (*chunkFile, error) {
	id := key.id
	path := t.inlinePath(id)
	var data *os.File
	newDir, err := t.createInInoDir(id, func() (err error) {
		data, err = t.createFile(path)
		return err
	})
	if err != nil {
		return nil, t.ioError(fmt.Sprintf("create %v", id), err)
	}
	t.markNewEntry(id.Ino, newDir)
	t.numChunks.Add(1)
	f := &chunkFile{key: key, data: data}
	// The head is written before any data, so that a file with a head
	// that does not read back is corruption, not an unfinished create.
	if err := t.writeHeader(f, id, header{dataOff: inlineDataOff}); err != nil {
		f.close()
		return nil, err
	}
	return t.store.files.add(f), nil
}

// openInline opens chunk key.id's file, if it has one, and reads its
// head: a file longer than its header says (a crash in an extending
// write that never completed) is cut back, a shorter one marks the chunk
// truncated, and a file shorter than a header (a crash right after it
// was created, before any write) is an empty chunk.
func (t *Target) openInline(key cacheKey) (*chunkFile, error) {
	id := key.id
	data, err := os.OpenFile(t.inlinePath(id), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, t.ioError(fmt.Sprintf("open %v", id), err)
	}
	f := &chunkFile{key: key, data: data}
	if err := t.loadHead(f); err != nil {
		data.Close()
		return nil, err
	}
	return t.store.files.add(f), nil
}

// loadHead reads the head of f, a chunk file holding its checksums, and
// checks the file's length against it (see openInline).
func (t *Target) loadHead(f *chunkFile) error {
	id := f.key.id
	info, err := f.data.Stat()
	if err != nil {
		return t.ioError(fmt.Sprintf("stat %v", id), err)
	}
	var b [headerSize]byte
	n, err := f.data.ReadAt(b[:], 0)
	if err != nil && err != io.EOF {
		return t.ioError(fmt.Sprintf("read header of %v", id), err)
	}
	if info.Size() < headerSize {
		if info.Size() > 0 {
			if err := f.data.Truncate(0); err != nil {
				return t.ioError(fmt.Sprintf("cut unwritten %v", id), err)
			}
		}
		f.hdr = header{dataOff: inlineDataOff}
		return nil
	}
	h, err := decodeHead(b[:n])
	if err != nil {
		f.bad = &CorruptionError{Target: t.dir, Chunk: id, Block: -1, Header: true}
		f.hdr = header{dataOff: inlineDataOff}
		f.size = max(info.Size()-f.hdr.dataOff, 0)
		return nil
	}
	f.hdr = h
	return t.checkLength(f, id, max(info.Size()-h.dataOff, 0))
}

// checkLength sets the length of chunk f, whose data is found to be size
// bytes, from its header: longer data (a crash in an extending write that
// never completed) is cut back; shorter marks the chunk truncated, which
// every read reports as corruption.
func (t *Target) checkLength(f *chunkFile, id ID, size int64) error {
	h := f.hdr
	switch {
	case size > h.length:
		if err := f.truncateData(h.length); err != nil {
			return t.ioError(fmt.Sprintf("cut uncommitted tail of %v", id), err)
		}
		t.usedBytes.Add(h.length - size)
		size = h.length
	case size < h.length:
		f.bad = &CorruptionError{Target: t.dir, Chunk: id, Block: size / BlockSize, Truncated: true,
			Length: size, Want: h.length}
	}
	f.size = size
	return nil
}

// maxCreateAttempts bounds how often createInInoDir tries again after the
// directory it made was removed before it could create a file in it.
const maxCreateAttempts = 64

// createInInoDir makes the directory of chunk id's file if needed and runs
// create, which creates a file in it. A delete of the file's chunks in
// another chain removes the directory when it finds it empty, possibly
// between the Mkdir and create: create then fails with ErrNotExist and
// both are tried again. newDir reports that the directory was made here
// (so its parent needs an fsync).
func (t *Target) createInInoDir(id ID, create func() error) (newDir bool, err error) {
	for attempt := 1; ; attempt++ {
		if err := os.Mkdir(t.inoDir(id.Ino), 0o755); err == nil {
			newDir = true
		} else if !errors.Is(err, fs.ErrExist) {
			return newDir, fmt.Errorf("create directory: %w", err)
		}
		err = create()
		if err == nil || !errors.Is(err, fs.ErrNotExist) || attempt == maxCreateAttempts {
			return newDir, err
		}
	}
}

// loadHeader reads the header of a chunk of the older form just opened
// and checks the data file's length against it (checkLength).
func (t *Target) loadHeader(f *chunkFile, id ID) error {
	info, err := f.data.Stat()
	if err != nil {
		return t.ioError(fmt.Sprintf("stat %v", id), err)
	}
	size := info.Size()
	h, err := readHeader(f.crc, size)
	if err != nil {
		if !errors.Is(err, errBadHeader) {
			return t.headerError(id, err)
		}
		f.bad = &CorruptionError{Target: t.dir, Chunk: id, Block: -1, Header: true}
		f.size = size
		return nil
	}
	f.hdr = h
	return t.checkLength(f, id, size)
}

// check fails with the chunk's corruption found when it was opened, if any
// (a damaged header, a data file shorter than the header says).
func (t *Target) check(f *chunkFile) error {
	if f.bad != nil {
		return t.corrupt(f.bad)
	}
	return nil
}

func checkRange(id ID, off int64, n int, limit int64) error {
	if off < 0 || n < 0 || limit <= 0 || limit > MaxChunkSize || off+int64(n) > limit {
		return fmt.Errorf("%v: range [%d, %d) outside a chunk of %d bytes (chunk size must be 1 B..64 MiB): %w",
			id, off, off+int64(n), limit, syscall.EINVAL)
	}
	return nil
}

// Write writes data at offset off of the chunk through chain, creating it
// if needed, as the chunk's next version, which it returns. The chunk is
// cut into chunkSize-byte pieces of a file: a write past chunkSize fails
// with EINVAL. A write past the chunk's end extends it, the gap reading as
// zeros. With sync, the chunk (and a new file's directory entry) is on
// stable storage when Write returns.
func (t *Target) Write(id ID, chain uint64, off int64, data []byte, chunkSize int64, sync bool) (uint64, error) {
	l := t.Lock(id, chain)
	defer l.Unlock()
	info, err := l.Info()
	if err != nil {
		return 0, err
	}
	if len(data) == 0 {
		return info.Version, l.Write(off, data, chunkSize, info.Version, sync)
	}
	return info.Version + 1, l.Write(off, data, chunkSize, info.Version+1, sync)
}

// ioSegment is how much of a write or read goes to or from the file (and
// is checksummed) at a time: a quarter of the level-2 cache of common
// server cores, so the checksum reads what the copy has just brought into
// it.
const ioSegment = 256 << 10

// writeLocked writes data at off, the checksums of every block whose
// content changes, and then the header with the new version and length.
// Only blocks partly kept from before are read (and verified); blocks
// wholly overwritten or in a zero gap are checksummed from memory.
func (t *Target) writeLocked(f *chunkFile, id ID, off int64, data []byte, version, chain uint64) error {
	if err := t.check(f); err != nil {
		return err
	}
	if f.crc != nil {
		return fmt.Errorf("write %v: a chunk of the older form of two files is rewritten before it is written: %w", id, syscall.EINVAL)
	}
	oldSize := f.size
	end := off + int64(len(data))
	newSize := max(oldSize, end)
	first, last := min(off, oldSize)/BlockSize, (end-1)/BlockSize
	sums := make([]byte, crcBytes*(last-first+1))
	// Blocks the write covers whole are checksummed after the data is
	// written: the write has just read the bytes, so the checksum reads
	// them from this core's cache rather than from the client's memory
	// (shared arena) a second time. Blocks merged with old bytes are
	// done first, while the old bytes are still there.
	whole := func(b int64) bool {
		bs := b * BlockSize
		return off <= bs && end >= min(bs+BlockSize, newSize)
	}
	for b := first; b <= last; b++ {
		if whole(b) {
			continue
		}
		bs := b * BlockSize
		be := min(bs+BlockSize, newSize)
		ds, de := max(off, bs), min(end, be) // part of the block the write covers
		var sum uint32
		if bs >= oldSize { // no old bytes: zeros up to the write, then data
			sum = crc32.Update(0, castagnoli, zeroBlock[:min(ds, be)-bs])
			if ds < de {
				sum = crc32.Update(sum, castagnoli, data[ds-off:de-off])
			}
		} else {
			var err error
			if sum, err = t.mergeBlock(f, id, b, oldSize, be, data, off); err != nil {
				return err
			}
		}
		binary.LittleEndian.PutUint32(sums[(b-first)*crcBytes:], sum)
	}
	// The data goes in segments of ioSegment bytes, each checksummed
	// right after it is written, while its bytes are still in this core's
	// cache: a whole megabyte written first and checksummed after was read
	// back from memory (about 88 against 35 us per MiB here).
	for so := int64(0); so < int64(len(data)); {
		se := int64(len(data))
		if se-so > ioSegment {
			// End the segment on a block boundary of the chunk.
			se = ((off+so+ioSegment)/BlockSize)*BlockSize - off
		}
		if _, err := f.writeData(data[so:se], off+so); err != nil {
			t.undoExtend(f, oldSize, end)
			return t.ioError(fmt.Sprintf("write %v at offset %d", id, off+so), err)
		}
		for b := (off + so) / BlockSize; b*BlockSize < off+se && b <= last; b++ {
			if whole(b) {
				bs := b * BlockSize
				sum := crc32.Checksum(data[bs-off:min(bs+BlockSize, newSize)-off], castagnoli)
				binary.LittleEndian.PutUint32(sums[(b-first)*crcBytes:], sum)
			}
		}
		so = se
	}
	if err := f.writeSums(sums, first); err != nil {
		t.undoExtend(f, oldSize, end)
		return t.ioError(fmt.Sprintf("write checksums of %v", id), err)
	}
	h := header{version: version, chain: chain, length: newSize}
	if err := t.writeHeader(f, id, h); err != nil {
		t.undoExtend(f, oldSize, end)
		return err
	}
	f.size = newSize
	t.usedBytes.Add(newSize - oldSize)
	return nil
}

func (t *Target) writeHeader(f *chunkFile, id ID, h header) error {
	if h.dataOff == 0 {
		h.dataOff = f.hdr.dataOff
	}
	b := h.encode()
	if _, err := f.sumsFile().WriteAt(b[:], 0); err != nil {
		return t.ioError(fmt.Sprintf("write header of %v", id), err)
	}
	f.hdr = h
	return nil
}

// rewrite makes chunk f (held exclusively), of the older form of two
// files, one chunk file holding its checksums. Its bytes and checksums
// are copied as they are (never checked and summed anew, so corruption
// is not blessed), the header keeps its version and chain, the new file
// goes to a temporary name, is synced and renamed into place, the
// directory is synced, and only then are the old files removed (a crash
// in between leaves both; the chunk file is the one read).
func (t *Target) rewrite(f *chunkFile, id ID) error {
	nblocks := (f.size + BlockSize - 1) / BlockSize
	sums := make([]byte, nblocks*crcBytes)
	if m, err := f.readSums(sums, 0); err != nil && err != io.EOF {
		return t.ioError(fmt.Sprintf("read checksums of %v", id), err)
	} else if m < len(sums) {
		return t.corrupt(&CorruptionError{Target: t.dir, Chunk: id, Block: int64(m) / crcBytes, Missing: true})
	}
	data := make([]byte, f.size)
	if n, err := f.readData(data, 0); int64(n) < f.size {
		if err == nil || err == io.EOF {
			return t.corrupt(&CorruptionError{Target: t.dir, Chunk: id, Block: int64(n) / BlockSize, Truncated: true,
				Length: int64(n), Want: f.size})
		}
		return t.ioError(fmt.Sprintf("read %v", id), err)
	}
	h := header{version: f.hdr.version, chain: f.hdr.chain, length: f.size, dataOff: inlineDataOff}
	file, err := writeInline(t.inlinePath(id), h, sums, data)
	if err != nil {
		return t.ioError(fmt.Sprintf("rewrite %v as one file", id), err)
	}
	if err := syncDir(t.inoDir(id.Ino)); err != nil {
		file.Close()
		return t.ioError(fmt.Sprintf("sync directory of inode %d", id.Ino), err)
	}
	if f.crc != nil {
		path := t.chunkPath(id)
		if err := t.discard(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.store.log.Warn("remove the old data file of a rewritten chunk", "chunk", id.String(), "err", err)
		}
		if err := t.discard(path + ".crc"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.store.log.Warn("remove the old checksum file of a rewritten chunk", "chunk", id.String(), "err", err)
		}
	}
	f.close()
	f.data, f.crc, f.hdr = file, nil, h
	return nil
}

// writeInline writes a chunk file with header h, checksums sums and
// bytes data to path+".tmp", fsyncs it, renames it to path and returns
// it open for reading and writing.
func writeInline(path string, h header, sums, data []byte) (*os.File, error) {
	head := make([]byte, headerSize+len(sums))
	hb := h.encode()
	copy(head, hb[:])
	copy(head[headerSize:], sums)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, dataModeFresh)
	if err != nil {
		return nil, err
	}
	if _, err = f.WriteAt(head, 0); err == nil && len(data) > 0 {
		_, err = f.WriteAt(data, h.dataOff)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, err
	}
	return f, nil
}

// mergeBlock returns the checksum of block b after the write: its old bytes
// (verified), zeros up to be where the chunk grows, and data over them.
func (t *Target) mergeBlock(f *chunkFile, id ID, b, oldSize, be int64, data []byte, off int64) (uint32, error) {
	buf := blockPool.Get().(*[BlockSize]byte)
	defer blockPool.Put(buf)
	bs := b * BlockSize
	oldEnd := min(bs+BlockSize, oldSize)
	if err := t.readBlocks(f, id, buf[:oldEnd-bs], b); err != nil {
		return 0, err
	}
	clear(buf[oldEnd-bs : be-bs])
	ds, de := max(off, bs), min(off+int64(len(data)), be)
	if ds < de {
		copy(buf[ds-bs:de-bs], data[ds-off:de-off])
	}
	return crc32.Checksum(buf[:be-bs], castagnoli), nil
}

// undoExtend cuts a chunk back to its old length after a failed extending
// write, so that its length keeps matching its checksums.
func (t *Target) undoExtend(f *chunkFile, oldSize, end int64) {
	if end > oldSize {
		f.truncateData(oldSize)
		f.cutSums((oldSize + BlockSize - 1) / BlockSize)
	}
}

// readBlocks reads buf from the chunk starting at block first (buf is
// whole blocks, except that it may end at the chunk's end) and verifies
// every block's checksum.
func (t *Target) readBlocks(f *chunkFile, id ID, buf []byte, first int64) error {
	nblocks := (int64(len(buf)) + BlockSize - 1) / BlockSize
	var small [16 * crcBytes]byte
	sums := small[:0]
	if nblocks > 16 {
		sums = make([]byte, 0, nblocks*crcBytes)
	}
	sums = sums[:nblocks*crcBytes]
	m, err := f.readSums(sums, first)
	if err != nil && err != io.EOF {
		return t.ioError(fmt.Sprintf("read checksums of %v", id), err)
	}
	// Read and check a segment at a time (see ioSegment): the
	// checksums read what the read has just brought into the cache.
	for so := int64(0); so < int64(len(buf)); so += ioSegment {
		se := min(so+ioSegment, int64(len(buf)))
		n, err := f.readData(buf[so:se], first*BlockSize+so)
		if int64(n) < se-so {
			if err == nil || err == io.EOF {
				got := so + int64(n)
				return t.corrupt(&CorruptionError{Target: t.dir, Chunk: id, Block: first + got/BlockSize,
					Truncated: true, Length: first*BlockSize + got, Want: first*BlockSize + int64(len(buf))})
			}
			return t.ioError(fmt.Sprintf("read %v", id), err)
		}
		for i := so / BlockSize; i*BlockSize < se; i++ {
			block := buf[i*BlockSize : min((i+1)*BlockSize, int64(len(buf)))]
			got := crc32.Checksum(block, castagnoli)
			if int64(m) < (i+1)*crcBytes {
				return t.corrupt(&CorruptionError{Target: t.dir, Chunk: id, Block: first + i, Computed: got, Missing: true})
			}
			if want := binary.LittleEndian.Uint32(sums[i*crcBytes:]); got != want {
				return t.corrupt(&CorruptionError{Target: t.dir, Chunk: id, Block: first + i, Stored: want, Computed: got})
			}
		}
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
	if off >= f.size {
		return nil, nil, nil
	}
	end := min(off+int64(length), f.size)
	first := off / BlockSize
	alignedStart := first * BlockSize
	alignedEnd := min(((end-1)/BlockSize+1)*BlockSize, f.size)
	if alloc == nil {
		buf = make([]byte, alignedEnd-alignedStart)
	} else {
		buf = alloc(int(alignedEnd - alignedStart))
	}
	if alignedEnd-alignedStart >= minReadIn {
		t.readInCold(f, alignedStart, alignedEnd)
	}
	if err := t.readBlocks(f, id, buf, first); err != nil {
		return nil, buf, err
	}
	return buf[off-alignedStart : end-alignedStart], buf, nil
}

// minReadIn is the least read for which a cold range is first read into
// the page cache in large folios (readInCold).
const minReadIn = 128 << 10

// readInOff is set once the kernel turned out to lack MADV_POPULATE_READ.
var readInOff atomic.Bool

// readInCold reads bytes [lo, hi) of the chunk's data file into the page
// cache in large folios when they are not there yet, before a read
// copies them out: the kernel's own read-ahead of a file opened afresh
// (every chunk read once is one) reads single pages, which this
// machine's disk served at a third of the speed (see pagecache). Cold
// 64 MiB reads through the servers (--local-reads=false) went from 1,158
// to 1,336 MB/s with one reader and from 1,579 to 1,758 with four. A
// target on a tmpfs has nothing to read in.
func (t *Target) readInCold(f *chunkFile, lo, hi int64) {
	if t.inMemory || readInOff.Load() {
		return
	}
	t.populate(int(f.data.Fd()), f.hdr.dataOff+lo, f.hdr.dataOff+hi, f.hdr.dataOff+lo)
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

// Opened is a chunk opened for a client on this host to read in place
// (OpenForRead).
type Opened struct {
	// File is the chunk's file, read-only; nil if the chunk does not
	// exist.
	File *os.File
	// DataOffset is where the chunk's bytes start in File.
	DataOffset int64
	Length     int64
	Version    uint64
	// Sums holds the CRC32C of each block.
	Sums []uint32
}

// OpenForRead opens chunk id for a client on this host to read in place:
// its file (read-only; nil if the chunk does not exist), where its bytes
// start in it, its length, version and block checksums, read together
// under the chunk's read lock so they describe one version. With verify
// every block is read and checked first: a bad copy fails with a
// *CorruptionError, as a read of it would. Bytes [wantLo, wantHi) of the
// chunk, those the client reads first (none if empty), are read into the
// page cache in the background while the checksums are read, so the disk
// has both requests at once.
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
	nblocks := (f.size + BlockSize - 1) / BlockSize
	raw := make([]byte, nblocks*crcBytes)
	m, err := f.readSums(raw, 0)
	if err != nil && err != io.EOF {
		return Opened{}, t.ioError(fmt.Sprintf("read checksums of %v", id), err)
	}
	if m < len(raw) {
		return Opened{}, t.corrupt(&CorruptionError{Target: t.dir, Chunk: id, Block: int64(m) / crcBytes, Missing: true})
	}
	if verify {
		buf := blockPool.Get().(*[BlockSize]byte)
		defer blockPool.Put(buf)
		for b := range nblocks {
			if err := t.readBlocks(f, id, buf[:min(BlockSize, f.size-b*BlockSize)], b); err != nil {
				return Opened{}, err
			}
		}
	}
	sums := make([]uint32, nblocks)
	for i := range sums {
		sums[i] = binary.LittleEndian.Uint32(raw[i*crcBytes:])
	}
	// A descriptor of its own, read-only, of the same file.
	fd, err := syscall.Open(fmt.Sprintf("/proc/self/fd/%d", f.data.Fd()), syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
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
	return Opened{File: os.NewFile(uintptr(fd), f.data.Name()), DataOffset: f.hdr.dataOff, Length: f.size,
		Version: f.hdr.version, Sums: sums}, nil
}

// sumsBufPool holds buffers for a whole head (header and the checksums of
// the largest chunk).
var sumsBufPool = sync.Pool{New: func() any { return new([headSize]byte) }}

// openForReadDirect is OpenForRead's way for a plain chunk, without the
// file cache: the chunk file opened read-only (the descriptor the client
// gets) and its head read in one pread. It is about half the system
// calls of opening the chunk for writing, reopening it read-only and
// evicting another chunk from the cache, and a sequential reader in
// place opens one chunk per chunk size it reads. ok is false for anything
// but a chunk file whose header is good and whose length is what it says
// (missing, of the older form, damaged, cut short or with an unfinished
// tail, or any error): the cached way handles, repairs and reports those.
// Bytes [wantLo, wantHi) are read in meanwhile (readInBackground).
// Called with the chunk's read lock held.
func (t *Target) openForReadDirect(id ID, wantLo, wantHi int64) (Opened, bool) {
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
	t.readInBackground(fd, inlineDataOff, wantLo, wantHi, st.Size-inlineDataOff)
	buf := sumsBufPool.Get().(*[headSize]byte)
	defer sumsBufPool.Put(buf)
	n, err := syscall.Pread(fd, buf[:], 0)
	if err != nil || n < headerSize {
		return Opened{}, false
	}
	h, err := decodeHead(buf[:n])
	if err != nil || st.Size-h.dataOff != h.length && !(h.length == 0 && st.Size <= h.dataOff) {
		return Opened{}, false
	}
	nblocks := (h.length + BlockSize - 1) / BlockSize
	if int64(n) < headerSize+nblocks*crcBytes {
		return Opened{}, false // checksums missing: the cached way reports it
	}
	sums := make([]uint32, nblocks)
	for i := range sums {
		sums[i] = binary.LittleEndian.Uint32(buf[headerSize+i*crcBytes:])
	}
	keep = true
	return Opened{File: os.NewFile(uintptr(fd), path), DataOffset: h.dataOff, Length: h.length, Version: h.version, Sums: sums}, true
}
