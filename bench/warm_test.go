package bench

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentPages counts the pages of path in the page cache.
func residentPages(t *testing.T, path string, size int) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	vec := make([]byte, (size+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(size), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestReReadStartsWarm checks that a re-read worker has its region in
// the page cache before it starts, even when the pages were dropped
// after the file was last read (as a cold read on another target does).
func TestReReadStartsWarm(t *testing.T) {
	dir, err := os.MkdirTemp(".", "warm-") // not a tmpfs: its pages cannot be dropped
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "f")
	const size = 4 << 20
	if err := os.WriteFile(path, make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	dropPages(t, path)
	pages := size / os.Getpagesize()
	if n := residentPages(t, path, size); n > pages/2 {
		t.Skipf("this file system keeps %d of %d pages after FADV_DONTNEED", n, pages)
	}
	for _, tt := range []struct {
		kind string
		warm bool
	}{{WSeqRead, false}, {WReRead, true}} {
		dropPages(t, path)
		run, cleanup, err := prepareData(&task{Kind: tt.kind, Path: path, Record: 256 << 10, Size: size, Warm: tt.warm})
		if err != nil {
			t.Fatal(err)
		}
		n := residentPages(t, path, size)
		if moved, _, err := run(); err != nil || moved != size {
			t.Errorf("%s: moved %d bytes, %v", tt.kind, moved, err)
		}
		cleanup()
		if got := n == pages; got != tt.warm {
			t.Errorf("%s: %d of %d pages cached before the timed part; want all cached: %v", tt.kind, n, pages, tt.warm)
		}
	}
	for _, s := range plan(&Config{Records: []int64{256 << 10}, Procs: []int{1}, Size: size, Workloads: []string{GroupData}}) {
		if s.workload != WReRead {
			continue
		}
		for _, tk := range s.tasks("/x") {
			if !tk.Warm {
				t.Errorf("re-read task %+v is not warmed", tk)
			}
		}
	}
}

// dropPages writes path's pages out and drops them from the page cache.
func dropPages(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fsync(int(f.Fd())); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}
