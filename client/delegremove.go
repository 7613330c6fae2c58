package client

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/perm"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Removes under a delegation (README.md "Create delegations"). While this
// client holds a directory and knows one of its regular files completely
// (its kept attributes, filecache.go: inode, owner, one link), an unlink
// of it is checked here with the meta service's rules (package perm) and
// answered at once: the name leaves the complete-directory cache, the
// file's kept attributes go, and the remove is queued. Queued removes go
// to the meta service as ordinary Unlink calls, sent together (one batch,
// one commit), before any queued create (a name removed here may be made
// again), and before every other call of this client that could see them
// (beforeCall): after pendingDelay, at an fsync of the directory
// (SyncDir), when the delegation is recalled, and when the client closes.

const (
	// maxQueuedRemoves bounds the removes answered here that the meta
	// service does not have yet; past it, unlinks go to the meta service
	// (which first sends the queue).
	maxQueuedRemoves = 4096
	// removeSendFor is how long sending a batch of removes may take.
	removeSendFor = time.Minute
)

// pendingRemove is an unlink answered here, until the meta service has
// answered it.
type pendingRemove struct {
	caller *weftv1.Caller
	parent uint64
	name   string
	ino    uint64
}

// queuedSendKey marks the context of a queued call being sent (a remove,
// a CreateMany): it needs nothing sent first, and it changes no kept file
// (keepFilesKey): a removed file's attributes went when the remove was
// answered, a made file is new.
type queuedSendKey struct{}

// queuedSend reports whether ctx is that of a queued call being sent.
func queuedSend(ctx context.Context) bool { return ctx.Value(queuedSendKey{}) != nil }

// withQueuedSend marks ctx as that of a queued call being sent.
func withQueuedSend(ctx context.Context) context.Context {
	return context.WithValue(keepFiles(ctx), queuedSendKey{}, true)
}

// keepFilesKey marks the context of a call that changes no kept file
// other than those its caller drops itself: no kept file's attributes
// are dropped for it (beforeCall, afterCall).
type keepFilesKey struct{}

// keepFiles marks ctx with keepFilesKey.
func keepFiles(ctx context.Context) context.Context {
	return context.WithValue(ctx, keepFilesKey{}, true)
}

// keepsFiles reports whether ctx is marked with keepFilesKey.
func keepsFiles(ctx context.Context) bool { return ctx.Value(keepFilesKey{}) != nil }

// removeLocal answers an unlink of name in parent here if this client
// holds parent's delegation and knows the entry; ok is false when the
// unlink must go to the meta service (which then also says why not, if
// the caller may not remove it).
func (c *Client) removeLocal(caller *weftv1.Caller, parent uint64, name string) (ok bool) {
	d := &c.deleg
	if d.held.Load() == 0 || d.nRemoves.Load() >= maxQueuedRemoves || !c.cb.live.Load() {
		return false
	}
	dirAttr := c.dirs.attr(parent)
	child := c.dirs.file(parent, name)
	// A file with other links is left to the meta service: their kept
	// attributes would change.
	if dirAttr == nil || child == nil || !perm.IsReg(child.Mode) || child.Nlink != 1 ||
		perm.Of(caller).CheckRemove(dirAttr, child, "unlink") != nil {
		return false
	}
	sess := c.Session()
	d.mu.Lock()
	defer d.mu.Unlock()
	dd := d.dirs[parent]
	if dd == nil || dd.recalled || dd.session != sess || !c.dirs.removeKnown(parent, name, child.Ino, time.Now().UnixNano()) {
		return false
	}
	d.removes = append(d.removes, &pendingRemove{caller: caller, parent: parent, name: name, ino: child.Ino})
	if d.removeNames == nil {
		d.removeNames = make(map[entryKey]int)
	}
	d.removeNames[entryKey{parent, name}]++
	d.nRemoves.Add(1)
	c.armPendingLocked()
	d.removed.Add(1)
	return true
}

// LocalRemoves reports how many unlinks were answered here under
// delegations.
func (c *Client) LocalRemoves() uint64 { return c.deleg.removed.Load() }

// PendingRemoves reports how many unlinks answered here the meta service
// has not answered yet.
func (c *Client) PendingRemoves() int64 { return c.deleg.nRemoves.Load() }

// removeQueued reports whether a remove of name in parent answered here
// has not been answered by the meta service yet.
func (c *Client) removeQueued(parent uint64, name string) bool {
	d := &c.deleg
	if d.nRemoves.Load() == 0 {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.removeNames[entryKey{parent, name}] > 0
}

// sendRemoves sends the queued removes and returns once every remove
// queued before it was called is answered (also those being sent by
// others), or ctx ends.
func (c *Client) sendRemoves(ctx context.Context) {
	d := &c.deleg
	if d.nRemoves.Load() == 0 {
		return
	}
	d.mu.Lock()
	batch := d.removes
	d.removes = nil
	var wait []chan struct{}
	for ch := range d.removeFlight {
		wait = append(wait, ch)
	}
	done := make(chan struct{})
	if len(batch) > 0 {
		if d.removeFlight == nil {
			d.removeFlight = make(map[chan struct{}]struct{})
		}
		d.removeFlight[done] = struct{}{}
	}
	d.mu.Unlock()
	if len(batch) > 0 {
		c.unlinkAll(batch)
		d.mu.Lock()
		delete(d.removeFlight, done)
		d.mu.Unlock()
		close(done)
	}
	for _, ch := range wait {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// unlinkAll sends a batch of queued removes, all at once so that they go
// together, and delivers each outcome. It runs on the client's context
// (the removes were answered already). The opens this client holds of
// files made here are recorded first: a file removed while open lives
// on. When they of files made here
// could not be recorded first, none is sent: each fails.
func (c *Client) unlinkAll(batch []*pendingRemove) {
	ctx, cancel := context.WithTimeout(withQueuedSend(c.bg), removeSendFor)
	defer cancel()
	regErr := c.registerOpens(ctx)
	errs := make([]error, len(batch))
	var wg sync.WaitGroup
	for i, r := range batch {
		if regErr != nil {
			errs[i] = regErr
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.countMeta()
			_, errs[i] = c.meta.Unlink(ctx, &weftv1.RemoveRequest{Caller: r.caller, Parent: r.parent, Name: r.name})
		}()
	}
	wg.Wait()
	d := &c.deleg
	var failed []*weftv1.EntryChange
	d.mu.Lock()
	for i, r := range batch {
		k := entryKey{r.parent, r.name}
		if d.removeNames[k]--; d.removeNames[k] <= 0 {
			delete(d.removeNames, k)
		}
		if errs[i] == nil {
			continue
		}
		err := fserr.Wrap(syscall.EIO, "unlink %q in directory %d (answered here under a delegation) was refused by the meta service: %v",
			r.name, r.parent, errs[i])
		c.log.Warn("a remove answered here could not be stored; the name is back, and the next fsync of its directory reports the error",
			"dir", r.parent, "name", r.name, "ino", r.ino, "err", err)
		if d.removeErrs == nil {
			d.removeErrs = make(map[uint64]error)
		}
		if d.removeErrs[r.parent] == nil {
			d.removeErrs[r.parent] = err
		}
		failed = append(failed, &weftv1.EntryChange{Parent: r.parent, Name: r.name})
	}
	d.nRemoveErrs.Store(int64(len(d.removeErrs)))
	d.mu.Unlock()
	d.nRemoves.Add(-int64(len(batch)))
	if len(failed) > 0 {
		// The name this client removed exists: forget what it knows of
		// the directory, here and in the kernel.
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

// takeRemoveErr returns, once, the first remove answered here in dir that
// the meta service refused.
func (c *Client) takeRemoveErr(dir uint64) error {
	d := &c.deleg
	if d.nRemoveErrs.Load() == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.removeErrs[dir]
	delete(d.removeErrs, dir)
	d.nRemoveErrs.Store(int64(len(d.removeErrs)))
	return err
}
