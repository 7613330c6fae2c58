package client

import (
	"context"
	"errors"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Delegations of directories (asking for them, the grants and their recalls).

// noteCreate counts an answered create (or remove) in dir and asks for
// the directory once this client makes files there often and knows its
// names.
func (c *Client) noteCreate(caller *weftv1.Caller, dir uint64) {
	if c.cfg.Testing.NoDelegations || !c.cb.live.Load() || caller.GetSession() == "" {
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
	if c.cfg.Testing.NoDelegations || !c.cb.live.Load() || caller.GetSession() == "" || d.held.Load() >= maxHeldDirs {
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
