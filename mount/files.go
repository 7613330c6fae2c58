package mount

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/weft-fs/weft/client"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func (fs *weftFS) addFile(f *client.File) uint64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.nextFh++
	fs.files[fs.nextFh] = f
	return fs.nextFh
}

func (fs *weftFS) file(fh uint64) *client.File {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.files[fh]
}

// changed reports whether fresh attributes differ in length or mtime from
// what the kernel was last told (or nothing was told).
func (fs *weftFS) changed(a *weftv1.Attr) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	t, ok := fs.told[a.Ino]
	return !ok || t.size != a.Size || t.mtimeNs != a.MtimeNs
}

func (fs *weftFS) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	f, a, err := fs.c.Create(ctx, fs.caller(&in.InHeader), in.NodeId, name, in.Mode&07777, in.Flags,
		in.Flags&syscall.O_EXCL != 0)
	if err != nil {
		return status(fs.log, "create", in.NodeId, err)
	}
	fs.fillEntry(a, &out.EntryOut)
	fs.noteEntry(in.NodeId, name, &out.EntryOut)
	out.Fh = fs.addFile(f)
	return fuse.OK
}

// Open implements close-to-open: the attributes are fetched fresh; if the
// length or mtime changed since the kernel last heard, its cached
// attributes are invalidated and (without FOPEN_KEEP_CACHE) its cached
// pages dropped; otherwise the pages are kept.
func (fs *weftFS) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	f, a, err := fs.c.Open(ctx, fs.caller(&in.InHeader), in.NodeId, in.Flags)
	if err != nil {
		return staleIfGone(status(fs.log, "open", in.NodeId, err))
	}
	if fs.changed(a) {
		if fs.srv != nil {
			fs.srv.InodeNotify(in.NodeId, -1, 0)
		}
		fs.remember(a)
	} else {
		out.OpenFlags |= fuse.FOPEN_KEEP_CACHE
	}
	out.Fh = fs.addFile(f)
	return fuse.OK
}

func (fs *weftFS) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	f := fs.file(in.Fh)
	if f == nil {
		return nil, fuse.EBADF
	}
	ctx, stop := reqContext(cancel)
	defer stop()
	data, release, err := f.ReadView(ctx, buf[:min(len(buf), int(in.Size))], int64(in.Offset))
	if err != nil {
		return nil, status(fs.log, "read", in.NodeId, err)
	}
	if release != nil {
		return &viewResult{data: data, release: release}, fuse.OK
	}
	return fuse.ReadResultData(data), fuse.OK
}

// viewResult answers a read with bytes of the client's read-ahead
// buffers, given back once the kernel has them.
type viewResult struct {
	data    []byte
	release func()
}

func (r *viewResult) Bytes([]byte) ([]byte, fuse.Status) { return r.data, fuse.OK }

// Slices makes go-fuse write the answer straight from the buffer (writev)
// and call Done only after that.
func (r *viewResult) Slices() ([][]byte, fuse.Status) { return [][]byte{r.data}, fuse.OK }
func (r *viewResult) Size() int                       { return len(r.data) }

// Done is called once the answer is sent.
func (r *viewResult) Done() {
	if r.release != nil {
		r.release()
		r.release = nil
	}
}

func (fs *weftFS) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	f := fs.file(in.Fh)
	if f == nil {
		return 0, fuse.EBADF
	}
	ctx, stop := reqContext(cancel)
	defer stop()
	n, err := f.WriteAt(ctx, data, int64(in.Offset))
	if err != nil {
		return 0, status(fs.log, "write", in.NodeId, err)
	}
	return uint32(n), fuse.OK
}

func (fs *weftFS) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	f := fs.file(in.Fh)
	if f == nil {
		return fuse.EBADF
	}
	ctx, stop := reqContext(cancel)
	defer stop()
	err := f.Flush(ctx)
	fs.unlockOnClose(&in.InHeader, in.NodeId, in.LockOwner, false) // close(2) drops the process's POSIX locks
	return status(fs.log, "flush", in.NodeId, err)
}

func (fs *weftFS) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	f := fs.file(in.Fh)
	if f == nil {
		return fuse.EBADF
	}
	ctx, stop := reqContext(cancel)
	defer stop()
	return status(fs.log, "fsync", in.NodeId, f.Fsync(ctx))
}

// Release flushes what the file still buffers (writes of a shared mmap
// can arrive after the last flush) and closes it. The kernel gets no
// answer, so an error is only logged.
func (fs *weftFS) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	fs.mu.Lock()
	f := fs.files[in.Fh]
	delete(fs.files, in.Fh)
	fs.mu.Unlock()
	if f == nil {
		return
	}
	if in.ReleaseFlags&fuse.FUSE_RELEASE_FLOCK_UNLOCK != 0 {
		fs.unlockOnClose(&in.InHeader, in.NodeId, in.LockOwner, true)
	}
	if err := f.Release(context.Background()); err != nil {
		fs.log.Error("release of a closed file failed", "ino", in.NodeId, "err", err)
	}
}

func (fs *weftFS) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	f := fs.file(in.Fh)
	if f == nil {
		return fuse.EBADF
	}
	ctx, stop := reqContext(cancel)
	defer stop()
	return status(fs.log, "fallocate", in.NodeId, f.Fallocate(ctx, in.Mode, in.Offset, in.Length))
}
