package client

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

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
	c    *Client
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
	// Removes answered here (delegremove.go): queued, their entries
	// (queued or being sent), batches being sent (closed when
	// answered), and per directory the first one the meta service
	// refused, for its next fsync.
	removes      []*pendingRemove
	removeNames  map[entryKey]int
	removeFlight map[chan struct{}]struct{}
	removeErrs   map[uint64]error
	nRemoves     atomic.Int64  // queued or being sent
	nRemoveErrs  atomic.Int64  // len(removeErrs)
	removed      atomic.Uint64 // removes answered here
	made         atomic.Uint64 // files made here
	lastMade     atomic.Int64  // when the last one was made (Unix ns)
	granted      atomic.Uint64 // grants received
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
	who := perm.Of(caller)
	if dirAttr == nil || !who.Allowed(dirAttr, perm.MayWrite|perm.MayExec) {
		return nil, nil, false // the meta service says why not
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
	p := &pendingCreate{c: c, nf: nf, made: time.Now(), done: make(chan struct{})}
	// As the meta service makes it (owner, group, setgid rules).
	attr = perm.NewAttr(who, dirAttr, syscall.S_IFREG|mode&0o7777, ino, now)
	attr.Layout = nf.Layout
	// The name goes into the complete-directory cache before anyone can
	// look it up, under the delegation's lock (a recall waits for it).
	c.dirs.add(parent, name, true, now)
	d.queue = append(d.queue, p)
	d.waiting.Add(1)
	c.armPendingLocked()
	p.cur = proto.Clone(attr).(*weftv1.Attr)
	f = c.newFile(attr, flags, sess, caller)
	f.made = p
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
