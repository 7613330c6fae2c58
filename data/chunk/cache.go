package chunk

import (
	"container/list"
	"os"
	"sync"
)

// chunkFile is an open chunk: its file (holding its header, checksums and
// data; or, for a chunk of the older form, its data file and its checksum
// file) and its length. Its fields are used only under the chunk's lock
// (read lock for reads), never by lockless callers such as SyncFile: a
// mutation may swap the files (rewrite), and truncate, delete, Replace
// and Verify drop the file from the cache, after which it is closed by
// its last user.
type chunkFile struct {
	key  cacheKey
	data *os.File
	crc  *os.File // nil for a chunk file holding its checksums
	size int64    // committed length (as the header says)
	hdr  header   // as last read or written
	// bad is corruption found when the chunk was opened (damaged header,
	// data file shorter than the header says): reads fail with it until
	// the chunk is replaced.
	bad *CorruptionError

	// Guarded by fileCache.mu.
	refs    int
	elem    *list.Element
	dropped bool // out of the cache; closed when refs reaches 0
}

func (f *chunkFile) close() {
	f.data.Close()
	if f.crc != nil {
		f.crc.Close()
	}
}

// sumsFile is the file holding the chunk's header and checksums.
func (f *chunkFile) sumsFile() *os.File {
	if f.crc != nil {
		return f.crc
	}
	return f.data
}

// readData reads the chunk's bytes at off.
func (f *chunkFile) readData(b []byte, off int64) (int, error) {
	return f.data.ReadAt(b, f.hdr.dataOff+off)
}

// writeData writes the chunk's bytes at off.
func (f *chunkFile) writeData(b []byte, off int64) (int, error) {
	return f.data.WriteAt(b, f.hdr.dataOff+off)
}

// truncateData cuts or extends the chunk's bytes to n.
func (f *chunkFile) truncateData(n int64) error {
	return f.data.Truncate(f.hdr.dataOff + n)
}

// readSums reads checksums from block first on.
func (f *chunkFile) readSums(b []byte, first int64) (int, error) {
	return f.sumsFile().ReadAt(b, f.hdr.sumsOff()+first*crcBytes)
}

// writeSums writes checksums from block first on.
func (f *chunkFile) writeSums(b []byte, first int64) error {
	_, err := f.sumsFile().WriteAt(b, f.hdr.sumsOff()+first*crcBytes)
	return err
}

// cutSums drops the checksums past block n of a chunk of two files; a
// chunk file's head keeps them (the length bounds what is read).
func (f *chunkFile) cutSums(n int64) error {
	if f.crc == nil {
		return nil
	}
	return f.crc.Truncate(f.hdr.sumsOff() + crcBytes*n)
}

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
