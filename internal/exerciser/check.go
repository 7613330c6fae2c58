package exerciser

import (
	"golang.org/x/sys/unix"
)

// checkRead reads n bytes at off from f (pread, or read at the file
// position already set to off), retrying short reads until end of file, and
// compares them with the model. It returns the number of bytes read.
func (x *exerciser) checkRead(f *file, off, n int64, positional bool, what string) int {
	x.t.Helper()
	buf := make([]byte, n)
	got := 0
	for int64(got) < n {
		var m int
		var err error
		if positional {
			m, err = unix.Pread(f.fd, buf[got:], off+int64(got))
		} else {
			m, err = unix.Read(f.fd, buf[got:])
		}
		if err != nil {
			x.fail("%s %s at %d (%d of %d bytes done): %v", what, f.path, off+int64(got), got, n, err)
		}
		if m == 0 {
			break
		}
		got += m
	}
	x.compare(f, off, n, buf[:got], what)
	return got
}

// compare checks the bytes got by a read of n bytes at off against the
// model of f, naming the first differing offset. Reads are retried until
// end of file, so got must be exactly what the model holds there.
func (x *exerciser) compare(f *file, off, n int64, got []byte, what string) {
	x.t.Helper()
	size := int64(len(f.data))
	var want []byte
	if off < size {
		want = f.data[off:min(off+n, size)]
	}
	for i := 0; i < len(got) && i < len(want); i++ {
		if got[i] != want[i] {
			x.fail("%s %s: %d bytes read at %d differ from the model: first differing offset %d (got %#02x, want %#02x); file size %d",
				what, f.path, len(got), off, off+int64(i), got[i], want[i], size)
		}
	}
	if len(got) != len(want) {
		x.fail("%s %s at %d: read %d bytes, want %d (file size %d); first differing offset %d",
			what, f.path, off, len(got), len(want), size, off+int64(min(len(got), len(want))))
	}
}

// checkWhole checks f's size and reads the whole file through a fresh
// descriptor.
func (x *exerciser) checkWhole(f *file, what string) {
	x.t.Helper()
	x.wantSize(f, what)
	fd, err := unix.Open(f.path, unix.O_RDONLY, 0)
	if err != nil {
		x.fail("%s: open %s: %v", what, f.path, err)
	}
	defer unix.Close(fd)
	buf := make([]byte, len(f.data)+1)
	got := 0
	for got < len(buf) {
		m, err := unix.Pread(fd, buf[got:], int64(got))
		if err != nil {
			x.fail("%s: pread %s at %d: %v", what, f.path, got, err)
		}
		if m == 0 {
			break
		}
		got += m
	}
	x.compareWhole(f, buf[:got], what)
}

// compareWhole compares a whole file's contents with the model.
func (x *exerciser) compareWhole(f *file, got []byte, what string) {
	x.t.Helper()
	for i := 0; i < len(got) && i < len(f.data); i++ {
		if got[i] != f.data[i] {
			x.fail("%s of %s: first differing offset %d (got %#02x, want %#02x); size %d",
				what, f.path, i, got[i], f.data[i], len(f.data))
		}
	}
	if len(got) != len(f.data) {
		x.fail("%s of %s: read %d bytes, want %d; first differing offset %d",
			what, f.path, len(got), len(f.data), min(len(got), len(f.data)))
	}
}
