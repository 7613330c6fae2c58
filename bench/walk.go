package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Workloads of the large-tree group (--walk-files N).
const (
	GroupWalk = "walk"

	WMdStatCold = "md-stat-cold" // md-stat with the kernel's caches dropped first: one lookup per stat
	WWalkLarge  = "walk-large"   // du-like lstat of every entry of a prepared tree of --walk-files files
)

// walkDirFiles is how many files each directory of the prepared tree holds.
const walkDirFiles = 1000

// walkTreeDir is where the tree of n files lives below a target. It is
// kept between runs (outside the run's own directory, which is removed at
// the end), so a tree of a million files is made once.
func walkTreeDir(target string, n int) string {
	return filepath.Join(target, fmt.Sprintf("weft-bench-tree-%d", n))
}

// walkSteps prepares (once) a tree of cfg.WalkFiles empty files in
// directories of walkDirFiles each and walks it cold, as du does.
func walkSteps(cfg *Config) []step {
	n := cfg.WalkFiles
	return []step{
		{workload: "setup", untimed: true, action: func(target string) error { return prepareTree(walkTreeDir(target, n), n) }},
		{workload: WWalkLarge, group: GroupWalk, procs: 1, cold: true, files: n,
			tasks: func(target string) []task { return []task{{Kind: WWalk, Path: walkTreeDir(target, n)}} }},
	}
}

// prepareTree makes dir holding n empty files in subdirectories of
// walkDirFiles files, with 16 goroutines, unless a complete tree of n
// files is there already (a marker file is written last).
func prepareTree(dir string, n int) error {
	marker := filepath.Join(dir, ".complete")
	if b, err := os.ReadFile(marker); err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(n) {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dirs := (n + walkDirFiles - 1) / walkDirFiles
	var next atomic.Int64
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				d := int(next.Add(1) - 1)
				if d >= dirs {
					return
				}
				sub := filepath.Join(dir, fmt.Sprintf("d%05d", d))
				if err := os.Mkdir(sub, 0o755); err != nil && !os.IsExist(err) {
					errs <- err
					return
				}
				for i := d * walkDirFiles; i < min(n, (d+1)*walkDirFiles); i++ {
					p := filepath.Join(sub, "f"+strconv.Itoa(i))
					if err := unix.Mknod(p, unix.S_IFREG|0o644, 0); err != nil && err != unix.EEXIST {
						errs <- fmt.Errorf("make %s: %w", p, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("prepare a tree of %d files in %s: %w", n, dir, err)
	}
	return os.WriteFile(marker, []byte(strconv.Itoa(n)+"\n"), 0o644)
}
