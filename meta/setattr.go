package meta

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/internal/perm"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// SetAttr bits.
const (
	setMode     = perm.SetMode
	setUID      = perm.SetUID
	setGID      = perm.SetGID
	setSize     = perm.SetSize
	setAtime    = perm.SetAtime
	setMtime    = perm.SetMtime
	setAtimeNow = perm.SetAtimeNow
	setMtimeNow = perm.SetMtimeNow
)

// SetAttr changes mode, owner, size and times as chmod, chown, truncate and
// utimensat do, with their permission rules. A size change first has the
// data servers cut the file's chunks at min(old, new) size, then commits
// the new size.
func (s *Service) SetAttr(ctx context.Context, req *weftv1.SetAttrRequest) (*weftv1.AttrResponse, error) {
	c := callerOf(req.Caller)
	op := fmt.Sprintf("setattr of inode %d", req.Ino)
	if req.Valid&setSize != 0 {
		if err := s.truncateChunks(ctx, c, req.Ino, req.Size, op); err != nil {
			return nil, err
		}
	}
	var a *weftv1.Attr
	err := s.update(ctx, func(x *tx) error {
		var err error
		if a, err = x.inode(req.Ino, op); err != nil {
			return err
		}
		if err := applySetAttr(c, a, req, x.now, op); err != nil {
			return err
		}
		return x.putInode(a)
	})
	if err != nil {
		return nil, err
	}
	return &weftv1.AttrResponse{Attr: a}, nil
}

// truncateChunks checks that c may truncate ino and has the data servers
// drop the file's data beyond min(old size, size), so that growing the
// file later reads zeros and shrinking it frees space.
func (s *Service) truncateChunks(ctx context.Context, c caller, ino, size uint64, op string) error {
	var a *weftv1.Attr
	err := s.view(ctx, func(x *tx) error {
		var err error
		if a, err = x.inode(ino, op); err != nil {
			return err
		}
		return checkTruncate(c, a, op)
	})
	if err != nil {
		return err
	}
	if a.Layout == nil || len(a.Layout.Chains) == 0 {
		return nil
	}
	// The cut is done chain by chain and cannot be undone: one that
	// fails after others were cut leaves the file cut there under its old
	// length. A member that died is taken out of its chain within the
	// failure timeout, and the cut (idempotent) then goes through with
	// the others: retry that long, as writes do.
	ft := s.cfg.Cluster.FailureTimeout
	if ft <= 0 {
		ft = cluster.DefaultFailureTimeout
	}
	deadline := time.Now().Add(2*ft + time.Second)
	for {
		err := s.cluster.TruncateFile(ctx, ino, a.Layout, min(a.Size, size))
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EIO) || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s: truncate to %d bytes on the data servers: %w", op, size, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(truncateRetryDelay):
		}
	}
}

// truncateRetryDelay spaces the tries of a truncate whose chain has a
// member that cannot be reached.
const truncateRetryDelay = 250 * time.Millisecond

// checkTruncate checks that c may truncate a (perm.CheckTruncate).
func checkTruncate(c caller, a *weftv1.Attr, op string) error { return perm.CheckTruncate(c, a, op) }

// applySetAttr applies req to a with Linux's rules (perm.ApplySetAttr).
func applySetAttr(c caller, a *weftv1.Attr, req *weftv1.SetAttrRequest, now int64, op string) error {
	return perm.ApplySetAttr(c, a, req, now, op)
}
