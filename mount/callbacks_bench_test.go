package mount

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// cpuSeconds is the user+system CPU time of this process.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// TestMeasureCallbacks measures cached stats through FUSE and creates/s
// with and without callbacks (meta service, data servers and both mounts
// in this process). It only runs with WEFT_MEASURE_CALLBACKS=1 and
// reports numbers; it asserts nothing about them.
func TestMeasureCallbacks(t *testing.T) {
	if os.Getenv("WEFT_MEASURE_CALLBACKS") == "" {
		t.Skip("set WEFT_MEASURE_CALLBACKS=1 to measure")
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root here")
	}
	for _, cb := range []bool{true, false} {
		tc := startCluster(t, &weftv1.Layout{ChunkSize: 1 << 20, StripeCount: 1, Replicas: 1}, 1)
		opts := Options{NoCallbacks: !cb}
		a, _, _ := mountWith(t, tc, opts)
		b, cb2, _ := mountWith(t, tc, opts)
		const nFiles = 1000
		if err := os.Mkdir(filepath.Join(a, "s"), 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range nFiles {
			if err := os.WriteFile(filepath.Join(a, "s", fmt.Sprint(i)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for _, procs := range []int{1, 4} {
			calls0, cpu0, start := cb2.MetaCalls(), cpuSeconds(), time.Now()
			var wg sync.WaitGroup
			var mu sync.Mutex
			total := 0
			for p := range procs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					n := 0
					for time.Since(start) < 3*time.Second {
						if _, err := os.Stat(filepath.Join(b, "s", fmt.Sprint((n+p*7)%nFiles))); err != nil {
							t.Error(err)
							return
						}
						n++
					}
					mu.Lock()
					total += n
					mu.Unlock()
				}()
			}
			wg.Wait()
			el, cpu := time.Since(start).Seconds(), cpuSeconds()-cpu0
			t.Logf("callbacks=%v stat on B, %d threads: %.0f stats/s, %.2f core-us/stat, %d meta calls",
				cb, procs, float64(total)/el, cpu*1e6/float64(total), cb2.MetaCalls()-calls0)
		}
		// Creates on A while B caches the directory (it listed it and
		// looked names up), so every create is called back to B.
		dir := filepath.Join(a, "c")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if _, err := os.ReadDir(filepath.Join(b, "c")); err != nil {
			t.Fatal(err)
		}
		_, _ = os.Stat(filepath.Join(b, "c", "x"))
		const nCreates = 3000
		cpu0, start := cpuSeconds(), time.Now()
		for i := range nCreates {
			f, err := os.OpenFile(filepath.Join(dir, fmt.Sprint(i)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		el, cpu := time.Since(start).Seconds(), cpuSeconds()-cpu0
		st := tc.Meta()
		sess, interests, pub, sent, alls := st.CallbackStats()
		t.Logf("callbacks=%v create on A, B watching: %.0f creates/s, %.1f core-us/create (whole process); meta: %d sessions, %d interests, %d changes published, %d messages sent, %d all",
			cb, nCreates/el, cpu*1e6/nCreates, sess, interests, pub, sent, alls)
	}
}
