// Package chunk is a data server's on-disk chunk store.
//
// A target is a directory on a local file system. Chunk (ino, index) of a
// file lives in one file on it:
//
//	<target>/chunks/<ino%256 as 2 hex digits>/<ino in hex>/<index>.w
//
// Its head is a header holding the chunk's version (+1 per mutation), the
// chain it was written through and its length, and one little-endian
// CRC32C (Castagnoli) per BlockSize block of the chunk, the last block's
// covering only the bytes present; the bytes start 2 MiB in (see
// header.go; sparse where never written). Every read verifies the
// checksums of the blocks it touches and fails with an error wrapping
// syscall.EIO (and ErrCorrupt) on a mismatch. Chunks of the older form of
// two files (<index> and <index>.crc) are read as they are and rewritten
// as one file at their first mutation.
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
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/weft-fs/weft/internal/pagecache"
)

const (
	// BlockSize is the unit of checksumming: one CRC32C per 64 KiB.
	BlockSize = 64 << 10
	// MaxChunkSize bounds a chunk (and so any one read or write).
	MaxChunkSize = 64 << 20
	// DefaultMaxOpenChunks bounds the open-file cache (two fds per chunk).
	DefaultMaxOpenChunks = 512

	crcBytes = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

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
	s := &Store{files: newFileCache(opts.MaxOpenChunks), log: opts.Logger}
	for _, dir := range dirs {
		t, err := openTarget(s, dir)
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

// Close closes every open chunk file and releases the targets' locks. No
// other method may be running or called afterwards.
func (s *Store) Close() error {
	s.files.drop(func(cacheKey) bool { return true })
	for _, t := range s.targets {
		t.lockFile.Close()
	}
	return nil
}

// Target is one directory holding chunks.
type Target struct {
	dir      string
	store    *Store
	lockFile *os.File

	// fileLocks are held shared by chunk mutations and exclusively by
	// operations on a whole file in one chain (truncate, delete);
	// chunkLocks are held exclusively by mutations of a chunk and shared by
	// its reads. Lock order: file, then chunk.
	fileLocks  lockTable[fileKey]
	chunkLocks lockTable[ID]

	usedBytes atomic.Int64
	numChunks atomic.Int64

	syncMu sync.Mutex
	// newEntries: inos whose directory has entries not yet fsynced; the
	// value says the ino directory itself is new (its parent needs fsync).
	newEntries map[uint64]bool
	// dirty: chunks written since their last fdatasync.
	dirty map[uint64]map[uint64]struct{}

	spare spares // files of deleted chunks, for new ones (spare.go)

	// inMemory is set when the target is on a file system that keeps its
	// files in memory (tmpfs): nothing to read in ahead (readInCold).
	inMemory bool
	readIns  atomic.Int64 // reads whose range readInCold read in
}

func openTarget(s *Store, dir string) (*Target, error) {
	dir = filepath.Clean(dir)
	t := &Target{dir: dir, store: s, newEntries: make(map[uint64]bool), dirty: make(map[uint64]map[uint64]struct{}),
		inMemory: pagecache.DirInMemory(dir)}
	root := filepath.Join(dir, "chunks")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, t.ioError("create chunk directory", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, t.ioError("open lock file", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("target %s is in use by another weft data process (lock %s held): stop it or pick another directory: %w",
			dir, lock.Name(), err)
	}
	t.lockFile = lock
	for i := range 256 {
		if err := os.Mkdir(filepath.Join(root, fmt.Sprintf("%02x", i)), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			lock.Close()
			return nil, t.ioError("create chunk directory", err)
		}
	}
	if err := syncDir(root); err != nil {
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

// scan counts the chunks and bytes already on the target.
func (t *Target) scan(root string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return t.ioError("scan chunks", err)
		}
		if d.IsDir() {
			return nil
		}
		if strings.HasSuffix(d.Name(), ".tmp") { // an interrupted Replace
			os.Remove(path)
			return nil
		}
		if _, ok := chunkOf(0, d.Name()); !ok {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return t.ioError("scan chunks", err)
		}
		size := info.Size()
		if strings.HasSuffix(d.Name(), inlineSuffix) {
			size = max(size-inlineDataOff, 0) // the head is not counted
		}
		t.numChunks.Add(1)
		t.usedBytes.Add(size)
		return nil
	})
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
	var st syscall.Statfs_t
	if err := syscall.Statfs(t.dir, &st); err != nil {
		return Usage{}, fmt.Errorf("statfs target %s: %w", t.dir, err)
	}
	var fi syscall.Stat_t
	if err := syscall.Stat(t.dir, &fi); err != nil {
		return Usage{}, fmt.Errorf("stat target %s: %w", t.dir, err)
	}
	return Usage{
		Filesystem: fmt.Sprintf("dev %d:%d", unix.Major(fi.Dev), unix.Minor(fi.Dev)),
		TotalBytes: st.Blocks * uint64(st.Bsize),
		FreeBytes:  st.Bavail * uint64(st.Bsize),
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
		var st syscall.Statfs_t
		if syscall.Statfs(t.dir, &st) == nil {
			free = formatBytes(st.Bavail * uint64(st.Bsize))
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

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
