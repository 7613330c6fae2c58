package exerciser

import (
	"golang.org/x/sys/unix"
)

// opKind is one kind of operation, chosen with its weight.
type opKind struct {
	name   string
	weight int
	run    func(x *exerciser, f *file)
}

var opKinds = []opKind{
	{"pwrite", 24, (*exerciser).pwrite},
	{"write", 10, (*exerciser).write},
	{"append", 3, (*exerciser).appendWrite},
	{"pread", 22, (*exerciser).pread},
	{"read", 8, (*exerciser).read},
	{"truncate", 5, (*exerciser).truncate},
	{"ftruncate", 5, (*exerciser).ftruncate},
	{"fsync", 3, (*exerciser).fsync},
	{"reopen", 5, func(x *exerciser, f *file) { x.reopen(f, 0) }},
	{"reopen O_TRUNC", 1, func(x *exerciser, f *file) { x.reopen(f, unix.O_TRUNC) }},
	{"stat", 4, (*exerciser).stat},
}

// totalWeight is the sum of the weights of opKinds.
var totalWeight = func() int {
	n := 0
	for _, k := range opKinds {
		n += k.weight
	}
	return n
}()

// step runs one randomly chosen operation on a randomly chosen file.
func (x *exerciser) step() {
	f := x.files[x.rng.IntN(len(x.files))]
	w := x.rng.IntN(totalWeight)
	for _, k := range opKinds {
		if w < k.weight {
			k.run(x, f)
			return
		}
		w -= k.weight
	}
}

// boundary picks one of the alignments the file system cares about.
func (x *exerciser) boundary() int64 {
	switch x.rng.IntN(4) {
	case 0, 1:
		return x.cfg.ChunkSizeHint
	case 2:
		return blockSize
	default:
		return pageSize
	}
}

// offset picks a position in [0, MaxFileSize]: half of the time on or
// within a few bytes of a multiple of a boundary, otherwise near the
// current size or anywhere.
func (x *exerciser) offset(size int64) int64 {
	limit := x.cfg.MaxFileSize
	var off int64
	switch r := x.rng.IntN(100); {
	case r < 50:
		b := x.boundary()
		off = x.rng.Int64N(limit/b+1) * b
		switch x.rng.IntN(4) {
		case 0:
			off--
		case 1:
			off++
		case 2:
			off += x.rng.Int64N(33) - 16
		}
	case r < 75:
		off = x.rng.Int64N(size + 1)
	case r < 85:
		off = size + x.rng.Int64N(3) - 1
	default:
		off = x.rng.Int64N(limit + 1)
	}
	return min(max(off, 0), limit)
}

// length picks an I/O size for a transfer starting at off: tiny, a boundary
// plus or minus a byte, medium, or up to two chunks; capped so the file
// stays within MaxFileSize. Never 0 unless off is at the limit.
func (x *exerciser) length(off int64) int64 {
	var n int64
	switch r := x.rng.IntN(100); {
	case r < 30:
		n = 1 + x.rng.Int64N(16)
	case r < 55:
		n = x.boundary() + x.rng.Int64N(3) - 1
	case r < 80:
		n = 1 + x.rng.Int64N(256<<10)
	default:
		n = 1 + x.rng.Int64N(2*x.cfg.ChunkSizeHint)
	}
	return max(min(n, x.cfg.MaxFileSize-off), 0)
}

// randomData returns n bytes of the run's data stream.
func (x *exerciser) randomData(n int64) []byte {
	b := make([]byte, n)
	x.stream.Read(b)
	return b
}

// applyWrite updates the model of f for data written at off.
// An empty write changes nothing, not even the size.
func (f *file) applyWrite(off int64, data []byte) {
	if len(data) == 0 {
		return
	}
	if end := off + int64(len(data)); end > int64(len(f.data)) {
		f.data = append(f.data, make([]byte, end-int64(len(f.data)))...)
	}
	copy(f.data[off:], data)
}

// applyTruncate updates the model of f for a truncation to size.
func (f *file) applyTruncate(size int64) {
	if size <= int64(len(f.data)) {
		f.data = f.data[:size:size]
		return
	}
	f.data = append(f.data, make([]byte, size-int64(len(f.data)))...)
}

// writeAll writes data at off (pwrite) or at the file position, retrying
// short writes.
func (x *exerciser) writeAll(f *file, data []byte, off int64, positional bool, what string) {
	x.t.Helper()
	for done := 0; done < len(data); {
		var n int
		var err error
		if positional {
			n, err = unix.Pwrite(f.fd, data[done:], off+int64(done))
		} else {
			n, err = unix.Write(f.fd, data[done:])
		}
		if err != nil || n == 0 {
			x.fail("%s %s at %d (%d of %d bytes done): wrote %d, %v", what, f.path, off+int64(done), done, len(data), n, err)
		}
		done += n
	}
}

func (x *exerciser) pwrite(f *file) {
	off := x.offset(int64(len(f.data)))
	data := x.randomData(x.length(off))
	x.record("pwrite %s off %d len %d", f.path, off, len(data))
	x.writeAll(f, data, off, true, "pwrite")
	f.applyWrite(off, data)
}

func (x *exerciser) write(f *file) {
	off := x.offset(int64(len(f.data)))
	data := x.randomData(x.length(off))
	x.record("lseek+write %s off %d len %d", f.path, off, len(data))
	x.seek(f, off)
	x.writeAll(f, data, off, false, "write")
	f.applyWrite(off, data)
	f.pos = off + int64(len(data))
	x.wantPos(f, "write")
}

// appendWrite writes through a second descriptor opened O_APPEND.
func (x *exerciser) appendWrite(f *file) {
	size := int64(len(f.data))
	data := x.randomData(x.length(size))
	x.record("O_APPEND write %s len %d (size %d)", f.path, len(data), size)
	// The descriptor is closed exactly once, also on failure: closing a
	// number twice could close a descriptor another goroutine (an
	// in-process file server) has opened meanwhile.
	fd, err := unix.Open(f.path, unix.O_WRONLY|unix.O_APPEND, 0)
	if err != nil {
		x.fail("open %s O_APPEND: %v", f.path, err)
	}
	if _, err := unix.Seek(fd, 0, unix.SEEK_SET); err != nil {
		unix.Close(fd)
		x.fail("lseek %s: %v", f.path, err)
	}
	for done := 0; done < len(data); {
		n, err := unix.Write(fd, data[done:])
		if err != nil || n == 0 {
			unix.Close(fd)
			x.fail("O_APPEND write %s (%d of %d bytes done): wrote %d, %v", f.path, done, len(data), n, err)
		}
		done += n
	}
	if err := unix.Close(fd); err != nil {
		x.fail("close %s after O_APPEND write: %v", f.path, err)
	}
	f.applyWrite(size, data)
}

func (x *exerciser) pread(f *file) {
	off := x.offset(int64(len(f.data)))
	n := x.length(off)
	x.record("pread %s off %d len %d", f.path, off, n)
	x.checkRead(f, off, n, true, "pread")
}

func (x *exerciser) read(f *file) {
	off := x.offset(int64(len(f.data)))
	n := x.length(off)
	x.record("lseek+read %s off %d len %d", f.path, off, n)
	x.seek(f, off)
	got := x.checkRead(f, off, n, false, "read")
	f.pos = off + int64(got)
	x.wantPos(f, "read")
}

func (x *exerciser) truncate(f *file) {
	size := x.offset(int64(len(f.data)))
	x.record("truncate %s to %d (was %d)", f.path, size, len(f.data))
	if err := unix.Truncate(f.path, size); err != nil {
		x.fail("truncate %s to %d: %v", f.path, size, err)
	}
	f.applyTruncate(size)
}

func (x *exerciser) ftruncate(f *file) {
	size := x.offset(int64(len(f.data)))
	x.record("ftruncate %s to %d (was %d)", f.path, size, len(f.data))
	if err := unix.Ftruncate(f.fd, size); err != nil {
		x.fail("ftruncate %s to %d: %v", f.path, size, err)
	}
	f.applyTruncate(size)
}

func (x *exerciser) fsync(f *file) {
	if x.rng.IntN(2) == 0 {
		x.record("fsync %s", f.path)
		if err := unix.Fsync(f.fd); err != nil {
			x.fail("fsync %s: %v", f.path, err)
		}
		return
	}
	x.record("fdatasync %s", f.path)
	if err := unix.Fdatasync(f.fd); err != nil {
		x.fail("fdatasync %s: %v", f.path, err)
	}
}

// reopen closes f's descriptor and opens the file again with extra flags.
func (x *exerciser) reopen(f *file, flags int) {
	x.record("close+open %s flags %#x", f.path, flags)
	if f.fd >= 0 {
		// close(2) frees the number even when it fails: forget it first,
		// so that closeAll does not close it again after the failure.
		fd := f.fd
		f.fd = -1
		if err := unix.Close(fd); err != nil {
			x.fail("close %s: %v", f.path, err)
		}
	}
	fd, err := unix.Open(f.path, unix.O_RDWR|flags, 0)
	if err != nil {
		x.fail("open %s: %v", f.path, err)
	}
	f.fd, f.pos = fd, 0
	if flags&unix.O_TRUNC != 0 {
		f.applyTruncate(0)
	}
}

func (x *exerciser) stat(f *file) {
	x.record("fstat+stat %s", f.path)
	x.wantSize(f, "fstat")
}

// seek moves f's file position to off.
func (x *exerciser) seek(f *file, off int64) {
	got, err := unix.Seek(f.fd, off, unix.SEEK_SET)
	if err != nil || got != off {
		x.fail("lseek %s to %d: %d, %v", f.path, off, got, err)
	}
	f.pos = off
}

// wantPos checks the file position of f's descriptor.
func (x *exerciser) wantPos(f *file, after string) {
	got, err := unix.Seek(f.fd, 0, unix.SEEK_CUR)
	if err != nil || got != f.pos {
		x.fail("file position of %s after %s: %d, %v; want %d", f.path, after, got, err, f.pos)
	}
}

// wantSize checks st_size through the descriptor and through the path.
func (x *exerciser) wantSize(f *file, what string) {
	var st unix.Stat_t
	if err := unix.Fstat(f.fd, &st); err != nil {
		x.fail("%s: fstat %s: %v", what, f.path, err)
	}
	if st.Size != int64(len(f.data)) {
		x.fail("%s: fstat %s: size %d, want %d", what, f.path, st.Size, len(f.data))
	}
	if err := unix.Stat(f.path, &st); err != nil {
		x.fail("%s: stat %s: %v", what, f.path, err)
	}
	if st.Size != int64(len(f.data)) {
		x.fail("%s: stat %s: size %d, want %d", what, f.path, st.Size, len(f.data))
	}
}
