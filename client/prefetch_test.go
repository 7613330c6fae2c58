package client

import (
	"bytes"
	"context"
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// cachedShare returns the share of the bytes of files that is in the
// page cache.
func cachedShare(t *testing.T, files []string) float64 {
	t.Helper()
	var cached, total int
	page := os.Getpagesize()
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		// The chunk's bytes: from where byte 7 of the file's header says
		// they start (in 64 KiB).
		var head [8]byte
		f.ReadAt(head[:], 0)
		dataOff := int64(head[7]) << 16
		st, _ := f.Stat()
		if st.Size() <= dataOff {
			f.Close()
			continue
		}
		mem, err := unix.Mmap(int(f.Fd()), dataOff, int(st.Size()-dataOff), unix.PROT_READ, unix.MAP_SHARED)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		vec := make([]byte, (len(mem)+page-1)/page)
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0])))
		unix.Munmap(mem)
		if errno != 0 {
			t.Fatal(errno)
		}
		for _, v := range vec {
			cached += int(v & 1)
		}
		total += len(vec)
	}
	return float64(cached) / float64(max(total, 1))
}

// dropCached writes files out and drops them from the page cache.
func dropCached(t *testing.T, files []string) {
	t.Helper()
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
}

// startDiskCluster starts a cluster of nData data servers whose files
// stripe over all of them in chunks of chunkSize, or skips the test when
// their directories are on a tmpfs (nothing is read from a disk there).
func startDiskCluster(t *testing.T, chunkSize uint32, nData int) *testCluster {
	t.Helper()
	tc := startCluster(t, &weftv1.Layout{ChunkSize: chunkSize, StripeCount: uint32(nData), Replicas: 1}, nData)
	var sfs unix.Statfs_t
	if err := unix.Statfs(tc.dataDirs[0], &sfs); err != nil {
		t.Fatal(err)
	}
	if sfs.Type == unix.TMPFS_MAGIC {
		t.Skip("the data servers' directories are on a tmpfs: nothing is read from a disk")
	}
	return tc
}

// testPattern returns n bytes that differ from page to page.
func testPattern(n int) []byte {
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i>>12 + i)
	}
	return data
}

// A reader in place has the data servers' files prefetched into the page
// cache ahead of it only as far as its read-ahead window reaches (to the
// end of the chunk it ends in): a sequential reader gets the file ahead
// of it, a reader of half of each large record does not make the disks
// read the halves it skips (the over-read a fixed read-ahead causes).
func TestReadInPlacePrefetchFollowsWindow(t *testing.T) {
	const chunk = 1 << 20
	tc := startDiskCluster(t, chunk, 2)
	ctx := context.Background()
	c := newTestClient(t, tc.metaAddr, Config{})
	const size = 64 << 20
	data := testPattern(size)
	for _, tt := range []struct {
		name     string
		run, gap int // bytes read, then skipped
		atMost   float64
		atLeast  float64
	}{
		{"sequential", size, 0, 1, 0.95},
		// What it reads, and the chunk the window ends in (a prefetch
		// reads the rest of a chunk file with it): 5 MiB of each 8; and
		// once, past the first part, the window of a stream from the
		// start of the file (half of 4 MiB), before the skip shows.
		{"half of each 8 MiB record", 4 << 20, 4 << 20, (size/(8<<20)*(5<<20) + 2<<20) / float64(size), 0.5},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := writeFile(t, c, tt.name, data)
			var files []string
			for idx := uint64(0); idx < size/chunk; idx++ {
				files = append(files, tc.chunkPath(tc.members(chainFor(f.in.layout, idx))[0], f.Ino(), idx))
			}
			dropCached(t, files)
			if s := cachedShare(t, files); s > 0.1 {
				t.Skipf("%.2f of the chunk files stay cached after FADV_DONTNEED", s)
			}
			g, _ := open(t, c, tt.name, syscall.O_RDONLY)
			defer g.Release(ctx)
			before := c.LocalReadBytes()
			buf := make([]byte, 1<<20) // the kernel's requests
			for rec := 0; rec < size; rec += tt.run + tt.gap {
				for off := rec; off < rec+tt.run; off += len(buf) {
					if _, err := g.ReadAt(ctx, buf, int64(off)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if c.LocalReadBytes() == before {
				t.Fatal("nothing was read in place")
			}
			time.Sleep(200 * time.Millisecond) // prefetches under way
			s := cachedShare(t, files)
			t.Logf("%s: %.2f of the file in the page cache after reading %.2f of it", tt.name, s, float64(tt.run)/float64(tt.run+tt.gap))
			if s > tt.atMost || s < tt.atLeast {
				t.Errorf("%.2f of the file is in the page cache, want %.2f to %.2f", s, tt.atLeast, tt.atMost)
			}
		})
	}
}

// A reader's first read of a cold chunk in place has the data server read
// the span it asked for from the disk while it opens the chunk and reads
// its checksums; a small random read does not.
func TestReadInPlaceOpenReadsInTheFirstSpan(t *testing.T) {
	const chunk = 1 << 20
	tc := startDiskCluster(t, chunk, 1)
	ctx := context.Background()
	c := newTestClient(t, tc.metaAddr, Config{})
	data := testPattern(chunk)
	for _, tt := range []struct {
		name   string
		off, n int
		readIn bool
	}{
		{"the whole file", 0, chunk, true},
		{"8 KiB", 512 << 10, 8 << 10, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := writeFile(t, c, tt.name, data)
			files := []string{tc.chunkPath(tc.members(chainFor(f.in.layout, 0))[0], f.Ino(), 0)}
			dropCached(t, files)
			if s := cachedShare(t, files); s > 0.1 {
				t.Skipf("%.2f of the chunk file stays cached after FADV_DONTNEED", s)
			}
			srv := tc.DataServer(0)
			before := srv.ReadIns()
			g, _ := open(t, c, tt.name, syscall.O_RDONLY)
			defer g.Release(ctx)
			buf := make([]byte, tt.n)
			if _, err := g.ReadAt(ctx, buf, int64(tt.off)); err != nil {
				t.Fatal(err)
			}
			if c.LocalReadBytes() == 0 {
				t.Fatal("nothing was read in place")
			}
			if !bytes.Equal(buf, data[tt.off:tt.off+tt.n]) {
				t.Fatal("read other bytes than written")
			}
			// A read in the background counts once it is done.
			for deadline := time.Now().Add(5 * time.Second); tt.readIn && srv.ReadIns() == before && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			if !tt.readIn {
				time.Sleep(50 * time.Millisecond) // one would have been done by now
			}
			if got := srv.ReadIns() > before; got != tt.readIn {
				t.Errorf("the server read the span in: %v, want %v", got, tt.readIn)
			}
		})
	}
}
