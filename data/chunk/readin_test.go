package chunk

import (
	"bytes"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// dropFromCache writes the chunk's data file back and drops it from the
// page cache.
func dropFromCache(t *testing.T, tg *Target, id ID) {
	t.Helper()
	f, err := os.Open(tg.chunkPath(id))
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
