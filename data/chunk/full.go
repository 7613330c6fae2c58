package chunk

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
)

// Full is a whole chunk with its version, as copied between replicas.
type Full struct {
	Version uint64
	Exists  bool // false: no such chunk (applying it deletes the chunk)
	Data    []byte
}

// ReadFull reads the whole chunk, verified, with its version.
func (l *Locked) ReadFull() (Full, error) {
	return l.t.readFull(l.id)
}

// ReadFull reads the whole chunk id, verified, with its version; a chunk
// that does not exist is returned with Exists false.
func (t *Target) ReadFull(id ID) (Full, error) {
	defer t.chunkLocks.lock(id, false)()
	return t.readFull(id)
}

func (t *Target) readFull(id ID) (Full, error) {
	f, err := t.openChunk(id, false)
	if err != nil || f == nil {
		return Full{}, err
	}
	defer t.store.files.release(f)
	if err := t.check(f); err != nil {
		return Full{}, err
	}
	buf := make([]byte, f.size())
	if f.size() > 0 {
		if err := t.readBlocks(f, buf, 0); err != nil {
			return Full{}, err
		}
	}
	return Full{Version: f.hdr.version, Exists: true, Data: buf}, nil
}

// Replace makes the chunk exactly full (deleting it if !full.Exists), as
// version full.Version: its file (head and data, every block one copy in
// slot A) is written to a temporary file, fsynced and renamed over the
// chunk's, then the directory is fsynced. A crash leaves the old chunk or
// the new one.
func (l *Locked) Replace(full Full) error {
	t, id := l.t, l.id
	if len(full.Data) > MaxChunkSize {
		return fmt.Errorf("replace %v on target %s: %d bytes is more than a chunk can hold", id, t.dir, len(full.Data))
	}
	// The caller holds the chunk: nothing opens it meanwhile, and its
	// open file (if cached) is of the file replaced.
	t.store.files.drop(func(k cacheKey) bool { return k.t == t && k.id == id })
	oldSize, existed := int64(0), false
	if _, err := t.fs.Lstat(t.inlinePath(id)); err == nil {
		oldSize, existed = t.lengthOf(t.inlinePath(id)), true
	}
	if !full.Exists {
		if !existed {
			return nil
		}
		if err := t.removeChunk(id, oldSize); err != nil {
			return err
		}
		return t.syncInoDir(id.Ino)
	}
	h := header{version: full.Version, chain: l.chain, length: int64(len(full.Data))}
	if h.version == 0 && h.length > 0 {
		return fmt.Errorf("replace %v on target %s: a chunk holding data has a version of at least 1: %w", id, t.dir, errInvalid)
	}
	newDir, err := t.createInInoDir(id, func() error {
		return t.writeWhole(id, h, full.Data)
	})
	if err != nil {
		return t.ioError(fmt.Sprintf("write copy of %v", id), err)
	}
	if !existed {
		t.numChunks.Add(1)
	}
	t.usedBytes.Add(int64(len(full.Data)) - oldSize)
	t.clearUnsynced(id)
	if err := t.fs.SyncDir(t.inoDir(id.Ino)); err != nil {
		return t.ioError(fmt.Sprintf("sync directory of inode %d", id.Ino), err)
	}
	if newDir {
		if err := t.fs.SyncDir(t.hashDir(id.Ino)); err != nil {
			return t.ioError(fmt.Sprintf("sync directory of inode %d", id.Ino), err)
		}
	}
	return nil
}

// writeWhole writes chunk id's file with header h and bytes data (every
// block one copy in slot A, durable: the synced record says so) to a
// temporary file, fsyncs it and renames it into place.
func (t *Target) writeWhole(id ID, h header, data []byte) error {
	path := t.inlinePath(id)
	nb := nblocks(h.length)
	head := make([]byte, entriesOff+nb*blockEntries)
	hb := h.encode()
	copy(head, hb[:])
	sb := encodeSynced(id, h.version)
	copy(head[syncedOff:], sb[:])
	for b := range nb {
		e := entry{gen: h.version & genMask, n: extent(b, h.length), slot: 0}
		e.sum = crc32.Checksum(data[b*BlockSize:b*BlockSize+e.n], castagnoli)
		e.encode(head[entryOff(b, 0):])
	}
	tmp := path + ".tmp"
	f, err := t.fs.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, dataModeFresh)
	if err != nil {
		return err
	}
	if _, err = f.WriteAt(head, 0); err == nil && len(data) > 0 {
		_, err = f.WriteAt(data, inlineDataOff)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = t.fs.Rename(tmp, path)
	}
	if err != nil {
		t.fs.Remove(tmp)
	}
	return err
}

// Stat returns the chunk's version, chain, length and digest without
// reading its data; a chunk that does not exist has Exists false.
func (t *Target) Stat(id ID) (Info, error) {
	defer t.chunkLocks.lock(id, false)()
	return t.stat(id)
}

// stat reads the chunk's head directly (not through the cache of open
// files, so that listing many chunks does not evict busy ones), unless
// the chunk is open, or must be recovered first.
func (t *Target) stat(id ID) (Info, error) {
	if f := t.store.files.get(cacheKey{t, id}); f != nil {
		defer t.store.files.release(f)
		return t.infoOf(f)
	}
	file, err := t.fs.OpenFile(t.inlinePath(id), os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return Info{ID: id}, nil
	}
	if err != nil {
		return Info{ID: id}, t.ioError(fmt.Sprintf("open %v", id), err)
	}
	buf := headPool.Get().(*[headSize]byte)
	defer headPool.Put(buf)
	n, err := readHead(file, buf[:])
	file.Close()
	if err != nil {
		return Info{ID: id}, t.ioError(fmt.Sprintf("read head of %v", id), err)
	}
	f := &chunkFile{key: cacheKey{t, id}}
	synced, stale := t.parseHead(f, buf[:n])
	if f.bad == nil && (len(stale) > 0 || synced < f.hdr.version && !t.unsyncedHas(id)) {
		// Settle it first: what a crash left may be torn.
		of, err := t.openChunk(id, false)
		if err != nil || of == nil {
			return Info{ID: id}, err
		}
		defer t.store.files.release(of)
		return t.infoOf(of)
	}
	return t.infoOf(f)
}

// infoOf is the Info of chunk f.
func (t *Target) infoOf(f *chunkFile) (Info, error) {
	id := f.key.id
	if f.bad != nil {
		return Info{ID: id, Exists: true}, t.corrupt(f.bad)
	}
	sums := make([]uint32, nblocks(f.size()))
	for b := range sums {
		sum, ok := f.contentSum(int64(b))
		if !ok {
			buf := blockPool.Get().(*[BlockSize]byte)
			ext := extent(int64(b), f.size())
			err := t.readBlocks(f, buf[:ext], int64(b))
			sum = crc32.Checksum(buf[:ext], castagnoli)
			blockPool.Put(buf)
			if err != nil {
				return Info{ID: id, Exists: true}, err
			}
		}
		sums[b] = sum
	}
	return Info{ID: id, Exists: true, Version: f.hdr.version, Chain: f.hdr.chain, Length: f.size(), Digest: digest(sums)}, nil
}

// Verify reads the whole chunk and checks it against its checksums and
// header: a *CorruptionError names what is wrong (a block, the header,
// the block table, data shorter than an entry says). It returns the
// bytes verified.
func (t *Target) Verify(id ID) (int64, error) {
	defer t.chunkLocks.lock(id, false)()
	// Reopen, so that the head is read from disk again.
	t.store.files.drop(func(k cacheKey) bool { return k.t == t && k.id == id })
	f, err := t.openChunk(id, false)
	if err != nil || f == nil {
		return 0, err
	}
	defer t.store.files.release(f)
	if err := t.check(f); err != nil {
		return 0, err
	}
	var n int64
	buf := blockPool.Get().(*[BlockSize]byte)
	defer blockPool.Put(buf)
	for b := range nblocks(f.size()) {
		m := extent(b, f.size())
		if err := t.readBlocks(f, buf[:m], b); err != nil {
			return n, err
		}
		n += m
	}
	return n, nil
}
