package testcluster

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-fs/weft/internal/disk"
	"github.com/weft-fs/weft/internal/exerciser"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// powerLossSeedEnv replays one seed of TestPowerLossKeepsWhatWasSynced.
const powerLossSeedEnv = "WEFT_POWERLOSS_SEED"

// TestPowerLossKeepsWhatWasSynced runs a whole cluster (meta service,
// three data servers, replicas 2, a FUSE mount) on one file system in
// memory that can lose power (disk.Mem), runs a data workload (random
// writes, fsyncs and truncations of a few files) and a metadata workload
// (creates, renames, unlinks and mkdirs, each followed by an fsync of
// its directory) on the mount, cuts the power at a random instant,
// starts everything again on what is left, and checks that every
// fsynced byte and every fsynced name survived, and that no file reads
// with an error: each page holds its content of the last fsync or of a
// write after it. Several rounds, each going on from what the last left.
func TestPowerLossKeepsWhatWasSynced(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil || os.Geteuid() != 0 {
		t.Skip("needs /dev/fuse and root")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(powerLossSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with %s=%d)", seed, powerLossSeedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, 0x90e4))
	mem := disk.NewMem(0)
	c := Start(t, Options{DataServers: 3, Layout: &weftv1.Layout{Replicas: 2, ChunkSize: 256 << 10, StripeCount: 2},
		Mount: true, FS: mem, ScrubRate: -1, FailureTimeout: 2 * time.Second, KeepDataAddrs: true})
	// A file made under a create delegation writes its data before the
	// meta service has it: a power loss between the two leaves chunks no
	// file owns, which fsck reports (and --repair deletes).
	c.LeavesDamage("unowned_chunk")
	files := &fileModel{files: map[string]*fileStates{}}
	names := &nameModel{}
	rounds := 3
	if testing.Short() {
		rounds = 1
	}
	for round := range rounds {
		root := c.MountDir()
		var mu sync.Mutex // orders acknowledgments with the instant of the loss
		stop := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		wg.Go(func() { errs <- files.run(root, rand.New(rand.NewPCG(seed, uint64(2*round))), &mu, stop) })
		wg.Go(func() { errs <- names.run(root, round, rand.New(rand.NewPCG(seed, uint64(2*round+1))), &mu, stop) })
		// The power goes at a random instant, while the exerciser (its
		// own model checks every read on the live cluster) runs too.
		lossAfter := time.Duration(300+rng.IntN(700)) * time.Millisecond
		lost := make(chan *disk.Mem, 1)
		go func() {
			time.Sleep(lossAfter)
			mu.Lock()
			defer mu.Unlock()
			img := mem.CrashCopy(rng)
			files.lost()
			names.lost()
			lost <- img
		}()
		exDir := filepath.Join(root, "exerciser"+strconv.Itoa(round))
		if err := os.Mkdir(exDir, 0o755); err != nil {
			t.Fatal(err)
		}
		exerciser.Run(t, exDir, exerciser.Config{Seed: int64(seed) + int64(round), Ops: 300, MaxFileSize: 2 << 20,
			ChunkSizeHint: 256 << 10})
		img := <-lost
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d (seed %d): workload before the power loss: %v", round, seed, err)
			}
		}
		mem = img
		c.PowerLoss(mem)
		if err := files.check(c.MountDir()); err != nil {
			t.Fatalf("round %d (seed %d): after the power loss: %v", round, seed, err)
		}
		if err := names.check(c.MountDir()); err != nil {
			t.Fatalf("round %d (seed %d): after the power loss: %v", round, seed, err)
		}
		if err := readAll(c.MountDir()); err != nil {
			t.Fatalf("round %d (seed %d): after the power loss: %v", round, seed, err)
		}
		t.Logf("round %d: %d fsyncs of data and %d of names acknowledged so far", round, files.syncs, names.syncs)
	}
}

// pageSize is the unit in which the data check compares contents.
const pageSize = 4096

// fileStates is what a file may hold after a power loss: its content at
// its last fsync and every content written since.
type fileStates struct {
	states  [][]byte
	cur     []byte
	pending []byte // the content if the change in flight is done
}

// fileModel is the data workload and its model.
type fileModel struct {
	files  map[string]*fileStates
	syncs  int
	frozen bool // the power is lost: later acknowledgments do not count
}

const (
	modelFiles   = 3
	maxModelFile = 1 << 20
)

// run writes, truncates and fsyncs files under root until stop.
func (m *fileModel) run(root string, rng *rand.Rand, mu *sync.Mutex, stop chan struct{}) error {
	mu.Lock()
	for i := range modelFiles {
		name := filepath.Join(root, "data"+strconv.Itoa(i))
		if m.files[name] == nil {
			m.files[name] = &fileStates{states: [][]byte{nil}}
		}
	}
	mu.Unlock()
	fds := map[string]int{}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		name := filepath.Join(root, "data"+strconv.Itoa(rng.IntN(modelFiles)))
		fd, ok := fds[name]
		if !ok {
			var err error
			if fd, err = unix.Open(name, unix.O_RDWR|unix.O_CREAT, 0o644); err != nil {
				return fmt.Errorf("open %s: %w", name, err)
			}
			fds[name] = fd
		}
		mu.Lock()
		f := m.files[name]
		next := slices.Clone(f.cur)
		mu.Unlock()
		var err error
		synced := false
		// The content a change leads to is known before it is made, and
		// is a possible content from then on (see lost).
		setPending := func() {
			mu.Lock()
			if !m.frozen {
				f.pending = next
			}
			mu.Unlock()
		}
		switch r := rng.IntN(10); {
		case r < 7:
			off := rng.Int64N(maxModelFile)
			n := min(int64(1+rng.IntN(300<<10)), maxModelFile-off)
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.IntN(255) + 1)
			}
			if end := off + n; end > int64(len(next)) {
				next = append(next, make([]byte, end-int64(len(next)))...)
			}
			copy(next[off:], b)
			setPending()
			_, err = unix.Pwrite(fd, b, off)
		case r < 8:
			size := rng.Int64N(int64(len(next)) + 1)
			next = next[:size]
			setPending()
			err = unix.Ftruncate(fd, size)
		default:
			err = unix.Fsync(fd)
			synced = true
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		mu.Lock()
		if m.frozen {
			mu.Unlock()
			return nil
		}
		if synced {
			f.states = [][]byte{next}
			m.syncs++
		} else {
			f.states = append(f.states, next)
		}
		f.cur, f.pending = next, nil
		mu.Unlock()
	}
}

// lost is called at the instant of the power loss, with the workload's
// mutex held: a change in flight then may or may not have been done.
func (m *fileModel) lost() {
	m.frozen = true
	for _, f := range m.files {
		if f.pending != nil {
			f.states = append(f.states, f.pending)
		}
	}
}

// check reads every file: its length must be one it had since its last
// fsync, and each page must hold the page of one of those contents.
func (m *fileModel) check(root string) error {
	for name, f := range m.files {
		got, err := os.ReadFile(name)
		if errors.Is(err, os.ErrNotExist) && slices.ContainsFunc(f.states, func(s []byte) bool { return s == nil }) {
			got, err = nil, nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		okLen := false
		for _, s := range f.states {
			okLen = okLen || len(s) == len(got)
		}
		if !okLen {
			var lens []int
			for _, s := range f.states {
				lens = append(lens, len(s))
			}
			return fmt.Errorf("%s: %d bytes, a length it did not have since its last fsync (possible: %v)", name, len(got), lens)
		}
		for off := 0; off < len(got); off += pageSize {
			end := min(off+pageSize, len(got))
			ok := false
			for _, s := range f.states {
				want := make([]byte, end-off)
				if off < len(s) {
					copy(want, s[off:min(end, len(s))])
				}
				if bytes.Equal(got[off:end], want) {
					ok = true
					break
				}
			}
			if !ok {
				return fmt.Errorf("%s: page at %d holds none of its %d possible contents", name, off, len(f.states))
			}
		}
		// What is there now is durable (the servers synced their file
		// systems when they started again).
		f.states, f.cur, f.pending = [][]byte{got}, got, nil
	}
	m.frozen = false
	return nil
}

// nameModel is the metadata workload and its model: the names in one
// directory, each change fsynced.
type nameModel struct {
	names    map[string]bool // durable: each change was followed by an fsync of its directory
	inFlight map[string]bool // the names if the change in flight at the loss was done
	// made is the file the change in flight creates, if it is a create
	// with a write: its create may be stored without its content until
	// its fsync returns (madeSynced).
	made       string
	madeSynced bool
	syncs      int
	empty      map[string]bool // names of files made empty (their content is not checked)
	log        []string        // the last changes, for a failure's message
	frozen     bool            // the power is lost: later acknowledgments do not count
}

// run creates, renames, unlinks and makes directories in root/names
// until stop, each change followed by an fsync of the directory; a
// change counts once the fsync returned.
func (m *nameModel) run(root string, round int, rng *rand.Rand, mu *sync.Mutex, stop chan struct{}) error {
	dir := filepath.Join(root, "names")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Fsync(dfd); err != nil {
		return err
	}
	mu.Lock()
	if m.names == nil {
		m.names = map[string]bool{}
	}
	if m.empty == nil {
		m.empty = map[string]bool{}
	}
	mu.Unlock()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		mu.Lock()
		next := make(map[string]bool, len(m.names))
		var have []string
		for n := range m.names {
			next[n] = true
			have = append(have, n)
		}
		mu.Unlock()
		slices.Sort(have)
		var err error
		openFD := -1
		// The names a change leads to are known before it is made, and
		// possible from then on.
		inFlight := func() {
			mu.Lock()
			if !m.frozen {
				m.inFlight, m.made, m.madeSynced = next, "", false
			}
			mu.Unlock()
		}
		switch r := rng.IntN(10); {
		case r < 4 || len(have) == 0:
			n := fmt.Sprintf("f%d-%d-%d", rng.IntN(1000), round, i)
			next[n] = true
			inFlight()
			mu.Lock()
			if !m.frozen {
				m.made = n
			}
			mu.Unlock()
			var fd int
			if fd, err = unix.Open(filepath.Join(dir, n), unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o644); err == nil {
				_, err = unix.Write(fd, []byte(n))
				if err == nil {
					err = unix.Fsync(fd)
				}
				mu.Lock()
				if err == nil && !m.frozen {
					m.madeSynced = true
				}
				mu.Unlock()
				if cerr := unix.Close(fd); err == nil {
					err = cerr
				}
			}
		case r < 5:
			// An empty file, not synced itself: the fsync of its
			// directory makes its name durable.
			n := fmt.Sprintf("e%d-%d-%d", rng.IntN(1000), round, i)
			next[n] = true
			mu.Lock()
			m.empty[n] = true
			mu.Unlock()
			inFlight()
			// Still open when its directory is synced.
			openFD, err = unix.Open(filepath.Join(dir, n), unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o644)
		case r < 6:
			n := fmt.Sprintf("d%d-%d-%d", rng.IntN(1000), round, i)
			next[n] = true
			inFlight()
			err = unix.Mkdir(filepath.Join(dir, n), 0o755)
		case r < 8:
			from := have[rng.IntN(len(have))]
			to := fmt.Sprintf("r%d-%d-%d", rng.IntN(1000), round, i)
			delete(next, from)
			next[to] = true
			mu.Lock()
			if m.empty[from] {
				m.empty[to] = true
			}
			mu.Unlock()
			inFlight()
			err = unix.Rename(filepath.Join(dir, from), filepath.Join(dir, to))
		default:
			n := have[rng.IntN(len(have))]
			delete(next, n)
			inFlight()
			err = os.Remove(filepath.Join(dir, n))
		}
		if err == nil {
			err = unix.Fsync(dfd)
		}
		if openFD >= 0 {
			if cerr := unix.Close(openFD); err == nil {
				err = cerr
			}
		}
		if err != nil {
			return fmt.Errorf("names: %w", err)
		}
		mu.Lock()
		if m.frozen {
			mu.Unlock()
			return nil
		}
		m.names, m.inFlight, m.made, m.madeSynced = next, nil, "", false
		m.syncs++
		m.log = append(m.log, fmt.Sprintf("%s op %d (%d names)", time.Now().Format("15:04:05.000000"), i, len(next)))
		if len(m.log) > 5 {
			m.log = m.log[1:]
		}
		mu.Unlock()
	}
}

func (m *nameModel) lost() {
	m.frozen = true
	m.log = append(m.log, time.Now().Format("15:04:05.000000")+" power loss")
}

// check lists the directory: it must hold the names of the last
// acknowledged change, or of the change in flight at the loss.
func (m *nameModel) check(root string) error {
	entries, err := os.ReadDir(filepath.Join(root, "names"))
	if errors.Is(err, os.ErrNotExist) && len(m.names) == 0 {
		// The power went before the directory was made: nothing to
		// check, and the next round's changes count again.
		m.inFlight, m.made, m.madeSynced, m.frozen = nil, "", false, false
		return nil
	}
	if err != nil {
		return fmt.Errorf("list the names: %w", err)
	}
	got := map[string]bool{}
	for _, e := range entries {
		got[e.Name()] = true
	}
	same := func(want map[string]bool) bool {
		if want == nil || len(want) != len(got) {
			return false
		}
		for n := range want {
			if !got[n] {
				return false
			}
		}
		return true
	}
	if !same(m.names) && !same(m.inFlight) {
		var missing, extra []string
		for n := range m.names {
			if !got[n] {
				missing = append(missing, n)
			}
		}
		for n := range got {
			if !m.names[n] {
				extra = append(extra, n)
			}
		}
		return fmt.Errorf("names: %d listed; missing %v, unexpected %v (of the last fsynced state); last: %v", len(got), missing, extra, m.log)
	}
	// Files hold what was written and fsynced. The file whose create
	// was in flight may be empty if its fsync had not returned (its
	// create may be stored before the length of its write): it is then
	// an empty file from now on.
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || m.empty[n] {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, "names", n))
		if err != nil {
			return fmt.Errorf("read %s: %w", n, err)
		}
		if len(b) == 0 && n == m.made && !m.madeSynced {
			m.empty[n] = true
			continue
		}
		if len(b) == 0 || len(b) > 20 {
			return fmt.Errorf("%s holds %q", n, b)
		}
	}
	m.names, m.inFlight, m.made, m.madeSynced, m.frozen = got, nil, "", false, false
	return nil
}

// readAll reads every file below root: after a crash, none may fail.
func readAll(root string) error {
	return filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			if _, err := os.ReadFile(p); err != nil {
				return fmt.Errorf("read %s: %w", p, err)
			}
		}
		return nil
	})
}
