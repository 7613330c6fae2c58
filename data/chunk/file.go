package chunk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// TruncateFile cuts the chunks of file ino held on this target to a file
// length of size, the file being cut into chunkSize-byte chunks: chunks that
// start at or past size are deleted, the one straddling size is shortened
// (its last block's checksum recomputed). Growing a file needs nothing here:
// missing bytes read as zeros. The result is on stable storage on return.
func (t *Target) TruncateFile(ino uint64, size, chunkSize int64) error {
	if size < 0 || chunkSize <= 0 || chunkSize > MaxChunkSize {
		return fmt.Errorf("truncate inode %d to %d bytes on target %s: chunk size %d outside 1 B..64 MiB: %w",
			ino, size, t.dir, chunkSize, syscall.EINVAL)
	}
	il := t.inoLock(ino)
	il.Lock()
	defer il.Unlock()
	dir := t.inoDir(ino)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return t.ioError(fmt.Sprintf("list chunks of inode %d", ino), err)
	}
	t.dropCached(ino)
	removed := false
	for _, e := range entries {
		id, ok := chunkOf(ino, e.Name())
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return t.ioError(fmt.Sprintf("stat %v", id), err)
		}
		start := id.Index * uint64(chunkSize)
		switch {
		case start >= uint64(size):
			if err := t.removeChunk(id, info.Size()); err != nil {
				return err
			}
			removed = true
		case start+uint64(info.Size()) > uint64(size):
			if err := t.shorten(id, size-int64(start)); err != nil {
				return err
			}
		}
	}
	if removed {
		if err := syncDir(dir); err != nil {
			return t.ioError(fmt.Sprintf("sync directory of inode %d", ino), err)
		}
	}
	return nil
}

// chunkOf parses a file name of an inode directory; ok is false for
// checksum files and anything else that is not a chunk.
func chunkOf(ino uint64, name string) (ID, bool) {
	if strings.HasSuffix(name, ".crc") {
		return ID{}, false
	}
	idx, err := strconv.ParseUint(name, 10, 64)
	return ID{Ino: ino, Index: idx}, err == nil
}

func (t *Target) dropCached(ino uint64) {
	t.store.files.drop(func(k cacheKey) bool { return k.t == t && k.id.Ino == ino })
}

func (t *Target) removeChunk(id ID, size int64) error {
	path := t.chunkPath(id)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return t.ioError(fmt.Sprintf("remove %v", id), err)
	}
	if err := os.Remove(path + ".crc"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return t.ioError(fmt.Sprintf("remove checksums of %v", id), err)
	}
	t.usedBytes.Add(-size)
	t.numChunks.Add(-1)
	t.clearDirty(id)
	return nil
}

// shorten cuts chunk id to newLen bytes. The bytes kept of the new last
// block are verified before its checksum is recomputed, so corruption is
// never blessed with a fresh checksum.
func (t *Target) shorten(id ID, newLen int64) error {
	path := t.chunkPath(id)
	data, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return t.ioError(fmt.Sprintf("open %v", id), err)
	}
	crc, err := os.OpenFile(path+".crc", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		data.Close()
		return t.ioError(fmt.Sprintf("open checksums of %v", id), err)
	}
	f := &chunkFile{data: data, crc: crc}
	defer f.close()
	info, err := data.Stat()
	if err != nil {
		return t.ioError(fmt.Sprintf("stat %v", id), err)
	}
	oldSize := info.Size()
	if newLen >= oldSize {
		return nil
	}
	last := newLen / BlockSize
	var sum [crcBytes]byte
	partial := newLen%BlockSize != 0
	if partial {
		buf := blockPool.Get().(*[BlockSize]byte)
		defer blockPool.Put(buf)
		bs := last * BlockSize
		if err := t.readBlocks(f, id, buf[:min(bs+BlockSize, oldSize)-bs], last); err != nil {
			return fmt.Errorf("truncate: %w", err)
		}
		binary.LittleEndian.PutUint32(sum[:], crc32.Checksum(buf[:newLen-bs], castagnoli))
	}
	if err := data.Truncate(newLen); err != nil {
		return t.ioError(fmt.Sprintf("truncate %v", id), err)
	}
	if partial {
		if _, err := crc.WriteAt(sum[:], last*crcBytes); err != nil {
			return t.ioError(fmt.Sprintf("write checksums of %v", id), err)
		}
	}
	if err := crc.Truncate(crcBytes * ((newLen + BlockSize - 1) / BlockSize)); err != nil {
		return t.ioError(fmt.Sprintf("truncate checksums of %v", id), err)
	}
	t.usedBytes.Add(newLen - oldSize)
	if err := t.syncChunk(f, id); err != nil {
		return err
	}
	t.clearDirty(id)
	return nil
}

// DeleteFile removes every chunk of file ino held on this target. A file
// without chunks here is not an error.
func (t *Target) DeleteFile(ino uint64) error {
	il := t.inoLock(ino)
	il.Lock()
	defer il.Unlock()
	t.dropCached(ino)
	dir := t.inoDir(ino)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return t.ioError(fmt.Sprintf("list chunks of inode %d", ino), err)
	}
	var bytes, chunks int64
	for _, e := range entries {
		if _, ok := chunkOf(ino, e.Name()); !ok {
			continue
		}
		if info, err := e.Info(); err == nil {
			bytes += info.Size()
			chunks++
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return t.ioError(fmt.Sprintf("delete chunks of inode %d", ino), err)
	}
	t.usedBytes.Add(-bytes)
	t.numChunks.Add(-chunks)
	t.syncMu.Lock()
	delete(t.dirty, ino)
	delete(t.newEntries, ino)
	t.syncMu.Unlock()
	return nil
}

// SyncFile makes every chunk of ino written on this target since its last
// sync durable: fdatasync of the chunk files, then fsync of the directories
// that got new entries.
func (t *Target) SyncFile(ino uint64) error {
	il := t.inoLock(ino)
	il.RLock()
	defer il.RUnlock()
	t.syncMu.Lock()
	dirty := t.dirty[ino]
	delete(t.dirty, ino)
	t.syncMu.Unlock()
	for idx := range dirty {
		id := ID{Ino: ino, Index: idx}
		if err := t.syncByID(id); err != nil {
			for idx := range dirty {
				t.markDirty(ID{Ino: ino, Index: idx})
			}
			return err
		}
	}
	return t.syncEntries(ino)
}

func (t *Target) syncByID(id ID) error {
	if f := t.store.files.get(cacheKey{t, id}); f != nil {
		defer t.store.files.release(f)
		return t.syncChunk(f, id)
	}
	path := t.chunkPath(id)
	for _, p := range []string{path, path + ".crc"} {
		file, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return t.ioError(fmt.Sprintf("open %v for sync", id), err)
		}
		err = syscall.Fdatasync(int(file.Fd()))
		file.Close()
		if err != nil {
			return t.ioError(fmt.Sprintf("sync %v", id), err)
		}
	}
	return nil
}

// syncChunk fdatasyncs the chunk's data and checksum files. Callers that
// hold the chunk exclusively then clear its dirty mark; SyncFile does not
// (it took the marks before syncing, and a write racing with it marks anew).
func (t *Target) syncChunk(f *chunkFile, id ID) error {
	if err := syscall.Fdatasync(int(f.data.Fd())); err != nil {
		return t.ioError(fmt.Sprintf("sync %v", id), err)
	}
	if err := syscall.Fdatasync(int(f.crc.Fd())); err != nil {
		return t.ioError(fmt.Sprintf("sync checksums of %v", id), err)
	}
	return nil
}

// syncEntries fsyncs the directory of ino if chunk files were created in it
// since its last sync, and its parent if the directory itself is new.
func (t *Target) syncEntries(ino uint64) error {
	t.syncMu.Lock()
	newDir, ok := t.newEntries[ino]
	delete(t.newEntries, ino)
	t.syncMu.Unlock()
	if !ok {
		return nil
	}
	err := syncDir(t.inoDir(ino))
	if err == nil && newDir {
		err = syncDir(t.hashDir(ino))
	}
	if err != nil {
		t.markNewEntry(ino, newDir)
		return t.ioError(fmt.Sprintf("sync directory of inode %d", ino), err)
	}
	return nil
}

func (t *Target) markNewEntry(ino uint64, newDir bool) {
	t.syncMu.Lock()
	t.newEntries[ino] = t.newEntries[ino] || newDir
	t.syncMu.Unlock()
}

func (t *Target) markDirty(id ID) {
	t.syncMu.Lock()
	m := t.dirty[id.Ino]
	if m == nil {
		m = make(map[uint64]struct{})
		t.dirty[id.Ino] = m
	}
	m[id.Index] = struct{}{}
	t.syncMu.Unlock()
}

func (t *Target) clearDirty(id ID) {
	t.syncMu.Lock()
	if m := t.dirty[id.Ino]; m != nil {
		delete(m, id.Index)
		if len(m) == 0 {
			delete(t.dirty, id.Ino)
		}
	}
	t.syncMu.Unlock()
}
