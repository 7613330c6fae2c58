package client

import (
	"context"
	"slices"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Closes with the data and the create at once (README.md "Create
// delegations", meta/inflight.go). The close of a small file made here
// whose create is not sent yet sends its data to the data servers and
// its create, with the length, to the meta service together, marked
// data_in_flight, and returns once both answered. The meta service keeps
// a record of the file until this client confirms the data: with the
// next CreateMany, or alone after confirmDelay. If this client dies
// between the two answers, the meta service settles the file against
// the data servers when the session ends (cut to length 0 if its data is
// not there), so no file shows a length whose bytes were never written.

const (
	// confirmDelay is how long confirmations wait for a CreateMany to
	// carry them before they go alone: long enough that a stream of
	// creates with pauses carries them all, short enough that records
	// do not pile up (each costs a chunk read if the client dies).
	confirmDelay = time.Second
	// maxConfirmsQueued bounds the confirmations kept while the meta
	// service cannot be reached; those beyond it are left to the meta
	// service's settling when the session ends (the data is there).
	maxConfirmsQueued = 4096
)

// inFlightSafeFor is how long after its create went a file's data may be
// acknowledged and still be confirmed later: the session that made the
// file cannot have ended before it (the session is renewed every third
// of its lease, and ends a lease after its last renewal). Data
// acknowledged later is confirmed before the close returns.
func (c *Client) inFlightSafeFor() time.Duration {
	c.sessionMu.Lock()
	defer c.sessionMu.Unlock()
	return c.lease / 6
}

// flushInFlight is the final flush of a file made here whose create is
// not sent yet, when all its bytes are in its first chunk: the data and
// the create go at once. done is false when the file does not qualify
// (the caller flushes it the usual way).
func (in *inode) flushInFlight(ctx context.Context, p *pendingCreate, durable bool) (done bool, err error) {
	c := in.c
	if !p.hasLayout() || c.cfg.SerialCloses {
		return false, nil
	}
	in.commitMu.Lock()
	defer in.commitMu.Unlock()
	in.mu.Lock()
	seq, size, mtime, written := in.writeSeq, in.localEnd, in.mtimeNs, in.writtenLocked()
	ok := in.pending == p && len(in.lost) == 0 && len(in.unsynced) == 0
	in.mu.Unlock()
	if !ok {
		return false, nil
	}
	d := &c.deleg
	d.mu.Lock()
	// Writes not committed yet, or committed into the create by a time
	// change (setAttrLocal: the create holds their length, their bytes
	// are still here).
	if p.sent || !(written || p.nf.Committed && p.hold) {
		d.mu.Unlock()
		return false, nil
	}
	if written {
		size, mtime = max(size, p.nf.Size), max(mtime, p.nf.MtimeNs)
	} else {
		size, mtime = p.nf.Size, p.nf.MtimeNs
	}
	if size == 0 || size > uint64(p.nf.Layout.ChunkSize) {
		d.mu.Unlock()
		return false, nil
	}
	p.nf.Committed, p.nf.Size, p.nf.MtimeNs, p.nf.DataInFlight = true, size, mtime, true
	// The create may go before the bytes now: the record covers it.
	p.hold = false
	d.mu.Unlock()

	sentAt := time.Now()
	created := make(chan error, 1)
	go func() { created <- c.awaitCreate(ctx, p) }()
	in.mu.Lock()
	errsBefore := in.errs.seq
	in.mu.Unlock()
	dataErr := in.sendDurably(ctx, durable)
	in.mu.Lock()
	if dataErr == nil && (len(in.lost) > 0 || in.errs.seq != errsBefore) {
		dataErr = in.errs.err // the send or the sync failed (recorded; the close reports it)
	}
	in.mu.Unlock()
	dataOK := dataErr == nil && time.Since(sentAt) <= c.inFlightSafeFor()
	if err := <-created; err != nil {
		if !p.stored() {
			// The caller gave up (its context ended) while the create
			// was on its way: settle the file once it is stored.
			c.settleWhenStored(p, dataOK)
		}
		// Else refused or never stored: as for any create made here,
		// the error is the file's; its chunks belong to no file (fsck).
		return true, err
	}
	in.mu.Lock()
	in.pending = nil
	in.mu.Unlock()
	c.inFlightCloses.Add(1)
	if dataErr != nil {
		// The meta service has the length, the data servers perhaps
		// not the bytes: it settles the file (it keeps the length if
		// the bytes arrived after all, else cuts the file to 0). The
		// close reports the error.
		if ctx.Err() != nil {
			// Interrupted: the sends go on; settle once they are done,
			// so that none lands after the file was cut.
			in.mu.Lock()
			ops := in.sendsLocked()
			in.mu.Unlock()
			c.background(createManyRetryFor, func(bctx context.Context) {
				if waitOps(bctx, ops) == nil {
					c.settleUnwritten(p.nf.Ino)
				}
			})
			return true, dataErr
		}
		emptied := c.settleUnwritten(p.nf.Ino)
		in.mu.Lock()
		if emptied {
			in.metaSize = 0
		} else {
			in.metaSize = p.attr.GetSize()
		}
		in.attrGen++
		in.mu.Unlock()
		return true, dataErr
	}
	if !dataOK {
		// Acknowledged late: the session may have ended meanwhile.
		if err := c.confirmNow(ctx, p.nf.Ino); err != nil {
			return true, err
		}
	} else {
		c.queueConfirm(p.nf.Ino)
	}
	attr := p.attr
	in.mu.Lock()
	in.metaSize, in.metaMtimeNs = attr.GetSize(), attr.GetMtimeNs()
	in.attrGen++
	if written && in.writeSeq == seq {
		in.committedSeq = seq
		in.localEnd = 0
	}
	in.mu.Unlock()
	return true, nil
}

// settleWhenStored waits in the background for the create of p, sent
// with its data in flight by a close that gave up waiting, and then
// confirms its data (dataOK: the data servers acknowledged it in time)
// or has the meta service settle the file.
func (c *Client) settleWhenStored(p *pendingCreate, dataOK bool) {
	c.background(createManyRetryFor+time.Minute, func(ctx context.Context) {
		select {
		case <-p.done:
		case <-ctx.Done():
			return // settled when the session ends
		}
		if p.err != nil {
			return
		}
		if dataOK {
			c.queueConfirm(p.nf.Ino)
			return
		}
		c.settleUnwritten(p.nf.Ino)
	})
}

// settleUnwritten has the meta service settle ino, whose data may not
// have reached the data servers, and reports whether it cut the file to
// length 0. If the meta service cannot be told now, it is told in the
// background (retrying for a minute), or settles the file itself when
// the session ends.
func (c *Client) settleUnwritten(ino uint64) (emptied bool) {
	ctx, cancel := context.WithTimeout(c.bg, sessionCallTimeout)
	emptied, err := c.reportUnwritten(ctx, ino)
	cancel()
	if err == nil || c.bg.Err() != nil {
		return emptied
	}
	c.log.Warn("a file whose data could not be written could not be reported to the meta service; retrying",
		"ino", ino, "err", err)
	c.background(time.Minute, func(ctx context.Context) {
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			if _, err := c.reportUnwritten(ctx, ino); err == nil {
				return
			}
		}
	})
	return false
}

// InFlightCloses reports how many closes sent a file's data and its
// create at once.
func (c *Client) InFlightCloses() uint64 { return c.inFlightCloses.Load() }

// queueConfirm queues the confirmation of ino's data for the next
// CreateMany, or alone after confirmDelay.
func (c *Client) queueConfirm(ino uint64) {
	d := &c.deleg
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.confirms) >= maxConfirmsQueued {
		return // settled when the session ends
	}
	d.confirms = append(d.confirms, ino)
	if !d.confirmTimer {
		d.confirmTimer = true
		time.AfterFunc(confirmDelay, c.sendConfirms)
	}
}

// takeConfirms takes the queued confirmations (for a CreateMany).
func (c *Client) takeConfirms() []uint64 {
	d := &c.deleg
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.confirms
	d.confirms = nil
	return out
}

// returnConfirms puts back confirmations a CreateMany did not deliver.
func (c *Client) returnConfirms(inos []uint64) {
	if len(inos) == 0 {
		return
	}
	d := &c.deleg
	d.mu.Lock()
	defer d.mu.Unlock()
	d.confirms = append(inos, d.confirms...)
	if len(d.confirms) > maxConfirmsQueued {
		d.confirms = d.confirms[:maxConfirmsQueued]
	}
}

// sendConfirms sends the queued confirmations alone (confirmDelay after
// the first was queued, when no CreateMany carried them).
func (c *Client) sendConfirms() {
	d := &c.deleg
	d.mu.Lock()
	d.confirmTimer = false
	inos := d.confirms
	d.confirms = nil
	d.mu.Unlock()
	if len(inos) == 0 || c.bg.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(c.bg, sessionCallTimeout)
	defer cancel()
	c.countMeta()
	resp, err := c.meta.CreateMany(ctx, &weftv1.CreateManyRequest{Session: c.Session(), Confirmed: inos})
	if err != nil {
		c.log.Warn("confirming files whose data was written failed; will retry", "files", len(inos), "err", err)
		c.returnConfirms(inos)
		d.mu.Lock()
		if !d.confirmTimer {
			d.confirmTimer = true
			time.AfterFunc(time.Second, c.sendConfirms)
		}
		d.mu.Unlock()
		return
	}
	c.noteUnknownConfirms(resp.GetUnknown())
}

// noteUnknownConfirms logs confirmations the meta service had no record
// of (settled already: this client's session ended meanwhile).
func (c *Client) noteUnknownConfirms(unknown []uint64) {
	if len(unknown) > 0 {
		c.log.Warn("the meta service had settled files before their data was confirmed (this client's session ended meanwhile); check their contents",
			"inos", unknown)
	}
}

// confirmNow confirms ino's data before its close returns: an error if
// the meta service settled the file already (its session ended while the
// data was on its way), which may have emptied it.
func (c *Client) confirmNow(ctx context.Context, ino uint64) error {
	c.countMeta()
	resp, err := c.meta.CreateMany(ctx, &weftv1.CreateManyRequest{Session: c.Session(), Confirmed: []uint64{ino}})
	if err != nil {
		return fserr.Wrap(syscall.EIO, "confirm the data of file %d with the meta service: %v", ino, err)
	}
	if slices.Contains(resp.GetUnknown(), ino) {
		return fserr.Wrap(syscall.EIO, "file %d: its data reached the data servers after the meta service had given up on it (this client's session ended meanwhile); the file may be empty: write it again", ino)
	}
	return nil
}

// reportUnwritten tells the meta service that ino's data could not be
// written; emptied reports that it cut the file to length 0.
func (c *Client) reportUnwritten(ctx context.Context, ino uint64) (emptied bool, err error) {
	c.countMeta()
	resp, err := c.meta.CreateMany(ctx, &weftv1.CreateManyRequest{Session: c.Session(), Unwritten: []uint64{ino}})
	if err != nil {
		return false, err
	}
	return slices.Contains(resp.GetEmptied(), ino), nil
}
