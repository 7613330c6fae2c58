package mount

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Limits of the notifier.
const (
	// maxTrackedNames bounds the names (positive and negative entries)
	// the mount remembers having handed to the kernel with a long entry
	// timeout; past it, new entries get the short timeout.
	maxTrackedNames = 1 << 19
	// maxTrackedNegative bounds the negative entries among them.
	maxTrackedNegative = 1 << 16
	// maxQueued is how many callbacks wait for the notifier goroutine
	// before they collapse into one "drop everything".
	maxQueued = 1024
)

// nameRef is a directory entry the kernel may cache.
type nameRef struct {
	parent uint64
	name   string
}

// notifier turns the meta service's callbacks into FUSE notifications
// (InodeNotify, EntryNotify). It runs them on its own goroutine, never
// inside a FUSE request: a notification waits for locks the kernel may
// hold while it waits for a request of ours.
//
// It also remembers the names it let the kernel cache for long, so that a
// callback saying "drop everything" (stream restart, server overflow, or
// the stream breaking) can invalidate each of them.
type notifier struct {
	fs *weftFS

	mu      sync.Mutex
	queue   []*weftv1.Invalidation
	all     bool // an "all" is queued
	wake    chan struct{}
	byName  map[nameRef]uint64   // entry -> child inode (0: negative)
	byChild map[uint64][]nameRef // child inode -> its entries
	negs    int

	// Counters (tests, status).
	inodeNotes, entryNotes, allNotes atomic.Uint64
}

func newNotifier(fs *weftFS) *notifier {
	return &notifier{
		fs: fs, wake: make(chan struct{}, 1),
		byName: make(map[nameRef]uint64), byChild: make(map[uint64][]nameRef),
	}
}

// deliver queues a callback; it never blocks (the client's stream
// goroutine calls it).
func (n *notifier) deliver(inv *weftv1.Invalidation) {
	n.mu.Lock()
	switch {
	case inv.All || len(n.queue) >= maxQueued:
		n.all = true
		n.queue = nil
	case !n.all:
		n.queue = append(n.queue, inv)
	}
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// run sends the queued notifications until done is closed.
func (n *notifier) run(done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-n.wake:
		}
		n.mu.Lock()
		all, queue := n.all, n.queue
		n.all, n.queue = false, nil
		n.mu.Unlock()
		srv := n.fs.srv
		if srv == nil {
			continue
		}
		if all {
			n.dropAll(srv)
			continue
		}
		for _, inv := range queue {
			for _, e := range inv.Entries {
				n.untrack(nameRef{e.Parent, e.Name})
				srv.EntryNotify(e.Parent, e.Name)
				n.entryNotes.Add(1)
			}
			for _, ino := range inv.Inodes {
				// Offset 0, length 0: attributes and every cached page.
				srv.InodeNotify(ino, 0, 0)
				n.inodeNotes.Add(1)
			}
		}
	}
}

// dropAll invalidates every name and inode the kernel may hold from us.
func (n *notifier) dropAll(srv *fuse.Server) {
	n.allNotes.Add(1)
	n.mu.Lock()
	names := make([]nameRef, 0, len(n.byName))
	for r := range n.byName {
		names = append(names, r)
	}
	clear(n.byName)
	clear(n.byChild)
	n.negs = 0
	n.mu.Unlock()
	n.fs.mu.Lock()
	inos := make([]uint64, 0, len(n.fs.told))
	for ino := range n.fs.told {
		inos = append(inos, ino)
	}
	n.fs.mu.Unlock()
	for _, r := range names {
		srv.EntryNotify(r.parent, r.name)
	}
	for _, ino := range inos {
		srv.InodeNotify(ino, 0, 0)
	}
}

// track remembers that the kernel got entry parent/name -> child (0:
// negative) with a long timeout; false if it may not (too many
// remembered): then the entry must get the short timeout.
func (n *notifier) track(parent uint64, name string, child uint64) bool {
	r := nameRef{parent, name}
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.byName[r]; ok {
		if old == child {
			return true
		}
		n.untrackLocked(r)
	}
	if len(n.byName) >= maxTrackedNames || (child == 0 && n.negs >= maxTrackedNegative) {
		return false
	}
	n.byName[r] = child
	if child == 0 {
		n.negs++
	} else {
		n.byChild[child] = append(n.byChild[child], r)
	}
	return true
}

func (n *notifier) untrack(r nameRef) {
	n.mu.Lock()
	n.untrackLocked(r)
	n.mu.Unlock()
}

func (n *notifier) untrackLocked(r nameRef) {
	child, ok := n.byName[r]
	if !ok {
		return
	}
	delete(n.byName, r)
	if child == 0 {
		n.negs--
		return
	}
	list := n.byChild[child]
	for i, x := range list {
		if x == r {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(n.byChild, child)
	} else {
		n.byChild[child] = list
	}
}

// forgetChild drops the names of an inode the kernel forgot.
func (n *notifier) forgetChild(child uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, r := range n.byChild[child] {
		delete(n.byName, r)
	}
	delete(n.byChild, child)
}

// renamed moves the remembered name of a renamed entry (the kernel moved
// its dentry, keeping its timeout).
func (n *notifier) renamed(oldParent uint64, oldName string, newParent uint64, newName string) {
	n.mu.Lock()
	child, ok := n.byName[nameRef{oldParent, oldName}]
	n.mu.Unlock()
	n.untrack(nameRef{oldParent, oldName})
	n.untrack(nameRef{newParent, newName})
	if ok && child != 0 && !n.track(newParent, newName, child) {
		// Not remembered: it must not stay cached for long unseen.
		if srv := n.fs.srv; srv != nil {
			go srv.EntryNotify(newParent, newName)
		}
	}
}

// attrTTL is the attribute timeout to hand the kernel now: the long one
// while callbacks reach us, the short one otherwise.
func (fs *weftFS) attrTTL() time.Duration {
	if fs.opts.callbacks && !fs.c.CallbacksLive() {
		return min(fs.opts.AttrTimeout, ShortTimeout)
	}
	return fs.opts.AttrTimeout
}

// entryTTL is the entry timeout for parent/name -> child (0: negative)
// as handed to the kernel now: long only while callbacks reach us and the
// name is remembered for a "drop everything".
func (fs *weftFS) entryTTL(parent uint64, name string, child uint64) time.Duration {
	if !fs.opts.callbacks {
		return fs.opts.EntryTimeout
	}
	if !fs.c.CallbacksLive() || !fs.notes.track(parent, name, child) {
		return min(fs.opts.EntryTimeout, ShortTimeout)
	}
	return fs.opts.EntryTimeout
}

// plainEntryTTL is the entry timeout of an entry not (yet) remembered:
// the short one with callbacks (noteEntry makes it long).
func (fs *weftFS) plainEntryTTL() time.Duration {
	if fs.opts.callbacks {
		return min(fs.opts.EntryTimeout, ShortTimeout)
	}
	return fs.opts.EntryTimeout
}

// noteEntry sets out's entry timeout for parent/name (after fillEntry).
func (fs *weftFS) noteEntry(parent uint64, name string, out *fuse.EntryOut) {
	if fs.opts.callbacks {
		out.SetEntryTimeout(fs.entryTTL(parent, name, out.NodeId))
	}
}

// negativeEntry answers a lookup of a missing name with a negative entry
// the kernel may cache (callbacks on and live): true if it did.
func (fs *weftFS) negativeEntry(parent uint64, name string, out *fuse.EntryOut) bool {
	if !fs.opts.callbacks || !fs.c.CallbacksLive() || !fs.notes.track(parent, name, 0) {
		return false
	}
	*out = fuse.EntryOut{}
	out.SetEntryTimeout(fs.opts.EntryTimeout)
	return true
}

// forgotten is called for a FUSE FORGET: the kernel dropped the inode.
func (fs *weftFS) forgotten(ino uint64) {
	if !fs.opts.callbacks {
		return
	}
	fs.notes.forgetChild(ino)
	fs.c.Forget(ino)
}

// NotifyCounts reports the FUSE notifications sent for callbacks: inode
// and entry invalidations and "drop everything" sweeps.
func (m *FS) NotifyCounts() (inodes, entries, alls uint64) {
	n := m.fs.notes
	if n == nil {
		return 0, 0, 0
	}
	return n.inodeNotes.Load(), n.entryNotes.Load(), n.allNotes.Load()
}
