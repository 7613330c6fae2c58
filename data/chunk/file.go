package chunk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// LockedFile is the set of chunks of one file in one chain, held
// exclusively: no chunk of it is mutated by anyone else until Unlock. A
// replicating caller truncates or deletes, forwards the operation to the
// next replica, then unlocks.
type LockedFile struct {
	t      *Target
	ino    uint64
	chain  uint64
	unlock func()
}

// LockFile takes the chunks of file ino in chain exclusively.
func (t *Target) LockFile(ino, chain uint64) *LockedFile {
	return &LockedFile{t: t, ino: ino, chain: chain, unlock: t.fileLocks.lock(fileKey{ino, chain}, true)}
}

// Unlock releases the file.
func (lf *LockedFile) Unlock() { lf.unlock() }

// TruncateFile cuts the chunks of file ino held on this target for chain
// to a file length of size (see LockedFile.Truncate).
func (t *Target) TruncateFile(ino, chain uint64, size, chunkSize int64) error {
	lf := t.LockFile(ino, chain)
	defer lf.Unlock()
	return lf.Truncate(size, chunkSize)
}

// Truncate cuts the file's chunks of the locked chain (and chunks of no
// known chain, written before versions existed) to a file length of size,
// the file being cut into chunkSize-byte chunks: chunks that start at or
// past size are deleted, the one straddling size is shortened (its last
// block's checksum recomputed, its version incremented). Growing a file
// needs nothing here: missing bytes read as zeros. The result is on stable
// storage on return.
func (lf *LockedFile) Truncate(size, chunkSize int64) error {
	t, ino := lf.t, lf.ino
	if size < 0 || chunkSize <= 0 || chunkSize > MaxChunkSize {
		return fmt.Errorf("truncate inode %d to %d bytes on target %s: chunk size %d outside 1 B..64 MiB: %w",
			ino, size, t.dir, chunkSize, syscall.EINVAL)
	}
	ids, err := t.fileChunks(ino)
	if err != nil {
		return err
	}
	removed := false
	for _, id := range ids {
		r, err := lf.truncateChunk(id, size, chunkSize)
		if err != nil {
			return err
		}
		removed = removed || r
	}
	if removed {
		return t.syncInoDir(ino)
	}
	return nil
}

// truncateChunk applies a truncation to one chunk if it belongs to the
// locked chain; removed reports that the chunk was deleted.
func (lf *LockedFile) truncateChunk(id ID, size, chunkSize int64) (removed bool, err error) {
	t := lf.t
	defer t.chunkLocks.lock(id, true)()
	f, err := t.openChunk(id, false)
	if err != nil || f == nil {
		return false, err
	}
	defer t.store.files.release(f)
	if f.bad != nil && f.bad.Header {
		return false, nil // chain unknown; a repair brings the truncated copy
	}
	if f.hdr.chain != lf.chain && f.hdr.chain != 0 {
		return false, nil
	}
	start := int64(id.Index) * chunkSize
	switch {
	case start >= size:
		t.store.files.drop(func(k cacheKey) bool { return k == f.key })
		return true, t.removeChunk(id, f.size)
	case start+f.size > size:
		return false, t.shorten(f, id, size-start, lf.chain)
	}
	return false, nil
}

// fileChunks lists the chunks of ino present on the target.
func (t *Target) fileChunks(ino uint64) ([]ID, error) {
	entries, err := os.ReadDir(t.inoDir(ino))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, t.ioError(fmt.Sprintf("list chunks of inode %d", ino), err)
	}
	var ids []ID
	for _, e := range entries {
		if id, ok := chunkOf(ino, e.Name()); ok {
			ids = append(ids, id)
		}
	}
	// A chunk may have a file of each form for a while (a crash while
	// one was rewritten as the other): list it once.
	slices.SortFunc(ids, CompareListOrder)
	return slices.Compact(ids), nil
}

// chunkOf parses a file name of an inode directory (a chunk file, or the
// data file of a chunk of the older form); ok is false for checksum and
// temporary files and anything else that is not a chunk.
func chunkOf(ino uint64, name string) (ID, bool) {
	idx, err := strconv.ParseUint(strings.TrimSuffix(name, inlineSuffix), 10, 64)
	return ID{Ino: ino, Index: idx}, err == nil
}

// removeChunk removes the files of chunk id, of either form.
func (t *Target) removeChunk(id ID, size int64) error {
	path := t.chunkPath(id)
	found := false
	for _, p := range []string{t.inlinePath(id), path, path + ".crc"} {
		err := t.discard(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return t.ioError(fmt.Sprintf("remove %v", id), err)
		}
		found = found || p != path+".crc"
	}
	if !found {
		return nil
	}
	t.usedBytes.Add(-size)
	t.numChunks.Add(-1)
	t.clearDirty(id)
	return nil
}

// shorten cuts chunk id (open as f, held exclusively) to newLen bytes as
// its next version. The bytes kept of the new last block are verified
// before its checksum is recomputed, so corruption is never blessed with a
// fresh checksum.
func (t *Target) shorten(f *chunkFile, id ID, newLen int64, chain uint64) error {
	if err := t.check(f); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	if f.crc != nil {
		if err := t.rewrite(f, id); err != nil {
			return err
		}
	}
	oldSize := f.size
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
	if err := f.truncateData(newLen); err != nil {
		return t.ioError(fmt.Sprintf("truncate %v", id), err)
	}
	if partial {
		if err := f.writeSums(sum[:], last); err != nil {
			return t.ioError(fmt.Sprintf("write checksums of %v", id), err)
		}
	}
	if err := f.cutSums((newLen + BlockSize - 1) / BlockSize); err != nil {
		return t.ioError(fmt.Sprintf("truncate checksums of %v", id), err)
	}
	if err := t.writeHeader(f, id, header{version: f.hdr.version + 1, chain: chain, length: newLen}); err != nil {
		return err
	}
	f.size = newLen
	t.usedBytes.Add(newLen - oldSize)
	if err := t.syncChunk(f, id); err != nil {
		return err
	}
	t.clearDirty(id)
	return nil
}

// Delete removes the file's chunks of the locked chain (and chunks of no
// known chain, written before versions existed), and the file's directory
// once empty.
func (lf *LockedFile) Delete() error {
	return lf.t.deleteChunks(lf.ino, func(f *chunkFile) bool {
		return (f.bad == nil || !f.bad.Header) && (f.hdr.chain == lf.chain || f.hdr.chain == 0)
	})
}

// DeleteFile removes every chunk of file ino held on this target, in every
// chain. A file without chunks here is not an error.
func (t *Target) DeleteFile(ino uint64) error {
	return t.deleteChunks(ino, func(*chunkFile) bool { return true })
}

func (t *Target) deleteChunks(ino uint64, match func(*chunkFile) bool) error {
	ids, err := t.fileChunks(ino)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := t.deleteChunk(id, match); err != nil {
			return err
		}
	}
	// Fails while chunks of other chains remain; a concurrent creation
	// retries its Mkdir (see createInInoDir).
	os.Remove(t.inoDir(ino))
	return nil
}

func (t *Target) deleteChunk(id ID, match func(*chunkFile) bool) error {
	defer t.chunkLocks.lock(id, true)()
	f, err := t.openChunk(id, false)
	if err != nil {
		var ce *CorruptionError
		if !errors.As(err, &ce) {
			return err
		}
	}
	if f == nil {
		return nil
	}
	size := f.size
	ok := match(f)
	t.store.files.release(f)
	if !ok {
		return nil
	}
	t.store.files.drop(func(k cacheKey) bool { return k == f.key })
	return t.removeChunk(id, size)
}

// SyncFile makes every chunk of ino written on this target since its last
// sync durable: fdatasync of the chunk files, then fsync of the directories
// that got new entries.
//
// It takes no chunk lock (a write holding its chunk while it forwards, or
// an empty write with sync, calls it), so it never touches the cache of
// open files: their fields are used only under the chunk's lock, and a
// mutation may replace (migrate) or close (truncate, delete, Replace) them
// meanwhile. It opens the chunk files by path instead; fdatasync of any
// descriptor of a file flushes what was written through every other.
func (t *Target) SyncFile(ino uint64) error {
	t.syncMu.Lock()
	dirty := t.dirty[ino]
	delete(t.dirty, ino)
	t.syncMu.Unlock()
	for idx := range dirty {
		id := ID{Ino: ino, Index: idx}
		if err := t.syncByPath(id); err != nil {
			for idx := range dirty {
				t.markDirty(ID{Ino: ino, Index: idx})
			}
			return err
		}
	}
	return t.syncEntries(ino)
}

// syncByPath fdatasyncs chunk id's files through descriptors of its own.
// A chunk removed meanwhile has nothing left to sync; one replaced
// meanwhile was synced by Replace.
func (t *Target) syncByPath(id ID) error {
	path := t.chunkPath(id)
	for _, p := range []string{t.inlinePath(id), path, path + ".crc"} {
		file, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return t.ioError(fmt.Sprintf("open %v for sync", id), err)
		}
		err = fdatasync(file)
		file.Close()
		if err != nil {
			return t.ioError(fmt.Sprintf("sync %v", id), err)
		}
	}
	return nil
}

// syncChunk fdatasyncs the chunk's file (the data and checksum files of
// a chunk of the older form at once, unless the target is in memory). The caller holds the chunk
// exclusively, and then clears its dirty mark.
func (t *Target) syncChunk(f *chunkFile, id ID) error {
	if f.crc == nil {
		if err := fdatasync(f.data); err != nil {
			return t.ioError(fmt.Sprintf("sync %v", id), err)
		}
		return nil
	}
	var crcErr error
	var wg sync.WaitGroup
	if !t.inMemory {
		// Both at once: the disk gets both files' writes together, and
		// the file system may commit them in one journal commit.
		wg.Go(func() { crcErr = fdatasync(f.crc) })
	}
	err := fdatasync(f.data)
	wg.Wait()
	if t.inMemory && err == nil {
		crcErr = fdatasync(f.crc)
	}
	if err != nil {
		return t.ioError(fmt.Sprintf("sync %v", id), err)
	}
	if crcErr != nil {
		return t.ioError(fmt.Sprintf("sync checksums of %v", id), crcErr)
	}
	return nil
}

// syncChunkAndEntries makes a chunk durable: its files, and the
// directory entries made for it. On a disk the three go at once (new small
// files at close: 7-20% more per second than one after the other); on a
// file system in memory, where a sync costs nothing, one after the other,
// which spares waking another thread.
func (t *Target) syncChunkAndEntries(f *chunkFile, id ID) error {
	if !t.inMemory {
		var entriesErr error
		var wg sync.WaitGroup
		wg.Go(func() { entriesErr = t.syncEntries(id.Ino) })
		err := t.syncChunk(f, id)
		wg.Wait()
		if err != nil {
			return err
		}
		t.clearDirty(id)
		return entriesErr
	}
	if err := t.syncChunk(f, id); err != nil {
		return err
	}
	t.clearDirty(id)
	return t.syncEntries(id.Ino)
}

// fdatasync flushes f's data (and the metadata needed to read it back).
// The descriptor is held for the call, so a concurrent Close makes it fail
// with os.ErrClosed instead of syncing whatever file reuses the number.
func fdatasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			if serr = syscall.Fdatasync(int(fd)); serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
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
	if errors.Is(err, fs.ErrNotExist) { // deleted meanwhile
		return nil
	}
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
