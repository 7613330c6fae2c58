package client

import (
	"context"
	"slices"

	"google.golang.org/grpc/status"
)

// Files made under a delegation and not sent yet (delegate.go) are known
// to this client only: calls that name them, or promise their names
// durable, send them first.

// SyncDir makes the names made in directory dir durable: creates this
// client made under a delegation and has not sent yet are sent, and it
// returns once the meta service has answered every create made before
// the call (fsync of a directory). The first of dir's creates that failed
// is the error.
func (c *Client) SyncDir(ctx context.Context, dir uint64) error {
	d := &c.deleg
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

// sendPendingFile sends file ino first if it was made here and not sent
// yet (locks, extended attributes: the meta service must have it).
func (c *Client) sendPendingFile(ctx context.Context, ino uint64) {
	d := &c.deleg
	if d.waiting.Load() == 0 {
		return
	}
	d.mu.Lock()
	needed := len(d.inflight) > 0 || slices.ContainsFunc(d.queue, func(p *pendingCreate) bool { return p.nf.GetIno() == ino })
	d.mu.Unlock()
	if needed {
		c.sendPending(ctx)
	}
}

// sendPendingIn sends the files made here and not sent yet before a call
// that names entries of dirs (unlink, rename, link): the meta service
// must have them first, or the call finds no such name. With no dirs it
// sends them if there are any (rmdir: the directory's own files are not
// known by its parent).
func (c *Client) sendPendingIn(ctx context.Context, dirs ...uint64) {
	d := &c.deleg
	if d.waiting.Load() == 0 {
		return
	}
	d.mu.Lock()
	needed := len(dirs) == 0 || len(d.inflight) > 0
	for _, p := range d.queue {
		if needed {
			break
		}
		needed = slices.Contains(dirs, p.nf.GetParent())
	}
	d.mu.Unlock()
	if needed {
		c.sendPending(ctx)
	}
}
