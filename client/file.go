package client

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Fallocate modes (as fallocate(2)).
const (
	FallocKeepSize  = 0x1
	FallocPunchHole = 0x2
	FallocZeroRange = 0x10
)

// File is an open file: a handle on an inode opened through this Client.
// Files of the same inode share the inode's write buffer. A File is safe
// for concurrent use; Release ends it.
type File struct {
	c        *Client
	ino      uint64
	in       *inode // nil unless a regular file
	flags    uint32
	session  string
	caller   *weftv1.Caller
	released atomic.Bool
	// made is set for a file made here under a create delegation and
	// not yet known to be at the meta service; its methods (delegopen.go,
	// nil for any other file) say what each use of the file waits for.
	made *pendingCreate
	// seen is how far this file has reported its inode's write-back
	// errors (wberr.go); guarded by in.mu.
	seen errCursor
}

// Ino returns the file's inode number.
func (f *File) Ino() uint64 { return f.ino }

// Flags returns the open(2) flags the file was opened with.
func (f *File) Flags() uint32 { return f.flags }

// Open opens inode ino with open(2) flags for caller; the meta service
// checks permissions and records the open in the session (so an unlinked
// open file keeps its data until Release). The returned attributes are
// fresh from the meta service (close-to-open), with this client's
// buffered size applied.
func (c *Client) Open(ctx context.Context, caller *weftv1.Caller, ino uint64, flags uint32) (*File, *weftv1.Attr, error) {
	c.opens.replayMu.RLock() // until the file is counted (replay.go)
	defer c.opens.replayMu.RUnlock()
	sess := c.Session()
	early := c.openEarly(ino, flags)
	c.countMeta()
	resp, err := c.meta.Open(ctx, &weftv1.OpenRequest{Caller: caller, Ino: ino, Flags: flags, Session: sess})
	if err != nil {
		if early != nil {
			c.dropRef(early)
		}
		return nil, nil, err
	}
	if early != nil {
		early.adoptEarly(resp.Attr)
		return c.fileOf(ino, early, flags, sess, caller), c.overlay(resp.Attr, 0, false), nil
	}
	return c.newFile(resp.Attr, flags, sess, caller), c.overlay(resp.Attr, 0, false), nil
}

// Create creates (or, unless exclusive, opens an existing) regular file
// name in parent and opens it with open(2) flags.
func (c *Client) Create(ctx context.Context, caller *weftv1.Caller, parent uint64, name string, mode, flags uint32,
	exclusive bool) (*File, *weftv1.Attr, error) {
	if f, attr, ok := c.createLocal(caller, parent, name, mode, flags); ok {
		return f, attr, nil
	}
	c.opens.replayMu.RLock() // until the file is counted (replay.go)
	defer c.opens.replayMu.RUnlock()
	sess := c.Session()
	tok, track := c.dirToken()
	c.countMeta()
	resp, err := c.meta.Create(keepFiles(ctx), &weftv1.CreateRequest{
		Caller: caller, Parent: parent, Name: name, Mode: mode | syscall.S_IFREG,
		Exclusive: exclusive, Session: sess, OpenFlags: flags,
	})
	if err != nil {
		c.dirs.dropEntry(parent, name) // it may have been truncated
		c.noteMade(parent, name, err)
		return nil, nil, err
	}
	c.dirs.dropFile(resp.Attr.GetIno())
	if track && c.cb.live.Load() {
		c.dirs.putCreated(parent, name, resp.Attr, tok)
	}
	c.noteCreated(parent, name, resp.Created, resp.Attr)
	if resp.Created {
		c.noteCreate(caller, parent)
	}
	return c.newFile(resp.Attr, flags, sess, caller), c.overlay(resp.Attr, 0, false), nil
}

func (c *Client) newFile(attr *weftv1.Attr, flags uint32, sess string, caller *weftv1.Caller) *File {
	var in *inode
	if attr.Mode&syscall.S_IFMT == syscall.S_IFREG {
		in = c.acquire(attr)
	}
	return c.fileOf(attr.Ino, in, flags, sess, caller)
}

// fileOf returns an open file of ino whose shared state in (nil for a
// file that is not regular) already counts the open, and counts it open.
func (c *Client) fileOf(ino uint64, in *inode, flags uint32, sess string, caller *weftv1.Caller) *File {
	c.opens.add(ino)
	f := &File{c: c, ino: ino, flags: flags, session: sess, caller: caller, in: in}
	if in != nil {
		in.mu.Lock()
		f.seen = in.sampleErrLocked()
		in.mu.Unlock()
	}
	return f
}

// acquire returns the shared state of a regular file and counts one more
// open of it; attr is fresh from the meta service.
func (c *Client) acquire(attr *weftv1.Attr) *inode {
	c.inodesMu.Lock()
	defer c.inodesMu.Unlock()
	in := c.inodes[attr.Ino]
	if in == nil {
		in = &inode{
			c: c, ino: attr.Ino,
			dirty:    make(map[uint64]*chunkBuf),
			inflight: make(map[uint64]*sendOp),
		}
		in.unsynced, in.syncAll = c.closedUnsynced.take(attr.Ino)
		c.inodes[attr.Ino] = in
	}
	in.mu.Lock()
	in.opens++
	if attr.Layout != nil {
		in.layout = attr.Layout
	}
	in.metaSize, in.metaMtimeNs = attr.Size, attr.MtimeNs
	if in.opens == 1 {
		in.raState.skipped = false // how earlier openers read says nothing of this one
	}
	in.dropReadAheadLocked() // a fresh open reads what is stored now
	in.mu.Unlock()
	return in
}

// dropRef counts one open less; the state goes once nothing is open or
// buffered.
func (c *Client) dropRef(in *inode) {
	c.inodesMu.Lock()
	defer c.inodesMu.Unlock()
	in.mu.Lock()
	defer in.mu.Unlock()
	in.opens--
	if in.opens <= 0 {
		// The next open drops them anyway; their buffers (the lean data
		// path's) go back now.
		in.dropReadAheadLocked()
	}
	if in.opens <= 0 && len(in.dirty) == 0 && len(in.inflight) == 0 && !in.writtenLocked() &&
		len(in.lost) == 0 && !in.unseenErrLocked() {
		delete(c.inodes, in.ino)
		// Written without sync (closed without Config.CloseSync): a
		// later fsync of the file, through another open, syncs them.
		c.closedUnsynced.put(in.ino, in.unsynced)
	}
}

func (c *Client) lookupInode(ino uint64) *inode {
	c.inodesMu.Lock()
	defer c.inodesMu.Unlock()
	return c.inodes[ino]
}

// ReadAt reads into p from offset off, clipped to the file's size as this
// client knows it (buffered writes included). It returns the bytes read,
// 0 at or past the end of the file.
func (f *File) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if f.in == nil {
		return 0, errNotRegular
	}
	if err := f.made.ready(ctx, f.in); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fmt.Errorf("read at negative offset %d: %w", off, syscall.EINVAL)
	}
	return f.in.read(ctx, p, uint64(off))
}

// ReadView is ReadAt for a caller that can use the client's own buffer:
// where the range lies in one read-ahead window it returns those bytes
// without copying them into p, and a function to call once done with
// them; else the bytes read into p and a nil function.
func (f *File) ReadView(ctx context.Context, p []byte, off int64) ([]byte, func(), error) {
	if f.in == nil {
		return nil, nil, errNotRegular
	}
	if err := f.made.ready(ctx, f.in); err != nil {
		return nil, nil, err
	}
	if off < 0 {
		return nil, nil, fmt.Errorf("read at negative offset %d: %w", off, syscall.EINVAL)
	}
	return f.in.readView(ctx, p, uint64(off))
}

// WriteAt buffers p at offset off (at the end of the file for a file
// opened with O_APPEND) and returns len(p). The data reaches the data
// servers when a chunk fills, when the client's buffer limit is reached,
// or at Flush, Fsync or Release. A background send that fails loses its
// bytes; each File of the inode reports it once at its next WriteAt
// (which then writes nothing) and once at its next Flush or Fsync.
func (f *File) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if f.in == nil {
		return 0, errNotRegular
	}
	if err := f.made.readyToWrite(ctx, f.in); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, fmt.Errorf("write at negative offset %d: %w", off, syscall.EINVAL)
	}
	at, err := f.in.write(p, uint64(off), f.flags&syscall.O_APPEND != 0, f.caller, &f.seen)
	if err != nil {
		return 0, err
	}
	f.c.relieve(ctx, f.in, at, uint64(len(p)))
	return len(p), nil
}

// backgroundShare: once the client buffers more than this share of its
// write buffer, a writer starts sending its file's other buffered chunks
// in the background (as the kernel's dirty_background_ratio does), so
// that sends overlap with writing instead of piling up for the next
// flush; only past the whole limit does it wait.
const backgroundShare = 4

// relieve sends buffered data when the client holds much of its limit:
// past a quarter, the writer's file's chunks other than the ones its
// write [off, off+n) touched start in the background; past the limit,
// the writer waits for its own file's sends, then everyone's.
func (c *Client) relieve(ctx context.Context, in *inode, off, n uint64) {
	buffered := c.buffered.Load()
	if buffered > c.cfg.WriteBufferBytes/backgroundShare {
		in.sendOthers(off, n)
	}
	if buffered <= c.cfg.WriteBufferBytes {
		return
	}
	_ = in.sendAll(ctx, false)
	if c.buffered.Load() <= c.cfg.WriteBufferBytes {
		return
	}
	c.inodesMu.Lock()
	all := make([]*inode, 0, len(c.inodes))
	for _, o := range c.inodes {
		all = append(all, o)
	}
	c.inodesMu.Unlock()
	for _, o := range all {
		_ = o.sendAll(ctx, false)
	}
}

// Flush is the flush of a close: it sends the file's buffered writes and
// commits the length and mtime (close-to-open: another client that opens
// the file afterwards sees them), stored in the memory of every live
// replica, and on their disks with Config.CloseSync (README.md "The
// durability contract"). It fails if a write-back error of the file was
// not yet reported by this File's Fsync (each close of the open file
// reports it: dup and fork make several).
func (f *File) Flush(ctx context.Context) error {
	return f.flush(ctx, f.c.cfg.CloseSync, false, true)
}

// Fsync makes every write acknowledged before it durable (on the disks of
// every live replica), and a file made under a delegation stored at the
// meta service, before it returns. It fails, once, if a write-back error
// of the file was not yet reported by this File's Fsync.
func (f *File) Fsync(ctx context.Context) error {
	return f.flush(ctx, true, true, false)
}

// flush is Flush (closing) or Fsync: durable or not; advance moves the
// File's cursor past the error it reports (Fsync).
func (f *File) flush(ctx context.Context, durable, advance, closing bool) error {
	if err := f.made.readyToFlush(ctx, f, durable, advance, closing); err != errFlushHere {
		return err
	}
	if f.in == nil {
		return nil
	}
	return f.in.flush(ctx, durable, &f.seen, advance)
}

// Release flushes the file as Flush does (its length is committed when
// Release returns) and closes it with the meta service in the
// background: the open record only keeps an unlinked file's data, and
// its removal needs no one to wait (see README.md "Background release").
// At the file's last close on this client, writes kept past bytes that
// were lost are given up (the file is cut there).
// Close waits for queued releases. Calling it again does nothing.
func (f *File) Release(ctx context.Context) error {
	return f.release(ctx, func() error {
		c := f.c
		c.opens.replayMu.RLock() // from the count's drop until queued or sent (replay.go)
		defer c.opens.replayMu.RUnlock()
		sess := c.opens.remove(f.ino, f.session)
		if c.dropUnregistered(f) {
			return nil // the meta service has no open record of it
		}
		return c.releaseLater(ctx, f.ino, sess)
	})
}

// ReleaseNow is Release with the meta service's release sent before it
// returns.
func (f *File) ReleaseNow(ctx context.Context) error {
	return f.release(ctx, func() error {
		c := f.c
		c.opens.replayMu.RLock() // from the count's drop until sent (replay.go)
		defer c.opens.replayMu.RUnlock()
		sess := c.opens.remove(f.ino, f.session)
		if c.dropUnregistered(f) {
			return nil
		}
		return c.sendReleaseLocked(ctx, &weftv1.ReleaseRequest{Ino: f.ino, Session: sess})
	})
}

// release flushes and drops the file's data once, then closes it with the
// meta service through send; it reports the first error.
func (f *File) release(ctx context.Context, send func() error) error {
	if f.released.Swap(true) {
		return nil
	}
	var err error
	if f.in != nil {
		err = f.in.flush(ctx, f.c.cfg.CloseSync, &f.seen, false)
		f.in.mu.Lock()
		last := f.in.opens == 1
		f.in.mu.Unlock()
		if last {
			f.in.settleLost(ctx)
		}
		f.c.dropRef(f.in)
	}
	if rerr := send(); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// Fallocate implements fallocate(2) modes: 0 grows the file to off+length
// if shorter; FallocKeepSize is accepted (space is not reserved);
// FallocPunchHole|FallocKeepSize and FallocZeroRange(|FallocKeepSize)
// write zeros over the range (within the file's size; zero range without
// keep-size also grows the file). Other modes (collapse, insert range)
// fail with EOPNOTSUPP.
func (f *File) Fallocate(ctx context.Context, mode uint32, off, length uint64) error {
	if f.in == nil {
		return errNotRegular
	}
	if err := f.made.ready(ctx, f.in); err != nil {
		return err
	}
	switch mode {
	case 0:
		return f.grow(ctx, off+length)
	case FallocKeepSize:
		return nil
	case FallocPunchHole | FallocKeepSize, FallocZeroRange | FallocKeepSize:
		return f.zero(ctx, off, length)
	case FallocZeroRange:
		if err := f.zero(ctx, off, length); err != nil {
			return err
		}
		return f.grow(ctx, off+length)
	}
	return fmt.Errorf("fallocate mode %#x: %w", mode, syscall.EOPNOTSUPP)
}

// grow makes the file at least size bytes long (the new range reads as
// zeros).
func (f *File) grow(ctx context.Context, size uint64) error {
	in := f.in
	in.mu.Lock()
	cur, barrier := in.sizeLocked(), in.barrierLocked()
	in.mu.Unlock()
	if size <= cur {
		return nil
	}
	if size > barrier {
		return fserr.Wrap(syscall.EIO, "grow file %d to %d bytes: bytes from %d were lost when their write-back failed; write them again or truncate the file first",
			f.ino, size, barrier)
	}
	in.commitMu.Lock()
	defer in.commitMu.Unlock()
	f.c.cb.commits.Add(1)
	resp, err := f.c.meta.CommitWrite(ctx, &weftv1.CommitWriteRequest{
		Caller: f.caller, Ino: f.ino, Size: size, MtimeNs: time.Now().UnixNano(),
	})
	if err != nil {
		return fmt.Errorf("grow file %d to %d bytes: %w", f.ino, size, err)
	}
	in.mu.Lock()
	in.metaSize = max(in.metaSize, resp.GetAttr().GetSize())
	in.attrGen++
	in.mu.Unlock()
	return nil
}

// zero writes zeros over [off, off+length) within the file's current
// size (punch hole and zero range keep no holes on the targets yet).
func (f *File) zero(ctx context.Context, off, length uint64) error {
	in := f.in
	in.mu.Lock()
	size := in.sizeLocked()
	in.mu.Unlock()
	end := min(off+length, size)
	zeros := make([]byte, min(end-min(off, end), 1<<20))
	for pos := off; pos < end; {
		n := min(uint64(len(zeros)), end-pos)
		if _, err := in.write(zeros[:n], pos, false, f.caller, nil); err != nil {
			return err
		}
		f.c.relieve(ctx, in, pos, n)
		pos += n
	}
	return nil
}
