package posixtest

import (
	"bytes"
	"fmt"

	"golang.org/x/sys/unix"
)

// The mapping tests touch mapped pages of the file system under test in a
// child process: a page fault blocks its thread in the kernel, invisibly to
// the Go runtime, and if the file system is served by this very process
// (an in-process FUSE mount) a garbage collection that waits for that
// thread while the server waits for the collection deadlocks.

// mmapWrite maps op.Path shared and writable (op.Size bytes), writes
// pattern(3000, byte(off)) at each of op.Offsets, msyncs if op.Flags is 1,
// unmaps and closes. It returns the first 4 bytes seen in the mapping.
func mmapWrite(op userOp) ([]byte, error) {
	fd, err := unix.Open(op.Path, unix.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	m, err := unix.Mmap(fd, 0, int(op.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	head := append([]byte{}, m[:4]...)
	for _, off := range op.Offsets {
		copy(m[off:], pattern(3000, byte(off)))
	}
	if op.Flags == 1 {
		if err := unix.Msync(m, unix.MS_SYNC); err != nil {
			return nil, err
		}
	}
	if err := unix.Munmap(m); err != nil {
		return nil, err
	}
	return head, unix.Close(fd)
}

// mmapRead maps op.Path shared read-only (op.Size bytes) and returns its
// contents twice: as mapped, and after writing op.Data at offset len(op.Data)
// through another descriptor. Then it writes to a private mapping, which
// must not reach the file. A shared writable mapping of the read-only
// descriptor must fail with EACCES.
func mmapRead(op userOp) ([]byte, error) {
	fd, err := unix.Open(op.Path, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	m, err := unix.Mmap(fd, 0, int(op.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	defer unix.Munmap(m)
	out := append([]byte{}, m...)
	wfd, err := unix.Open(op.Path, unix.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	_, err = unix.Pwrite(wfd, op.Data, int64(len(op.Data)))
	unix.Close(wfd)
	if err != nil {
		return nil, err
	}
	out = append(out, m...)
	priv, err := unix.Mmap(fd, 0, int(op.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	copy(priv, "private")
	if err := unix.Munmap(priv); err != nil {
		return nil, err
	}
	if _, err := unix.Mmap(fd, 0, int(op.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != unix.EACCES {
		return nil, fmt.Errorf("mmap PROT_WRITE MAP_SHARED of a read-only descriptor: %v, want EACCES", err)
	}
	return out, nil
}

var mmapTests = []testCase{
	{"MmapShared", func(e *env) {
		if e.opts.SkipMmap {
			e.t.Skip("shared mappings not supported (Options.SkipMmap)")
		}
		for _, msync := range []bool{true, false} {
			p := e.path("synced")
			if !msync {
				p = e.path("unsynced")
			}
			size := 2*mib + 3*unix.Getpagesize()
			writeFile(e.t, p, []byte("head"), 0o644)
			must(e.t, unix.Truncate(p, int64(size)), "truncate %s", p)
			want := make([]byte, size)
			copy(want, "head")
			offsets := []int64{4, mib - 2, mib + 1000, 2 * mib}
			for _, off := range offsets {
				copy(want[off:], pattern(3000, byte(off)))
			}
			flags := 0
			if msync {
				flags = 1
			}
			errno, head := runChild(e.t, nil, userOp{Op: "mmapwrite", Path: p, Size: int64(size), Offsets: offsets, Flags: flags})
			if errno != 0 {
				e.t.Fatalf("mmap %s MAP_SHARED, write, msync=%v, munmap, close: %s", p, msync, errnoName(errno))
			}
			if !bytes.Equal(head, []byte("head")) {
				e.t.Errorf("mapping of %s: starts %q, want %q", p, head, "head")
			}
			wantContent(e.t, p, want)
		}
	}},
	{"MmapRead", func(e *env) {
		if e.opts.SkipMmap {
			e.t.Skip("mappings not supported (Options.SkipMmap)")
		}
		p := e.path("f")
		data := pattern(mib+12345, 8)
		writeFile(e.t, p, data, 0o644)
		fresh := []byte("fresh")
		errno, out := runChild(e.t, nil, userOp{Op: "mmapread", Path: p, Size: int64(len(data)), Data: fresh})
		if errno != 0 || len(out) != 2*len(data) {
			e.t.Fatalf("mmap %s read-only: %s, %d bytes (want %d)", p, errnoName(errno), len(out), 2*len(data))
		}
		wantBytes(e.t, out[:len(data)], data, "mapping of "+p)
		copy(data[len(fresh):], fresh)
		wantBytes(e.t, out[len(data):], data, "shared mapping of "+p+" after a write(2) through another descriptor")
		wantContent(e.t, p, data)
	}},
}
