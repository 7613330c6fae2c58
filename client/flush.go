package client

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// flush is the flush of a close or an fsync: it sends every buffered
// write, makes the writes durable when durable (the last write of each
// buffered chunk goes with sync, and SyncFile goes to the chains holding
// chunks written earlier without sync), and commits the length and mtime
// to the meta service, never past bytes that were lost (wberr.go). A
// close is durable with Config.CloseSync, an fsync always.
//
// It returns the error of the flush itself (a commit refused, the caller
// gone) or else the latest write-back error that seen (the File's cursor)
// has not reported yet; nil seen reports an error nobody has seen. Only
// an fsync (advance) moves the cursor past what it reports: a close is
// one of possibly many of the open file (dup, fork: a child closes its
// copies at exec), so each reports what no fsync of the file has.
func (in *inode) flush(ctx context.Context, durable bool, seen *errCursor, advance bool) error {
	in.mu.Lock()
	p := in.pending
	in.mu.Unlock()
	var err error
	switch {
	case p == nil:
		err = in.flushData(ctx, durable)
	default:
		// A create not sent yet waits for the flush, which sends it
		// with the file's length.
		in.c.beginFlush(p)
		err = in.flushData(ctx, durable)
		in.c.capCreate(p, in)
		in.c.endFlush(p, err)
	}
	return in.report(err, seen, advance)
}

// report is what a flush returns (see flush).
func (in *inode) report(err error, seen *errCursor, advance bool) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	var werr error
	switch {
	case seen != nil && advance:
		werr = in.takeErrLocked(&seen.sync)
	case seen != nil:
		cur := seen.sync
		werr = in.takeErrLocked(&cur)
	case in.unseenErrLocked():
		in.errs.seen = true
		werr = in.errs.err
	}
	if err != nil {
		return err
	}
	return werr
}

// flushData sends, syncs (when durable) and commits.
func (in *inode) flushData(ctx context.Context, durable bool) error {
	if err := in.sendDurably(ctx, durable); err != nil {
		return err
	}
	return in.commit(ctx)
}

// sendDurably sends every buffered write and waits for the sends under
// way. When durable, the last write of each chunk goes with sync and the
// chains holding chunks written earlier without sync are made durable
// (SyncFile); a failed sync is recorded as a write-back error (other
// Files' fsyncs see it too) and tried again at the next durable flush.
// Failed sends are recorded by the sends themselves; the error returned
// is the caller's context's.
func (in *inode) sendDurably(ctx context.Context, durable bool) error {
	if err := in.sendAll(ctx, durable); err != nil {
		return err
	}
	if !durable {
		return nil
	}
	in.mu.Lock()
	all := in.syncAll
	if len(in.unsynced) == 0 && !all {
		// Nothing sent without sync since the last sync (a file only
		// read, or whose last writes went with sync).
		in.mu.Unlock()
		return nil
	}
	taken := maps.Clone(in.unsynced)
	clear(in.unsynced)
	var chains []uint64
	for _, ch := range taken {
		chains = append(chains, ch)
	}
	if all {
		chains = append(chains, in.layout.GetChains()...)
	}
	in.syncAll = false
	in.mu.Unlock()
	slices.Sort(chains)
	chains = slices.Compact(chains)
	if err := in.syncChains(ctx, chains); err != nil {
		in.mu.Lock()
		maps.Copy(in.unsynced, taken)
		in.syncAll = in.syncAll || all
		if ctx.Err() == nil {
			in.recordErrLocked(fmt.Errorf("sync file %d on the data servers: %w", in.ino, err))
		}
		in.mu.Unlock()
		return ctx.Err()
	}
	return nil
}

// syncChains makes the file's chunks on the given chains durable, in
// parallel.
func (in *inode) syncChains(ctx context.Context, chains []uint64) error {
	return in.c.syncFileChains(ctx, in.ino, chains)
}

// syncFileChains makes file ino's chunks on the given chains durable, in
// parallel.
func (c *Client) syncFileChains(ctx context.Context, ino uint64, chains []uint64) error {
	errs := make([]error, len(chains))
	var wg sync.WaitGroup
	for i, ch := range chains {
		wg.Go(func() {
			errs[i] = c.onChain(ctx, ch, fmt.Sprintf("sync file %d", ino),
				func(ctx context.Context, dc dataServer, version uint64) error {
					_, err := dc.SyncFile(ctx, &weftv1.SyncFileRequest{Ino: ino, ChainId: ch, ChainVersion: version})
					return err
				})
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// commit records the length and mtime of the writes made so far with the
// meta service, if there are any not yet committed.
func (in *inode) commit(ctx context.Context) error {
	in.commitMu.Lock()
	defer in.commitMu.Unlock()
	return in.commitLocked(ctx)
}

// commitLocked is commit with in.commitMu held. The length committed
// stops at the first lost byte past what the meta service has (the
// barrier); writes past it stay uncommitted, and if some were made after
// the latest write-back error was recorded, that is recorded as an error
// of its own (their writer is told once, as of any write-back error).
func (in *inode) commitLocked(ctx context.Context) error {
	in.mu.Lock()
	if !in.writtenLocked() {
		in.mu.Unlock()
		return nil
	}
	seq, size, mtime, caller, p := in.writeSeq, in.localEnd, in.mtimeNs, in.caller, in.pending
	barrier := in.barrierLocked()
	capped := size > barrier
	if capped {
		size = barrier
		if in.errs.pastAt > in.errs.atWrite {
			in.recordErrLocked(in.capErrorLocked(barrier, in.localEnd))
		}
		if size <= in.metaSize && p == nil {
			in.mu.Unlock()
			return nil // nothing more to show
		}
	}
	in.mu.Unlock()
	var attr *weftv1.Attr
	if p != nil {
		folded := !p.stored() && in.c.foldCommit(p, size, mtime)
		if err := in.c.awaitCreate(ctx, p); err != nil {
			return err
		}
		in.mu.Lock()
		in.pending = nil
		in.mu.Unlock()
		if folded {
			attr = p.attr
		}
	}
	if attr == nil {
		in.c.cb.commits.Add(1)
		// Only this file changes: its kept attributes go, not all.
		resp, err := in.c.meta.CommitWrite(keepFiles(ctx), &weftv1.CommitWriteRequest{Caller: caller, Ino: in.ino, Size: size, MtimeNs: mtime})
		in.c.noteAttrChange(in.ino)
		if err != nil {
			return fmt.Errorf("commit length %d of file %d to the meta service: %w", size, in.ino, err)
		}
		attr = resp.GetAttr()
	}
	in.mu.Lock()
	in.metaSize, in.metaMtimeNs = attr.GetSize(), attr.GetMtimeNs()
	in.attrGen++
	if in.writeSeq == seq && !capped {
		in.committedSeq = seq
		in.localEnd = 0
	}
	in.mu.Unlock()
	return nil
}

// settleLost runs at the last close of the file on this client: writes
// kept past a barrier are given up, and the file is truncated at the
// barrier on the data servers, so that their stored bytes never show if
// the file grows later (it is then a hole of zeros, as after any
// truncate). Lost ranges below the length are forgotten: their error was
// recorded (and is kept for the next opener until someone sees it).
func (in *inode) settleLost(ctx context.Context) {
	in.mu.Lock()
	if len(in.lost) == 0 || in.pending != nil {
		in.mu.Unlock()
		return
	}
	barrier, caller := in.barrierLocked(), in.caller
	capped := in.writtenLocked() && in.localEnd > barrier
	if !capped {
		in.lost = nil
		in.mu.Unlock()
		return
	}
	in.mu.Unlock()
	in.commitMu.Lock()
	defer in.commitMu.Unlock()
	resp, err := in.c.meta.SetAttr(ctx, &weftv1.SetAttrRequest{
		Caller: caller, Ino: in.ino, Valid: uint32(weftv1.SetAttrValid_SETATTR_SIZE), Size: barrier,
	})
	in.c.noteAttrChange(in.ino)
	if err != nil {
		in.c.log.Warn("a file that lost written bytes could not be cut at them on the data servers; its length is right, but if it grows later, bytes written past it may show",
			"ino", in.ino, "length", barrier, "err", err)
		return
	}
	in.mu.Lock()
	in.metaSize = resp.GetAttr().GetSize()
	in.attrGen++
	in.lost = nil
	in.committedSeq, in.localEnd = in.writeSeq, 0
	in.dropReadAheadLocked()
	in.mu.Unlock()
}

// prepareTruncate drops buffered bytes at or past size, sends the rest and
// commits the length written so far, so that the meta service's truncate
// of the chunks that follows sees every earlier write. The caller holds
// in.commitMu until the truncate is done.
func (in *inode) prepareTruncate(ctx context.Context, size uint64) error {
	in.mu.Lock()
	if in.layout != nil && in.layout.ChunkSize > 0 {
		cs := uint64(in.layout.ChunkSize)
		for idx, buf := range in.dirty {
			start := idx * cs
			switch {
			case start >= size:
				in.c.buffered.Add(-buf.size)
				delete(in.dirty, idx)
				buf.release()
			case start+cs > size:
				in.c.buffered.Add(-buf.truncate(size - start))
				if buf.size == 0 {
					delete(in.dirty, idx)
				}
			}
		}
	}
	in.localEnd = min(in.localEnd, size)
	in.dropReadAheadLocked()
	in.mu.Unlock()
	if err := in.sendAll(ctx, false); err != nil {
		return err
	}
	return in.commitLocked(ctx)
}

// truncated records the length the meta service reported after a truncate.
func (in *inode) truncated(size uint64) {
	in.mu.Lock()
	in.metaSize = size
	in.localEnd = min(in.localEnd, size)
	in.cutLostLocked(size)
	in.dropReadAheadLocked()
	in.attrGen++
	in.mu.Unlock()
}
