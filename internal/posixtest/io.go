package posixtest

import (
	"bytes"

	"golang.org/x/sys/unix"
)

const (
	kib = 1 << 10
	mib = 1 << 20
)

var ioTests = []testCase{
	{"ReadWrite", func(e *env) {
		p := e.path("f")
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o644)
		must(e.t, err, "open %s", p)
		defer unix.Close(fd)
		n, err := unix.Write(fd, []byte("hello, "))
		must(e.t, err, "write %s", p)
		if n != 7 {
			e.t.Errorf("write %s: %d bytes, want 7", p, n)
		}
		_, err = unix.Write(fd, []byte("world"))
		must(e.t, err, "write %s", p)
		wantBytes(e.t, readAt(e.t, fd, 100, 0, p), []byte("hello, world"), "pread "+p)
		_, err = unix.Seek(fd, 0, unix.SEEK_SET)
		must(e.t, err, "lseek")
		buf := make([]byte, 5)
		n, err = unix.Read(fd, buf)
		must(e.t, err, "read %s", p)
		wantBytes(e.t, buf[:n], []byte("hello"), "read "+p)
		// pwrite does not move the file offset.
		_, err = unix.Pwrite(fd, []byte("W"), 7)
		must(e.t, err, "pwrite %s", p)
		n, err = unix.Read(fd, buf)
		must(e.t, err, "read %s", p)
		wantBytes(e.t, buf[:n], []byte(", Wor"), "read after pwrite "+p)
		// Reads at and past end of file return 0 bytes.
		_, err = unix.Seek(fd, 0, unix.SEEK_END)
		must(e.t, err, "lseek SEEK_END")
		n, err = unix.Read(fd, buf)
		if err != nil || n != 0 {
			e.t.Errorf("read at end of %s: %d bytes, %v; want 0, nil", p, n, err)
		}
		n, err = unix.Pread(fd, buf, 1000)
		if err != nil || n != 0 {
			e.t.Errorf("pread past end of %s: %d bytes, %v; want 0, nil", p, n, err)
		}
		wantSize(e.t, p, 12)
	}},
	{"BadDescriptorMode", func(e *env) {
		p := e.path("f")
		writeFile(e.t, p, []byte("data"), 0o644)
		ro, err := unix.Open(p, unix.O_RDONLY, 0)
		must(e.t, err, "open %s", p)
		defer unix.Close(ro)
		_, err = unix.Write(ro, []byte("x"))
		wantErrno(e.t, err, unix.EBADF, "write to %s opened O_RDONLY", p)
		wo, err := unix.Open(p, unix.O_WRONLY, 0)
		must(e.t, err, "open %s", p)
		defer unix.Close(wo)
		_, err = unix.Read(wo, make([]byte, 4))
		wantErrno(e.t, err, unix.EBADF, "read from %s opened O_WRONLY", p)
		dfd, err := unix.Open(e.dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(e.t, err, "open %s", e.dir)
		defer unix.Close(dfd)
		_, err = unix.Read(dfd, make([]byte, 4))
		wantErrno(e.t, err, unix.EISDIR, "read from directory %s", e.dir)
	}},
	{"SparseFile", func(e *env) {
		p := e.path("f")
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o644)
		must(e.t, err, "open %s", p)
		defer unix.Close(fd)
		const off = 3*mib + 5
		writeAt(e.t, fd, []byte("tail"), off, p)
		writeAt(e.t, fd, []byte("head"), 0, p)
		wantSize(e.t, p, off+4)
		want := make([]byte, off+4)
		copy(want, "head")
		copy(want[off:], "tail")
		wantBytes(e.t, readAt(e.t, fd, off+100, 0, p), want, "sparse file "+p)
		wantBytes(e.t, readAt(e.t, fd, 10, mib-5, p), make([]byte, 10), "hole of "+p+" at 1 MiB")
	}},
	{"WriteAcrossBoundaries", func(e *env) {
		p := e.path("f")
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o644)
		must(e.t, err, "open %s", p)
		defer closeFd(&fd)
		model := make([]byte, 0)
		put := func(off int64, data []byte) {
			writeAt(e.t, fd, data, off, p)
			if end := off + int64(len(data)); end > int64(len(model)) {
				model = append(model, make([]byte, end-int64(len(model)))...)
			}
			copy(model[off:], data)
		}
		put(64*kib-3, pattern(10, 1))
		put(mib-7, pattern(200*kib, 2))
		put(2*mib-1, pattern(2, 3))
		put(128*kib-1, pattern(mib+2, 4))
		put(3*mib-(64*kib), pattern(128*kib, 5))
		wantBytes(e.t, readAt(e.t, fd, len(model)+10, 0, p), model, "whole "+p)
		for _, off := range []int64{64*kib - 1, mib - 1, mib, 2*mib - 2, 3*mib - 1} {
			got := readAt(e.t, fd, 3, off, p)
			wantBytes(e.t, got, model[off:min(off+3, int64(len(model)))], "pread across a boundary of "+p)
		}
		wantSize(e.t, p, int64(len(model)))
		closeFd(&fd)
		wantContent(e.t, p, model)
	}},
	{"TwoDescriptors", func(e *env) {
		// Writes through one descriptor are seen by another of the same
		// file at once, also in the same block and with O_APPEND.
		p := e.path("f")
		data := pattern(3*mib+12345, 2)
		writeFile(e.t, p, data, 0o644)
		fd1, err := unix.Open(p, unix.O_RDWR, 0)
		must(e.t, err, "open %s", p)
		defer closeFd(&fd1)
		fd2, err := unix.Open(p, unix.O_RDWR|unix.O_APPEND, 0)
		must(e.t, err, "open %s O_APPEND", p)
		defer closeFd(&fd2)
		for i, off := range []int64{mib - 100, 3 * mib, 3*mib + 12000, 10} {
			chunk := pattern(5000+i, byte(10+i))
			writeAt(e.t, fd1, chunk, off, p)
			if end := off + int64(len(chunk)); end > int64(len(data)) {
				data = append(data, make([]byte, end-int64(len(data)))...)
			}
			copy(data[off:], chunk)
			tail := pattern(100+i, byte(20+i))
			_, err := unix.Write(fd2, tail)
			must(e.t, err, "O_APPEND write %s", p)
			data = append(data, tail...)
			wantBytes(e.t, readAt(e.t, fd2, len(data)+10, 0, p), data, "read through the other descriptor of "+p)
			wantBytes(e.t, readAt(e.t, fd1, len(data)+10, 0, p), data, "read through the writing descriptor of "+p)
		}
		closeFd(&fd1)
		closeFd(&fd2)
		wantContent(e.t, p, data)
	}},
	{"Fsync", func(e *env) {
		p := e.path("f")
		fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o644)
		must(e.t, err, "open %s", p)
		defer unix.Close(fd)
		writeAt(e.t, fd, pattern(100*kib, 7), 0, p)
		wantErrno(e.t, unix.Fsync(fd), 0, "fsync %s", p)
		writeAt(e.t, fd, pattern(10, 8), 50, p)
		wantErrno(e.t, unix.Fdatasync(fd), 0, "fdatasync %s", p)
		dfd, err := unix.Open(e.dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(e.t, err, "open %s", e.dir)
		defer unix.Close(dfd)
		wantErrno(e.t, unix.Fsync(dfd), 0, "fsync directory %s", e.dir)
		want := pattern(100*kib, 7)
		copy(want[50:], pattern(10, 8))
		wantContent(e.t, p, want)
	}},
	{"Lseek", func(e *env) {
		p := e.path("f")
		writeFile(e.t, p, pattern(1000, 1), 0o644)
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		must(e.t, err, "open %s", p)
		defer unix.Close(fd)
		for _, c := range []struct {
			off    int64
			whence int
			want   int64
		}{
			{0, unix.SEEK_END, 1000},
			{-10, unix.SEEK_END, 990},
			{5, unix.SEEK_CUR, 995},
			{100, unix.SEEK_END, 1100},
			{7, unix.SEEK_SET, 7},
		} {
			got, err := unix.Seek(fd, c.off, c.whence)
			if err != nil || got != c.want {
				e.t.Errorf("lseek %s (%d, whence %d): %d, %v; want %d", p, c.off, c.whence, got, err, c.want)
			}
		}
		_, err = unix.Seek(fd, -1, unix.SEEK_SET)
		wantErrno(e.t, err, unix.EINVAL, "lseek %s to -1", p)
		_, err = unix.Seek(fd, -2000, unix.SEEK_END)
		wantErrno(e.t, err, unix.EINVAL, "lseek %s before the start (SEEK_END)", p)
		// A write after seeking past the end leaves a hole.
		_, err = unix.Seek(fd, 10, unix.SEEK_END)
		must(e.t, err, "lseek")
		_, err = unix.Write(fd, []byte("z"))
		must(e.t, err, "write")
		got := readAt(e.t, fd, 20, 1000, p)
		wantBytes(e.t, got, append(make([]byte, 10), 'z'), "write after lseek past end of "+p)
	}},
}

var truncateTests = []testCase{
	{"TruncateUpDownExtend", func(e *env) {
		for _, viaFd := range []bool{false, true} {
			p := e.path("path")
			if viaFd {
				p = e.path("fd")
			}
			data := pattern(2*mib+500, 9)
			writeFile(e.t, p, data, 0o644)
			fd, err := unix.Open(p, unix.O_RDWR, 0)
			must(e.t, err, "open %s", p)
			trunc := func(size int64) {
				e.t.Helper()
				if viaFd {
					must(e.t, unix.Ftruncate(fd, size), "ftruncate %s to %d", p, size)
				} else {
					must(e.t, unix.Truncate(p, size), "truncate %s to %d", p, size)
				}
				wantSize(e.t, p, size)
			}
			// Up: the new part reads as zeros.
			trunc(3*mib + 7)
			want := append(append([]byte{}, data...), make([]byte, 3*mib+7-len(data))...)
			wantBytes(e.t, readAt(e.t, fd, 4*mib, 0, p), want, "after truncating up "+p)
			// Down across a chunk boundary, then extend again: the cut data
			// must not reappear.
			trunc(mib + 10)
			wantBytes(e.t, readAt(e.t, fd, 4*mib, 0, p), data[:mib+10], "after truncating down "+p)
			trunc(2*mib + 100)
			want = append(append([]byte{}, data[:mib+10]...), make([]byte, mib+90)...)
			wantBytes(e.t, readAt(e.t, fd, 4*mib, 0, p), want, "after extending again "+p)
			// Down inside the first block, then write past the end.
			trunc(100)
			writeAt(e.t, fd, []byte("end"), 64*kib, p)
			want = append(append([]byte{}, data[:100]...), make([]byte, 64*kib-100)...)
			want = append(want, "end"...)
			wantBytes(e.t, readAt(e.t, fd, 4*mib, 0, p), want, "after truncate and write past end "+p)
			trunc(0)
			wantBytes(e.t, readAt(e.t, fd, 10, 0, p), nil, "after truncating to 0 "+p)
			unix.Close(fd)
		}
	}},
	{"TruncateErrors", func(e *env) {
		p := e.path("f")
		writeFile(e.t, p, []byte("x"), 0o644)
		wantErrno(e.t, unix.Truncate(e.dir, 0), unix.EISDIR, "truncate directory %s", e.dir)
		wantErrno(e.t, unix.Truncate(p, -1), unix.EINVAL, "truncate %s to -1", p)
		wantErrno(e.t, unix.Truncate(e.path("missing"), 0), unix.ENOENT, "truncate %s", e.path("missing"))
		wantErrno(e.t, unix.Truncate(e.path("f", "x"), 0), unix.ENOTDIR, "truncate %s", e.path("f", "x"))
		fd, err := unix.Open(p, unix.O_RDWR, 0)
		must(e.t, err, "open %s", p)
		wantErrno(e.t, unix.Ftruncate(fd, -1), unix.EINVAL, "ftruncate %s to -1", p)
		unix.Close(fd)
		fd, err = unix.Open(p, unix.O_RDONLY, 0)
		must(e.t, err, "open %s", p)
		wantErrno(e.t, unix.Ftruncate(fd, 0), unix.EINVAL, "ftruncate %s opened O_RDONLY", p)
		unix.Close(fd)
		wantContent(e.t, p, []byte("x"))
	}},
	{"TruncateOpenReaders", func(e *env) {
		// A reader's descriptor sees a truncation done through a path.
		p := e.path("f")
		writeFile(e.t, p, pattern(10000, 3), 0o644)
		fd, err := unix.Open(p, unix.O_RDONLY, 0)
		must(e.t, err, "open %s", p)
		defer unix.Close(fd)
		must(e.t, unix.Truncate(p, 10), "truncate")
		got := readAt(e.t, fd, 100, 0, p)
		if !bytes.Equal(got, pattern(10, 3)) {
			e.t.Errorf("read of %s after truncate to 10 through the path: %d bytes, want 10", p, len(got))
		}
	}},
}
