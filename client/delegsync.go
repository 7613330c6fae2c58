package client

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/fserr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Files made and removes answered under a delegation and not sent yet
// (delegate.go, delegremove.go) are known to this client only: calls that
// name them, or promise their names durable, send them first.

// SyncDir makes the names made and removed in directory dir durable:
// creates and removes this client answered under a delegation and has not
// sent yet are sent, and it returns once the meta service has answered
// every one made before the call (fsync of a directory). The first of
// dir's removes the meta service refused since the last SyncDir of dir,
// else the first of its creates that failed, is the error.
func (c *Client) SyncDir(ctx context.Context, dir uint64) error {
	d := &c.deleg
	c.sendRemoves(ctx)
	if err := c.takeRemoveErr(dir); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	if d.waiting.Load() == 0 {
		return nil
	}
	d.mu.Lock()
	var mine []*pendingCreate
	for _, p := range d.queue {
		if p.nf.GetParent() == dir {
			mine = append(mine, p)
		}
	}
	d.mu.Unlock()
	c.sendPending(ctx)
	for _, p := range mine {
		select {
		case <-p.done:
			if p.err != nil {
				return p.err
			}
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return nil
}

// pendingTimer sends the queued files once the oldest has waited
// pendingDelay, so that each file gets its time to be written and closed
// first (its length then goes with its create), not only the file that
// started the timer.
func (c *Client) pendingTimer() {
	d := &c.deleg
	d.mu.Lock()
	if len(d.removes) > 0 {
		// Removes wait for nothing: they go now, and the creates when
		// their time comes.
		d.mu.Unlock()
		c.sendRemoves(c.bg)
		d.mu.Lock()
	}
	var oldest *pendingCreate
	for _, p := range d.queue {
		if p.flushing == 0 && !p.hold {
			oldest = p
			break
		}
	}
	if oldest == nil {
		// Nothing queued, or only files being flushed: those send
		// themselves, or arm the timer again (endFlush). Removes queued
		// meanwhile wait for the next round.
		d.timer = false
		if len(d.removes) > 0 {
			c.armPendingLocked()
		}
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
	if !d.timer && len(d.queue)+len(d.removes) > 0 {
		d.timer = true
		time.AfterFunc(c.createSendDelay(), c.pendingTimer)
	}
}

// createSendDelay is Config.Testing.CreateSendDelay or pendingDelay.
func (c *Client) createSendDelay() time.Duration {
	if c.cfg.Testing.CreateSendDelay > 0 {
		return c.cfg.Testing.CreateSendDelay
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

// sendPending sends every queued remove and file and returns once every
// one answered here before it was called is answered by the meta service.
func (c *Client) sendPending(ctx context.Context) {
	c.sendRemoves(ctx)
	c.sendCreates(ctx)
}

// sendCreates sends every queued file (in CreateMany calls, up to
// maxCreateManyInFlight at once: what queues while they are all out
// goes in the next) and returns once every file made before it was
// called is answered (also those of calls already in flight). Removes
// answered here before a file was made go first: the file may take a
// removed name.
func (c *Client) sendCreates(ctx context.Context) {
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
		if len(d.removes)+len(d.removeFlight) > 0 {
			d.mu.Unlock()
			<-d.slots
			if ctx.Err() != nil {
				return // the callers wait for their files with ctx
			}
			c.sendRemoves(ctx)
			continue
		}
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
	req := &weftv1.CreateManyRequest{Session: c.Session(), Files: make([]*weftv1.NewFile, len(batch))}
	for i, p := range batch {
		req.Files[i] = p.nf
	}
	var resp *weftv1.CreateManyResponse
	var err error
	deadline := time.Now().Add(createManyRetryFor)
	for backoff := 20 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		ctx, cancel := context.WithDeadline(withQueuedSend(c.bg), deadline)
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
			if c.cb.live.Load() {
				// Known here now: its unlink may be answered here.
				c.dirs.putMade(p.nf.Parent, p.nf.Name, p.attr)
			}
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
