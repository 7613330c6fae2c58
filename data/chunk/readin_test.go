package chunk

import (
	"bytes"
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dropFromCache writes the chunk's file back and drops it from the page
// cache.
func dropFromCache(t *testing.T, tg *Target, id ID) {
	t.Helper()
	f, err := os.Open(tg.inlinePath(id))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}

// A read of a cold range of 128 KiB or more reads the range into the page
// cache in large folios first; a cached range, or a small read, does not.
func TestColdReadsReadInAhead(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	if tg.inMemory {
		t.Skip("the test directory is on a tmpfs: nothing to read in")
	}
	id := ID{Ino: 7, Index: 0}
	data := pattern(3, 1<<20)
	if _, err := tg.Write(id, 1, 0, data, 1<<20, true); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		drop    bool // drop the file from the page cache first
		off, n  int
		readIns int64
	}{
		{"cold, 256 KiB", true, 512 << 10, 256 << 10, 1},
		{"cached, 256 KiB", false, 512 << 10, 256 << 10, 0},
		{"cold, 64 KiB", true, 0, 64 << 10, 0},
		{"cold, unaligned 200 KiB", true, 100 << 10, 200 << 10, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.drop {
				dropFromCache(t, tg, id)
			}
			before := tg.readIns.Load()
			got, err := tg.Read(id, int64(tt.off), tt.n)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data[tt.off:tt.off+tt.n]) {
				t.Fatal("read returned other bytes than written")
			}
			if n := tg.readIns.Load() - before; n != tt.readIns {
				if readInOff.Load() {
					t.Skip("MADV_POPULATE_READ is not supported by this kernel")
				}
				t.Errorf("%d reads in ahead, want %d", n, tt.readIns)
			}
		})
	}
}

// Opening a chunk for a reader in place reads the range the reader asked
// for into the page cache meanwhile, when it is large enough or the whole
// chunk; a small range or none reads nothing in.
func TestOpenForReadReadsInTheWantedRange(t *testing.T) {
	_, tg := openTestStore(t, Options{})
	if tg.inMemory {
		t.Skip("the test directory is on a tmpfs: nothing to read in")
	}
	id := ID{Ino: 8, Index: 0}
	data := pattern(4, 1<<20)
	if _, err := tg.Write(id, 1, 0, data, 1<<20, true); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		lo, hi     int64
		readIn     bool
		inLo, inHi int64 // a range that must be in the page cache after
	}{
		{"none", 0, 0, false, 0, 0},
		{"8 KiB", 300 << 10, 308 << 10, false, 0, 0},
		{"unaligned 300 KiB", 100 << 10, 400 << 10, true, 64 << 10, 448 << 10},
		{"the whole chunk", 0, 1 << 20, true, 0, 1 << 20},
		{"past the end", 512 << 10, 4 << 20, true, 512 << 10, 1 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dropFromCache(t, tg, id)
			before := tg.readIns.Load()
			o, err := tg.OpenForRead(id, false, tt.lo, tt.hi)
			if err != nil {
				t.Fatal(err)
			}
			f, length := o.File, o.Length
			defer f.Close()
			if length != int64(len(data)) {
				t.Fatalf("length %d, want %d", length, len(data))
			}
			deadline := time.Now().Add(5 * time.Second)
			for tt.readIn && tg.readIns.Load() == before && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if !tt.readIn {
				time.Sleep(20 * time.Millisecond) // a read in would have started by now
			}
			if got := tg.readIns.Load() > before; got != tt.readIn {
				if readInOff.Load() {
					t.Skip("MADV_POPULATE_READ is not supported by this kernel")
				}
				t.Fatalf("read in: %v, want %v", got, tt.readIn)
			}
			if tt.readIn && !resident(t, f, o.DataOffset+tt.inLo, o.DataOffset+tt.inHi) {
				t.Errorf("bytes %d-%d are not all in the page cache", tt.inLo, tt.inHi)
			}
			got := make([]byte, len(data))
			if _, err := f.ReadAt(got, o.DataOffset); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("read through the descriptor: %v, bytes equal: %v", err, bytes.Equal(got, data))
			}
		})
	}
}

// resident reports whether every page of bytes [lo, hi) of f is in the
// page cache.
func resident(t *testing.T, f *os.File, lo, hi int64) bool {
	t.Helper()
	m, err := unix.Mmap(int(f.Fd()), lo, int(hi-lo), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	for _, v := range vec {
		if v&1 == 0 {
			return false
		}
	}
	return true
}
