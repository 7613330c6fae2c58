package client

import (
	"context"
	"errors"
	"fmt"
	"strings"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Where files made here under a delegation and not sent yet meet the rest
// of the client: what each use of such a File waits for (File.made), the
// open records of those still open, and beforeCall, the one seam every
// other call to the meta service passes.

// The uses of a file made here (File.made) wait for what they need of its
// create; every method is a no-op for nil (any other file).

// ready waits until the meta service has the file, and gives the inode in
// (nil if not regular) its layout: reads, fallocate.
func (p *pendingCreate) ready(ctx context.Context, in *inode) error {
	if p == nil {
		return nil
	}
	if err := p.c.awaitCreate(ctx, p); err != nil {
		return err
	}
	if in != nil {
		in.mu.Lock()
		if in.layout == nil {
			in.layout = p.attr.Layout
		}
		in.mu.Unlock()
	}
	return nil
}

// readyToWrite is ready for a write: a file with a layout from its grant
// is written at once (its data goes ahead of its create), unless the meta
// service refused it already; its close then flushes.
func (p *pendingCreate) readyToWrite(ctx context.Context, in *inode) error {
	if p == nil {
		return nil
	}
	p.written.Store(true)
	if p.hasLayout() {
		if p.stored() {
			return p.err
		}
		return nil
	}
	return p.ready(ctx, in)
}

// errFlushHere says that a flush of a file made here is the usual one.
var errFlushHere = errors.New("flush as any file")

// readyToFlush is the part of a close's or fsync's flush of f that its
// create needs, or errFlushHere when the usual flush of f.in is all. A
// close of a file neither written nor read (reads wait for the meta
// service) has nothing to flush, and the file goes within milliseconds.
// A file with a layout from its grant may have its data out already: its
// data is flushed first, so that its length goes with the create
// (inode.commitLocked), which is then awaited.
func (p *pendingCreate) readyToFlush(ctx context.Context, f *File, durable, advance, closing bool) error {
	switch {
	case p == nil:
		return errFlushHere
	case closing && !p.stored() && !p.written.Load():
		return nil
	case p.hasLayout() && f.in != nil:
		if err := f.in.flush(ctx, durable, &f.seen, advance); err != nil {
			return err
		}
		return p.c.awaitCreate(ctx, p)
	}
	if err := p.ready(ctx, f.in); err != nil {
		return err
	}
	return errFlushHere
}

// dropUnregistered forgets f if it is open without an open record at the
// meta service, and reports whether it was (then nothing is released
// there).
func (c *Client) dropUnregistered(f *File) bool {
	d := &c.deleg
	if d.nUnreg.Load() == 0 {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.unreg[f]; ok {
		delete(d.unreg, f)
		d.nUnreg.Add(-1)
		return true
	}
	return false
}

// registerOpens records with the meta service the opens of files made
// here that it has (the caller sent their creates). Releases wait while
// it runs.
func (c *Client) registerOpens(ctx context.Context) error {
	d := &c.deleg
	if d.nUnreg.Load() == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var files []*File
	var inos []uint64
	for f := range d.unreg {
		select {
		case <-f.made.done:
		default:
			continue // made after the sends began: nothing can name it yet
		}
		if f.made.err == nil {
			files = append(files, f)
			inos = append(inos, f.ino)
		}
	}
	for len(inos) > 0 {
		n := min(len(inos), maxPendingBatch)
		c.countMeta()
		if _, err := c.meta.RecordOpens(ctx, &weftv1.RecordOpensRequest{Session: c.Session(), Inos: inos[:n]}); err != nil {
			return fmt.Errorf("record the opens of %d files made under a delegation: %w", n, err)
		}
		for _, f := range files[:n] {
			delete(d.unreg, f)
			d.nUnreg.Add(-1)
		}
		files, inos = files[n:], inos[n:]
	}
	return nil
}

// beforeCall runs before every call of this client to the meta service:
// it is where files made and removes answered here meet every other
// namespace call. They are at the meta service before anything that
// could see or change them or their directories, and the opens of made
// files recorded before anything that could remove a name. A queued call
// being sent (queuedSend) needs nothing.
func (c *Client) beforeCall(ctx context.Context, method string) error {
	if queuedSend(ctx) {
		return nil
	}
	name := method[strings.LastIndexByte(method, '/')+1:]
	if clearsFileAttrs[name] && !keepsFiles(ctx) && c.dirs.hasFiles() {
		c.dirs.dropFiles()
	}
	d := &c.deleg
	if d.waiting.Load() == 0 && d.nUnreg.Load() == 0 && d.nRemoves.Load() == 0 {
		return nil
	}
	// What the call needs of them is its method's (weft.v1.call).made.
	switch weftv1.MetaCallOf(name).GetMade() {
	case weftv1.Made_MADE_OPEN_RECORDED:
		c.sendPending(ctx)
		return c.registerOpens(ctx)
	case weftv1.Made_MADE_SENT:
		c.sendPending(ctx)
	case weftv1.Made_MADE_SENT_ENTRY:
		c.sendCreates(ctx)
	}
	return nil
}

// afterCall runs when a meta call of this client returned: after a
// change, kept files' attributes go again, and lookups answered while it
// was on its way are not kept (they may predate it), unless the caller
// drops what the call changed itself (keepFiles).
func (c *Client) afterCall(ctx context.Context, method string) {
	if clearsFileAttrs[method[strings.LastIndexByte(method, '/')+1:]] && !keepsFiles(ctx) {
		c.dirs.dropFiles()
	}
}
