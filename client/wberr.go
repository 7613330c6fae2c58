package client

import (
	"fmt"
	"slices"
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
)

// Failed write-back (README.md "Write-back errors"). A background send
// that fails loses its bytes: the client does not keep them to send
// again. Two things remember the failure on the inode:
//
//   - an error sequence (errSeq), reported as Linux's errseq does: each
//     File sees a recorded error once at its next write and once at its
//     next fsync or close, and a File opened after an error nobody saw
//     sees it too;
//   - the lost byte ranges: reads of them fail with EIO (never zeros that
//     were not stored), and the length committed to the meta service
//     never covers one past what the meta service has (the barrier),
//     until the range is written again or truncated away.

// errSeq is an inode's record of failed write-backs. seq counts errors
// recorded; a File's cursors say up to which one it has seen.
type errSeq struct {
	err  error
	seq  uint64
	seen bool // the latest error was reported to some File
	// atWrite is the inode's writeSeq when the latest error was
	// recorded; pastAt is the writeSeq of the latest write that ended
	// past the barrier (barrierLocked). A flush that cannot commit such
	// a write made after the latest error records an error of its own.
	atWrite, pastAt uint64
}

// errCursor is a File's position in its inode's errSeq, one for writes
// and one for fsync and close (each reports an error once).
type errCursor struct{ write, sync uint64 }

// recordErrLocked records a failed write-back. As Linux's errseq_set, a
// new error that follows one nobody has seen yet replaces it without
// counting: whoever looks next sees the latest, once.
func (in *inode) recordErrLocked(err error) {
	if in.errs.seq == 0 || in.errs.seen {
		in.errs.seq++
	}
	in.errs.err, in.errs.seen, in.errs.atWrite = err, false, in.writeSeq
}

// sampleErrLocked is the cursor of a File opened now: it will see the
// latest error if nobody has seen it yet, else only later ones.
func (in *inode) sampleErrLocked() errCursor {
	s := in.errs.seq
	if s > 0 && !in.errs.seen {
		s--
	}
	return errCursor{write: s, sync: s}
}

// takeErrLocked returns the latest error if it is newer than *cur, and
// moves *cur past it.
func (in *inode) takeErrLocked(cur *uint64) error {
	if *cur >= in.errs.seq {
		return nil
	}
	*cur = in.errs.seq
	in.errs.seen = true
	return in.errs.err
}

// unseenErrLocked reports whether an error was recorded that no File
// has seen: the inode's state is kept for the next opener.
func (in *inode) unseenErrLocked() bool { return in.errs.seq > 0 && !in.errs.seen }

// byteRange is [lo, hi) of a file.
type byteRange struct{ lo, hi uint64 }

// maxLostRanges bounds the lost ranges an inode keeps; past it the
// highest are merged into one (which may count stored bytes as lost:
// reads of them fail, the length stops where it would anyway).
const maxLostRanges = 1024

// addLostLocked records [lo, hi) as lost, merged with the ranges it
// touches.
func (in *inode) addLostLocked(lo, hi uint64) {
	if lo >= hi {
		return
	}
	i := 0
	for i < len(in.lost) && in.lost[i].hi < lo {
		i++
	}
	j := i
	for j < len(in.lost) && in.lost[j].lo <= hi {
		lo, hi = min(lo, in.lost[j].lo), max(hi, in.lost[j].hi)
		j++
	}
	in.lost = slices.Replace(in.lost, i, j, byteRange{lo, hi})
	if n := len(in.lost); n > maxLostRanges {
		k := maxLostRanges / 2
		in.lost = append(in.lost[:k], byteRange{in.lost[k].lo, in.lost[n-1].hi})
	}
}

// clearLostLocked forgets what of [lo, hi) was lost: it was written
// again (or stored after all).
func (in *inode) clearLostLocked(lo, hi uint64) {
	if len(in.lost) == 0 || lo >= hi {
		return
	}
	out := in.lost[:0:0]
	for _, r := range in.lost {
		if r.hi <= lo || r.lo >= hi {
			out = append(out, r)
			continue
		}
		if r.lo < lo {
			out = append(out, byteRange{r.lo, lo})
		}
		if r.hi > hi {
			out = append(out, byteRange{hi, r.hi})
		}
	}
	in.lost = out
}

// cutLostLocked forgets lost bytes at or past size (truncated away).
func (in *inode) cutLostLocked(size uint64) {
	in.clearLostLocked(size, ^uint64(0))
}

// lostInLocked returns the lost bytes of [lo, hi) the extents ov (this
// client's unsent writes, laid over what is read) do not cover, if any.
func (in *inode) lostInLocked(lo, hi uint64, ov []extent, base uint64) (byteRange, bool) {
	for _, r := range in.lost {
		a, b := max(r.lo, lo), min(r.hi, hi)
		if a >= b {
			continue
		}
		if ov != nil && covers(ov, a-base, b-base) {
			continue
		}
		return byteRange{a, b}, true
	}
	return byteRange{}, false
}

// barrierLocked is the length a commit may not go past: the first lost
// byte at or beyond the length the meta service has (lost bytes below it
// are failed overwrites: the old bytes are still stored). ^0 when there
// is none.
func (in *inode) barrierLocked() uint64 {
	for _, r := range in.lost {
		if r.hi > in.metaSize {
			return max(r.lo, in.metaSize)
		}
	}
	return ^uint64(0)
}

// lostReadError is the error of a read of lost bytes.
func (in *inode) lostReadError(r byteRange) error {
	return fserr.Wrap(syscall.EIO, "read of file %d: bytes %d-%d were written but their write-back failed (%v), so they are not stored; write them again",
		in.ino, r.lo, r.hi, in.errs.err)
}

// capError is the error recorded when a flush commits a shorter length
// than was written, because of lost bytes: the writes past them are not
// visible.
// It carries the errno of the loss (ENOSPC stays ENOSPC), else EIO.
func (in *inode) capErrorLocked(barrier, end uint64) error {
	e, ok := fserr.Errno(in.errs.err)
	if !ok || (e != syscall.ENOSPC && e != syscall.EDQUOT) {
		e = syscall.EIO
	}
	return fserr.Wrap(e, "file %d keeps length %d: bytes from %d were lost when their write-back failed (%v), so the %d bytes written up to %d cannot be made visible; write the lost bytes again or truncate the file",
		in.ino, barrier, barrier, in.errs.err, end-barrier, end)
}

// OnLostWrites sets fn to be told of every file whose write-back failed
// (in its own goroutine), so that a cache above the client (the kernel's
// page cache of a mount) drops the file's pages: its lost bytes must read
// as the error they are, not as what was written.
func (c *Client) OnLostWrites(fn func(ino uint64)) { c.lostHook.Store(&fn) }

// noteLost tells the OnLostWrites hook about ino.
func (c *Client) noteLost(ino uint64) {
	if fn := c.lostHook.Load(); fn != nil {
		go (*fn)(ino)
	}
}

// capCreate cuts the length an unsent create carries (committed into it
// by a time change while the bytes were buffered) at the first byte whose
// write-back failed, so the meta service never gets a length covering
// bytes the data servers lack; the flush of the file reports the loss.
func (c *Client) capCreate(p *pendingCreate, in *inode) {
	d := &c.deleg
	d.mu.Lock() // before in.mu, as setAttrLocal
	defer d.mu.Unlock()
	in.mu.Lock()
	defer in.mu.Unlock()
	if len(in.lost) == 0 {
		return
	}
	first := in.lost[0].lo // nothing of the file is stored before its create
	if p.sent || !p.nf.Committed || p.nf.Size <= first {
		return
	}
	in.recordErrLocked(in.capErrorLocked(first, p.nf.Size))
	p.nf.Size = first
	if p.cur != nil {
		p.cur.Size = first
	}
	in.metaSize = min(in.metaSize, first)
}

// writeBackError wraps err of a failed send of chunk idx of the file.
func writeBackError(ino, idx uint64, err error) error {
	return fmt.Errorf("write back file %d chunk %d: %w", ino, idx, err)
}
