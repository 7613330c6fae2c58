package meta

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Lock service limits and timing.
const (
	// maxLocksPerInode bounds the lock records of one kind on one inode:
	// a lock operation reads them all in one transaction, which must stay
	// below etcd's default --max-txn-ops (128). Past it a lock fails with
	// ENOLCK, as the kernel's does when it runs out of lock space.
	maxLocksPerInode = 100
	// lockWaitSlice is the longest one waiting SetLock (F_SETLKW) call
	// waits; then it answers EAGAIN and the client asks again, so a waiter
	// never depends on one long-lived call (a meta server can go away).
	lockWaitSlice = 10 * time.Second
	// lockPollMin and lockPollMax bound the backoff of a waiter polling
	// for a lock released through another meta server; a release through
	// this one wakes its waiters at once.
	lockPollMin = 2 * time.Millisecond
	lockPollMax = 250 * time.Millisecond
)

// lockParams is a validated LockRequest.
type lockParams struct {
	ino        uint64
	kind       lockKind
	who        lockOwner
	start, end uint64
	typ, pid   uint32
}

// lockParamsOf checks req. A flock lock always covers the whole file.
func lockParamsOf(req *weftv1.LockRequest, op string) (lockParams, error) {
	p := lockParams{
		ino: req.Ino, kind: kindPOSIX, who: lockOwner{session: req.GetCaller().GetSession(), owner: req.Owner},
		start: req.Start, end: req.End, typ: req.Type, pid: req.Pid,
	}
	if req.Flock {
		p.kind, p.start, p.end = kindFlock, 0, lockEOF
	}
	switch {
	case p.typ > lockUnlock:
		return p, fserr.Wrap(syscall.EINVAL, "%s on inode %d: lock type %d (want 0 read, 1 write or 2 unlock)", op, p.ino, p.typ)
	case p.end < p.start:
		return p, fserr.Wrap(syscall.EINVAL, "%s on inode %d: range ends at %d before its start %d", op, p.ino, p.end, p.start)
	case p.ino == 0:
		return p, fserr.Wrap(syscall.EINVAL, "%s: no inode given", op)
	}
	return p, nil
}

// lockResponse describes l for a LockResponse (nil: no lock, F_UNLCK).
func lockResponse(l *heldLock) *weftv1.LockResponse {
	if l == nil {
		return &weftv1.LockResponse{Type: lockUnlock}
	}
	return &weftv1.LockResponse{Type: l.typ, Start: l.start, End: l.end, Pid: l.pid, Owner: l.owner}
}

// GetLock tests for a lock (F_GETLK): it returns the first lock of another
// owner that would conflict with the one described, with its holder's pid,
// or type F_UNLCK if there is none.
func (s *Service) GetLock(ctx context.Context, req *weftv1.LockRequest) (*weftv1.LockResponse, error) {
	p, err := lockParamsOf(req, "test lock")
	if err != nil {
		return nil, err
	}
	if p.typ == lockUnlock {
		return nil, fserr.Wrap(syscall.EINVAL, "test lock on inode %d: F_UNLCK is not a lock to test", p.ino)
	}
	var conflict *heldLock
	err = s.view(ctx, func(x *tx) error {
		all, err := x.locksOn(p.ino, p.kind)
		if err != nil {
			return err
		}
		conflict = firstConflict(all, p.who, p.start, p.end, p.typ)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("test lock on inode %d: %w", p.ino, err)
	}
	return lockResponse(conflict), nil
}

// SetLock takes, converts or releases a lock (F_SETLK, F_SETLKW, flock).
// A lock that conflicts with another owner's fails with EAGAIN, unless
// req.Wait: then the call waits until it can be granted, up to
// lockWaitSlice, and answers EAGAIN after that so that the client asks
// again. A cancelled call (the waiting process got a signal) ends at once.
func (s *Service) SetLock(ctx context.Context, req *weftv1.LockRequest) (*weftv1.LockResponse, error) {
	p, err := lockParamsOf(req, "lock")
	if err != nil {
		return nil, err
	}
	if p.who.session == "" {
		return nil, fserr.Wrap(syscall.EINVAL, "lock inode %d: the request names no session; locks belong to a client session", p.ino)
	}
	if !req.Wait || p.typ == lockUnlock {
		conflict, err := s.trySetLock(ctx, p)
		if err != nil {
			return nil, err
		}
		if conflict != nil {
			return nil, lockBusy(p, conflict)
		}
		return lockResponse(nil), nil
	}
	if err := s.waitLock(ctx, p); err != nil {
		return nil, err
	}
	return lockResponse(nil), nil
}

// lockBusy is the EAGAIN of a lock that conflicts with c.
func lockBusy(p lockParams, c *heldLock) error {
	what := "lock"
	if p.kind == kindFlock {
		what = "flock"
	}
	return fserr.Wrap(syscall.EAGAIN, "%s on inode %d [%d, %d]: conflicts with a %s lock [%d, %d] of pid %d in session %s",
		what, p.ino, p.start, p.end, lockTypeName(c.typ), c.start, c.end, c.pid, c.session)
}

func lockTypeName(t uint32) string {
	switch t {
	case lockRead:
		return "read"
	case lockWrite:
		return "write"
	}
	return "unlock"
}

// trySetLock applies p in one transaction if no other owner's lock
// conflicts; otherwise it returns the conflicting lock. Taking a flock
// lock of the other type (a conversion) releases the owner's old one
// first, also when the new one cannot be granted, as Linux does (so that
// two holders of a shared lock who both upgrade do not deadlock).
func (s *Service) trySetLock(ctx context.Context, p lockParams) (*heldLock, error) {
	var conflict *heldLock
	changed := false
	err := s.update(ctx, func(x *tx) error {
		conflict, changed = nil, false
		if _, err := x.session(p.who.session, "lock"); err != nil {
			return err
		}
		if p.typ != lockUnlock {
			if _, ok, err := x.t.Get(inodeKey(p.ino)); err != nil {
				return err
			} else if !ok {
				return fserr.Wrap(syscall.ENOENT, "lock inode %d: no such inode", p.ino)
			}
		}
		all, err := x.locksOn(p.ino, p.kind)
		if err != nil {
			return err
		}
		var mine []heldLock
		others := 0
		for _, l := range all {
			if l.lockOwner == p.who {
				mine = append(mine, l)
			} else {
				others++
			}
		}
		if c := firstConflict(all, p.who, p.start, p.end, p.typ); c != nil {
			cc := *c
			conflict = &cc
			if p.kind == kindFlock && len(mine) > 0 {
				changed = true
				return x.replaceOwnerLocks(p.ino, p.kind, p.who, mine, nil)
			}
			return nil
		}
		now := applyLock(mine, p.who, p.start, p.end, p.typ, p.pid)
		if others+len(now) > maxLocksPerInode {
			return fserr.Wrap(syscall.ENOLCK, "lock inode %d: more than %d locks on it; release some first", p.ino, maxLocksPerInode)
		}
		if sameLocks(mine, now) {
			return nil
		}
		changed = true
		return x.replaceOwnerLocks(p.ino, p.kind, p.who, mine, now)
	})
	if err != nil {
		return nil, fmt.Errorf("lock inode %d: %w", p.ino, err)
	}
	if changed {
		s.wakeLockWaiters(p.ino)
	}
	return conflict, nil
}

// sameLocks reports whether a and b (both sorted by start) are equal.
func sameLocks(a, b []heldLock) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// waitLock retries p until it is granted (waking when a lock on the inode
// changes through this meta server, polling with backoff for changes
// through others), the call is cancelled, or lockWaitSlice is over. No
// transaction is open while it waits.
func (s *Service) waitLock(ctx context.Context, p lockParams) error {
	slice := lockWaitSlice
	if dl, ok := ctx.Deadline(); ok {
		slice = max(min(slice, time.Until(dl)-time.Second), 0)
	}
	giveUp := time.NewTimer(slice)
	defer giveUp.Stop()
	backoff := lockPollMin
	for {
		wake, release := s.watchLocks(p.ino)
		conflict, err := s.trySetLock(ctx, p)
		if err != nil || conflict == nil {
			release()
			return err
		}
		poll := time.NewTimer(backoff)
		select {
		case <-wake:
			backoff = lockPollMin
		case <-poll.C:
			backoff = min(2*backoff, lockPollMax)
		case <-ctx.Done():
			poll.Stop()
			release()
			return fmt.Errorf("wait for lock on inode %d: %w", p.ino, ctx.Err())
		case <-giveUp.C:
			poll.Stop()
			release()
			return lockBusy(p, conflict)
		}
		poll.Stop()
		release()
	}
}

// lockWake holds the channels waiters of a lock watch, per service and
// inode: a change of the locks on the inode closes (and replaces) it.
var lockWake = struct {
	sync.Mutex
	m map[lockWakeKey]*lockWaiters
}{m: make(map[lockWakeKey]*lockWaiters)}

type lockWakeKey struct {
	s   *Service
	ino uint64
}

type lockWaiters struct {
	ch   chan struct{}
	refs int
}

// watchLocks returns a channel closed at the next change of the locks on
// ino made through this service, and the function to call once done.
func (s *Service) watchLocks(ino uint64) (<-chan struct{}, func()) {
	k := lockWakeKey{s, ino}
	lockWake.Lock()
	defer lockWake.Unlock()
	w := lockWake.m[k]
	if w == nil {
		w = &lockWaiters{ch: make(chan struct{})}
		lockWake.m[k] = w
	}
	w.refs++
	return w.ch, func() {
		lockWake.Lock()
		defer lockWake.Unlock()
		if w.refs--; w.refs == 0 {
			delete(lockWake.m, k)
		}
	}
}

// wakeLockWaiters wakes the waiters for locks on ino.
func (s *Service) wakeLockWaiters(ino uint64) {
	lockWake.Lock()
	defer lockWake.Unlock()
	if w := lockWake.m[lockWakeKey{s, ino}]; w != nil {
		close(w.ch)
		w.ch = make(chan struct{})
	}
}
