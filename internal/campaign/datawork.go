package campaign

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Data workload sizes.
const (
	dataFiles     = 3
	dataMaxSize   = 2 << 20
	dataMaxWrite  = 384 << 10
	chunkBytes    = 256 << 10 // the campaign's chunk size
	blockBytes    = 64 << 10
	pageBytes     = 4 << 10
	stepPause     = 5 * time.Millisecond
	downPause     = 100 * time.Millisecond
	failedPause   = 200 * time.Millisecond
	maxOpsPerFile = 24 // unacknowledged operations before an fsync or close is due
)

// dataWorker writes, truncates, syncs, closes and reads back files of its
// own directory on one mount, and checks every read against its model.
type dataWorker struct {
	evidenceDir string // where findings' contents are saved
	evidenceN   int
	name        string
	lateFor     time.Duration // how long writes from before a failure may land
	m           *mountNode
	dir         string
	rng         *rand.Rand
	data        *rand.ChaCha8
	rec         *recorder
	files       []*dataFile
}

// dataFile is one file of a data worker.
type dataFile struct {
	path   string
	ino    uint64   // from fstat at its last open
	hist   []string // its last operations
	fd     int      // -1 while closed
	gen    int      // the mount generation fd belongs to
	since  int      // operations since the last acknowledgement
	model  dataModel
	reason string // the failure that left the model open
}

func newDataWorker(name string, m *mountNode, dir string, seed uint64, lateFor time.Duration, rec *recorder) *dataWorker {
	var key [32]byte
	for i := range 8 {
		key[i] = byte(seed >> (8 * i))
	}
	w := &dataWorker{name: name, lateFor: lateFor, m: m, dir: dir, rng: rand.New(rand.NewPCG(seed, 0xda7a)), data: rand.NewChaCha8(key), rec: rec}
	for i := range dataFiles {
		w.files = append(w.files, &dataFile{path: path.Join(dir, fmt.Sprintf("f%d", i)), fd: -1})
	}
	return w
}

// run works until stop is closed.
func (w *dataWorker) run(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		w.step()
	}
}

// call runs one system call of the workload on f and records it (and in
// f's history, with detail).
func (w *dataWorker) call(f *dataFile, op, detail string, fn func() error) error {
	start := time.Now()
	err := fn()
	w.rec.done(w.name, op, start, err)
	result := "ok"
	if err != nil {
		result = err.Error()
	}
	f.hist = append(f.hist, fmt.Sprintf("%s %s %s: %s", start.Format("15:04:05.000"), op, detail, result))
	if len(f.hist) > historyLen {
		f.hist = f.hist[len(f.hist)-historyLen:]
	}
	return err
}

// historyLen is how many operations a file's history keeps.
const historyLen = 40

// evidence saves got and want of a finding on f under the campaign's
// directory and returns what to add to the finding: the inode, where the
// evidence is, and f's recent operations.
func (w *dataWorker) evidence(f *dataFile, got, want []byte) string {
	w.evidenceN++
	base := filepath.Join(w.evidenceDir, fmt.Sprintf("%s-%s-%d", strings.ReplaceAll(w.dir, "/", "_"), path.Base(f.path), w.evidenceN))
	os.MkdirAll(w.evidenceDir, 0o755)
	os.WriteFile(base+".got", got, 0o644)
	os.WriteFile(base+".want", want, 0o644)
	return fmt.Sprintf(" [inode %d; contents in %s.{got,want}; its last operations:\n    %s]", f.ino, base, strings.Join(f.hist, "\n    "))
}

// fail leaves f's model open after err.
func (w *dataWorker) fail(f *dataFile, what string, err error) {
	if !f.model.failed {
		f.reason = fmt.Sprintf("%s: %v", what, err)
	}
	f.model.failed = true
	if f.fd >= 0 {
		unix.Close(f.fd)
		f.fd = -1
	}
}

func (w *dataWorker) step() {
	root, gen, ok := w.m.rootOf()
	for _, f := range w.files {
		if f.fd >= 0 && f.gen != gen {
			// Closed at once: a mount stopped cleanly goes away when
			// its last file is closed.
			w.fail(f, "its mount went away", errors.New("mount stopped"))
		}
	}
	if !ok {
		time.Sleep(downPause)
		return
	}
	var usable []*dataFile
	for _, f := range w.files {
		if f.model.failed {
			w.recoverFile(root, f)
		}
		if !f.model.failed {
			usable = append(usable, f)
		}
	}
	if len(usable) == 0 {
		time.Sleep(failedPause)
		return
	}
	f := usable[w.rng.IntN(len(usable))]
	if f.fd < 0 {
		flags := unix.O_RDWR | unix.O_CREAT
		trunc := w.rng.IntN(10) == 0
		if trunc {
			flags |= unix.O_TRUNC
		}
		var fd int
		err := w.call(f, "open", fmt.Sprintf("flags %#x", flags), func() (err error) {
			if fd, err = unix.Openat(root, f.path, flags|unix.O_CLOEXEC, 0o644); err == nil {
				var st unix.Stat_t
				if unix.Fstat(fd, &st) == nil {
					f.ino = st.Ino
				}
			}
			return
		})
		if err != nil {
			if trunc {
				f.model.noteTruncateAttempt(0)
			}
			w.fail(f, "open", err)
			return
		}
		f.fd, f.gen = fd, gen
		if trunc {
			f.model.truncate(0)
		}
	}
	w.op(f)
	time.Sleep(stepPause)
}

// op runs one operation on open file f.
func (w *dataWorker) op(f *dataFile) {
	f.since++
	r := w.rng.IntN(100)
	if f.since >= maxOpsPerFile {
		r = 90 + w.rng.IntN(10) // an fsync or a close
	}
	switch {
	case r < 40:
		off := w.offset(int64(len(f.model.cur)))
		w.write(f, off, w.length(off))
	case r < 50:
		off := int64(len(f.model.cur))
		w.write(f, off, w.length(off))
	case r < 56:
		size := w.offset(int64(len(f.model.cur)))
		err := w.call(f, "ftruncate", fmt.Sprintf("to %d", size), func() error { return unix.Ftruncate(f.fd, size) })
		if err != nil {
			f.model.noteTruncateAttempt(size)
			w.fail(f, fmt.Sprintf("ftruncate to %d", size), err)
			return
		}
		f.model.truncate(size)
	case r < 80:
		w.readBack(f)
	case r < 84:
		var st unix.Stat_t
		if err := w.call(f, "fstat", "", func() error { return unix.Fstat(f.fd, &st) }); err != nil {
			w.fail(f, "fstat", err)
			return
		}
		if st.Size != int64(len(f.model.cur)) {
			w.rec.find("%s: fstat of %s says %d bytes, but this client wrote %d (no error before)", w.name, f.path, st.Size, len(f.model.cur))
			f.model.failed, f.reason = true, "wrong size"
		}
	case r < 95:
		if err := w.call(f, "fsync", "", func() error { return unix.Fsync(f.fd) }); err != nil {
			w.fail(f, "fsync", err)
			return
		}
		f.model.ack()
		f.since = 0
	default:
		fd := f.fd
		f.fd = -1
		if err := w.call(f, "close", "", func() error { return unix.Close(fd) }); err != nil {
			w.fail(f, "close", err)
			return
		}
		f.model.ack()
		f.since = 0
	}
}

// write writes n bytes at off.
func (w *dataWorker) write(f *dataFile, off, n int64) {
	buf := make([]byte, n)
	w.data.Read(buf)
	err := w.call(f, "pwrite", fmt.Sprintf("%d bytes at %d", n, off), func() error {
		for done := int64(0); done < n; {
			k, err := unix.Pwrite(f.fd, buf[done:], off+done)
			if err != nil {
				return err
			}
			if k == 0 {
				return io.ErrShortWrite
			}
			done += int64(k)
		}
		return nil
	})
	if err != nil {
		f.model.noteWriteAttempt(off, buf)
		w.fail(f, fmt.Sprintf("pwrite of %d bytes at %d", n, off), err)
		return
	}
	f.model.write(off, buf)
}

// readBack reads a range of f (sometimes all of it) and compares it with
// what this client wrote.
func (w *dataWorker) readBack(f *dataFile) {
	size := int64(len(f.model.cur))
	off, n := int64(0), size+1 // past the end: the read must stop there
	if w.rng.IntN(4) != 0 && size > 0 {
		off = w.offset(size - 1)
		n = w.length(off)
	}
	want := f.model.cur[min(off, size):min(off+n, size)]
	var got []byte
	err := w.call(f, "pread", fmt.Sprintf("%d bytes at %d", n, off), func() (err error) { got, err = preadFull(f.fd, off, n); return })
	if err != nil {
		w.fail(f, fmt.Sprintf("pread of %d bytes at %d", n, off), err)
		return
	}
	if string(got) != string(want) {
		if explained, clobbered := f.model.lateExplains(off, got, want); explained {
			if clobbered {
				w.rec.find("%s: a write sent to %s before a failure (its mount killed, its chain stalled) landed after the file was settled and replaced bytes this client wrote and synced since: %s%s",
					w.name, f.path, describeDiff(got, want), w.evidence(f, got, want))
			} else {
				w.rec.note("%s: a write sent to %s before a failure landed after the file was read back and synced",
					w.name, f.path)
			}
			f.model.failed, f.reason = true, "a write from before a failure landed late"
			return
		}
		w.rec.find("%s: read of %s at %d (%d bytes asked) returned wrong data without an error: %s%s",
			w.name, f.path, off, n, describeDiff(got, want), w.evidence(f, got, want))
		f.model.failed, f.reason = true, "wrong data read"
	}
}

// preadFull reads up to n bytes at off, stopping at the end of the file.
func preadFull(fd int, off, n int64) ([]byte, error) {
	buf := make([]byte, n)
	done := int64(0)
	for done < n {
		k, err := unix.Pread(fd, buf[done:], off+done)
		if err != nil {
			return nil, err
		}
		if k == 0 {
			break
		}
		done += int64(k)
	}
	return buf[:done], nil
}

// readWhole reads the file at p below root.
func readWhole(root int, p string) ([]byte, error) {
	fd, err := unix.Openat(root, p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	got, err := preadFull(fd, 0, st.Size+1)
	if err != nil {
		return nil, err
	}
	if int64(len(got)) != st.Size {
		return got, fmt.Errorf("read %d bytes of a file fstat says is %d long", len(got), st.Size)
	}
	return got, nil
}

// recoverFile settles a file whose model an error left open: it reads
// what the file holds, checks it against the model, syncs it and makes
// it the acknowledged content. It stays failed if any step fails (the
// next step tries again).
func (w *dataWorker) recoverFile(root int, f *dataFile) {
	var fd int
	var err error
	w.call(f, "open to recover", "", func() error {
		fd, err = unix.Openat(root, f.path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		return ignoreENOENT(err) // ENOENT is an answer
	})
	if errors.Is(err, unix.ENOENT) {
		if f.model.exists {
			w.rec.find("%s: %s is gone: its creation was acknowledged (after %s)", w.name, f.path, f.reason)
		}
		f.model.forget()
		return
	}
	if err != nil {
		return
	}
	defer func() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}()
	// Read twice: through the mount's page cache, as the application
	// would, then with the cache dropped, as the data servers have it.
	// The two must agree: the kernel may drop the cache at any time.
	var st unix.Stat_t
	var cached, got []byte
	err = w.call(f, "read to recover", "", func() error {
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		var err error
		if cached, err = preadFull(fd, 0, st.Size+1); err != nil {
			return err
		}
		if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
			return err
		}
		got, err = preadFull(fd, 0, st.Size+1)
		return err
	})
	if err != nil {
		return
	}
	if explained, _ := f.model.lateExplains(0, got, cached); explained {
		// A write from before an earlier failure landed after this
		// client read the bytes: its cache is as close-to-open allows.
		w.rec.note("%s: a write sent to %s before a failure landed after its pages were cached", w.name, f.path)
	} else if string(cached) != string(got) {
		w.rec.find("%s: %s after %s: the mount's cache disagrees with the data servers (cached, then uncached: %s)%s",
			w.name, f.path, f.reason, describeDiff(cached, got), w.evidence(f, cached, got))
	}
	if why := f.model.explain(got); why != "" {
		w.rec.find("%s: %s after %s holds what no acknowledged state explains: %s%s", w.name, f.path, f.reason, why, w.evidence(f, got, f.model.acked))
	}
	if w.call(f, "fsync to recover", "", func() error { return unix.Fsync(fd) }) != nil {
		return
	}
	cfd := fd
	fd = -1
	if w.call(f, "close to recover", "", func() error { return unix.Close(cfd) }) != nil {
		return
	}
	f.model.adopt(got, time.Now().Add(w.lateFor))
	f.since = 0
}

// finish closes every file (the close must succeed: it runs after
// recovery) and settles the failed ones.
func (w *dataWorker) finish() {
	root, gen, ok := w.m.rootOf()
	if !ok {
		w.rec.find("%s: its mount is down at the end", w.name)
		return
	}
	for _, f := range w.files {
		if f.fd >= 0 && f.gen != gen {
			w.fail(f, "its mount went away", errors.New("mount restarted"))
		}
		if f.fd >= 0 {
			fd := f.fd
			f.fd = -1
			if err := w.call(f, "close", "final", func() error { return unix.Close(fd) }); err != nil {
				w.fail(f, "final close", err)
			} else {
				f.model.ack()
			}
		}
		for try := 0; f.model.failed && try < 10; try++ {
			w.recoverFile(root, f)
			if f.model.failed {
				time.Sleep(time.Second)
			}
		}
		if f.model.failed {
			w.rec.find("%s: %s could not be settled after %s", w.name, f.path, f.reason)
		}
	}
}

// check reads every file through root (of another mount) and compares it
// with the acknowledged content.
func (w *dataWorker) check(root int) int {
	n := 0
	for _, f := range w.files {
		got, err := readWhole(root, f.path)
		switch {
		case errors.Is(err, unix.ENOENT) && !f.model.exists:
		case err != nil:
			w.rec.find("%s: read %s through a fresh mount: %v (acknowledged %d bytes)", w.name, f.path, err, len(f.model.acked))
		case !f.model.exists:
			w.rec.find("%s: %s exists (%d bytes) though its creation was never acknowledged nor seen", w.name, f.path, len(got))
		case string(got) != string(f.model.acked):
			w.rec.find("%s: %s through a fresh mount: %s%s", w.name, f.path, describeDiff(got, f.model.acked), w.evidence(f, got, f.model.acked))
		default:
			n += len(got)
		}
	}
	return n
}

// offset picks an offset up to size, often on or next to a chunk, block
// or page boundary.
func (w *dataWorker) offset(size int64) int64 {
	limit := min(size+chunkBytes, dataMaxSize)
	if limit <= 0 {
		return 0
	}
	switch w.rng.IntN(4) {
	case 0:
		return w.rng.Int64N(limit + 1)
	}
	unit := []int64{chunkBytes, blockBytes, pageBytes}[w.rng.IntN(3)]
	b := w.rng.Int64N(limit/unit+1) * unit
	b += int64(w.rng.IntN(5)) - 2
	return min(max(b, 0), limit)
}

// length picks a write or read length at off.
func (w *dataWorker) length(off int64) int64 {
	room := dataMaxSize - off
	if room <= 0 {
		return 1
	}
	var n int64
	switch w.rng.IntN(4) {
	case 0:
		n = 1 + w.rng.Int64N(64)
	case 1:
		n = chunkBytes + int64(w.rng.IntN(5)) - 2
	default:
		n = 1 + w.rng.Int64N(dataMaxWrite)
	}
	return max(1, min(n, room))
}

// ignoreENOENT is err unless it is ENOENT (an answer, not a failure).
func ignoreENOENT(err error) error {
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}
