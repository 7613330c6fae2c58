package chunk

import (
	"container/list"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/weft-fs/weft/internal/disk"
)

// chunkFile is an open chunk: its file, header and block table. Its
// fields are used only under the chunk's lock (read lock for reads),
// never by lockless callers such as SyncFile: truncate, delete, Replace
// and Verify drop the file from the cache, after which it is closed by
// its last user.
type chunkFile struct {
	key  cacheKey
	file disk.File
	hdr  header
	// ents holds the entries of every block below the length (and of
	// blocks a mutation in progress adds).
	ents [][2]entry
	// bad is corruption found when the chunk was opened (damaged header
	// or block table): reads fail with it until the chunk is replaced.
	bad *CorruptionError
	// damaged marks blocks whose entries are damaged: they read as
	// corrupt until written whole or cut away.
	damaged map[int64]bool

	// Guarded by fileCache.mu.
	refs    int
	elem    *list.Element
	dropped bool // out of the cache; closed when refs reaches 0
}

func (f *chunkFile) close() { f.file.Close() }

// size is the chunk's committed length.
func (f *chunkFile) size() int64 { return f.hdr.length }

// cur returns the index of block b's newest entry, or -1 if it has none
// (it reads as zeros).
func (f *chunkFile) cur(b int64) int {
	if b >= int64(len(f.ents)) {
		return -1
	}
	e := f.ents[b]
	switch {
	case e[0].empty() && e[1].empty():
		return -1
	case e[1].empty() || !e[0].empty() && e[0].gen >= e[1].gen:
		return 0
	}
	return 1
}

// durable returns the index of block b's newest entry that is on stable
// storage (written at or before version floor), or -1.
func (f *chunkFile) durable(b int64, floor uint64) int {
	best := -1
	for i, e := range f.ents[b] {
		if !e.empty() && e.gen <= floor&genMask && (best < 0 || e.gen > f.ents[b][best].gen) {
			best = i
		}
	}
	return best
}

// contentSum is the CRC32C of block b's content over its extent; ok is
// false for a copy that counts bytes past the extent (see readBlocks),
// whose content's sum needs its bytes.
func (f *chunkFile) contentSum(b int64) (sum uint32, ok bool) {
	ext := extent(b, f.hdr.length)
	i := f.cur(b)
	if i < 0 {
		return zerosSum(0, ext), true
	}
	e := f.ents[b][i]
	if e.n > ext {
		return 0, false
	}
	return zerosSum(e.sum, ext-e.n), true
}

// damagedError is the error of a read of block b if its entries are
// damaged, else nil.
func (t *Target) damagedError(f *chunkFile, b int64) error {
	if !f.damaged[b] {
		return nil
	}
	return t.corrupt(&CorruptionError{Target: t.dir, Chunk: f.key.id, Block: b, Missing: true})
}

// inPlace reports that every block's content is one whole copy (in any
// slot), as a client reading the file in place can check it: no holes,
// no copy shorter than its block, nothing damaged.
func (f *chunkFile) inPlace() bool {
	if len(f.damaged) > 0 {
		return false
	}
	for b := range nblocks(f.hdr.length) {
		i := f.cur(b)
		if i < 0 || f.ents[b][i].n != extent(b, f.hdr.length) {
			return false
		}
	}
	return true
}

// slotsOf returns the slot of each block's content (nil when all are in
// slot 0), and where the file must reach for all of it.
func (f *chunkFile) slotsOf() (slots []uint8, end int64) {
	for b := range nblocks(f.hdr.length) {
		e := f.ents[b][f.cur(b)]
		if e.slot != 0 && slots == nil {
			slots = make([]uint8, nblocks(f.hdr.length))
		}
		if slots != nil {
			slots[b] = uint8(e.slot)
		}
		end = max(end, slotOff(b, e.slot)+e.n)
	}
	return slots, end
}

// inlinePath is the path of chunk id's file.
func (t *Target) inlinePath(id ID) string {
	return filepath.Join(t.inoDir(id.Ino), strconv.FormatUint(id.Index, 10)+inlineSuffix)
}

// inlineSuffix ends the name of a chunk file.
const inlineSuffix = ".w"

// openChunk returns the chunk's open file with a cache reference taken
// (release with t.store.files.release), or nil if the chunk does not
// exist and create is false. The caller holds the chunk's lock
// (exclusively if create is true).
func (t *Target) openChunk(id ID, create bool) (*chunkFile, error) {
	key := cacheKey{t, id}
	if f := t.store.files.get(key); f != nil {
		return f, nil
	}
	file, err := t.fs.OpenFile(t.inlinePath(id), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if !create {
			return nil, nil
		}
		return t.createChunk(key)
	}
	if err != nil {
		return nil, t.ioError(fmt.Sprintf("open %v", id), err)
	}
	f := &chunkFile{key: key, file: file}
	if err := t.load(f); err != nil {
		file.Close()
		return nil, err
	}
	return t.store.files.add(f), nil
}

// createChunk creates the file of chunk key.id and adds it to the cache.
func (t *Target) createChunk(key cacheKey) (*chunkFile, error) {
	id := key.id
	path := t.inlinePath(id)
	var file disk.File
	newDir, err := t.createInInoDir(id, func() (err error) {
		file, err = t.createFile(path)
		return err
	})
	if err != nil {
		return nil, t.ioError(fmt.Sprintf("create %v", id), err)
	}
	t.markNewEntry(id.Ino, newDir)
	t.numChunks.Add(1)
	f := &chunkFile{key: key, file: file}
	// The header goes first, so that a file whose head does not read
	// back is corruption, not an unfinished create.
	if err := t.writeHeader(f, header{}); err != nil {
		f.close()
		return nil, err
	}
	return t.store.files.add(f), nil
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
		if err := t.fs.Mkdir(t.inoDir(id.Ino), 0o700); err == nil {
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

// readHead reads up to the whole head of a chunk file into a buffer of
// headSize bytes: the header and the entries of the blocks its length
// covers. n is how much of buf holds it.
func readHead(file disk.File, buf []byte) (n int, err error) {
	n, err = file.ReadAt(buf[:min(4096, len(buf))], 0)
	if err != nil && err != io.EOF {
		return n, err
	}
	if n < headerSize {
		return n, nil
	}
	h, herr := decodeHeader(buf)
	if herr != nil {
		return n, nil
	}
	want := entriesOff + nblocks(h.length)*blockEntries
	if int64(n) >= want {
		return n, nil
	}
	m := 0
	if n == 4096 {
		m, err = file.ReadAt(buf[n:want], int64(n))
		if err != nil && err != io.EOF {
			return n + m, err
		}
	}
	// Entries past the end of the file read as zeros (empty), as a hole
	// would: a crash kept the head's new content but not the file's new
	// size, so they were never synced.
	clear(buf[n+m : want])
	return int(want), nil
}

// parseHead fills f's header and entries from its head b: a file holding
// nothing (created, never committed) is an empty chunk; a damaged header
// or entry marks the chunk bad. Entries newer than the header belong to
// a mutation that never committed and are dropped (stale lists the
// blocks that had one). It returns the synced record's version.
func (t *Target) parseHead(f *chunkFile, b []byte) (synced uint64, stale []int64) {
	id := f.key.id
	if len(b) < headerSize || unwritten(b) {
		f.hdr, f.ents = header{}, nil
		return 0, nil
	}
	h, err := decodeHeader(b)
	if err != nil {
		f.bad = &CorruptionError{Target: t.dir, Chunk: id, Block: -1, Header: true}
		return 0, nil
	}
	f.hdr = h
	nb := nblocks(h.length)
	if int64(len(b)) < entriesOff+nb*blockEntries {
		f.bad = &CorruptionError{Target: t.dir, Chunk: id, Block: int64(max(len(b)-entriesOff, 0)) / blockEntries, Missing: true}
		return 0, nil
	}
	f.ents = make([][2]entry, nb)
	for blk := range nb {
		for i := range 2 {
			e, err := decodeEntry(b[entryOff(blk, i):])
			if err != nil {
				if f.damaged == nil {
					f.damaged = make(map[int64]bool)
				}
				f.damaged[blk] = true
				e = entry{}
			}
			if e.gen > h.version&genMask {
				e = entry{} // of a mutation that never committed
				if len(stale) == 0 || stale[len(stale)-1] != blk {
					stale = append(stale, blk)
				}
			}
			f.ents[blk][i] = e
		}
	}
	return min(decodeSynced(id, b[syncedOff:]), h.version), stale
}

// load reads the head of f, just opened, and recovers the chunk if a
// previous run of the server left writes in it that were never synced.
func (t *Target) load(f *chunkFile) error {
	id := f.key.id
	buf := headPool.Get().(*[headSize]byte)
	defer headPool.Put(buf)
	n, err := readHead(f.file, buf[:])
	if err != nil {
		return t.ioError(fmt.Sprintf("read head of %v", id), err)
	}
	synced, stale := t.parseHead(f, buf[:n])
	if f.bad != nil {
		return nil
	}
	if t.unsyncedHas(id) {
		synced = f.hdr.version // what is not durable is in the page cache, whole
	}
	if synced >= f.hdr.version && len(stale) == 0 {
		return nil
	}
	return t.recover(f, synced, stale)
}

// recover settles a chunk written by an earlier run of the server and
// not synced since (synced is the last version known durable): a copy
// newer than synced may be torn (a power loss keeps any part of what was
// not synced), so each is checked against its checksum; one that fails
// is dropped and the block keeps its older copy, or reads as zeros if
// it had none that was durable (its content was never promised). The
// outcome is made durable, so it is decided once. Entries of mutations
// that never committed (blocks stale) are cleared on disk too, before a
// later version could make them look committed.
func (t *Target) recover(f *chunkFile, synced uint64, stale []int64) error {
	id := f.key.id
	t.recoverMu.Lock()
	defer t.recoverMu.Unlock()
	buf := blockPool.Get().(*[BlockSize]byte)
	defer blockPool.Put(buf)
	var fixed []int64
	for b := range int64(len(f.ents)) {
		if synced >= f.hdr.version {
			break
		}
		for {
			i := f.cur(b)
			if i < 0 {
				break
			}
			e := f.ents[b][i]
			if e.gen <= synced&genMask {
				break // durable: checked as every read checks it
			}
			m, err := f.file.ReadAt(buf[:e.n], slotOff(b, e.slot))
			if err != nil && err != io.EOF {
				return t.ioError(fmt.Sprintf("read %v to recover it", id), err)
			}
			clear(buf[m:e.n]) // past the end of the file: zeros, as a hole
			if crc32.Checksum(buf[:e.n], castagnoli) == e.sum {
				break
			}
			f.ents[b][i] = entry{}
			fixed = append(fixed, b)
		}
	}
	if len(fixed) > 0 {
		t.store.log.Warn("chunk had writes that a crash left unfinished: blocks keep their previous content",
			"chunk", id.String(), "target", t.dir, "blocks", len(fixed))
	}
	for _, b := range append(fixed, stale...) {
		if err := t.writeEntries(f, b, b); err != nil {
			return err
		}
	}
	if err := f.file.Datasync(); err != nil {
		return t.ioError(fmt.Sprintf("sync %v after recovering it", id), err)
	}
	t.writeSynced(f.file, id, f.hdr.version)
	return nil
}

// writeEntries writes the entries of blocks first..last of f.
func (t *Target) writeEntries(f *chunkFile, first, last int64) error {
	b := make([]byte, (last-first+1)*blockEntries)
	for blk := first; blk <= last; blk++ {
		var e [2]entry
		if blk < int64(len(f.ents)) {
			e = f.ents[blk]
		}
		e[0].encode(b[(blk-first)*blockEntries:])
		e[1].encode(b[(blk-first)*blockEntries+entrySize:])
	}
	if _, err := f.file.WriteAt(b, entryOff(first, 0)); err != nil {
		return t.ioError(fmt.Sprintf("write block table of %v", f.key.id), err)
	}
	return nil
}

// writeHeader writes h as f's header.
func (t *Target) writeHeader(f *chunkFile, h header) error {
	b := h.encode()
	if _, err := f.file.WriteAt(b[:], 0); err != nil {
		return t.ioError(fmt.Sprintf("write header of %v", f.key.id), err)
	}
	f.hdr = h
	return nil
}

// writeSynced records in chunk id's file that it was durable at version
// v. The record only spares a recovery after a crash (see recover), so
// an error writing it is not one of the caller's.
func (t *Target) writeSynced(file disk.File, id ID, v uint64) {
	b := encodeSynced(id, v)
	if _, err := file.WriteAt(b[:], syncedOff); err != nil {
		t.store.log.Warn("record that a chunk is synced", "chunk", id.String(), "target", t.dir, "err", err)
	}
}

// check fails with the chunk's corruption found when it was opened, if any.
func (t *Target) check(f *chunkFile) error {
	if f.bad != nil {
		return t.corrupt(f.bad)
	}
	return nil
}

func checkRange(id ID, off int64, n int, limit int64) error {
	if off < 0 || n < 0 || limit <= 0 || limit > MaxChunkSize || off+int64(n) > limit {
		return fmt.Errorf("%v: range [%d, %d) outside a chunk of %d bytes (chunk size must be 1 B..64 MiB): %w",
			id, off, off+int64(n), limit, errInvalid)
	}
	return nil
}

// noFloor is the synced floor of a chunk with nothing unsynced.
const noFloor = math.MaxUint64

type cacheKey struct {
	t  *Target
	id ID
}

// fileCache keeps recently used chunk files open (LRU), so that streaming
// reads and writes cost one pread/pwrite each. Entries in use are never
// closed under their user: an evicted entry is closed on its last release.
type fileCache struct {
	mu  sync.Mutex
	max int
	m   map[cacheKey]*chunkFile
	lru *list.List // front: most recently used
}

func newFileCache(max int) *fileCache {
	return &fileCache{max: max, m: make(map[cacheKey]*chunkFile), lru: list.New()}
}

// get returns the cached file for key with a reference taken, or nil.
func (c *fileCache) get(key cacheKey) *chunkFile {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.m[key]
	if f == nil {
		return nil
	}
	f.refs++
	c.lru.MoveToFront(f.elem)
	return f
}

// add caches f (just opened by the caller) with a reference taken. If
// another caller cached the same chunk meanwhile, f is closed and the cached
// file is returned instead.
func (c *fileCache) add(f *chunkFile) *chunkFile {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[f.key]; old != nil {
		f.close()
		old.refs++
		c.lru.MoveToFront(old.elem)
		return old
	}
	f.refs = 1
	f.elem = c.lru.PushFront(f)
	c.m[f.key] = f
	for c.lru.Len() > c.max {
		c.removeLocked(c.lru.Back().Value.(*chunkFile))
	}
	return f
}

// release drops a reference taken by get or add.
func (c *fileCache) release(f *chunkFile) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f.refs--
	if f.refs == 0 && f.dropped {
		f.close()
	}
}

// drop removes from the cache every file whose key matches, so that files
// about to be removed or cut are reopened afresh.
func (c *fileCache) drop(match func(cacheKey) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, f := range c.m {
		if match(key) {
			c.removeLocked(f)
		}
	}
}

func (c *fileCache) removeLocked(f *chunkFile) {
	c.lru.Remove(f.elem)
	delete(c.m, f.key)
	f.dropped = true
	if f.refs == 0 {
		f.close()
	}
}
