package data

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/data/chunk"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// readChunk serves ReadChunk: data read into a buffer of alloc (nil: a
// new one), returned as buf for the caller to give back.
func (s *Server) readChunk(req *weftv1.ReadChunkRequest, alloc func(int) []byte) (data, buf []byte, err error) {
	m, err := s.member(req.GetChainId(), req.GetChainVersion(), 0, roleRead)
	if err != nil {
		return nil, nil, err
	}
	id, err := chunkID(req.GetChunk())
	if err != nil {
		return nil, nil, err
	}
	data, buf, err = m.target.ReadInto(id, int64(req.GetOffset()), int(req.GetLength()), alloc)
	if err != nil {
		s.noteCorrupt(m, id, err)
		return nil, buf, err
	}
	return data, buf, nil
}

// ReadChunkPooled is ReadChunk into a buffer of the lean data path's pool
// (not zeroed first), which the caller gives back with wire.PutBuffer once
// the answer is sent.
func (s *Server) ReadChunkPooled(_ context.Context, req *weftv1.ReadChunkRequest) (data, buf []byte, err error) {
	return s.readChunk(req, wire.GetBuffer)
}

// OpenChunkRead opens a chunk for a client on this host to read in place
// (see wire.LocalChunk), after the checks of a read: this server serves
// the chain at the request's version. The request's range, if any, is
// what the client reads first: it is read in from the disk meanwhile.
func (s *Server) OpenChunkRead(_ context.Context, req *weftv1.ReadChunkRequest, verify bool) (*wire.LocalChunk, error) {
	m, err := s.member(req.GetChainId(), req.GetChainVersion(), 0, roleRead)
	if err != nil {
		return nil, err
	}
	id, err := chunkID(req.GetChunk())
	if err != nil {
		return nil, err
	}
	s.mu.RLock()
	lease := s.leaseLocked()
	s.mu.RUnlock()
	lo := int64(req.GetOffset())
	o, err := m.target.OpenForRead(id, verify, lo, lo+int64(req.GetLength()))
	if errors.Is(err, chunk.ErrNotInPlace) {
		return nil, status.Error(codes.Unimplemented, err.Error()) // the client reads it through the server
	}
	if err != nil {
		s.noteCorrupt(m, id, err)
		return nil, err
	}
	return &wire.LocalChunk{Opened: o, Lease: lease}, nil
}

// ReadIns counts the cold ranges the server's targets read into the
// page cache ahead of readers (chunk.Target.ReadIns).
func (s *Server) ReadIns() int64 {
	var n int64
	for _, t := range s.store.Targets() {
		n += t.ReadIns()
	}
	return n
}

// ReadLease is how long chunks opened in place may be read from now: until
// the server would fence itself if it heard nothing more from the meta
// service (see wire.ChunkOpener).
func (s *Server) ReadLease() time.Duration {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.fencedLocked() != nil {
		return 0
	}
	return s.leaseLocked()
}
