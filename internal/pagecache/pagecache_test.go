package pagecache

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentShare is the share of f's bytes [lo, hi) in the page cache.
func residentShare(t *testing.T, f *os.File, lo, hi int64) float64 {
	t.Helper()
	m, err := unix.Mmap(int(f.Fd()), lo, int(hi-lo), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return float64(n) / float64(len(vec))
}

// coldFile writes a file of size random bytes on a disk (not a tmpfs)
// and drops it from the page cache; it skips the test where it cannot.
func coldFile(t *testing.T, size int) *os.File {
	t.Helper()
	dir := t.TempDir()
	if DirInMemory(dir) {
		t.Skip("the temporary directory is on a tmpfs: nothing to read in")
	}
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	p := filepath.Join(dir, "chunk")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if s := residentShare(t, f, 0, int64(size)); s > 0.1 {
		t.Skipf("%.2f of the file stays cached after FADV_DONTNEED", s)
	}
	return f
}

// TestPopulate checks that the range asked for is in the page cache
// afterwards, and that a range past the end of the file fails with
// EFAULT, without a signal.
func TestPopulate(t *testing.T) {
	const size = 8 << 20
	f := coldFile(t, size)
	if InMemory(f) {
		t.Errorf("a file of %s is taken for one in memory", f.Name())
	}
	// The last quarter, from a byte that is not page-aligned.
	err := Populate(int(f.Fd()), 6<<20+100, size)
	if errors.Is(err, ErrNoPopulate) {
		t.Skip("MADV_POPULATE_READ is not supported by this kernel")
	}
	if err != nil {
		t.Fatalf("populate: %v", err)
	}
	if s := residentShare(t, f, 6<<20, size); s < 1 {
		t.Errorf("%.2f of the populated range is in the page cache", s)
	}
	if err := Populate(int(f.Fd()), size-4096, size+1<<20); !errors.Is(err, unix.EFAULT) {
		t.Errorf("populate past the end of the file: %v, want EFAULT", err)
	}
}

// TestPopulateIfCold checks that a cold range is read in and a cached
// one left alone.
func TestPopulateIfCold(t *testing.T) {
	const size = 4 << 20
	f := coldFile(t, size)
	got, err := PopulateIfCold(int(f.Fd()), 1<<20, 2<<20)
	if errors.Is(err, ErrNoPopulate) {
		t.Skip("MADV_POPULATE_READ is not supported by this kernel")
	}
	if err != nil || !got {
		t.Fatalf("cold range: populated %v, err %v; want it read in", got, err)
	}
	if s := residentShare(t, f, 1<<20, 2<<20); s < 1 {
		t.Errorf("%.2f of the cold range is in the page cache after it was populated", s)
	}
	if got, err := PopulateIfCold(int(f.Fd()), 1<<20, 2<<20); err != nil || got {
		t.Errorf("cached range: populated %v, err %v; want it left alone", got, err)
	}
}

// TestInMemory checks that files of /dev/shm count as in memory.
func TestInMemory(t *testing.T) {
	shm, err := os.CreateTemp("/dev/shm", "weft-test-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	defer os.Remove(shm.Name())
	defer shm.Close()
	if !InMemory(shm) || !DirInMemory("/dev/shm") {
		t.Error("a file in /dev/shm is not taken for one in memory")
	}
}
