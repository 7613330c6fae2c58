package meta

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// checkOpen checks that c may open a with open(2) flags: read and/or write
// permission by the access mode, write for O_TRUNC; directories only for
// reading.
func checkOpen(c caller, a *weftv1.Attr, flags uint32, op string) error {
	var mask uint32
	switch flags & syscall.O_ACCMODE {
	case syscall.O_RDONLY:
		mask = mayRead
	case syscall.O_WRONLY:
		mask = mayWrite
	default:
		mask = mayRead | mayWrite
	}
	if flags&syscall.O_TRUNC != 0 {
		mask |= mayWrite
	}
	if isDir(a.Mode) && mask&mayWrite != 0 {
		return fserr.Wrap(syscall.EISDIR, "%s: directory %d cannot be opened for writing", op, a.Ino)
	}
	return c.Check(a, mask, op)
}

// Open checks that the caller may open the inode with the request's flags
// and records the open for the session, so that unlinking the file keeps
// its data until the last Release. The record is committed lazily when
// the engine allows it: a crash may lose it, and the client replays it
// (replay.go). The file is not truncated here: the
// client sends SetAttr with size 0 for O_TRUNC.
func (s *Service) Open(ctx context.Context, req *weftv1.OpenRequest) (*weftv1.AttrResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("open inode %d", req.Ino)
	var a *weftv1.Attr
	if s.epoch != "" {
		ctx = kv.Lazy(ctx) // clients replay what a crash loses (replay.go)
	}
	err := s.update(ctx, func(x *tx) error {
		var err error
		if a, err = x.inode(req.Ino, op); err != nil {
			return err
		}
		if err := checkOpen(c, a, req.Flags, op); err != nil {
			return err
		}
		if req.Session == "" {
			return nil
		}
		return x.recordOpen(req.Session, a.Ino, op)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.AttrResponse{Attr: a}, nil
}

// recordOpen counts one more open of ino by session.
func (x *tx) recordOpen(session string, ino uint64, op string) error {
	if _, err := x.session(session, op); err != nil {
		return err
	}
	k := openKey(ino, session)
	if err := addUint64(x.t, k, 1); err != nil {
		return err
	}
	return x.t.Set(sessionOpenKey(session, ino), nil)
}

// recordNewOpen records the first open of ino, an inode made in this
// transaction (nothing can have it open yet), by session.
func (x *tx) recordNewOpen(session string, ino uint64, op string) error {
	if _, err := x.session(session, op); err != nil {
		return err
	}
	if err := x.t.Set(openKey(ino, session), be64(1)); err != nil {
		return err
	}
	return x.t.Set(sessionOpenKey(session, ino), nil)
}

// Release drops one open of the inode by the session. The last release of
// an orphan deletes it. Releasing what is not open is not an error (a
// release may be retried). Like an open, a release that deletes nothing
// commits lazily when the engine allows it (replay.go).
func (s *Service) Release(ctx context.Context, req *weftv1.ReleaseRequest) (*weftv1.ReleaseResponse, error) {
	if len(req.MoreInos) > maxReleaseBatch {
		return nil, fserr.Wrap(syscall.EINVAL, "release of %d files in one call: at most %d", len(req.MoreInos)+1, maxReleaseBatch+1)
	}
	fn := func(lazy bool) func(x *tx) error {
		return func(x *tx) error {
			x.lazy = lazy
			if err := x.release(req.Session, req.Ino); err != nil {
				return err
			}
			for _, ino := range req.MoreInos {
				if err := x.release(req.Session, ino); err != nil {
					return err
				}
			}
			return nil
		}
	}
	var err error
	if s.epoch != "" {
		// Lazily, as the opens (replay.go), unless it deletes a file.
		err = s.update(kv.Lazy(ctx), fn(true))
	}
	if s.epoch == "" || errors.Is(err, errNeedsSync) {
		err = s.update(ctx, fn(false))
	}
	if err != nil {
		return nil, err
	}
	return &weftv1.ReleaseResponse{}, nil
}

// maxReleaseBatch bounds ReleaseRequest.more_inos.
const maxReleaseBatch = 1024

// release counts one open of ino by session less.
func (x *tx) release(session string, ino uint64) error {
	n, err := getUint64(x.t, openKey(ino, session))
	if err != nil || n == 0 {
		return err
	}
	if n > 1 {
		return x.t.Set(openKey(ino, session), be64(n-1))
	}
	return x.dropOpen(session, ino)
}

// dropOpen forgets all opens of ino by session and deletes the inode if it
// was an orphan nobody else has open.
func (x *tx) dropOpen(session string, ino uint64) error {
	if err := x.t.Delete(openKey(ino, session)); err != nil {
		return err
	}
	if err := x.t.Delete(sessionOpenKey(session, ino)); err != nil {
		return err
	}
	_, orphan, err := x.t.Get(orphanKey(ino))
	if err != nil || !orphan || x.grace {
		return err // in the grace period the sweep deletes it (replay.go)
	}
	open, err := x.isOpen(ino)
	if err != nil || open {
		return err
	}
	if x.lazy {
		return errNeedsSync
	}
	a, err := x.inode(ino, "release")
	if err != nil {
		return err
	}
	return x.removeInode(a)
}

// Access checks access(2) permission: mask is R_OK|W_OK|X_OK bits, 0 for
// existence only.
func (s *Service) Access(ctx context.Context, req *weftv1.AccessRequest) (*weftv1.AccessResponse, error) {
	c := callerOf(req.Caller)
	err := s.view(ctx, func(x *tx) error {
		op := fmt.Sprintf("access inode %d", req.Ino)
		a, err := x.inode(req.Ino, op)
		if err != nil {
			return err
		}
		return c.Check(a, req.Mask&7, op)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.AccessResponse{}, nil
}

// CommitWrite records written data: size grows to at least the request's
// size, mtime is set (to now if the request has none) and ctime to now, and
// setuid/setgid are cleared when the writer is not root. No permission is
// checked: the writer was checked at open, and an open file stays writable
// after a chmod.
func (s *Service) CommitWrite(ctx context.Context, req *weftv1.CommitWriteRequest) (*weftv1.AttrResponse, error) {
	c := callerOf(req.Caller)
	var a *weftv1.Attr
	err := s.update(ctx, func(x *tx) error {
		op := fmt.Sprintf("commit write to inode %d", req.Ino)
		var err error
		if a, err = x.inode(req.Ino, op); err != nil {
			return err
		}
		if !isReg(a.Mode) {
			return fserr.Wrap(syscall.EINVAL, "%s: not a regular file", op)
		}
		a.Size = max(a.Size, req.Size)
		a.MtimeNs = req.MtimeNs
		if a.MtimeNs == 0 {
			a.MtimeNs = x.now
		}
		a.CtimeNs = x.now
		if !c.Root() {
			a.Mode = fileType(a.Mode) | killSuid(a.Mode&0o7777)
		}
		return x.putInode(a)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.AttrResponse{Attr: a}, nil
}
