package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// task is what the runner asks one worker process to do. It travels as one
// JSON line on the worker's stdin.
type task struct {
	Kind     string `json:"kind"`     // a workload name (see workloads.go)
	Path     string `json:"path"`     // file (data) or directory (metadata, tree)
	Record   int64  `json:"record"`   // bytes per I/O
	Size     int64  `json:"size"`     // bytes of the region this worker touches
	Offset   int64  `json:"offset"`   // start of the region in the file
	Files    int    `json:"files"`    // metadata: entries per worker; tar: files in the tarball
	Prefix   string `json:"prefix"`   // metadata: name prefix of this worker's entries
	Seed     uint64 `json:"seed"`     // pseudo-random offsets and data
	Truncate bool   `json:"truncate"` // data write: start from an empty file
	NoFsync  bool   `json:"no_fsync"` // data write: skip the final fsync
	Cold     string `json:"cold"`     // "fadvise": drop this file's cached pages before the barrier
	// Warm: before the barrier, open the file, read the region whole and
	// close it, as a program that read the file just before; re-read
	// then measures what the file system keeps of it across opens
	// (whatever other targets' cold reads dropped meanwhile).
	Warm  bool  `json:"warm,omitempty"`
	Total int64 `json:"total_cap"` // random workloads: bytes to move (default Size)
}

// workerResult is a worker's answer, one JSON line on its stdout.
type workerResult struct {
	Bytes      int64   `json:"bytes"`
	Ops        int64   `json:"ops"`
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"cpu_seconds"`
	Err        string  `json:"err,omitempty"`
}

// workerHello is the first line a worker writes: ready, or why not.
type workerHello struct {
	Ready bool   `json:"ready"`
	Err   string `json:"err,omitempty"`
}

// WorkerMain is the body of the hidden "weft bench-worker" command: it
// reads one task from in, prepares it (opens files, fills buffers, builds
// offsets), says it is ready, waits for "go" on in, runs the timed part and
// writes its result to out. Every allocation happens before "go".
func WorkerMain(in io.Reader, out io.Writer) error {
	br := bufio.NewReader(in)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("bench worker: read the task from stdin: %w", err)
	}
	var t task
	if err := json.Unmarshal(line, &t); err != nil {
		return fmt.Errorf("bench worker: decode the task: %w", err)
	}
	enc := json.NewEncoder(out)
	run, cleanup, err := prepare(&t)
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		enc.Encode(workerHello{Err: err.Error()})
		return err
	}
	if err := enc.Encode(workerHello{Ready: true}); err != nil {
		return err
	}
	if _, err := br.ReadBytes('\n'); err != nil {
		return fmt.Errorf("bench worker: wait for the start signal: %w", err)
	}
	cpu0 := cpuSelf()
	start := time.Now()
	bytes, ops, err := run()
	res := workerResult{Bytes: bytes, Ops: ops, Seconds: time.Since(start).Seconds(), CPUSeconds: cpuSelf() - cpu0}
	if err != nil {
		res.Err = err.Error()
	}
	if eerr := enc.Encode(res); eerr != nil {
		return eerr
	}
	return err
}

// cpuSelf is the user+system CPU time of this process in seconds.
func cpuSelf() float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// runFunc is the timed part of a task: bytes moved, operations done.
type runFunc func() (int64, int64, error)

// prepare does the untimed setup of t and returns its timed part.
func prepare(t *task) (runFunc, func(), error) {
	switch t.Kind {
	case WSeqWrite, WRandWrite, WSharedWrite, WSeqRead, WReRead, WRandRead, WStrided, WMixed, WFairRead:
		return prepareData(t)
	case WMdCreate, WMdCreateShared, WMdStat, WMdStatShared, WMdStatCold, WMdStatCold + "-shared", WMdRead, WMdReadShared,
		WMdRemove, WMdRemoveShared, WMdMkdir, WMdMkdirShared, WMdRmdir, WMdRmdirShared,
		WMdSmallWrite, WMdSmallWrite + "-shared", WMdSmallReadCold, WMdSmallReadCold + "-shared":
		return prepareMeta(t)
	case WUntar:
		return prepareUntar(t)
	case WWalk:
		return func() (int64, int64, error) { n, err := walk(t.Path); return 0, n, err }, nil, nil
	case WTreeRemove:
		return func() (int64, int64, error) { n, err := removeTree(t.Path); return 0, n, err }, nil, nil
	}
	return nil, nil, fmt.Errorf("unknown workload %q", t.Kind)
}

// alignedBuffer returns a page-aligned buffer of n bytes (an anonymous
// mapping) filled with non-zero pseudo-random data, and its release.
func alignedBuffer(n int64, seed uint64) ([]byte, func(), error) {
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, fmt.Errorf("allocate a %d-byte buffer: %w", n, err)
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64() | 0x0101010101010101
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b, func() { unix.Munmap(b) }, nil
}

// prepareData opens the file of a data task, allocates its buffers and
// precomputes the offsets of every operation.
func prepareData(t *task) (runFunc, func(), error) {
	if t.Record <= 0 || t.Size < t.Record {
		return nil, nil, fmt.Errorf("record %d and size %d do not fit", t.Record, t.Size)
	}
	if t.Warm {
		if err := readRegion(t); err != nil {
			return nil, nil, err
		}
	}
	flags := unix.O_RDONLY
	write := t.Kind == WSeqWrite || t.Kind == WRandWrite || t.Kind == WSharedWrite || t.Kind == WMixed
	if write {
		flags = unix.O_RDWR | unix.O_CREAT
		if t.Truncate {
			flags |= unix.O_TRUNC
		}
	}
	fd, err := unix.Open(t.Path, flags|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", t.Path, err)
	}
	wbuf, freeW, err := alignedBuffer(t.Record, t.Seed+1)
	if err != nil {
		unix.Close(fd)
		return nil, nil, err
	}
	rbuf, freeR, err := alignedBuffer(t.Record, t.Seed+2)
	if err != nil {
		freeW()
		unix.Close(fd)
		return nil, nil, err
	}
	cleanup := func() { freeW(); freeR(); unix.Close(fd) }
	if t.Cold == "fadvise" {
		unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
	}
	n := t.Size / t.Record
	offs := make([]int64, 0, n)
	kinds := []byte(nil)
	rng := rand.New(rand.NewPCG(t.Seed, 7))
	switch t.Kind {
	case WStrided:
		for i := int64(0); i < n; i += 2 {
			offs = append(offs, t.Offset+i*t.Record)
		}
	case WRandRead, WRandWrite, WMixed:
		for _, i := range rng.Perm(int(n)) {
			offs = append(offs, t.Offset+int64(i)*t.Record)
		}
		if t.Kind == WMixed {
			kinds = make([]byte, n)
			for i := range kinds {
				kinds[i] = byte(rng.IntN(2))
			}
		}
	default:
		for i := int64(0); i < n; i++ {
			offs = append(offs, t.Offset+i*t.Record)
		}
	}
	sync := write && !t.NoFsync
	run := func() (int64, int64, error) {
		var moved int64
		for i, off := range offs {
			var err error
			var got int
			if write && (kinds == nil || kinds[i] == 1) {
				got, err = rawPwrite(fd, wbuf, off)
			} else {
				got, err = rawPread(fd, rbuf, off)
			}
			if err != nil {
				return moved, int64(i), fmt.Errorf("%s at offset %d of %s: %w", t.Kind, off, t.Path, err)
			}
			if got != len(wbuf) {
				return moved, int64(i), fmt.Errorf("%s at offset %d of %s: short transfer of %d bytes, wanted %d", t.Kind, off, t.Path, got, len(wbuf))
			}
			moved += int64(got)
		}
		if sync {
			if err := unix.Fsync(fd); err != nil {
				return moved, int64(len(offs)), fmt.Errorf("fsync %s: %w", t.Path, err)
			}
		}
		return moved, int64(len(offs)), nil
	}
	return run, cleanup, nil
}

// readRegion reads the task's region of its file once, through an open
// of its own.
func readRegion(t *task) error {
	f, err := os.Open(t.Path)
	if err != nil {
		return fmt.Errorf("warm %s: %w", t.Path, err)
	}
	defer f.Close()
	buf := make([]byte, min(t.Record, 8<<20))
	for off := t.Offset; off < t.Offset+t.Size; off += int64(len(buf)) {
		if _, err := f.ReadAt(buf[:min(int64(len(buf)), t.Offset+t.Size-off)], off); err != nil {
			return fmt.Errorf("warm %s at offset %d: %w", t.Path, off, err)
		}
	}
	return nil
}

// prepareMeta builds the names of a metadata task.
func prepareMeta(t *task) (runFunc, func(), error) {
	names := make([]string, t.Files)
	paths := make([]cPath, t.Files)
	for i := range names {
		names[i] = filepath.Join(t.Path, t.Prefix+strconv.Itoa(i))
		paths[i] = newCPath(names[i])
	}
	buf := make([]byte, 4096)
	st := new(unix.Statx_t)
	var moved int64 // bytes per operation
	var done func() // releases what the operations use
	var data []byte // a small file's bytes (written, or read into)
	if strings.HasPrefix(t.Kind, WMdSmallWrite) || strings.HasPrefix(t.Kind, WMdSmallReadCold) {
		var err error
		if data, done, err = alignedBuffer(smallFileBytes, t.Seed+1); err != nil {
			return nil, nil, err
		}
		moved = smallFileBytes
	}
	var op func(p cPath) error
	switch t.Kind {
	case WMdCreate, WMdCreateShared:
		op = func(p cPath) error {
			fd, err := rawOpen(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			return rawClose(fd)
		}
	case WMdStat, WMdStatShared, WMdStatCold, WMdStatCold + "-shared":
		op = func(p cPath) error { return rawLstat(p, st) }
	case WMdRead, WMdReadShared:
		op = func(p cPath) error {
			fd, err := rawOpen(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			_, err = rawRead(fd, buf)
			rawClose(fd)
			return err
		}
	case WMdSmallWrite, WMdSmallWrite + "-shared":
		op = func(p cPath) error {
			fd, err := rawOpen(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err != nil {
				return err
			}
			if n, err := rawPwrite(fd, data, 0); err != nil || n != len(data) {
				rawClose(fd)
				return fmt.Errorf("write %d of %d bytes: %w", n, len(data), err)
			}
			return rawClose(fd)
		}
	case WMdSmallReadCold, WMdSmallReadCold + "-shared":
		if t.Cold == "fadvise" { // without root: each file dropped by itself
			for _, n := range names {
				if fd, err := unix.Open(n, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
					unix.Fsync(fd)
					unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
					unix.Close(fd)
				}
			}
		}
		op = func(p cPath) error {
			fd, err := rawOpen(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer rawClose(fd)
			var got int
			for { // to the end, as cat does
				n, err := rawRead(fd, data)
				if err != nil {
					return err
				}
				if n == 0 {
					break
				}
				got += n
			}
			if got != smallFileBytes {
				return fmt.Errorf("read %d bytes of a %d-byte file", got, smallFileBytes)
			}
			return nil
		}
	case WMdRemove, WMdRemoveShared:
		op = func(p cPath) error { return rawUnlink(p, false) }
	case WMdMkdir, WMdMkdirShared:
		op = func(p cPath) error { return rawMkdir(p, 0o755) }
	case WMdRmdir, WMdRmdirShared:
		op = func(p cPath) error { return rawUnlink(p, true) }
	}
	run := func() (int64, int64, error) {
		for i, p := range paths {
			if err := op(p); err != nil {
				return moved * int64(i), int64(i), fmt.Errorf("%s %s: %w", t.Kind, names[i], err)
			}
		}
		return moved * int64(len(names)), int64(len(names)), nil
	}
	return run, done, nil
}

// walk lstats every entry below dir, as du does, and counts them.
func walk(dir string) (int64, error) {
	var st unix.Stat_t
	var n int64
	var visit func(d string) error
	visit = func(d string) error {
		f, err := os.Open(d)
		if err != nil {
			return err
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			return fmt.Errorf("read directory %s: %w", d, err)
		}
		for _, name := range names {
			p := d + "/" + name
			if err := unix.Lstat(p, &st); err != nil {
				return fmt.Errorf("lstat %s: %w", p, err)
			}
			n++
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				if err := visit(p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return n, visit(dir)
}

// removeTree removes dir and everything below it, as rm -r does, and
// counts the entries removed.
func removeTree(dir string) (int64, error) {
	n, err := walk(dir)
	if err != nil {
		return 0, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return 0, err
	}
	return n + 1, nil
}
