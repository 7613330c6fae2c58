package chunk

import (
	"container/list"
	"sync"
)

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
