package posixtest

import (
	"bytes"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// writeFile creates (or truncates) path with mode and writes data, failing
// the subtest on error.
func writeFile(t testing.TB, path string, data []byte, mode uint32) {
	t.Helper()
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, mode)
	must(t, err, "open %s O_WRONLY|O_CREAT|O_TRUNC", path)
	defer unix.Close(fd)
	writeAt(t, fd, data, 0, path)
}

// writeAt pwrites all of data at off.
func writeAt(t testing.TB, fd int, data []byte, off int64, path string) {
	t.Helper()
	for len(data) > 0 {
		n, err := unix.Pwrite(fd, data, off)
		must(t, err, "pwrite %s at %d (%d bytes)", path, off, len(data))
		if n == 0 {
			t.Fatalf("pwrite %s at %d: wrote 0 bytes", path, off)
		}
		data, off = data[n:], off+int64(n)
	}
}

// readAt preads up to n bytes at off, stopping early only at end of file.
func readAt(t testing.TB, fd int, n int, off int64, path string) []byte {
	t.Helper()
	buf := make([]byte, n)
	got := 0
	for got < n {
		m, err := unix.Pread(fd, buf[got:], off+int64(got))
		must(t, err, "pread %s at %d", path, off+int64(got))
		if m == 0 {
			break
		}
		got += m
	}
	return buf[:got]
}

// closeFd closes *fd unless it is already closed (-1) and marks it closed.
// Closing a number twice could close a descriptor that another goroutine
// (an in-process file server) has opened meanwhile.
func closeFd(fd *int) {
	if *fd >= 0 {
		unix.Close(*fd)
		*fd = -1
	}
}

// readFile reads the whole file at path.
func readFile(t testing.TB, path string) []byte {
	t.Helper()
	fd, err := unix.Open(path, unix.O_RDONLY, 0)
	must(t, err, "open %s O_RDONLY", path)
	defer unix.Close(fd)
	var st unix.Stat_t
	must(t, unix.Fstat(fd, &st), "fstat %s", path)
	return readAt(t, fd, int(st.Size)+1, 0, path)
}

// wantContent checks that the file at path holds exactly want, naming the
// first differing offset otherwise.
func wantContent(t testing.TB, path string, want []byte) {
	t.Helper()
	got := readFile(t, path)
	wantBytes(t, got, want, "content of "+path)
}

// wantBytes compares got with want, naming the first differing offset.
func wantBytes(t testing.TB, got, want []byte, what string) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	t.Errorf("%s: %d bytes, want %d; first difference at offset %d", what, len(got), len(want), i)
}

// lstat returns the attributes of path itself, failing the subtest on error.
func lstat(t testing.TB, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	must(t, unix.Lstat(path, &st), "lstat %s", path)
	return st
}

// wantMode checks the file type and permission bits of path (not following
// symlinks).
func wantMode(t testing.TB, path string, want uint32) {
	t.Helper()
	if got := lstat(t, path).Mode; got != want {
		t.Errorf("lstat %s: mode %#o, want %#o", path, got, want)
	}
}

// wantSize checks st_size of path.
func wantSize(t testing.TB, path string, want int64) {
	t.Helper()
	if got := lstat(t, path).Size; got != want {
		t.Errorf("lstat %s: size %d, want %d", path, got, want)
	}
}

// wantNlink checks st_nlink of path.
func wantNlink(t testing.TB, path string, want uint64) {
	t.Helper()
	if got := lstat(t, path).Nlink; got != want {
		t.Errorf("lstat %s: nlink %d, want %d", path, got, want)
	}
}

// pattern returns n bytes of a recognisable pattern that differs with seed,
// never containing zero bytes (so holes are told apart from data).
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i%251) + seed | 1
	}
	return b
}

// tsTime converts a Timespec to a time.Time.
func tsTime(ts unix.Timespec) time.Time { return time.Unix(ts.Sec, ts.Nsec) }

// timestampTick waits long enough that the kernel's coarse clock (and a
// remote server's clock) moves on, so a timestamp update is visible.
func timestampTick() { time.Sleep(30 * time.Millisecond) }
