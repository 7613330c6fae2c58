package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Lock types (the fcntl values) and the end of a range that runs to the
// end of the file.
const (
	LockRead   = 0
	LockWrite  = 1
	LockUnlock = 2
	LockToEOF  = math.MaxUint64
)

// lockCallSlack is added to the meta service's longest wait for a lock
// (10 s per call) to bound one waiting call.
const lockCallSlack = 20 * time.Second

// Lock describes a byte-range lock: type, range [Start, End] (End
// inclusive, LockToEOF for the end of the file), the pid and owner of its
// holder (reported by TestLock).
type Lock struct {
	Type       uint32
	Start, End uint64
	Pid        uint32
	Owner      uint64
}

// Locks are kept by the meta service, so they hold across clients: POSIX
// (fcntl) byte-range locks and flock whole-file locks, which do not
// interact. The owner is the kernel's lock owner (a process's file table
// for POSIX locks, an open file for flock); with the client's session it
// names the holder. A lock lives until it is unlocked or the session ends
// (closed, or expired when the client vanished).

// TestLock returns the first lock held by another owner that conflicts
// with lk on inode ino (F_GETLK), or a Lock of type LockUnlock if lk could
// be taken.
func (c *Client) TestLock(ctx context.Context, caller *weftv1.Caller, ino, owner uint64, lk Lock) (Lock, error) {
	resp, err := c.meta.GetLock(ctx, lockRequest(caller, ino, owner, lk, false, false))
	if err != nil {
		return Lock{}, fmt.Errorf("test lock on inode %d: %w", ino, err)
	}
	return Lock{Type: resp.Type, Start: resp.Start, End: resp.End, Pid: resp.Pid, Owner: resp.Owner}, nil
}

// SetLock takes, converts or releases (Type LockUnlock) a POSIX lock, or
// with flock a whole-file flock lock. A lock another owner's lock
// conflicts with fails with EAGAIN, unless wait: then SetLock waits until
// it is granted or ctx ends (the error then wraps ctx's, which the FUSE
// adapter answers with EINTR).
//
// Before a lock is released the file's buffered writes are made durable
// and its length committed (a failure is reported by the next fsync or
// close, as NFS does); when a lock is granted the client drops what
// it read ahead and returns fresh attributes of the file (nil if they
// could not be fetched), so that a process that locks a range sees what
// the previous holder wrote there (as NFS does): the FUSE adapter drops
// the kernel's cached pages if the file changed.
func (c *Client) SetLock(ctx context.Context, caller *weftv1.Caller, ino, owner uint64, lk Lock, flock, wait bool) (*weftv1.Attr, error) {
	if lk.Type == LockUnlock {
		// The lock goes even if the write-back failed: the error stays
		// with the file and the next fsync or close reports it.
		if err := c.flushInode(ctx, ino); err != nil {
			c.log.Warn("write-back before an unlock failed; unlocking anyway", "ino", ino, "err", err)
		}
	}
	req := lockRequest(caller, ino, owner, lk, flock, wait)
	for {
		callCtx, cancel := ctx, context.CancelFunc(func() {})
		if wait {
			callCtx, cancel = context.WithTimeout(ctx, lockCallSlack)
		}
		_, err := c.meta.SetLock(callCtx, req)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("wait for lock on inode %d: %w", ino, ctx.Err())
		}
		// A waiting call answers EAGAIN when its time is up; one cut off
		// (a meta server going away) is asked again too.
		if wait && (errors.Is(err, syscall.EAGAIN) || errors.Is(err, context.DeadlineExceeded) || isCode(err, codes.Unavailable)) {
			continue
		}
		return nil, fmt.Errorf("lock inode %d: %w", ino, err)
	}
	if lk.Type == LockUnlock {
		return nil, nil
	}
	c.dropReadAhead(ino)
	a, err := c.GetAttr(ctx, ino)
	if err != nil {
		c.log.Warn("lock granted but the file's attributes could not be refreshed", "ino", ino, "err", err)
		return nil, nil
	}
	return a, nil
}

func lockRequest(caller *weftv1.Caller, ino, owner uint64, lk Lock, flock, wait bool) *weftv1.LockRequest {
	return &weftv1.LockRequest{
		Caller: caller, Ino: ino, Owner: owner, Start: lk.Start, End: lk.End,
		Type: lk.Type, Pid: lk.Pid, Flock: flock, Wait: wait,
	}
}

// flushInode makes the inode's buffered writes durable, if this client
// has it open.
func (c *Client) flushInode(ctx context.Context, ino uint64) error {
	in := c.lookupInode(ino)
	if in == nil {
		return nil
	}
	return in.flush(ctx, in.c.cfg.CloseSync, nil, false)
}

// dropReadAhead forgets what the client read ahead of inode ino.
func (c *Client) dropReadAhead(ino uint64) {
	if in := c.lookupInode(ino); in != nil {
		in.mu.Lock()
		in.dropReadAheadLocked()
		in.mu.Unlock()
	}
}
