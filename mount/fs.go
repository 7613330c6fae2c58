package mount

import (
	"errors"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/weft-fs/weft/client"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// told is what the kernel was last told about an inode's data: if a fresh
// open finds the same, its cached pages are still good.
type told struct {
	size    uint64
	mtimeNs int64
}

// weftFS implements fuse.RawFileSystem over a client.Client.
type weftFS struct {
	fuse.RawFileSystem
	c    *client.Client
	opts Options
	log  *slog.Logger
	srv  *fuse.Server

	mu      sync.Mutex
	nextFh  uint64
	files   map[uint64]*client.File
	dirs    map[uint64]*dirHandle
	told    map[uint64]told
	parents map[uint64]uint64 // directory -> its parent, for ".."
	locks   lockTable         // who may hold locks (locks.go)

	notes *notifier // callbacks to FUSE notifications (notify.go)
}

func newFS(c *client.Client, opts Options) *weftFS {
	return &weftFS{
		RawFileSystem: fuse.NewDefaultRawFileSystem(),
		c:             c, opts: opts, log: slog.Default().With("component", "mount"),
		files:   make(map[uint64]*client.File),
		dirs:    make(map[uint64]*dirHandle),
		told:    make(map[uint64]told),
		parents: make(map[uint64]uint64),
	}
}

func (fs *weftFS) String() string { return "weft" }

func (fs *weftFS) Init(srv *fuse.Server) { fs.srv = srv }

func (fs *weftFS) caller(h *fuse.InHeader) *weftv1.Caller {
	return fs.c.Caller(h.Uid, h.Gid, h.Pid)
}

// remember records what the kernel is told about a's data.
//
// The kernel does not drop a file's cached pages by itself when it sees
// its length or mtime change (the mount asks for explicit data cache
// control, so that a read after a write does not cost a getattr): while
// callbacks are live the meta service's callback drops them, and an open
// that finds the file changed does; otherwise a regular file that
// changed since the kernel last heard has its pages dropped here.
func (fs *weftFS) remember(a *weftv1.Attr) {
	fs.mu.Lock()
	t, ok := fs.told[a.Ino]
	fs.told[a.Ino] = told{size: a.Size, mtimeNs: a.MtimeNs}
	fs.mu.Unlock()
	if ok && (t.size != a.Size || t.mtimeNs != a.MtimeNs) && a.Mode&syscall.S_IFMT == syscall.S_IFREG &&
		fs.notes != nil && !fs.c.CallbacksLive() {
		fs.notes.deliver(&weftv1.Invalidation{Inodes: []uint64{a.Ino}})
	}
}

func (fs *weftFS) fillEntry(a *weftv1.Attr, out *fuse.EntryOut) {
	out.NodeId = a.Ino
	out.Generation = a.Generation
	out.SetEntryTimeout(fs.plainEntryTTL())
	out.SetAttrTimeout(fs.attrTTL())
	fillAttr(a, &out.Attr)
	fs.remember(a)
}

func (fs *weftFS) fillAttrOut(a *weftv1.Attr, out *fuse.AttrOut) {
	out.SetTimeout(fs.attrTTL())
	fillAttr(a, &out.Attr)
	fs.remember(a)
}

func (fs *weftFS) noteDir(parent uint64, a *weftv1.Attr) {
	if a.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		fs.mu.Lock()
		fs.parents[a.Ino] = parent
		fs.mu.Unlock()
	}
}

func (fs *weftFS) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	a, err := fs.c.Lookup(ctx, fs.caller(h), h.NodeId, name)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) && fs.negativeEntry(h.NodeId, name, out) {
			return fuse.OK
		}
		return status(fs.log, "lookup", h.NodeId, err)
	}
	fs.noteDir(h.NodeId, a)
	fs.fillEntry(a, out)
	fs.noteEntry(h.NodeId, name, out)
	return fuse.OK
}

// Forget needs no state: node ids are inode numbers.
func (fs *weftFS) Forget(nodeid, nlookup uint64) {
	fs.mu.Lock()
	delete(fs.told, nodeid)
	fs.mu.Unlock()
	fs.forgotten(nodeid)
}

func (fs *weftFS) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	a, err := fs.c.GetAttr(ctx, in.NodeId)
	if err != nil {
		return status(fs.log, "getattr", in.NodeId, err)
	}
	fs.fillAttrOut(a, out)
	return fuse.OK
}

func (fs *weftFS) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	req := &weftv1.SetAttrRequest{Caller: fs.caller(&in.InHeader), Ino: in.NodeId}
	if in.Valid&fuse.FATTR_MODE != 0 {
		req.Valid |= uint32(weftv1.SetAttrValid_SETATTR_MODE)
		req.Mode = in.Mode & 07777
	}
	if in.Valid&fuse.FATTR_UID != 0 {
		req.Valid |= uint32(weftv1.SetAttrValid_SETATTR_UID)
		req.Uid = in.Uid
	}
	if in.Valid&fuse.FATTR_GID != 0 {
		req.Valid |= uint32(weftv1.SetAttrValid_SETATTR_GID)
		req.Gid = in.Gid
	}
	if in.Valid&fuse.FATTR_SIZE != 0 {
		req.Valid |= uint32(weftv1.SetAttrValid_SETATTR_SIZE)
		req.Size = in.Size
	}
	now := time.Now().UnixNano()
	switch {
	case in.Valid&fuse.FATTR_ATIME_NOW != 0:
		req.Valid |= uint32(weftv1.SetAttrValid_SETATTR_ATIME_NOW)
		req.AtimeNs = now
	case in.Valid&fuse.FATTR_ATIME != 0:
		req.Valid |= uint32(weftv1.SetAttrValid_SETATTR_ATIME)
		req.AtimeNs = int64(in.Atime)*1e9 + int64(in.Atimensec)
	}
	switch {
	case in.Valid&fuse.FATTR_MTIME_NOW != 0:
		req.Valid |= uint32(weftv1.SetAttrValid_SETATTR_MTIME_NOW)
		req.MtimeNs = now
	case in.Valid&fuse.FATTR_MTIME != 0:
		req.Valid |= uint32(weftv1.SetAttrValid_SETATTR_MTIME)
		req.MtimeNs = int64(in.Mtime)*1e9 + int64(in.Mtimensec)
	}
	var (
		a   *weftv1.Attr
		err error
	)
	if req.Valid == 0 {
		// The kernel sends a setattr that changes nothing for
		// chown(f, -1, -1) and the like, which still sets ctime.
		req.Valid = uint32(weftv1.SetAttrValid_SETATTR_CTIME_NOW)
	}
	a, err = fs.c.SetAttr(ctx, req)
	if err != nil {
		return status(fs.log, "setattr", in.NodeId, err)
	}
	fs.fillAttrOut(a, out)
	return fuse.OK
}

func (fs *weftFS) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	a, err := fs.c.Mknod(ctx, fs.caller(&in.InHeader), in.NodeId, name, in.Mode, in.Rdev)
	if err != nil {
		return status(fs.log, "mknod", in.NodeId, err)
	}
	fs.fillEntry(a, out)
	fs.noteEntry(in.NodeId, name, out)
	return fuse.OK
}

func (fs *weftFS) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	a, err := fs.c.Mkdir(ctx, fs.caller(&in.InHeader), in.NodeId, name, in.Mode&07777)
	if err != nil {
		return status(fs.log, "mkdir", in.NodeId, err)
	}
	fs.noteDir(in.NodeId, a)
	fs.fillEntry(a, out)
	fs.noteEntry(in.NodeId, name, out)
	return fuse.OK
}

func (fs *weftFS) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	return status(fs.log, "unlink", h.NodeId, fs.c.Unlink(ctx, fs.caller(h), h.NodeId, name))
}

func (fs *weftFS) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	return status(fs.log, "rmdir", h.NodeId, fs.c.Rmdir(ctx, fs.caller(h), h.NodeId, name))
}

func (fs *weftFS) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	err := fs.c.Rename(ctx, fs.caller(&in.InHeader), in.NodeId, oldName, in.Newdir, newName, in.Flags)
	if err == nil && fs.opts.callbacks {
		fs.notes.renamed(in.NodeId, oldName, in.Newdir, newName)
	}
	return status(fs.log, "rename", in.NodeId, err)
}

func (fs *weftFS) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	a, err := fs.c.Link(ctx, fs.caller(&in.InHeader), in.Oldnodeid, in.NodeId, name)
	if err != nil {
		return status(fs.log, "link", in.Oldnodeid, err)
	}
	fs.fillEntry(a, out)
	fs.noteEntry(in.NodeId, name, out)
	return fuse.OK
}

func (fs *weftFS) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	a, err := fs.c.Symlink(ctx, fs.caller(h), h.NodeId, name, target)
	if err != nil {
		return status(fs.log, "symlink", h.NodeId, err)
	}
	fs.fillEntry(a, out)
	fs.noteEntry(h.NodeId, name, out)
	return fuse.OK
}

func (fs *weftFS) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	ctx, stop := reqContext(cancel)
	defer stop()
	target, err := fs.c.Readlink(ctx, h.NodeId)
	if err != nil {
		return nil, status(fs.log, "readlink", h.NodeId, err)
	}
	return []byte(target), fuse.OK
}

func (fs *weftFS) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	return status(fs.log, "access", in.NodeId, fs.c.Access(ctx, fs.caller(&in.InHeader), in.NodeId, in.Mask))
}

func (fs *weftFS) StatFs(cancel <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	st, err := fs.c.StatFS(ctx)
	if err != nil {
		return status(fs.log, "statfs", h.NodeId, err)
	}
	bs := st.BlockSize
	if bs == 0 {
		bs = 4096
	}
	*out = fuse.StatfsOut{
		Blocks: st.TotalBytes / bs, Bfree: st.FreeBytes / bs, Bavail: st.AvailBytes / bs,
		Files: st.Files + 1<<32, Ffree: 1 << 32, Bsize: uint32(bs), Frsize: uint32(bs), NameLen: 255,
	}
	return fuse.OK
}

func (fs *weftFS) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, name string, dest []byte) (uint32, fuse.Status) {
	ctx, stop := reqContext(cancel)
	defer stop()
	v, err := fs.c.GetXattr(ctx, fs.caller(h), h.NodeId, name)
	if err != nil {
		return 0, status(fs.log, "getxattr", h.NodeId, err)
	}
	return copyOrSize(dest, v)
}

func (fs *weftFS) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	ctx, stop := reqContext(cancel)
	defer stop()
	names, err := fs.c.ListXattr(ctx, fs.caller(h), h.NodeId)
	if err != nil {
		return 0, status(fs.log, "listxattr", h.NodeId, err)
	}
	var b []byte
	for _, n := range names {
		b = append(append(b, n...), 0)
	}
	return copyOrSize(dest, b)
}

// copyOrSize answers an xattr read: a size-0 probe gets the size needed, a
// buffer too small ERANGE.
func copyOrSize(dest, v []byte) (uint32, fuse.Status) {
	if len(dest) == 0 {
		return uint32(len(v)), fuse.OK
	}
	if len(dest) < len(v) {
		return uint32(len(v)), fuse.ERANGE
	}
	return uint32(copy(dest, v)), fuse.OK
}

func (fs *weftFS) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, name string, data []byte) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	err := fs.c.SetXattr(ctx, fs.caller(&in.InHeader), in.NodeId, name, data, in.Flags)
	return status(fs.log, "setxattr", in.NodeId, err)
}

func (fs *weftFS) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	return status(fs.log, "removexattr", h.NodeId, fs.c.RemoveXattr(ctx, fs.caller(h), h.NodeId, name))
}

// FsyncDir makes the directory's entries durable: every namespace
// operation is durable when the meta service answers it, and files made
// here under a delegation (not sent yet) are sent and answered first.
func (fs *weftFS) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	return status(fs.log, "fsyncdir", in.NodeId, fs.c.SyncDir(ctx, in.NodeId))
}
