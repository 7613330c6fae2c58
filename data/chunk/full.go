package chunk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/crc64"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// Full is a whole chunk with its version, as copied between replicas.
type Full struct {
	Version uint64
	Exists  bool // false: no such chunk (applying it deletes the chunk)
	Data    []byte
}

// Locked is a chunk held exclusively for mutation (and the chunks of its
// file in its chain shared, so no truncate or delete of that chain runs
// meanwhile). A replicating caller applies a mutation and forwards it to
// the next replica before unlocking, so every replica sees the chunk's
// mutations in the same order. Its methods must not be called after
// Unlock, nor concurrently.
type Locked struct {
	t      *Target
	id     ID
	chain  uint64
	unlock []func()
}

// Lock takes chunk id of chain for mutation.
func (t *Target) Lock(id ID, chain uint64) *Locked {
	l := &Locked{t: t, id: id, chain: chain}
	l.unlock = append(l.unlock, t.fileLocks.lock(fileKey{id.Ino, chain}, false), t.chunkLocks.lock(id, true))
	return l
}

// Unlock releases the chunk.
func (l *Locked) Unlock() {
	for i := len(l.unlock) - 1; i >= 0; i-- {
		l.unlock[i]()
	}
	l.unlock = nil
}

// Info returns the chunk's version, chain and length. A chunk whose header
// is damaged fails with a *CorruptionError.
func (l *Locked) Info() (Info, error) {
	return l.t.info(l.id)
}

// info reads a chunk's header; the caller holds the chunk's lock.
func (t *Target) info(id ID) (Info, error) {
	f, err := t.openChunk(id, false)
	if err != nil || f == nil {
		return Info{ID: id}, err
	}
	defer t.store.files.release(f)
	if f.bad != nil && f.bad.Header {
		return Info{ID: id}, t.corrupt(f.bad)
	}
	return Info{ID: id, Exists: true, Version: f.hdr.version, Chain: f.hdr.chain, Length: f.size}, nil
}

// Write writes data at off (as Target.Write) and sets the chunk's version
// to version. An empty write changes nothing (with sync it syncs the file).
func (l *Locked) Write(off int64, data []byte, chunkSize int64, version uint64, sync bool) error {
	return l.WritePieces([]Piece{{Off: off, Data: data}}, chunkSize, version, sync)
}

// Piece is one range of a write of several pieces of a chunk.
type Piece struct {
	Off  int64
	Data []byte
}

// WritePieces is Write of several pieces at once, as one write that sets
// the chunk's version to version: every range is checked before anything
// is written, the pieces are written in order, and with sync the chunk is
// synced once, after the last. Pieces without data change nothing.
func (l *Locked) WritePieces(pieces []Piece, chunkSize int64, version uint64, sync bool) error {
	t, id := l.t, l.id
	total := 0
	for _, p := range pieces {
		if err := checkRange(id, p.Off, len(p.Data), chunkSize); err != nil {
			return fmt.Errorf("write to target %s: %w", t.dir, err)
		}
		total += len(p.Data)
	}
	if total == 0 {
		if sync {
			return t.SyncFile(id.Ino)
		}
		return nil
	}
	f, err := t.openChunk(id, true)
	if err != nil {
		return err
	}
	defer t.store.files.release(f)
	if err := t.check(f); err != nil {
		return err
	}
	end := int64(0)
	for _, p := range pieces {
		end = max(end, p.Off+int64(len(p.Data)))
	}
	if f.crc != nil {
		if err := t.rewrite(f, id); err != nil {
			return err
		}
	}
	for _, p := range pieces {
		if len(p.Data) == 0 {
			continue
		}
		if err := t.writeLocked(f, id, p.Off, p.Data, version, l.chain); err != nil {
			return err
		}
	}
	if !sync {
		t.markDirty(id)
		if total >= startWritebackAt {
			// Start writing the bytes to the disk now (without waiting), so
			// the file's sync at close finds them written instead of
			// writing the whole file then: one call over the range the
			// pieces span (what lies between them is not dirty).
			lo, hi := pieces[0].Off, pieces[0].Off
			for _, p := range pieces {
				lo, hi = min(lo, p.Off), max(hi, p.Off+int64(len(p.Data)))
			}
			_ = unix.SyncFileRange(int(f.data.Fd()), f.hdr.dataOff+lo, hi-lo, unix.SYNC_FILE_RANGE_WRITE)
		}
		return nil
	}
	return t.syncChunkAndEntries(f, id)
}

// startWritebackAt is the least write (not synced) whose bytes go to the
// disk at once rather than when the kernel gets to them.
const startWritebackAt = 256 << 10

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
	buf := make([]byte, f.size)
	if f.size > 0 {
		if err := t.readBlocks(f, id, buf, 0); err != nil {
			return Full{}, err
		}
	}
	return Full{Version: f.hdr.version, Exists: true, Data: buf}, nil
}

// Replace makes the chunk exactly full (deleting it if !full.Exists), as
// version full.Version: its file (header, checksums and data) is written
// to a temporary file, fsynced and renamed over the chunk's, the
// directory is fsynced, and then the files of a chunk of the older form
// are removed (a crash in between leaves both; the new file is read).
func (l *Locked) Replace(full Full) error {
	t, id := l.t, l.id
	if len(full.Data) > MaxChunkSize {
		return fmt.Errorf("replace %v on target %s: %d bytes is more than a chunk can hold", id, t.dir, len(full.Data))
	}
	t.store.files.drop(func(k cacheKey) bool { return k.t == t && k.id == id })
	path := t.chunkPath(id)
	oldSize, existed := int64(0), false
	if info, err := t.stat(id); err == nil && info.Exists {
		oldSize, existed = info.Length, true
	} else if inline, err := os.Stat(t.inlinePath(id)); err == nil {
		oldSize, existed = max(inline.Size()-inlineDataOff, 0), true
	}
	older, err := os.Stat(path)
	if err == nil && !existed {
		oldSize, existed = older.Size(), true
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
	h := header{version: full.Version, chain: l.chain, length: int64(len(full.Data)), dataOff: inlineDataOff}
	var file *os.File
	newDir, err := t.createInInoDir(id, func() (err error) {
		file, err = writeInline(t.inlinePath(id), h, blockSums(full.Data), full.Data)
		return err
	})
	if err != nil {
		return t.ioError(fmt.Sprintf("write copy of %v", id), err)
	}
	file.Close()
	if !existed {
		t.numChunks.Add(1)
	}
	t.usedBytes.Add(int64(len(full.Data)) - oldSize)
	t.clearDirty(id)
	if err := syncDir(t.inoDir(id.Ino)); err != nil {
		return t.ioError(fmt.Sprintf("sync directory of inode %d", id.Ino), err)
	}
	if newDir {
		if err := syncDir(t.hashDir(id.Ino)); err != nil {
			return t.ioError(fmt.Sprintf("sync directory of inode %d", id.Ino), err)
		}
	}
	if older != nil {
		for _, p := range []string{path, path + ".crc"} {
			if err := t.discard(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return t.ioError(fmt.Sprintf("remove the older files of %v", id), err)
			}
		}
	}
	return nil
}

func (t *Target) syncInoDir(ino uint64) error {
	if err := syncDir(t.inoDir(ino)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return t.ioError(fmt.Sprintf("sync directory of inode %d", ino), err)
	}
	return nil
}

// blockSums returns the CRC32C of every block of data.
func blockSums(data []byte) []byte {
	sums := make([]byte, 0, crcBytes*((len(data)+BlockSize-1)/BlockSize))
	for off := 0; off < len(data); off += BlockSize {
		sums = binary.LittleEndian.AppendUint32(sums, crc32.Checksum(data[off:min(off+BlockSize, len(data))], castagnoli))
	}
	return sums
}

// Stat returns the chunk's version, chain, length and digest without
// reading its data; a chunk that does not exist has Exists false.
func (t *Target) Stat(id ID) (Info, error) {
	defer t.chunkLocks.lock(id, false)()
	return t.stat(id)
}

// stat reads the chunk's header and checksums directly (not through the
// cache of open files, so that listing many chunks does not evict busy
// ones).
func (t *Target) stat(id ID) (Info, error) {
	if info, ok, err := t.statInline(id); ok || err != nil {
		return info, err
	}
	path := t.chunkPath(id)
	di, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Info{ID: id}, nil
	}
	if err != nil {
		return Info{ID: id}, t.ioError(fmt.Sprintf("stat %v", id), err)
	}
	b, err := os.ReadFile(path + ".crc")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Info{ID: id}, t.ioError(fmt.Sprintf("read checksums of %v", id), err)
	}
	h, err := decodeHeader(b, di.Size())
	if err != nil {
		return Info{ID: id, Exists: true}, t.headerError(id, err)
	}
	return Info{ID: id, Exists: true, Version: h.version, Chain: h.chain, Length: h.length,
		Digest: sumsDigest(b[min(int(h.sumsOff()), len(b)):], h.length)}, nil
}

// statInline is stat of a chunk file holding its checksums; ok is false
// when the chunk has none.
func (t *Target) statInline(id ID) (info Info, ok bool, err error) {
	file, err := os.Open(t.inlinePath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{ID: id}, false, nil
	}
	if err != nil {
		return Info{ID: id}, true, t.ioError(fmt.Sprintf("open %v", id), err)
	}
	defer file.Close()
	buf := sumsBufPool.Get().(*[headSize]byte)
	defer sumsBufPool.Put(buf)
	n, err := file.ReadAt(buf[:], 0)
	if err != nil && err != io.EOF {
		return Info{ID: id}, true, t.ioError(fmt.Sprintf("read header of %v", id), err)
	}
	if n < headerSize {
		return Info{ID: id, Exists: true}, true, nil // created, never written: empty
	}
	h, err := decodeHead(buf[:n])
	if err != nil {
		return Info{ID: id, Exists: true}, true, t.headerError(id, err)
	}
	return Info{ID: id, Exists: true, Version: h.version, Chain: h.chain, Length: h.length,
		Digest: sumsDigest(buf[headerSize:n], h.length)}, true, nil
}

// sumsDigest is the digest of a chunk of length bytes whose block
// checksums start sums: a CRC-64 of those of its blocks.
func sumsDigest(sums []byte, length int64) uint64 {
	n := min(int64(len(sums)), crcBytes*((length+BlockSize-1)/BlockSize))
	return crc64.Checksum(sums[:n], crc64Table)
}

// Verify reads the whole chunk and checks it against its checksums and
// header: a *CorruptionError names what is wrong (a block, the header, a
// data file shorter than the header says). It returns the bytes verified.
func (t *Target) Verify(id ID) (int64, error) {
	defer t.chunkLocks.lock(id, false)()
	// Reopen, so that the header and length are read from disk again.
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
	for b := int64(0); b*BlockSize < f.size; b++ {
		m := min(BlockSize, f.size-b*BlockSize)
		if err := t.readBlocks(f, id, buf[:m], b); err != nil {
			return n, err
		}
		n += m
	}
	// Checksums beyond the data: the data file was cut short on a block
	// boundary of a chunk written before headers held its length.
	if f.crc == nil {
		return n, nil
	}
	if st, err := f.crc.Stat(); err == nil && f.hdr.legacy {
		if want := crcBytes * ((f.size + BlockSize - 1) / BlockSize); st.Size() > want {
			return n, t.corrupt(&CorruptionError{Target: t.dir, Chunk: id, Block: f.size / BlockSize, Truncated: true,
				Length: f.size, Want: st.Size() / crcBytes * BlockSize})
		}
	}
	return n, nil
}
