package mount

import (
	"context"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// dirHandle is an open directory. Its listing is snapshotted on the first
// read (and again on a read from offset 0, i.e. rewinddir); offsets are
// indexes into the snapshot, so a listing is stable while it is read even
// if the directory changes.
type dirHandle struct {
	mu      sync.Mutex
	ino     uint64
	caller  *weftv1.Caller
	entries []*weftv1.DirEntry // nil until loaded; starts with "." and ".."
}

func (fs *weftFS) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	caller := fs.caller(&in.InHeader)
	if _, err := fs.c.OpenDir(ctx, caller, in.NodeId, in.Flags); err != nil {
		return status(fs.log, "opendir", in.NodeId, err)
	}
	fs.mu.Lock()
	fs.nextFh++
	out.Fh = fs.nextFh
	fs.dirs[out.Fh] = &dirHandle{ino: in.NodeId, caller: caller}
	fs.mu.Unlock()
	return fuse.OK
}

func (fs *weftFS) ReleaseDir(in *fuse.ReleaseIn) {
	fs.mu.Lock()
	delete(fs.dirs, in.Fh)
	fs.mu.Unlock()
}

// load pages through the meta service's listing into a new snapshot.
func (fs *weftFS) load(ctx context.Context, d *dirHandle, plus bool) error {
	fs.mu.Lock()
	parent, ok := fs.parents[d.ino]
	fs.mu.Unlock()
	if !ok || d.ino == fuse.FUSE_ROOT_ID {
		parent = d.ino
	}
	entries := []*weftv1.DirEntry{
		{Name: ".", Ino: d.ino, Type: syscall.S_IFDIR},
		{Name: "..", Ino: parent, Type: syscall.S_IFDIR},
	}
	after := ""
	for {
		page, more, err := fs.c.ReadDir(ctx, d.caller, d.ino, after, plus)
		if err != nil {
			return err
		}
		entries = append(entries, page...)
		if !more || len(page) == 0 {
			break
		}
		after = page[len(page)-1].Name
	}
	d.entries = entries
	return nil
}

func (fs *weftFS) readDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList, plus bool) fuse.Status {
	fs.mu.Lock()
	d := fs.dirs[in.Fh]
	fs.mu.Unlock()
	if d == nil {
		return fuse.EBADF
	}
	ctx, stop := reqContext(cancel)
	defer stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.entries == nil || in.Offset == 0 {
		if err := fs.load(ctx, d, plus); err != nil {
			return status(fs.log, "readdir", in.NodeId, err)
		}
	}
	for i := in.Offset; i < uint64(len(d.entries)); i++ {
		e := d.entries[i]
		de := fuse.DirEntry{Name: e.Name, Ino: e.Ino, Mode: e.Type, Off: i + 1}
		if !plus {
			if !out.AddDirEntry(de) {
				break
			}
			continue
		}
		eo := out.AddDirLookupEntry(de)
		if eo == nil {
			break
		}
		if e.Attr != nil && e.Name != "." && e.Name != ".." {
			fs.noteDir(d.ino, e.Attr)
			fs.fillEntry(e.Attr, eo)
			fs.noteEntry(d.ino, e.Name, eo)
		}
	}
	return fuse.OK
}

func (fs *weftFS) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return fs.readDir(cancel, in, out, false)
}

func (fs *weftFS) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return fs.readDir(cancel, in, out, true)
}
