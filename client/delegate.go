package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/perm"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Create delegations (README.md "Create delegations", meta/delegate.go).
// After a few creates in one directory whose names this client knows
// completely, it asks the meta service for the directory. While it holds
// it, a create of a new regular file there is answered here, with an
// inode number the grant reserved, and the file is queued; queued files
// go to the meta service together in CreateMany calls: at once when
// anyone waits for one (a close, an fsync, a write, any other namespace
// call of this client), else after pendingDelay. Files made so are open
// without an open record at the meta service: the records are made
// (RecordOpens) before this client unlinks, renames or links anything,
// and before it returns a recalled directory, the only ways another
// session could remove their names.

// Delegation tuning.
const (
	// delegateAfter creates in one directory within delegateWindow make
	// the client ask for it.
	delegateAfter  = 3
	delegateWindow = time.Second
	// pendingDelay is the longest a made file waits to be sent when
	// nobody waits for it.
	pendingDelay = 2 * time.Millisecond
	// maxPendingBatch is the most files one CreateMany carries (the meta
	// service takes 1024).
	maxPendingBatch = 512
	// maxCreateManyInFlight is how many CreateMany calls may be out at
	// once.
	maxCreateManyInFlight = 4
	// maxWaitingCreates bounds the files made here that the meta service
	// does not have yet: past it, creates go to the meta service (which
	// first sends the queue), so a creator faster than the meta service
	// is held to its pace.
	maxWaitingCreates = 4096
	// maxCountedDirs bounds the directories whose creates are counted.
	maxCountedDirs = 1024
	// maxHeldDirs bounds the directories a mkdir asks to hold at once.
	maxHeldDirs = 4096
	// relearnAfter is how long a directory that could not be learned
	// (learnDir) is not listed again for a delegation.
	relearnAfter = 30 * time.Second
	// createManyRetryFor is how long a CreateMany is retried while the
	// meta service is unreachable.
	createManyRetryFor = time.Minute
)

// delegDir is a directory delegated to this client.
type delegDir struct {
	gen      uint64
	session  string
	recalled bool // being returned: no more local creates
	// layouts were placed by the grant for new files here, given out in
	// turn (next): a file with one writes its data before the meta
	// service has it.
	layouts []*weftv1.Layout
	next    int
}

// createCount counts recent creates in a directory.
type createCount struct {
	n     int
	since time.Time
}

// pendingCreate is a file made under a delegation, until the meta
// service has it.
type pendingCreate struct {
	nf   *weftv1.NewFile
	sent bool      // taken into a CreateMany (under delegState.mu): nf no longer changes
	made time.Time // when it was made (monotonic)
	// flushing counts flushes of the file under way (its data on its
	// way to the data servers): the timer leaves it for its flush to
	// send, with its length.
	flushing int
	// hold: the create carries the length of writes whose bytes may not
	// have reached the data servers yet (setAttrLocal); the timer leaves
	// it until a flush has sent them, and sendPending sends them first.
	hold bool
	in   *inode // the file's, when hold is set
	// cur is the file's attributes as the meta service will store them,
	// with the changes made here (setAttrLocal) applied.
	cur     *weftv1.Attr
	written atomic.Bool   // written through any handle: its close flushes
	done    chan struct{} // closed once attr or err is set
	attr    *weftv1.Attr  // as stored
	err     error
}

// foldCommit puts a written file's length and mtime into its create, if
// the create is not sent yet, so one call stores both; the caller then
// waits for the create. The file's data must be durable already.
func (c *Client) foldCommit(p *pendingCreate, size uint64, mtimeNs int64) bool {
	d := &c.deleg
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.sent {
		return false
	}
	p.nf.Committed, p.nf.Size, p.nf.MtimeNs = true, size, mtimeNs
	return true
}

// hasLayout reports whether a file made here got a layout from its
// grant: its data may be written before the meta service has it.
func (p *pendingCreate) hasLayout() bool { return p != nil && p.nf.Layout != nil }

// maxNoXattrs bounds the files remembered as having no extended
// attributes; past it the set starts again empty.
const maxNoXattrs = 1 << 16

// knownNoXattrs reports whether ino is a file made here under a delegation
// that has no extended attributes: a new file has none, and it keeps none
// until this client sets one (SetXattr and RemoveXattr forget it first) or
// another client reaches the file, which needs a recall or changes the
// inode (both forget it, dropNoXattrs). The kernel asks for
// security.capability before a file's first write; for these files that
// is answered without a meta call.
func (c *Client) knownNoXattrs(ino uint64) bool {
	d := &c.deleg
	if d.nNoXattrs.Load() == 0 {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.noXattrs[ino]
	return ok
}

// forgetNoXattrs drops ino from the files known to have no extended
// attributes.
func (c *Client) forgetNoXattrs(ino uint64) {
	d := &c.deleg
	if d.nNoXattrs.Load() == 0 {
		return
	}
	d.mu.Lock()
	delete(d.noXattrs, ino)
	d.nNoXattrs.Store(int64(len(d.noXattrs)))
	d.mu.Unlock()
}

// dropNoXattrs forgets what a callback may have changed: the inodes it
// names, and every file once a delegation is recalled (or the stream
// restarted).
func (c *Client) dropNoXattrs(inv *weftv1.Invalidation) {
	d := &c.deleg
	if d.nNoXattrs.Load() == 0 {
		return
	}
	d.mu.Lock()
	if inv.All || len(inv.Recalls) > 0 {
		d.noXattrs = nil
	} else {
		for _, ino := range inv.Inodes {
			delete(d.noXattrs, ino)
		}
	}
	d.nNoXattrs.Store(int64(len(d.noXattrs)))
	d.mu.Unlock()
}

// stored reports whether the meta service has answered for the file.
func (p *pendingCreate) stored() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// delegState is the client's create delegations.
type delegState struct {
	mu     sync.Mutex
	dirs   map[uint64]*delegDir
	early  map[uint64]uint64 // directory -> generation recalled before its grant arrived
	asking map[uint64]bool
	counts map[uint64]*createCount
	// unlearned are directories learnDir could not learn, and when.
	unlearned map[uint64]time.Time
	inos      [][2]uint64 // reserved numbers not used yet: [next, end)
	queue     []*pendingCreate
	timer     bool               // a send after pendingDelay is scheduled
	unreg     map[*File]struct{} // open files without an open record
	held      atomic.Int64       // len(dirs)
	waiting   atomic.Int64       // len(queue) plus files being sent
	nUnreg    atomic.Int64       // len(unreg)
	// noXattrs are files made here that have no extended attributes
	// yet (see knownNoXattrs); nNoXattrs is its length.
	noXattrs  map[uint64]struct{}
	nNoXattrs atomic.Int64
	slots     chan struct{}              // CreateMany calls in flight (capacity maxCreateManyInFlight)
	inflight  map[chan struct{}]struct{} // closed when their call is answered
	made      atomic.Uint64              // files made here
	lastMade  atomic.Int64               // when the last one was made (Unix ns)
	granted   atomic.Uint64              // grants received
	// confirms are files sent with their data in flight whose data the
	// data servers acknowledged, to confirm with the next CreateMany
	// (inflight.go); confirmTimer: a lone send is scheduled.
	confirms     []uint64
	confirmTimer bool
}

// Delegations reports how many directories this client holds and how
// many files it made under delegations so far.
func (c *Client) Delegations() (held int, made uint64) {
	return int(c.deleg.held.Load()), c.deleg.made.Load()
}

// PendingCreates reports how many files made here under delegations the
// meta service does not have yet.
func (c *Client) PendingCreates() int64 { return c.deleg.waiting.Load() }

// createLocal makes a new regular file under a delegation of parent, if
// this client holds one and knows the name is free; ok is false when the
// create must go to the meta service.
func (c *Client) createLocal(caller *weftv1.Caller, parent uint64, name string, mode, flags uint32) (f *File, attr *weftv1.Attr, ok bool) {
	d := &c.deleg
	if d.held.Load() == 0 || d.waiting.Load() >= maxWaitingCreates || !c.cb.live.Load() || len(name) > maxNameLen || name == "." || name == ".." || strings.Contains(name, "/") {
		return nil, nil, false
	}
	sess := c.Session()
	dirAttr := c.dirs.attr(parent)
	if dirAttr == nil || dirAttr.Mode&syscall.S_ISGID != 0 {
		return nil, nil, false // the group rule of a setgid directory is the meta service's
	}
	d.mu.Lock()
	dd := d.dirs[parent]
	if dd == nil || dd.recalled || dd.session != sess || !c.dirs.missing(parent, name) {
		d.mu.Unlock()
		return nil, nil, false
	}
	for len(d.inos) > 0 && d.inos[0][0] == d.inos[0][1] {
		d.inos = d.inos[1:]
	}
	if len(d.inos) == 0 {
		d.mu.Unlock()
		c.askDelegation(caller, parent) // for more numbers
		return nil, nil, false
	}
	ino := d.inos[0][0]
	d.inos[0][0]++
	now := time.Now().UnixNano()
	nf := &weftv1.NewFile{Caller: caller, Parent: parent, Name: name, Mode: mode & 0o7777, Ino: ino, TimeNs: now}
	if len(dd.layouts) > 0 {
		nf.Layout = dd.layouts[dd.next%len(dd.layouts)]
		dd.next++
	}
	p := &pendingCreate{nf: nf, made: time.Now(), done: make(chan struct{})}
	attr = &weftv1.Attr{
		Ino: ino, Mode: syscall.S_IFREG | mode&0o7777, Nlink: 1, Uid: caller.GetUid(), Gid: caller.GetGid(),
		AtimeNs: now, MtimeNs: now, CtimeNs: now, Generation: 1, Layout: nf.Layout,
	}
	// The name goes into the complete-directory cache before anyone can
	// look it up, under the delegation's lock (a recall waits for it).
	c.dirs.add(parent, name, true, now)
	d.queue = append(d.queue, p)
	d.waiting.Add(1)
	c.armPendingLocked()
	p.cur = proto.Clone(attr).(*weftv1.Attr)
	f = c.newFile(attr, flags, sess, caller)
	f.pending = p
	if f.in != nil && p.hasLayout() {
		f.in.mu.Lock()
		f.in.pending = p
		f.in.mu.Unlock()
	}
	if d.unreg == nil {
		d.unreg = make(map[*File]struct{})
	}
	d.unreg[f] = struct{}{}
	d.nUnreg.Add(1)
	if d.noXattrs == nil || len(d.noXattrs) >= maxNoXattrs {
		d.noXattrs = make(map[uint64]struct{})
	}
	d.noXattrs[ino] = struct{}{}
	d.nNoXattrs.Store(int64(len(d.noXattrs)))
	d.mu.Unlock()
	d.made.Add(1)
	d.lastMade.Store(now)
	return f, attr, true
}

// localSetAttrBits are the changes setAttrLocal makes (no size change:
// that has the data servers cut chunks).
const localSetAttrBits = perm.SetMode | perm.SetUID | perm.SetGID | perm.SetAtime | perm.SetMtime |
	perm.SetAtimeNow | perm.SetMtimeNow | perm.SetCtimeNow

// setAttrLocal applies a chmod, chown or utimes of a file made here whose
// create is not sent yet to the create itself: checked and applied here
// with the meta service's own rules (package perm), and again by the meta
// service when the file arrives, as the changes SetAttr would have made at
// their times. ok is false when it must go to the meta service. Unpacking
// a tarball (each file created, written, its times, owner and mode set,
// closed) then costs one meta call per file.
func (c *Client) setAttrLocal(ctx context.Context, req *weftv1.SetAttrRequest) (attr *weftv1.Attr, ok bool, err error) {
	if req.Valid == 0 || req.Valid&^localSetAttrBits != 0 {
		return nil, false, nil
	}
	in := c.lookupInode(req.Ino)
	if in == nil {
		return nil, false, nil
	}
	in.mu.Lock()
	p := in.pending
	in.mu.Unlock()
	if p == nil {
		return nil, false, nil
	}
	const times = perm.SetAtime | perm.SetMtime | perm.SetAtimeNow | perm.SetMtimeNow
	if req.Valid&times != 0 {
		in.commitMu.Lock() // no commit of the file's writes meanwhile
		defer in.commitMu.Unlock()
	}
	d := &c.deleg
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.sent {
		return nil, false, nil
	}
	a := proto.Clone(p.cur).(*weftv1.Attr)
	if req.Valid&times != 0 {
		// Earlier writes are committed first, so their mtime does not
		// replace the one set now (as SetAttr does): their length and
		// mtime go with the create, before this change. Their bytes may
		// still be buffered here: the create is held (not sent by the
		// timer) until a flush has sent them.
		in.mu.Lock()
		if in.writtenLocked() {
			p.hold, p.in = true, in
			p.nf.Committed, p.nf.Size, p.nf.MtimeNs = true, in.localEnd, in.mtimeNs
			p.nf.CommitAfter = uint32(len(p.nf.Setattrs))
			a.Size, a.MtimeNs = in.localEnd, in.mtimeNs
			a.CtimeNs = max(a.CtimeNs, a.MtimeNs)
			if !perm.Of(p.nf.Caller).Root() {
				a.Mode = perm.FileType(a.Mode) | perm.KillSuid(a.Mode&0o7777)
			}
			// What the meta service will hold once the create arrives.
			in.metaSize, in.metaMtimeNs = a.Size, a.MtimeNs
			in.committedSeq, in.localEnd = in.writeSeq, 0
		}
		in.mu.Unlock()
	}
	now := time.Now().UnixNano()
	if err := perm.ApplySetAttr(perm.Of(req.Caller), a, req, now, fmt.Sprintf("setattr of inode %d", req.Ino)); err != nil {
		return nil, true, err
	}
	p.cur = a
	p.nf.Setattrs = append(p.nf.Setattrs, req)
	p.nf.SetattrTimesNs = append(p.nf.SetattrTimesNs, now)
	c.localSetAttrs.Add(1)
	return c.overlay(proto.Clone(a).(*weftv1.Attr), 0, false), true, nil
}

// LocalSetAttrs reports how many attribute changes were applied to files
// made here before their creates were sent (no meta call of their own).
func (c *Client) LocalSetAttrs() uint64 { return c.localSetAttrs.Load() }

// pendingTimer sends the queued files once the oldest has waited
// pendingDelay, so that each file gets its time to be written and closed
// first (its length then goes with its create), not only the file that
// started the timer.
func (c *Client) pendingTimer() {
	d := &c.deleg
	d.mu.Lock()
	var oldest *pendingCreate
	for _, p := range d.queue {
		if p.flushing == 0 && !p.hold {
			oldest = p
			break
		}
	}
	if oldest == nil {
		// Nothing queued, or only files being flushed: those send
		// themselves, or arm the timer again (endFlush).
		d.timer = false
		d.mu.Unlock()
		return
	}
	if wait := c.createSendDelay() - time.Since(oldest.made); wait > 0 {
		time.AfterFunc(wait, c.pendingTimer)
		d.mu.Unlock()
		return
	}
	d.timer = false
	d.mu.Unlock()
	c.sendPending(c.bg)
}

// armPendingLocked schedules the timer that sends queued files, unless
// it is scheduled already.
func (c *Client) armPendingLocked() {
	d := &c.deleg
	if !d.timer && len(d.queue) > 0 {
		d.timer = true
		time.AfterFunc(c.createSendDelay(), c.pendingTimer)
	}
}

// createSendDelay is Config.CreateSendDelay or its default.
func (c *Client) createSendDelay() time.Duration {
	if c.cfg.CreateSendDelay > 0 {
		return c.cfg.CreateSendDelay
	}
	return pendingDelay
}

// beginFlush notes that the file of p is being flushed: its create waits
// for the flush, which sends it with the file's length.
func (c *Client) beginFlush(p *pendingCreate) {
	c.deleg.mu.Lock()
	p.flushing++
	c.deleg.mu.Unlock()
}

// endFlush undoes beginFlush. After a flush that sent the file's bytes, a
// create still queued is left to the timer again; after a failed one, a
// create holding the length of unsent bytes stays held (sent only when
// someone needs it: a namespace call of this client, a recall).
func (c *Client) endFlush(p *pendingCreate, err error) {
	d := &c.deleg
	d.mu.Lock()
	p.flushing--
	if err == nil {
		p.hold = false
	}
	if !p.sent {
		c.armPendingLocked()
	}
	d.mu.Unlock()
}

// maxNameLen is the longest name a create may carry (NAME_MAX).
const maxNameLen = 255

// awaitCreate waits until the meta service has p (sending it now if it
// still waits) and returns its outcome.
func (c *Client) awaitCreate(ctx context.Context, p *pendingCreate) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	c.sendPending(ctx)
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// sendPending sends every queued file (in CreateMany calls, up to
// maxCreateManyInFlight at once: what queues while they are all out
// goes in the next) and returns once every file made before it was
// called is answered (also those of calls already in flight).
func (c *Client) sendPending(ctx context.Context) {
	d := &c.deleg
	if d.waiting.Load() == 0 {
		return
	}
	c.sendHeldData(ctx)
	d.mu.Lock()
	var wait []chan struct{}
	for b := range d.inflight {
		wait = append(wait, b)
	}
	var last *pendingCreate
	if n := len(d.queue); n > 0 {
		last = d.queue[n-1]
	}
	d.mu.Unlock()
	heldAgain := false
	for last != nil {
		select {
		case d.slots <- struct{}{}:
		case <-last.done:
			last = nil
			continue
		}
		d.mu.Lock()
		n := min(len(d.queue), maxPendingBatch)
		if !heldAgain && slices.ContainsFunc(d.queue[:n], func(p *pendingCreate) bool { return p.hold }) {
			// Held since sendHeldData above (a utimes meanwhile): send
			// its bytes first, once more.
			d.mu.Unlock()
			<-d.slots
			heldAgain = true
			c.sendHeldData(ctx)
			continue
		}
		batch := d.queue[:n:n]
		for _, p := range batch {
			p.sent = true
		}
		d.queue = d.queue[n:]
		if len(d.queue) == 0 {
			d.queue = nil
		}
		sent := make(chan struct{})
		if n > 0 {
			if d.inflight == nil {
				d.inflight = make(map[chan struct{}]struct{})
			}
			d.inflight[sent] = struct{}{}
		}
		d.mu.Unlock()
		if n == 0 {
			<-d.slots
			<-last.done // taken by a call in flight
			break
		}
		c.createMany(batch)
		d.mu.Lock()
		delete(d.inflight, sent)
		d.mu.Unlock()
		close(sent)
		<-d.slots
		select {
		case <-last.done:
			last = nil
		default:
		}
	}
	for _, b := range wait {
		<-b
	}
}

// sendHeldData sends the buffered bytes of queued files whose creates
// carry a length those bytes make up (hold), so that the meta service
// never has a length whose bytes the data servers do not; a send that
// fails is reported by the file's close.
func (c *Client) sendHeldData(ctx context.Context) {
	d := &c.deleg
	d.mu.Lock()
	var held []*pendingCreate
	for _, p := range d.queue {
		if p.hold {
			held = append(held, p)
		}
	}
	d.mu.Unlock()
	for _, p := range held {
		if err := p.in.sendAll(ctx, false); err != nil {
			c.log.Warn("sending the data of a file made here before its create failed; its close reports it", "ino", p.nf.Ino, "err", err)
			continue
		}
		c.capCreate(p, p.in)
		d.mu.Lock()
		p.hold = false
		d.mu.Unlock()
	}
}

// createMany sends one batch of made files and delivers each outcome.
// It runs in the background (the files' creators wait on them, not on
// the caller's context), retrying while the meta service is unreachable.
func (c *Client) createMany(batch []*pendingCreate) {
	req := &weftv1.CreateManyRequest{Session: c.Session(), Files: make([]*weftv1.NewFile, len(batch)), Confirmed: c.takeConfirms()}
	for i, p := range batch {
		req.Files[i] = p.nf
	}
	var resp *weftv1.CreateManyResponse
	var err error
	deadline := time.Now().Add(createManyRetryFor)
	for backoff := 20 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		ctx, cancel := context.WithDeadline(c.bg, deadline)
		c.countMeta()
		resp, err = c.meta.CreateMany(ctx, req)
		cancel()
		if err == nil || status.Code(err) != codes.Unavailable || time.Now().Add(backoff).After(deadline) || c.bg.Err() != nil {
			break
		}
		time.Sleep(backoff)
	}
	if err == nil && len(resp.Results) != len(batch) {
		err = fmt.Errorf("meta service answered %d of %d files", len(resp.Results), len(batch))
	}
	if err != nil {
		c.returnConfirms(req.Confirmed)
	} else {
		c.noteUnknownConfirms(resp.Unknown)
	}
	// The meta service answered (or will never): these no longer wait,
	// counted before anyone waiting on one of them wakes.
	c.deleg.waiting.Add(-int64(len(batch)))
	var failed []*weftv1.EntryChange
	for i, p := range batch {
		switch {
		case err != nil:
			p.err = fserr.Wrap(syscall.EIO, "create %q in directory %d (made here under a delegation) could not be sent to the meta service: %v",
				p.nf.Name, p.nf.Parent, err)
		case resp.Results[i].Errno != 0:
			// The create was answered already: what went wrong surfaces
			// as an I/O error of the file (its writes, close, fsync).
			r := resp.Results[i]
			p.err = fserr.Wrap(syscall.EIO, "create %q in directory %d (made here under a delegation) was refused by the meta service: %s",
				p.nf.Name, p.nf.Parent, r.Error)
		default:
			p.attr = resp.Results[i].Attr
		}
		if p.err != nil {
			c.log.Warn("a file made under a create delegation could not be stored; its next write, read or fsync (and close, once it was written) reports the error",
				"dir", p.nf.Parent, "name", p.nf.Name, "err", p.err)
			failed = append(failed, &weftv1.EntryChange{Parent: p.nf.Parent, Name: p.nf.Name})
		}
		close(p.done)
	}
	if len(failed) > 0 {
		// The name this client showed does not exist: forget it here and
		// in the kernel.
		inv := &weftv1.Invalidation{Entries: failed}
		for _, e := range failed {
			inv.Inodes = append(inv.Inodes, e.Parent)
		}
		c.dirs.invalidate(inv)
		if c.cb.hook != nil {
			c.cb.hook(inv)
		}
	}
}

// readyToWrite is ready for a write: a file made here with a layout from
// its grant is written at once (its data goes ahead of its create), unless
// the meta service refused it already.
func (f *File) readyToWrite(ctx context.Context) error {
	if p := f.pending; p.hasLayout() {
		if p.stored() {
			return p.err
		}
		return nil
	}
	return f.ready(ctx)
}

// ready waits until the meta service has the file, if it was made under a
// delegation, and gives the inode its layout.
func (f *File) ready(ctx context.Context) error {
	p := f.pending
	if p == nil {
		return nil
	}
	if err := f.c.awaitCreate(ctx, p); err != nil {
		return err
	}
	if f.in != nil {
		f.in.mu.Lock()
		if f.in.layout == nil {
			f.in.layout = p.attr.Layout
		}
		f.in.mu.Unlock()
	}
	return nil
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
// here that it has (their creates are sent first). Releases wait while it
// runs.
func (c *Client) registerOpens(ctx context.Context) error {
	d := &c.deleg
	if d.nUnreg.Load() == 0 {
		return nil
	}
	c.sendPending(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	var files []*File
	var inos []uint64
	for f := range d.unreg {
		select {
		case <-f.pending.done:
		default:
			continue // made after the sends began: nothing can name it yet
		}
		if f.pending.err == nil {
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
// files made here must be there before anything that could see or
// change their directories, and their opens recorded before anything
// that could remove a name.
func (c *Client) beforeCall(ctx context.Context, method string) error {
	name := method[strings.LastIndexByte(method, '/')+1:]
	if clearsFileAttrs[name] && c.dirs.hasFiles() {
		c.dirs.dropFiles()
	}
	d := &c.deleg
	if d.waiting.Load() == 0 && d.nUnreg.Load() == 0 {
		return nil
	}
	switch name {
	case "Unlink", "Rename", "Link":
		return c.registerOpens(ctx)
	case "Lookup", "GetAttr", "SetAttr", "Create", "Mkdir", "Rmdir", "Symlink", "Readlink", "ReadDir",
		"Open", "Access", "GetXattr", "SetXattr", "ListXattr", "RemoveXattr", "GetLayout", "SetLayout":
		c.sendPending(ctx)
	}
	return nil
}

// afterCall runs when a meta call of this client returned: after a
// change, kept files' attributes go again, and lookups answered while it
// was on its way are not kept (they may predate it).
func (c *Client) afterCall(method string) {
	if clearsFileAttrs[method[strings.LastIndexByte(method, '/')+1:]] {
		c.dirs.dropFiles()
	}
}

// noteCreate counts an answered create in dir and asks for the directory
// once this client makes files there often and knows its names.
func (c *Client) noteCreate(caller *weftv1.Caller, dir uint64) {
	if c.cfg.NoDelegations || !c.cb.live.Load() || caller.GetSession() == "" {
		return
	}
	d := &c.deleg
	now := time.Now()
	d.mu.Lock()
	if d.asking[dir] {
		d.mu.Unlock()
		return
	}
	if d.dirs[dir] != nil {
		// Held, yet this create went to the meta service: the directory
		// is no longer known here (the kernel forgot it).
		d.mu.Unlock()
		if c.dirs.attr(dir) == nil || !c.dirs.known(dir) {
			c.learnDir(caller, dir)
		}
		return
	}
	if d.counts == nil || len(d.counts) >= maxCountedDirs {
		d.counts = make(map[uint64]*createCount)
	}
	cc := d.counts[dir]
	if cc == nil || now.Sub(cc.since) > delegateWindow {
		cc = &createCount{since: now}
		d.counts[dir] = cc
	}
	cc.n++
	ask := cc.n >= delegateAfter
	d.mu.Unlock()
	if !ask {
		return
	}
	if c.dirs.attr(dir) != nil && c.dirs.known(dir) {
		c.askDelegation(caller, dir)
		return
	}
	c.learnDir(caller, dir)
}

// learnDir learns, in the background, the attributes and names of a
// directory this client creates files in often but does not know
// completely (it was never listed here, or the kernel forgot it), then
// asks for its delegation: one listing, and the creates that follow are
// answered here. A directory too big for one listing page, or one the
// caller may not list, is left alone.
func (c *Client) learnDir(caller *weftv1.Caller, dir uint64) {
	d := &c.deleg
	d.mu.Lock()
	if time.Since(d.unlearned[dir]) < relearnAfter || !d.claimLocked(dir) {
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	c.background(10*time.Second, func(ctx context.Context) {
		var err error
		// A listing overtaken by a change of the directory (this
		// client's own creates go on meanwhile) is not taken: try a few
		// times.
		for attempt := 0; attempt < 4 && err == nil && (c.dirs.attr(dir) == nil || !c.dirs.known(dir)); attempt++ {
			if c.dirs.attr(dir) == nil {
				_, err = c.getAttr(ctx, dir)
			}
			if err == nil && !c.dirs.known(dir) {
				var more bool
				if _, more, err = c.ReadDir(ctx, caller, dir, "", false); err == nil && more {
					break // too big to know here
				}
			}
		}
		d.mu.Lock()
		delete(d.asking, dir)
		if err != nil || !c.dirs.known(dir) {
			// Too big for one page, not listable by the caller, or
			// changing all the time: not tried again for a while.
			if d.unlearned == nil || len(d.unlearned) >= maxCountedDirs {
				d.unlearned = make(map[uint64]time.Time)
			}
			d.unlearned[dir] = time.Now()
		}
		held := d.dirs[dir] != nil
		d.mu.Unlock()
		if err != nil {
			c.log.Debug("directory not learned for a create delegation", "dir", dir, "err", err)
			return
		}
		if !held && c.dirs.attr(dir) != nil && c.dirs.known(dir) {
			c.askDelegation(caller, dir)
		}
	})
}

// background runs fn on a goroutine of the client's (Close waits for
// it) with a context that ends after timeout, or when the client closes.
func (c *Client) background(timeout time.Duration, fn func(ctx context.Context)) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(c.bg, timeout)
		defer cancel()
		fn(ctx)
	}()
}

// claimLocked marks dir as being asked for (a listing or a grant under
// way), unless it already is; it reports whether it was not.
func (d *delegState) claimLocked(dir uint64) bool {
	if d.asking == nil {
		d.asking = make(map[uint64]bool)
	}
	if d.asking[dir] {
		return false
	}
	d.asking[dir] = true
	return true
}

// askDelegation asks the meta service for dir in the background (also to
// get more inode numbers for a directory already held).
func (c *Client) askDelegation(caller *weftv1.Caller, dir uint64) {
	d := &c.deleg
	d.mu.Lock()
	if !d.claimLocked(dir) {
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	c.background(10*time.Second, func(ctx context.Context) {
		sess := caller.GetSession()
		c.countMeta()
		resp, err := c.meta.Delegate(ctx, &weftv1.DelegateRequest{Caller: caller, Dir: dir, NoInos: c.enoughInos()})
		d.mu.Lock()
		delete(d.asking, dir)
		d.mu.Unlock()
		if err != nil {
			c.log.Debug("create delegation not granted", "dir", dir, "err", err)
			return
		}
		c.installGrant(dir, sess, resp)
	})
}

// enoughInos reports whether the inode numbers left from earlier grants
// are plenty (a quarter of a grant's), so a new grant need not reserve
// more.
func (c *Client) enoughInos() bool {
	d := &c.deleg
	d.mu.Lock()
	defer d.mu.Unlock()
	var n uint64
	for _, r := range d.inos {
		n += r[1] - r[0]
	}
	return n >= 1024
}

// delegateAtMkdir reports whether a mkdir in parent should ask for the new
// directory's delegation at once: while this client is making files (it
// holds parent, or made a file under a delegation in the last second),
// as when unpacking a tarball, so that even the first files made in the
// new directory are made here.
func (c *Client) delegateAtMkdir(parent uint64, caller *weftv1.Caller) bool {
	d := &c.deleg
	if c.cfg.NoDelegations || !c.cb.live.Load() || caller.GetSession() == "" || d.held.Load() >= maxHeldDirs {
		return false
	}
	if time.Since(time.Unix(0, d.lastMade.Load())) < delegateWindow {
		return true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dirs[parent] != nil
}

// installGrant takes a delegation the meta service granted (to Delegate,
// or with a Mkdir).
func (c *Client) installGrant(dir uint64, sess string, resp *weftv1.DelegateResponse) {
	d := &c.deleg
	d.mu.Lock()
	switch {
	case !resp.GetGranted():
		d.mu.Unlock()
		return
	case d.early[dir] == resp.Generation:
		// Recalled before this answer came: it is returned already.
		delete(d.early, dir)
		d.mu.Unlock()
		return
	}
	if d.dirs == nil {
		d.dirs = make(map[uint64]*delegDir)
	}
	dd := d.dirs[dir]
	if dd == nil || dd.gen != resp.Generation {
		if dd == nil {
			d.held.Add(1)
		}
		dd = &delegDir{gen: resp.Generation, session: sess}
		d.dirs[dir] = dd
		d.granted.Add(1)
	}
	if len(resp.Layouts) > 0 {
		dd.layouts = resp.Layouts
	}
	if resp.InoCount > 0 {
		d.inos = append(d.inos, [2]uint64{resp.InoFirst, resp.InoFirst + resp.InoCount})
	}
	d.mu.Unlock()
}

// handleRecalls returns the delegations a callback recalls (all of them
// with Invalidation.all: the meta service may have restarted and
// forgotten them), in the background.
func (c *Client) handleRecalls(inv *weftv1.Invalidation) {
	d := &c.deleg
	if len(inv.Recalls) == 0 && !(inv.All && d.held.Load() > 0) {
		return
	}
	type ret struct{ dir, gen uint64 }
	var rets []ret
	d.mu.Lock()
	for _, r := range inv.Recalls {
		if dd := d.dirs[r.Dir]; dd != nil && dd.gen == r.Generation {
			dd.recalled = true
		} else {
			if d.early == nil {
				d.early = make(map[uint64]uint64)
			}
			d.early[r.Dir] = r.Generation
		}
		rets = append(rets, ret{r.Dir, r.Generation})
	}
	if inv.All {
		for dir, dd := range d.dirs {
			if !dd.recalled {
				dd.recalled = true
				rets = append(rets, ret{dir, dd.gen})
			}
		}
	}
	d.mu.Unlock()
	c.background(30*time.Second, func(ctx context.Context) {
		c.sendPending(ctx)
		if err := c.registerOpens(ctx); err != nil {
			c.log.Warn("recording the opens of files made under a recalled delegation failed", "err", err)
		}
		for _, r := range rets {
			c.countMeta()
			_, err := c.meta.ReturnDelegation(ctx, &weftv1.ReturnDelegationRequest{Session: c.Session(), Dir: r.dir, Generation: r.gen})
			if err != nil && !errors.Is(err, context.Canceled) {
				c.log.Debug("returning a create delegation failed (the meta service revokes it)", "dir", r.dir, "err", err)
			}
			d.mu.Lock()
			if dd := d.dirs[r.dir]; dd != nil && dd.gen == r.gen {
				delete(d.dirs, r.dir)
				d.held.Add(-1)
			}
			d.mu.Unlock()
		}
	})
}
