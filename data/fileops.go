package data

import (
	"context"
	"errors"
	"fmt"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

func mutationRole(forwarded bool) role {
	if forwarded {
		return roleForwarded
	}
	return roleHead
}

// TruncateFile cuts the file's chunks of the chain to the new length on
// every member: the head applies it, then forwards it down the chain while
// holding the file's chunks of that chain, so writes to them are ordered
// around it the same way on every replica. Shortened chunks get a new
// version.
func (s *Server) TruncateFile(ctx context.Context, req *weftv1.TruncateFileRequest) (*weftv1.TruncateFileResponse, error) {
	m, err := s.member(req.GetChainId(), req.GetChainVersion(), req.GetTargetId(), mutationRole(req.GetForwarded()))
	if err != nil {
		return nil, err
	}
	lf := m.target.LockFile(req.GetIno(), m.view.id)
	defer lf.Unlock()
	s.touchFile(m, req.GetIno())
	if err := lf.Truncate(int64(req.GetSize()), int64(req.GetChunkSize())); err != nil {
		return nil, s.diskError(m, fmt.Sprintf("truncate inode %d", req.GetIno()), err)
	}
	err = s.forwardFileOp(ctx, m, fmt.Sprintf("forward truncate of inode %d to %d bytes", req.GetIno(), req.GetSize()),
		func(ctx context.Context, c weftv1.DataClient, next *weftv1.ChainMember) error {
			_, err := c.TruncateFile(ctx, &weftv1.TruncateFileRequest{
				Ino: req.GetIno(), Size: req.GetSize(), ChunkSize: req.GetChunkSize(),
				ChainId: m.view.id, ChainVersion: m.view.version, Forwarded: true, TargetId: next.GetTargetId(),
			})
			return err
		})
	if err != nil {
		return nil, err
	}
	return &weftv1.TruncateFileResponse{}, nil
}

// DeleteFile removes the file's chunks. With a chain id, only the chunks
// of that chain, on every member (head first, forwarded down the chain);
// without, every chunk of the file on every local target (not fenced:
// deleted inode numbers are never reused, so this cannot race with live
// data).
func (s *Server) DeleteFile(ctx context.Context, req *weftv1.DeleteFileRequest) (*weftv1.DeleteFileResponse, error) {
	if req.GetChainId() == 0 {
		var errs []error
		for _, t := range s.store.Targets() {
			errs = append(errs, t.DeleteFile(req.GetIno()))
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		return &weftv1.DeleteFileResponse{}, nil
	}
	m, err := s.member(req.GetChainId(), req.GetChainVersion(), req.GetTargetId(), mutationRole(req.GetForwarded()))
	if err != nil {
		return nil, err
	}
	lf := m.target.LockFile(req.GetIno(), m.view.id)
	defer lf.Unlock()
	s.touchFile(m, req.GetIno())
	if err := lf.Delete(); err != nil {
		return nil, s.diskError(m, fmt.Sprintf("delete inode %d", req.GetIno()), err)
	}
	err = s.forwardFileOp(ctx, m, fmt.Sprintf("forward delete of inode %d", req.GetIno()),
		func(ctx context.Context, c weftv1.DataClient, next *weftv1.ChainMember) error {
			_, err := c.DeleteFile(ctx, &weftv1.DeleteFileRequest{
				Ino: req.GetIno(), ChainId: m.view.id, ChainVersion: m.view.version, Forwarded: true, TargetId: next.GetTargetId(),
			})
			return err
		})
	if err != nil {
		return nil, err
	}
	return &weftv1.DeleteFileResponse{}, nil
}

// SyncFile makes the file's chunks durable on every member of the chain
// (head first, forwarded down the chain).
func (s *Server) SyncFile(ctx context.Context, req *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error) {
	m, err := s.member(req.GetChainId(), req.GetChainVersion(), req.GetTargetId(), mutationRole(req.GetForwarded()))
	if err != nil {
		return nil, err
	}
	if err := m.target.SyncFile(req.GetIno()); err != nil {
		return nil, s.diskError(m, fmt.Sprintf("sync inode %d", req.GetIno()), err)
	}
	err = s.forwardFileOp(ctx, m, fmt.Sprintf("forward sync of inode %d", req.GetIno()),
		func(ctx context.Context, _ weftv1.DataClient, next *weftv1.ChainMember) error {
			c, err := s.chunkPeer(next) // syncs travel with the writes they cover
			if err != nil {
				return err
			}
			_, err = c.SyncFile(ctx, &weftv1.SyncFileRequest{
				Ino: req.GetIno(), ChainId: m.view.id, ChainVersion: m.view.version, Forwarded: true, TargetId: next.GetTargetId(),
			})
			return err
		})
	if err != nil {
		return nil, err
	}
	return &weftv1.SyncFileResponse{}, nil
}

// forwardFileOp passes a file-level operation (truncate, delete, sync) that
// m has applied on to its successor in the chain, if any, and waits for
// the rest of the chain; a failure names the member that failed.
func (s *Server) forwardFileOp(ctx context.Context, m member, what string,
	call func(ctx context.Context, c weftv1.DataClient, next *weftv1.ChainMember) error) error {
	next := m.successor()
	if next == nil {
		return nil
	}
	ctx, done := forwardContext(ctx, m.view)
	defer done()
	c, err := s.peers.client(next.GetAddress())
	if err == nil {
		err = call(ctx, c, next)
	}
	if err != nil {
		return s.forwardError(m, next, what, err)
	}
	s.forwards.ok(m)
	return nil
}
