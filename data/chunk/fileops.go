package chunk

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"slices"
	"strconv"
	"strings"
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
// known chain: created, never committed) to a file length of size, the
// file being cut into chunkSize-byte chunks: chunks that start at or past
// size are deleted, the one straddling size is shortened (as its next
// version). Growing a file needs nothing here: missing bytes read as
// zeros. The result is on stable storage on return.
func (lf *LockedFile) Truncate(size, chunkSize int64) error {
	t, ino := lf.t, lf.ino
	if size < 0 || chunkSize <= 0 || chunkSize > MaxChunkSize {
		return fmt.Errorf("truncate inode %d to %d bytes on target %s: chunk size %d outside 1 B..64 MiB: %w",
			ino, size, t.dir, chunkSize, errInvalid)
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
		return true, t.removeChunk(id, f.size())
	case start+f.size() > size:
		return false, t.shorten(f, size-start, lf.chain)
	}
	return false, nil
}

// fileChunks lists the chunks of ino present on the target.
func (t *Target) fileChunks(ino uint64) ([]ID, error) {
	entries, err := t.fs.ReadDir(t.inoDir(ino))
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
	slices.SortFunc(ids, CompareListOrder)
	return ids, nil
}

// chunkOf parses a file name of an inode directory; ok is false for
// temporary files and anything else that is not a chunk file.
func chunkOf(ino uint64, name string) (ID, bool) {
	s, ok := strings.CutSuffix(name, inlineSuffix)
	if !ok {
		return ID{}, false
	}
	idx, err := strconv.ParseUint(s, 10, 64)
	return ID{Ino: ino, Index: idx}, err == nil
}

// removeChunk removes the file of chunk id.
func (t *Target) removeChunk(id ID, size int64) error {
	err := t.discard(t.inlinePath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return t.ioError(fmt.Sprintf("remove %v", id), err)
	}
	t.usedBytes.Add(-size)
	t.numChunks.Add(-1)
	t.clearUnsynced(id)
	return nil
}

// shorten cuts chunk f (held exclusively) to newLen bytes as its next
// version, durably. The bytes kept of the new last block are checked
// before their checksum is computed, so corruption is never blessed with
// a fresh checksum. The new last block's entry goes beside the old one
// (its bytes stay where they are) and the header commits it; only once
// that is synced are the bytes past the end freed.
func (t *Target) shorten(f *chunkFile, newLen int64, chain uint64) error {
	id := f.key.id
	if err := t.check(f); err != nil {
		return fmt.Errorf("truncate: %w", err)
	}
	oldLen := f.size()
	version := f.hdr.version + 1
	if b := newLen / BlockSize; newLen%BlockSize != 0 {
		if err := t.damagedError(f, b); err != nil {
			return fmt.Errorf("truncate: %w", err)
		}
		if i := f.cur(b); i >= 0 {
			e := f.ents[b][i]
			if keep := newLen - b*BlockSize; keep < e.n {
				buf := blockPool.Get().(*[BlockSize]byte)
				defer blockPool.Put(buf)
				if err := t.readCopy(f, b, e, buf[:]); err != nil {
					return fmt.Errorf("truncate: %w", err)
				}
				ne := entry{gen: version & genMask, sum: crc32.Checksum(buf[:keep], castagnoli), n: keep, slot: e.slot}
				ei := 1 - i
				if di := f.durable(b, t.syncedFloor(id)); di >= 0 && di != i {
					ei = i // i is not durable: the durable one stays
				}
				f.ents[b][ei] = ne
				if err := t.writeEntries(f, b, b); err != nil {
					return err
				}
			}
		}
	}
	if err := t.writeHeader(f, header{version: version, chain: chain, length: newLen}); err != nil {
		return err
	}
	// The chunk's file and, if it is new, its directory entry: a
	// truncation is durable on return.
	if err := t.syncChunkAndEntries(f, id); err != nil {
		return err
	}
	// The new last block's older entry, counting bytes past the new end,
	// is no fallback any more: the new one is durable.
	if b := newLen / BlockSize; newLen%BlockSize != 0 {
		if i := f.cur(b); i >= 0 && f.ents[b][1-i].n > newLen-b*BlockSize {
			f.ents[b][1-i] = entry{}
			if err := t.writeEntries(f, b, b); err != nil {
				return err
			}
		}
	}
	// Free what is past the end: the file is cut after the new length if
	// every block's content is in slot 0 (so its size tells its length
	// when the target is scanned), else every slot of the blocks cut away
	// is punched out.
	first := nblocks(newLen)
	usesOthers := false
	for b := range first {
		if i := f.cur(b); i >= 0 && f.ents[b][i].slot != 0 {
			usesOthers = true
		}
	}
	if !usesOthers {
		if err := f.file.Truncate(inlineDataOff + newLen); err != nil {
			return t.ioError(fmt.Sprintf("truncate %v", id), err)
		}
	} else if n := nblocks(oldLen) - first; n > 0 {
		for s := range int8(slots) {
			if err := f.file.PunchHole(slotOff(first, s), n*BlockSize); err != nil {
				t.store.log.Warn("free the bytes of a truncated chunk", "chunk", id.String(), "target", t.dir, "err", err)
			}
		}
	}
	f.ents = f.ents[:first]
	for b := range f.damaged {
		if b >= first {
			delete(f.damaged, b)
		}
	}
	t.usedBytes.Add(newLen - oldLen)
	return nil
}

// Delete removes the file's chunks of the locked chain (and chunks of no
// known chain), and the file's directory once empty.
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
	t.fs.Remove(t.inoDir(ino))
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
	size := f.size()
	ok := match(f)
	t.store.files.release(f)
	if !ok {
		return nil
	}
	t.store.files.drop(func(k cacheKey) bool { return k == f.key })
	return t.removeChunk(id, size)
}

func (t *Target) syncInoDir(ino uint64) error {
	if err := t.fs.SyncDir(t.inoDir(ino)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return t.ioError(fmt.Sprintf("sync directory of inode %d", ino), err)
	}
	return nil
}
