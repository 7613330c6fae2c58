package cli

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// streamResult is what a streaming workload saw.
type streamResult struct {
	files     []string // completed (closed without error), in order
	errs      []error
	corrupted int64 // bytes read back different from what was written
	verified  int   // files read back and compared
}

// streamWorkload writes nFiles files of size bytes into dir in 1 MiB
// writes with an fsync every 4 MiB, while a reader reads back every
// completed file and compares it with what was written. written counts
// the bytes written so far; every write and fsync is timed into stall.
func streamWorkload(dir string, nFiles, size int, written *atomic.Int64, stall *stallMeter) *streamResult {
	res := &streamResult{}
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		res.errs = append(res.errs, err)
		mu.Unlock()
	}
	completed := make(chan string, nFiles)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // reader
		defer wg.Done()
		for name := range completed {
			got, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				fail(fmt.Errorf("read back %s: %w", name, err))
				continue
			}
			want := pattern(name, size)
			mu.Lock()
			res.verified++
			if sha256.Sum256(got) != sha256.Sum256(want) {
				n := int64(len(got) - len(want))
				if n < 0 {
					n = -n
				}
				for i := 0; i < len(got) && i < len(want); i++ {
					if got[i] != want[i] {
						n++
					}
				}
				res.corrupted += n
				res.errs = append(res.errs, fmt.Errorf("%s read back with %d wrong bytes (first at %d of %d)", name, n, firstDiff(got, want), len(want)))
			}
			mu.Unlock()
		}
	}()
	const writeSize, syncEvery = 1 << 20, 4 << 20
	for i := 0; i < nFiles; i++ {
		name := fmt.Sprintf("stream-%03d", i)
		content := pattern(name, size)
		err := func() error {
			f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				return err
			}
			defer f.Close()
			for off := 0; off < size; off += writeSize {
				end := min(off+writeSize, size)
				start := time.Now()
				if _, err := f.Write(content[off:end]); err != nil {
					return fmt.Errorf("write at %d: %w", off, err)
				}
				stall.record(time.Since(start), fmt.Sprintf("write of %s at %d MiB", name, off>>20))
				written.Add(int64(end - off))
				if end%syncEvery == 0 || end == size {
					start = time.Now()
					if err := f.Sync(); err != nil {
						return fmt.Errorf("fsync at %d: %w", end, err)
					}
					stall.record(time.Since(start), fmt.Sprintf("fsync of %s at %d MiB", name, end>>20))
				}
			}
			start := time.Now()
			err = f.Close()
			stall.record(time.Since(start), "close of "+name)
			return err
		}()
		if err != nil {
			fail(fmt.Errorf("%s: %w", name, err))
			continue
		}
		mu.Lock()
		res.files = append(res.files, name)
		mu.Unlock()
		completed <- name
	}
	close(completed)
	wg.Wait()
	return res
}

// TestFailureKillDataServerMidWrite: replicas 3 on 4 data servers; one is
// killed with SIGKILL while a file stream is written and verified. The
// workload must see no error and no wrong byte, the stall stays bounded;
// the server restarts, resyncs, and every chunk's replicas end identical.
func TestFailureKillDataServerMidWrite(t *testing.T) {
	c := newFailCluster(t, 4, []string{"--replicas", "3"}, nil)
	c.waitHealthy(3, failWait)
	if st, err := c.status(); err == nil {
		t.Logf("chains: %s", describeChains(st, 3))
	}
	mnt := c.mount()
	dir := filepath.Join(mnt, "stream")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	const nFiles, size = 16, 12 << 20 // 192 MiB in all
	var written atomic.Int64
	stall := &stallMeter{}
	done := make(chan *streamResult, 1)
	start := time.Now()
	go func() { done <- streamWorkload(dir, nFiles, size, &written, stall) }()

	victim := c.data[1]
	targetDir := victim.dir
	killed := false
	var res *streamResult
	deadline := time.After(2 * time.Minute)
	for res == nil {
		select {
		case res = <-done:
		case <-deadline:
			t.Fatalf("the workload did not finish within 2 minutes (%d MiB written)", written.Load()>>20)
		case <-time.After(20 * time.Millisecond):
			if !killed && written.Load() >= nFiles*size/3 {
				t.Logf("killing data server %d (SIGKILL) after %d MiB written", victim.n, written.Load()>>20)
				victim.proc.Kill(t, syscall.SIGKILL)
				killed = true
			}
		}
	}
	took := time.Since(start)
	if !killed {
		t.Fatal("the workload finished before the kill")
	}
	maxStall, where := stall.get()
	t.Logf("workload: %d files, %d MiB in %v (%.1f MiB/s) with replicas 3; longest stall %v (%s); failure timeout %v",
		len(res.files), written.Load()>>20, took.Round(time.Millisecond), float64(written.Load())/(1<<20)/took.Seconds(),
		maxStall.Round(time.Millisecond), where, failTimeout)
	for _, err := range res.errs {
		t.Errorf("workload error: %v", err)
	}
	if res.corrupted != 0 || res.verified != nFiles || len(res.files) != nFiles {
		t.Errorf("%d files completed, %d verified, %d corrupted bytes; want %d, %d, 0", len(res.files), res.verified, res.corrupted, nFiles, nFiles)
	}
	if maxStall > failTimeout+5*time.Second {
		t.Errorf("the application stalled %v (%s); the promise is at most the failure timeout (%v) plus a few seconds", maxStall, where, failTimeout)
	}

	before := dirBytes(targetDir)
	restart := time.Now()
	c.startData(victim)
	healthyAfter := c.waitHealthy(3, failWait)
	copied := dirBytes(targetDir) - before
	t.Logf("resync: data server %d healthy again %v after its restart; its target grew by %d MiB (%.1f MiB/s)",
		victim.n, time.Since(restart).Round(time.Millisecond), copied>>20, float64(copied)/(1<<20)/healthyAfter.Seconds())
	n := c.checkReplicasIdentical(3)
	if n == 0 {
		t.Error("no chunks found to compare")
	}
	t.Logf("%d chunks byte-identical on all 3 replicas of their chains", n)

	// And the data reads back through a fresh mount.
	fresh := c.mount()
	for _, name := range res.files {
		got, err := os.ReadFile(filepath.Join(fresh, "stream", name))
		if err != nil || !bytes.Equal(got, pattern(name, size)) {
			t.Errorf("%s through a fresh mount after the resync: err %v, equal %v", name, err, bytes.Equal(got, pattern(name, size)))
		}
	}
}
