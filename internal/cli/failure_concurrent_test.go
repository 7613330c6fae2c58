package cli

import (
	"bytes"
	"math/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestConcurrentWritersOneChunk: two mounts write interleaved, unaligned
// ranges of the same chunks of one replicas-3 file at the same time. After
// both closed, the file is the union of both writers' ranges and every
// replica is byte-identical.
func TestConcurrentWritersOneChunk(t *testing.T) {
	c := newFailCluster(t, 3, []string{"--replicas", "3"}, nil)
	c.waitHealthy(3, failWait)
	a, b := c.mount(), c.mount()
	const name = "shared"
	const size = 2<<20 + 5000 // three chunks of 1 MiB, the last short
	const rangeSize = 43690   // unaligned to the 64 KiB checksum blocks
	want := pattern(name, size)
	f, err := os.Create(filepath.Join(a, name))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()

	var starts []int
	for off := 0; off < size; off += rangeSize {
		starts = append(starts, off)
	}
	tests := []struct {
		mnt    string
		parity int
		seed   int64
	}{{a, 0, 1}, {b, 1, 2}}
	var wg sync.WaitGroup
	ready := make(chan struct{})
	errs := make(chan error, len(tests))
	for _, w := range tests {
		var mine []int
		for i, off := range starts {
			if i%2 == w.parity {
				mine = append(mine, off)
			}
		}
		rand.New(rand.NewSource(w.seed)).Shuffle(len(mine), func(i, j int) { mine[i], mine[j] = mine[j], mine[i] })
		wg.Add(1)
		go func(mnt string, offs []int) {
			defer wg.Done()
			f, err := os.OpenFile(filepath.Join(mnt, name), os.O_WRONLY, 0)
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			<-ready
			for _, off := range offs {
				end := min(off+rangeSize, size)
				// In pieces, so the writes of both mounts interleave.
				for p := off; p < end; p += 8192 {
					if _, err := f.WriteAt(want[p:min(p+8192, end)], int64(p)); err != nil {
						errs <- err
						return
					}
				}
			}
			if err := f.Sync(); err != nil {
				errs <- err
				return
			}
			errs <- f.Close()
		}(w.mnt, mine)
	}
	close(ready)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("writer: %v", err)
		}
	}
	got, err := os.ReadFile(filepath.Join(c.mount(), name))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the file is not the union of both writers' ranges: %d bytes (want %d), first difference at %d", len(got), len(want), firstDiff(got, want))
	}
	t.Logf("%d chunks identical on all 3 replicas", c.checkReplicasIdentical(3))
}
