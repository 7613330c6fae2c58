package client

import (
	"context"
	"strings"
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// overlay applies this client's view of an inode to attributes from the
// meta service: the buffered (not yet committed) length and the time of
// the last buffered write. With fresh, the meta service's length becomes
// the client's known length unless a commit or truncate of this client
// happened since gen was taken.
func (c *Client) overlay(attr *weftv1.Attr, gen uint64, fresh bool) *weftv1.Attr {
	if attr == nil {
		return nil
	}
	c.seen(attr.Ino)
	c.dirs.held(attr.Ino)
	c.layoutHints.note(attr)
	in := c.lookupInode(attr.Ino)
	if in == nil {
		return attr
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if fresh && in.attrGen == gen {
		if attr.Size != in.metaSize || attr.MtimeNs != in.metaMtimeNs {
			// Changed by someone else (or by a commit of this client
			// whose reply is not in yet): read what is stored now.
			in.dropReadAheadLocked()
		}
		in.metaSize, in.metaMtimeNs = attr.Size, attr.MtimeNs
	}
	if in.writtenLocked() {
		attr.Size = max(attr.Size, in.localEnd)
		attr.MtimeNs = max(attr.MtimeNs, in.mtimeNs)
		attr.CtimeNs = max(attr.CtimeNs, in.mtimeNs)
	}
	return attr
}

func (c *Client) attrGen(ino uint64) uint64 {
	in := c.lookupInode(ino)
	if in == nil {
		return 0
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.attrGen
}

// Lookup finds name in directory parent.
//
// A name known not to exist (the directory's contents are known
// completely and callbacks are live, see dircache.go) is answered with
// ENOENT without a call.
func (c *Client) Lookup(ctx context.Context, caller *weftv1.Caller, parent uint64, name string) (*weftv1.Attr, error) {
	if name != "." && name != ".." && c.knownMissing(parent, name) {
		return nil, errKnownMissing(parent, name)
	}
	if a := c.cachedFileAttr(parent, name); a != nil {
		return c.overlay(a, 0, false), nil
	}
	if c.removeQueued(parent, name) {
		c.sendRemoves(ctx) // else the meta service still has it
	}
	tok, track := c.dirToken()
	gen := c.dirs.fileGeneration()
	c.countMeta()
	resp, err := c.meta.Lookup(ctx, &weftv1.LookupRequest{Caller: caller, Parent: parent, Name: name})
	if err != nil {
		return nil, err
	}
	if c.cb.on.Load() && c.dirs.missing(parent, name) {
		// Made elsewhere; its callback is on the way.
		c.dirs.changed(parent)
	}
	if track && name != "." && name != ".." && c.ownSession(caller) {
		// The meta service calls this session back about the file now.
		c.dirs.putFile(parent, name, resp.Attr, tok, gen)
	}
	return c.overlay(resp.Attr, 0, false), nil
}

// GetAttr returns an inode's attributes, with the length and mtime of this
// client's buffered writes applied.
//
// A directory's attributes known under live callbacks (see dircache.go)
// are answered without a call.
func (c *Client) GetAttr(ctx context.Context, ino uint64) (*weftv1.Attr, error) {
	if a := c.cachedDirAttr(ino); a != nil {
		return a, nil
	}
	if a := c.cachedFileAttrOf(ino); a != nil {
		return c.overlay(a, 0, false), nil
	}
	return c.getAttr(ctx, ino)
}

// getAttr is GetAttr always asking the meta service.
func (c *Client) getAttr(ctx context.Context, ino uint64) (*weftv1.Attr, error) {
	gen := c.attrGen(ino)
	tok, track := c.dirToken()
	c.countMeta()
	resp, err := c.meta.GetAttr(ctx, &weftv1.GetAttrRequest{Ino: ino, Session: c.callbackSession()})
	if err != nil {
		return nil, err
	}
	if track {
		c.noteDirAttr(resp.Attr, tok)
	}
	return c.overlay(resp.Attr, gen, true), nil
}

// SetAttr changes the attributes named by req.Valid (SetAttrValid bits).
// A size change first drops this client's buffered bytes past the new
// length and sends and commits the rest; the meta service then truncates
// the chunks. A time change first commits buffered writes, so that their
// mtime cannot override the one set.
func (c *Client) SetAttr(ctx context.Context, req *weftv1.SetAttrRequest) (*weftv1.Attr, error) {
	resize := req.Valid&uint32(weftv1.SetAttrValid_SETATTR_SIZE) != 0
	const times = weftv1.SetAttrValid_SETATTR_ATIME | weftv1.SetAttrValid_SETATTR_MTIME |
		weftv1.SetAttrValid_SETATTR_ATIME_NOW | weftv1.SetAttrValid_SETATTR_MTIME_NOW
	if a, ok, err := c.setAttrLocal(ctx, req); ok {
		return a, err
	}
	in := c.lookupInode(req.Ino)
	switch {
	case in == nil:
	case resize:
		in.commitMu.Lock()
		defer in.commitMu.Unlock()
		if err := in.prepareTruncate(ctx, req.Size); err != nil {
			return nil, err
		}
	case req.Valid&uint32(times) != 0:
		// Commit earlier writes first, so their mtime does not replace
		// the one set now.
		if err := in.sendAll(ctx, false); err != nil {
			return nil, err
		}
		if err := in.commit(ctx); err != nil {
			return nil, err
		}
	}
	c.countMeta()
	// Only this file changes: its kept attributes go (noteAttrChange),
	// not all.
	resp, err := c.meta.SetAttr(keepFiles(ctx), req)
	c.noteAttrChange(req.Ino)
	if err != nil {
		return nil, err
	}
	if resize && in != nil {
		in.truncated(resp.Attr.GetSize())
	}
	return c.overlay(resp.Attr, 0, false), nil
}

// Mknod creates a special file (FIFO, socket, device) or an empty regular
// file; mode carries the file type bits.
func (c *Client) Mknod(ctx context.Context, caller *weftv1.Caller, parent uint64, name string, mode, rdev uint32) (*weftv1.Attr, error) {
	c.countMeta()
	resp, err := c.meta.Create(ctx, &weftv1.CreateRequest{
		Caller: caller, Parent: parent, Name: name, Mode: mode, Rdev: rdev, Exclusive: true,
	})
	c.noteMade(parent, name, err)
	if err != nil {
		return nil, err
	}
	return resp.Attr, nil
}

// Mkdir creates directory name in parent.
func (c *Client) Mkdir(ctx context.Context, caller *weftv1.Caller, parent uint64, name string, mode uint32) (*weftv1.Attr, error) {
	tok, track := c.dirToken()
	c.countMeta()
	req := &weftv1.MkdirRequest{Caller: caller, Parent: parent, Name: name, Mode: mode}
	if track && c.delegateAtMkdir(parent, caller) {
		req.Delegate, req.NoInos = true, c.enoughInos()
	}
	resp, err := c.meta.Mkdir(keepFiles(ctx), req) // no regular file changes
	c.noteEntry(parent, name, true, err, resp.GetParent(), tok, track)
	if err != nil {
		return nil, err
	}
	if track {
		c.dirComplete(resp.Attr.GetIno(), tok, nil) // a new directory is empty
		c.noteDirAttr(resp.Attr, tok)
		if resp.Delegation != nil {
			c.installGrant(resp.Attr.GetIno(), caller.GetSession(), resp.Delegation)
		}
	}
	return resp.Attr, nil
}

// Unlink removes the non-directory name from parent: answered here when
// this client holds parent's delegation and knows the file
// (delegremove.go), else by the meta service.
func (c *Client) Unlink(ctx context.Context, caller *weftv1.Caller, parent uint64, name string) error {
	if c.removeLocal(caller, parent, name) {
		return nil
	}
	tok, track := c.dirToken()
	known := c.dirs.file(parent, name)
	if known != nil && known.Nlink == 1 {
		// Only this file changes: its kept attributes go, not all.
		ctx = keepFiles(ctx)
		c.dirs.dropFile(known.Ino)
	}
	c.countMeta()
	resp, err := c.meta.Unlink(ctx, &weftv1.RemoveRequest{Caller: caller, Parent: parent, Name: name})
	c.noteEntry(parent, name, false, err, resp.GetParent(), tok, track)
	if keepsFiles(ctx) {
		c.dirs.dropFile(known.Ino) // and a lookup's answered meanwhile
	}
	if err == nil {
		c.noteCreate(caller, parent) // removes too make the directory worth holding
	}
	return err
}

// Rmdir removes the empty directory name from parent.
func (c *Client) Rmdir(ctx context.Context, caller *weftv1.Caller, parent uint64, name string) error {
	tok, track := c.dirToken()
	c.countMeta()
	// No regular file changes: kept files' attributes stay.
	resp, err := c.meta.Rmdir(keepFiles(ctx), &weftv1.RemoveRequest{Caller: caller, Parent: parent, Name: name})
	c.noteEntry(parent, name, false, err, resp.GetParent(), tok, track)
	if err == nil {
		// The removed directory's own attributes may be among those
		// cached, under an inode number this client does not know.
		c.dirs.dropAttrsOfEmptyBut(parent)
	}
	return err
}

// Rename moves oldParent/oldName to newParent/newName; flags are
// RenameFlags bits (RENAME_NOREPLACE, RENAME_EXCHANGE).
func (c *Client) Rename(ctx context.Context, caller *weftv1.Caller, oldParent uint64, oldName string,
	newParent uint64, newName string, flags uint32) error {
	tok, track := c.dirToken()
	c.countMeta()
	resp, err := c.meta.Rename(ctx, &weftv1.RenameRequest{
		Caller: caller, OldParent: oldParent, OldName: oldName, NewParent: newParent, NewName: newName, Flags: flags,
	})
	exchange := flags&uint32(weftv1.RenameFlags_RENAME_EXCHANGE) != 0
	c.noteEntries(err, tok, track,
		entryChange{dir: oldParent, name: oldName, added: exchange, parent: resp.GetOldParent()},
		entryChange{dir: newParent, name: newName, added: true, parent: resp.GetNewParent()})
	// A renamed directory's ctime and ".." changed, under an inode number
	// this client does not know.
	c.dirs.dropAttrsBut(oldParent, newParent)
	return err
}

// Link makes newParent/newName another name of inode ino.
func (c *Client) Link(ctx context.Context, caller *weftv1.Caller, ino, newParent uint64, newName string) (*weftv1.Attr, error) {
	tok, track := c.dirToken()
	c.countMeta()
	resp, err := c.meta.Link(ctx, &weftv1.LinkRequest{Caller: caller, Ino: ino, NewParent: newParent, NewName: newName})
	c.noteEntry(newParent, newName, true, err, resp.GetParent(), tok, track)
	if err != nil {
		return nil, err
	}
	return c.overlay(resp.Attr, 0, false), nil
}

// Symlink creates symbolic link name in parent pointing to target.
func (c *Client) Symlink(ctx context.Context, caller *weftv1.Caller, parent uint64, name, target string) (*weftv1.Attr, error) {
	tok, track := c.dirToken()
	c.countMeta()
	resp, err := c.meta.Symlink(ctx, &weftv1.SymlinkRequest{Caller: caller, Parent: parent, Name: name, Target: target})
	c.noteEntry(parent, name, true, err, resp.GetParent(), tok, track)
	if err != nil {
		return nil, err
	}
	return resp.Attr, nil
}

// Readlink returns a symbolic link's target.
func (c *Client) Readlink(ctx context.Context, ino uint64) (string, error) {
	c.countMeta()
	resp, err := c.meta.Readlink(ctx, &weftv1.ReadlinkRequest{Ino: ino})
	if err != nil {
		return "", err
	}
	return resp.Target, nil
}

// OpenDir checks that caller may open directory ino with flags.
func (c *Client) OpenDir(ctx context.Context, caller *weftv1.Caller, ino uint64, flags uint32) (*weftv1.Attr, error) {
	c.countMeta()
	resp, err := c.meta.Open(ctx, &weftv1.OpenRequest{Caller: caller, Ino: ino, Flags: flags})
	if err != nil {
		return nil, err
	}
	return resp.Attr, nil
}

// ReadDir returns one page of directory ino's entries in name order after
// startAfter (without "." and ".."), and whether more follow. With plus,
// entries carry their attributes.
//
// A listing that fits one page makes the directory known completely (see
// dircache.go) while callbacks are live.
func (c *Client) ReadDir(ctx context.Context, caller *weftv1.Caller, ino uint64, startAfter string, plus bool) ([]*weftv1.DirEntry, bool, error) {
	tok, track := c.dirToken()
	gen := c.dirs.fileGeneration()
	c.countMeta()
	resp, err := c.meta.ReadDir(ctx, &weftv1.ReadDirRequest{Caller: caller, Ino: ino, StartAfter: startAfter, Plus: plus, Limit: readDirPage})
	if err != nil {
		return nil, false, err
	}
	if track && plus && c.ownSession(caller) {
		// The attributes came with the names (READDIRPLUS): kept as a
		// lookup's are, so a walk of the tree after a cache drop asks
		// the meta service only for the listings.
		for _, e := range resp.Entries {
			if e.Name != "." && e.Name != ".." {
				c.dirs.putFile(ino, e.Name, e.Attr, tok, gen)
			}
		}
	}
	if track && startAfter == "" && !resp.More {
		names := make([]string, len(resp.Entries))
		for i, e := range resp.Entries {
			names[i] = e.Name
		}
		c.dirComplete(ino, tok, names)
	}
	for _, e := range resp.Entries {
		c.overlay(e.Attr, 0, false)
	}
	return resp.Entries, resp.More, nil
}

// readDirPage is how many entries one ReadDir RPC asks for: large pages
// make listing (and, with attributes, walking) a big directory a few RPCs.
const readDirPage = 4096

// Access checks access(2) mask bits for caller on inode ino.
func (c *Client) Access(ctx context.Context, caller *weftv1.Caller, ino uint64, mask uint32) error {
	c.countMeta()
	_, err := c.meta.Access(ctx, &weftv1.AccessRequest{Caller: caller, Ino: ino, Mask: mask})
	return err
}

// StatFS returns the file system's capacity and file count.
func (c *Client) StatFS(ctx context.Context) (*weftv1.StatFSResponse, error) {
	c.countMeta()
	return c.meta.StatFS(ctx, &weftv1.StatFSRequest{})
}

// GetXattr returns the value of extended attribute name of inode ino.
func (c *Client) GetXattr(ctx context.Context, caller *weftv1.Caller, ino uint64, name string) ([]byte, error) {
	if strings.HasPrefix(name, "security.") && c.knownNoXattrs(ino) {
		// Anyone may read security.* names; a file made here has none.
		return nil, fserr.Wrap(syscall.ENODATA, "get extended attribute %q of inode %d: no such attribute (the file was made here and has none)", name, ino)
	}
	c.countMeta()
	resp, err := c.meta.GetXattr(ctx, &weftv1.GetXattrRequest{Caller: caller, Ino: ino, Name: name})
	if err != nil {
		return nil, err
	}
	return resp.Value, nil
}

// SetXattr sets extended attribute name of inode ino; flags are
// XattrFlags bits (XATTR_CREATE, XATTR_REPLACE).
func (c *Client) SetXattr(ctx context.Context, caller *weftv1.Caller, ino uint64, name string, value []byte, flags uint32) error {
	c.forgetNoXattrs(ino)
	c.countMeta()
	_, err := c.meta.SetXattr(ctx, &weftv1.SetXattrRequest{Caller: caller, Ino: ino, Name: name, Value: value, Flags: flags})
	c.noteAttrChange(ino)
	return err
}

// ListXattr returns the names of inode ino's extended attributes.
func (c *Client) ListXattr(ctx context.Context, caller *weftv1.Caller, ino uint64) ([]string, error) {
	c.countMeta()
	resp, err := c.meta.ListXattr(ctx, &weftv1.ListXattrRequest{Caller: caller, Ino: ino})
	if err != nil {
		return nil, err
	}
	return resp.Names, nil
}

// RemoveXattr removes extended attribute name of inode ino.
func (c *Client) RemoveXattr(ctx context.Context, caller *weftv1.Caller, ino uint64, name string) error {
	c.forgetNoXattrs(ino)
	c.countMeta()
	_, err := c.meta.RemoveXattr(ctx, &weftv1.RemoveXattrRequest{Caller: caller, Ino: ino, Name: name})
	c.noteAttrChange(ino)
	return err
}
