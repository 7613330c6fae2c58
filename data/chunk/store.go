// Package chunk is a data server's on-disk chunk store.
//
// A target is a directory on a local file system. Chunk (ino, index) of a
// file lives in one file on it:
//
//	<target>/chunks/<ino%256 as 2 hex digits>/<ino in hex>/<index>.w
//
// Its head is a header holding the chunk's version (+1 per mutation), the
// chain it was written through and its length, and a block table: for
// every BlockSize block, two entries, each naming a copy of the block in
// one of two places of the file with its CRC32C and the version that
// wrote it (see format.go). Every read verifies the checksums of the
// blocks it touches and fails with an error wrapping syscall.EIO (and
// ErrCorrupt) on a mismatch. A mutation never writes over a copy still
// relied on (write.go), so a crash at any point leaves every block with
// its old or its new content, and never a chunk that does not read.
//
// Concurrency: all methods may be called concurrently. Mutations of one
// chunk are serialized (Lock hands the chunk out exclusively so a caller
// can forward the mutation to other replicas before anyone else touches
// it); reads of a chunk run in parallel with each other. Whole-file
// operations of one chain (LockFile) exclude mutations of that file's
// chunks in that chain. Durability: a Write with sync, or a SyncFile,
// returns only after the chunk files and the directory entries of newly
// created files are on stable storage; Replace and truncation are durable
// on return.
package chunk

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/weft-fs/weft/internal/disk"
)

const (
	// BlockSize is the unit of checksumming: one CRC32C per 64 KiB.
	BlockSize = 64 << 10
	// MaxChunkSize bounds a chunk (and so any one read or write).
	MaxChunkSize = 64 << 20
	// DefaultMaxOpenChunks bounds the open-file cache (a descriptor per
	// chunk).
	DefaultMaxOpenChunks = 512
	// SlotStride is the distance between the places (slots) of a block's
	// copies in a chunk file (see format.go).
	SlotStride = MaxChunkSize
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errInvalid is the errno of a request outside what a chunk can hold.
var errInvalid = syscall.EINVAL

// osFS is the local file system, the default.
var osFS disk.FS = disk.OS{}

// ID names a chunk: the index-th chunk_size piece of file ino.
type ID struct {
	Ino   uint64
	Index uint64
}

func (id ID) String() string { return fmt.Sprintf("chunk %d of inode %d", id.Index, id.Ino) }

// Options tune a Store.
type Options struct {
	// MaxOpenChunks bounds how many chunks are kept open; default
	// DefaultMaxOpenChunks.
	MaxOpenChunks int
	// Logger receives corruption reports; default slog.Default().
	Logger *slog.Logger
	// FS is the file system the targets are on; default the local one.
	FS disk.FS
}

// Store is the set of targets of one data server, sharing one cache of open
// chunk files.
type Store struct {
	targets []*Target
	files   *fileCache
	log     *slog.Logger
}

// Open opens (creating if needed) a target in each of dirs. A target is
// locked against use by another process until Close.
func Open(dirs []string, opts Options) (*Store, error) {
	if len(dirs) == 0 {
		return nil, errors.New("open chunk store: no target directories given")
	}
	if opts.MaxOpenChunks <= 0 {
		opts.MaxOpenChunks = DefaultMaxOpenChunks
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.FS == nil {
		opts.FS = osFS
	}
	s := &Store{files: newFileCache(opts.MaxOpenChunks), log: opts.Logger}
	for _, dir := range dirs {
		t, err := openTarget(s, opts.FS, dir)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.targets = append(s.targets, t)
	}
	return s, nil
}

// Targets returns the store's targets in the order of the directories given
// to Open.
func (s *Store) Targets() []*Target { return s.targets }

// Close syncs what was written and not synced (so that the next open
// has nothing to recover), closes every open chunk file and releases
// the targets' locks. No other method may be running or called
// afterwards.
func (s *Store) Close() error {
	var first error
	for _, t := range s.targets {
		if err := t.syncAll(); err != nil && first == nil {
			first = err
		}
	}
	s.files.drop(func(cacheKey) bool { return true })
	for _, t := range s.targets {
		t.lock.Close()
	}
	return first
}

// Target is one directory holding chunks.
type Target struct {
	dir   string
	fs    disk.FS
	store *Store
	lock  io.Closer

	// fileLocks are held shared by chunk mutations and exclusively by
	// operations on a whole file in one chain (truncate, delete);
	// chunkLocks are held exclusively by mutations of a chunk and shared by
	// its reads. Lock order: file, then chunk.
	fileLocks  lockTable[fileKey]
	chunkLocks lockTable[ID]
	// recoverMu serializes recoveries (chunkfile.go), which readers
	// holding a chunk shared may start.
	recoverMu sync.Mutex

	usedBytes atomic.Int64
	numChunks atomic.Int64

	syncMu sync.Mutex
	// newEntries: inos whose directory has entries not yet fsynced; the
	// value says the ino directory itself is new (its parent needs fsync).
	newEntries map[uint64]bool
	// unsynced: chunks written since their last fdatasync (sync.go).
	unsynced map[uint64]map[uint64]*syncState

	spare spares // files of deleted chunks, for new ones (spare.go)

	// inMemory is set when the target is on a file system that keeps its
	// files in memory (tmpfs): nothing to read in ahead (readInCold).
	inMemory bool
	readIns  atomic.Int64 // reads whose range readInCold read in
}

func openTarget(s *Store, fsys disk.FS, dir string) (*Target, error) {
	dir = filepath.Clean(dir)
	t := &Target{dir: dir, fs: fsys, store: s, newEntries: make(map[uint64]bool),
		unsynced: make(map[uint64]map[uint64]*syncState)}
	root := filepath.Join(dir, "chunks")
	if err := fsys.MkdirAll(root, 0o700); err != nil {
		return nil, t.ioError("create chunk directory", err)
	}
	lock, err := fsys.Lock(filepath.Join(dir, "LOCK"))
	if err != nil {
		return nil, fmt.Errorf("target %s is in use by another weft data process: stop it or pick another directory: %w",
			dir, err)
	}
	t.lock = lock
	if space, err := fsys.Statfs(dir); err == nil {
		t.inMemory = space.InMemory
	}
	// What an earlier run of the server left in the page cache goes to
	// the disk before anything is taken as durable (sync.go).
	if err := fsys.SyncFS(dir); err != nil {
		lock.Close()
		return nil, t.ioError("sync the file system of the target", err)
	}
	for i := range 256 {
		if err := fsys.Mkdir(filepath.Join(root, fmt.Sprintf("%02x", i)), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			lock.Close()
			return nil, t.ioError("create chunk directory", err)
		}
	}
	if err := fsys.SyncDir(root); err != nil {
		lock.Close()
		return nil, t.ioError("sync chunk directory", err)
	}
	if err := t.initSpares(); err != nil {
		lock.Close()
		return nil, err
	}
	if err := t.scan(root); err != nil {
		lock.Close()
		return nil, err
	}
	return t, nil
}

// scan counts the chunks and bytes already on the target and removes
// what an interrupted Replace left. A chunk file's bytes are counted
// from its size where it holds slot A alone (its length, but for what
// a crash left past it), else from its header.
func (t *Target) scan(root string) error {
	for i := range 256 {
		bucket := filepath.Join(root, fmt.Sprintf("%02x", i))
		inos, err := t.fs.ReadDir(bucket)
		if err != nil {
			return t.ioError("scan chunks", err)
		}
		for _, d := range inos {
			dir := filepath.Join(bucket, d.Name())
			entries, err := t.fs.ReadDir(dir)
			if err != nil {
				return t.ioError("scan chunks", err)
			}
			for _, e := range entries {
				path := filepath.Join(dir, e.Name())
				if strings.HasSuffix(e.Name(), ".tmp") { // an interrupted Replace
					t.fs.Remove(path)
					continue
				}
				if _, ok := chunkOf(0, e.Name()); !ok {
					continue
				}
				info, err := e.Info()
				if err != nil {
					return t.ioError("scan chunks", err)
				}
				if info.Size() < headerSize {
					// Created, and a crash came before its head was
					// written: it never held anything.
					t.fs.Remove(path)
					continue
				}
				size := max(info.Size()-inlineDataOff, 0)
				if size > MaxChunkSize {
					size = t.lengthOf(path)
				}
				t.numChunks.Add(1)
				t.usedBytes.Add(size)
			}
		}
	}
	return nil
}

// lengthOf reads the length in the header of the chunk file at path (0
// if it has none).
func (t *Target) lengthOf(path string) int64 {
	f, err := t.fs.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	var b [headerSize]byte
	if n, _ := f.ReadAt(b[:], 0); n < headerSize {
		return 0
	}
	h, err := decodeHeader(b[:])
	if err != nil {
		return 0
	}
	return h.length
}

// ReadIns counts the cold ranges this target read into the page cache
// ahead of a reader in large folios (before a read through the server,
// or while opening a chunk for a reader in place).
func (t *Target) ReadIns() int64 { return t.readIns.Load() }

// Dir returns the target's directory.
func (t *Target) Dir() string { return t.dir }

// Usage is a target's capacity and what chunks use of it.
type Usage struct {
	TotalBytes uint64 // size of the file system holding the target
	FreeBytes  uint64 // bytes available to the data server
	UsedBytes  uint64 // sum of the chunks' lengths
	Chunks     uint64
	// Filesystem identifies the file system holding the target (device
	// number), so capacity shared by several targets is counted once.
	Filesystem string
}

// Usage reports the target's capacity (statfs) and chunk usage.
func (t *Target) Usage() (Usage, error) {
	space, err := t.fs.Statfs(t.dir)
	if err != nil {
		return Usage{}, fmt.Errorf("statfs target %s: %w", t.dir, err)
	}
	return Usage{
		Filesystem: space.Device,
		TotalBytes: space.Total,
		FreeBytes:  space.Free,
		UsedBytes:  uint64(max(t.usedBytes.Load(), 0)),
		Chunks:     uint64(max(t.numChunks.Load(), 0)),
	}, nil
}

func (t *Target) hashDir(ino uint64) string {
	return filepath.Join(t.dir, "chunks", fmt.Sprintf("%02x", ino%256))
}

func (t *Target) inoDir(ino uint64) string {
	return filepath.Join(t.hashDir(ino), strconv.FormatUint(ino, 16))
}

// ioError wraps a file system error with the operation and the target; a
// full disk gets a message saying what to do.
func (t *Target) ioError(op string, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		free := "unknown"
		if space, serr := t.fs.Statfs(t.dir); serr == nil {
			free = formatBytes(space.Free)
		}
		return fmt.Errorf("%s: target %s is full (%s free): free space or add a target: %w", op, t.dir, free, syscall.ENOSPC)
	}
	return fmt.Errorf("%s on target %s: %w", op, t.dir, err)
}

func formatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
