// Package exerciser is a randomized data-integrity exerciser for file
// systems. It runs a long, seeded sequence of write, pwrite, read, pread,
// truncate, ftruncate, fsync, fdatasync, O_APPEND writes and close/reopen
// on a few files, with offsets and sizes biased to land on, around and
// across chunk boundaries, and checks every read, and at the end every
// file's size and contents, against an in-memory model.
//
// A run is reproducible from its seed alone: Run logs the seed at the start
// and names it in every failure, together with the index of the operation
// that failed and the first offset where the file differs from the model.
// Setting WEFT_EXERCISER_SEED replays a seed.
package exerciser

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// SeedEnv names the environment variable that, when set, overrides
// Config.Seed so that a failed run can be replayed.
const SeedEnv = "WEFT_EXERCISER_SEED"

// Config sizes a run. Zero fields take the defaults noted.
type Config struct {
	// Seed of the run; 0 picks one from the clock. WEFT_EXERCISER_SEED
	// overrides it.
	Seed int64
	// Ops is the number of operations (default 2000).
	Ops int
	// MaxFileSize bounds every file (default 8 MiB).
	MaxFileSize int64
	// Files is the number of files operated on (default 3).
	Files int
	// ChunkSizeHint is the chunk size of the file system under test
	// (default 1 MiB); offsets and sizes gather around its multiples, and
	// around multiples of 64 KiB (checksum blocks) and 4 KiB (pages).
	ChunkSizeHint int64
}

const (
	defaultOps         = 2000
	defaultMaxFileSize = 8 << 20
	defaultFiles       = 3
	defaultChunkSize   = 1 << 20
	blockSize          = 64 << 10
	pageSize           = 4 << 10
	historyLen         = 30
	fullCheckEvery     = 250
)

// withDefaults fills in zero fields.
func (c Config) withDefaults() Config {
	if c.Ops <= 0 {
		c.Ops = defaultOps
	}
	if c.MaxFileSize <= 0 {
		c.MaxFileSize = defaultMaxFileSize
	}
	if c.Files <= 0 {
		c.Files = defaultFiles
	}
	if c.ChunkSizeHint <= 0 {
		c.ChunkSizeHint = defaultChunkSize
	}
	return c
}

// Run exercises files named exerciser-N in dir (created or truncated) as cfg
// says, failing t at the first difference from the model. The files are
// left in dir for inspection. Run is not safe for concurrent use on the same
// dir.
func Run(t testing.TB, dir string, cfg Config) {
	t.Helper()
	cfg = cfg.withDefaults()
	if s := os.Getenv(SeedEnv); s != "" {
		seed, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("exerciser: %s=%q is not an integer seed: %v", SeedEnv, s, err)
		}
		cfg.Seed = seed
	}
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano()
	}
	t.Logf("exerciser: seed %d (replay with %s=%d), %d ops on %d files up to %d bytes, chunk size %d",
		cfg.Seed, SeedEnv, cfg.Seed, cfg.Ops, cfg.Files, cfg.MaxFileSize, cfg.ChunkSizeHint)
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], uint64(cfg.Seed))
	x := &exerciser{
		t:      t,
		cfg:    cfg,
		rng:    rand.New(rand.NewPCG(uint64(cfg.Seed), 0x9e3779b97f4a7c15)),
		stream: rand.NewChaCha8(key),
	}
	for i := 0; i < cfg.Files; i++ {
		f := &file{path: filepath.Join(dir, fmt.Sprintf("exerciser-%d", i)), fd: -1}
		fd, err := unix.Open(f.path, unix.O_RDWR|unix.O_CREAT|unix.O_TRUNC, 0o644)
		if err != nil {
			x.fail("create %s: %v", f.path, err)
		}
		f.fd = fd
		x.files = append(x.files, f)
	}
	defer x.closeAll()
	for x.op = 0; x.op < cfg.Ops; x.op++ {
		x.step()
		if (x.op+1)%fullCheckEvery == 0 {
			x.checkWhole(x.files[x.rng.IntN(len(x.files))], "periodic check")
		}
	}
	x.op = cfg.Ops
	for _, f := range x.files {
		x.reopen(f, 0)
		x.checkWhole(f, "final check")
	}
}

// file is one exercised file: its open descriptor, its file position and
// the model of its contents.
type file struct {
	path string
	fd   int
	pos  int64  // file offset of fd, as the model expects it
	data []byte // expected contents; len(data) is the expected size
}

// exerciser holds the state of one run.
type exerciser struct {
	t       testing.TB
	cfg     Config
	rng     *rand.Rand    // decisions
	stream  *rand.ChaCha8 // data bytes
	files   []*file
	op      int      // index of the current operation
	history []string // descriptions of the last operations
}

// record notes the current operation for failure reports.
func (x *exerciser) record(format string, args ...any) {
	x.history = append(x.history, fmt.Sprintf("#%d ", x.op)+fmt.Sprintf(format, args...))
	if len(x.history) > historyLen {
		x.history = x.history[1:]
	}
}

// fail stops the run with the seed, the operation index and the recent
// operations.
func (x *exerciser) fail(format string, args ...any) {
	x.t.Helper()
	x.t.Fatalf("exerciser seed %d, op #%d: %s\nreplay with %s=%d; last operations:\n  %s",
		x.cfg.Seed, x.op, fmt.Sprintf(format, args...), SeedEnv, x.cfg.Seed, strings.Join(x.history, "\n  "))
}

// closeAll closes whatever descriptors are still open.
func (x *exerciser) closeAll() {
	for _, f := range x.files {
		if f.fd >= 0 {
			unix.Close(f.fd)
			f.fd = -1
		}
	}
}
