package mount

import (
	"context"
	"math"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/weft-fs/weft/client"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// offsetMax is the kernel's end of a lock that runs to the end of the file
// (OFFSET_MAX); the meta service says math.MaxUint64. The kernel refuses a
// lock reply past OFFSET_MAX.
const offsetMax = math.MaxInt64

// lockTable remembers the (inode, owner) pairs that may hold locks
// through this mount, so that the close of a file that never locked
// anything costs no call to the meta service.
type lockTable struct {
	mu    sync.Mutex
	posix map[lockHolder]bool
	flock map[lockHolder]bool
}

type lockHolder struct{ ino, owner uint64 }

func (t *lockTable) set(flock bool) map[lockHolder]bool {
	if flock {
		if t.flock == nil {
			t.flock = make(map[lockHolder]bool)
		}
		return t.flock
	}
	if t.posix == nil {
		t.posix = make(map[lockHolder]bool)
	}
	return t.posix
}

// note records that owner may hold a lock on ino.
func (t *lockTable) note(ino, owner uint64, flock bool) {
	t.mu.Lock()
	t.set(flock)[lockHolder{ino, owner}] = true
	t.mu.Unlock()
}

// mayHold reports whether owner may hold a lock on ino.
func (t *lockTable) mayHold(ino, owner uint64, flock bool) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.set(flock)[lockHolder{ino, owner}]
}

// forget records that owner holds no lock on ino.
func (t *lockTable) forget(ino, owner uint64, flock bool) {
	t.mu.Lock()
	delete(t.set(flock), lockHolder{ino, owner})
	t.mu.Unlock()
}

// fromKernel converts a kernel lock to the client's.
func fromKernel(l *fuse.FileLock) client.Lock {
	lk := client.Lock{Type: l.Typ, Start: l.Start, End: l.End, Pid: l.Pid}
	if lk.End >= offsetMax {
		lk.End = client.LockToEOF
	}
	return lk
}

// toKernel converts a client lock to the kernel's.
func toKernel(lk client.Lock) fuse.FileLock {
	return fuse.FileLock{Typ: lk.Type, Start: min(lk.Start, offsetMax), End: min(lk.End, offsetMax), Pid: lk.Pid}
}

// GetLk answers F_GETLK from the locks the meta service holds for every
// client.
func (fs *weftFS) GetLk(cancel <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	ctx, stop := reqContext(cancel)
	defer stop()
	lk, err := fs.c.TestLock(ctx, fs.caller(&in.InHeader), in.NodeId, in.Owner, fromKernel(&in.Lk))
	if err != nil {
		return status(fs.log, "getlk", in.NodeId, err)
	}
	out.Lk = toKernel(lk)
	return fuse.OK
}

// SetLk takes or releases a POSIX lock (F_SETLK) or a flock lock
// (LOCK_NB) without waiting.
func (fs *weftFS) SetLk(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	return fs.setLk(cancel, in, false)
}

// SetLkw takes a lock, waiting until it can be granted (F_SETLKW, flock
// without LOCK_NB). A signal to the waiting process interrupts it: EINTR,
// which the kernel restarts for handlers installed with SA_RESTART.
func (fs *weftFS) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	return fs.setLk(cancel, in, true)
}

func (fs *weftFS) setLk(cancel <-chan struct{}, in *fuse.LkIn, wait bool) fuse.Status {
	flock := in.LkFlags&fuse.LK_FLOCK != 0
	lk := fromKernel(&in.Lk)
	ctx, stop := interruptible(cancel)
	defer stop()
	if lk.Type != client.LockUnlock {
		// Noted before asking, so that a close racing with the grant
		// still releases it.
		fs.locks.note(in.NodeId, in.Owner, flock)
	}
	a, err := fs.c.SetLock(ctx, fs.caller(&in.InHeader), in.NodeId, in.Owner, lk, flock, wait)
	if err != nil {
		return status(fs.log, "setlk", in.NodeId, err)
	}
	if lk.Type != client.LockUnlock {
		fs.lockGranted(in.NodeId, a)
	}
	return fuse.OK
}

// lockGranted drops the kernel's cached pages and attributes of the file
// if it changed since the kernel last heard (or the fresh attributes are
// not known), so that the new holder reads what the previous one wrote.
func (fs *weftFS) lockGranted(ino uint64, a *weftv1.Attr) {
	if a != nil && !fs.changed(a) {
		return
	}
	if fs.srv != nil {
		fs.srv.InodeNotify(ino, 0, 0)
	}
	if a != nil {
		fs.remember(a)
	}
}

// unlockOnClose releases the locks owner may hold on ino when the kernel
// says they go: POSIX locks at every close(2) of the file by the owning
// process (FUSE flush), flock locks at the last close of the open file
// (FUSE release with FUSE_RELEASE_FLOCK_UNLOCK). Errors are logged: the
// close itself has nothing to do with them, and the session's end
// releases what is left.
func (fs *weftFS) unlockOnClose(h *fuse.InHeader, ino, owner uint64, flock bool) {
	if !fs.locks.mayHold(ino, owner, flock) {
		return
	}
	lk := client.Lock{Type: client.LockUnlock, Start: 0, End: client.LockToEOF, Pid: h.Pid}
	if _, err := fs.c.SetLock(context.Background(), fs.caller(h), ino, owner, lk, flock, false); err != nil {
		fs.log.Error("releasing the locks of a closed file failed; they go when the session ends", "ino", ino, "flock", flock, "err", err)
		return
	}
	fs.locks.forget(ino, owner, flock)
}

// interruptible returns a context that ends when the kernel interrupts
// the request (the calling process got a signal).
func interruptible(cancel <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, stop := context.WithCancel(context.Background())
	if cancel != nil {
		go func() {
			select {
			case <-cancel:
				stop()
			case <-ctx.Done():
			}
		}()
	}
	return ctx, stop
}

// staleIfGone answers ESTALE instead of ENOENT for an open of an inode
// that another client deleted after this kernel looked its name up: the
// kernel then looks the name up again and retries once (as for NFS), so
// open(O_CREAT) of a name another client just removed creates the file
// instead of failing. SQLite's journal depends on it.
func staleIfGone(st fuse.Status) fuse.Status {
	if st == fuse.ENOENT {
		return fuse.Status(syscall.ESTALE)
	}
	return st
}
