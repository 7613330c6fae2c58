package data

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/data/chunk"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// WriteChunk writes data into a chunk. From a client it must reach the
// chain's head, which assigns the chunk's next version, applies the write
// and forwards it down the chain, holding the chunk until the rest of the
// chain has applied it: so every replica applies a chunk's writes in the
// same order, and success means every live replica has the write (durably
// with sync). A forwarded write is applied only on top of exactly the
// previous version (on a syncing member: of a chunk already verified);
// otherwise the member asks for the whole chunk (need_full_chunk).
func (s *Server) WriteChunk(ctx context.Context, req *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error) {
	r := roleHead
	if req.GetForwarded() {
		r = roleForwarded
	}
	m, err := s.member(req.GetChainId(), req.GetChainVersion(), req.GetTargetId(), r)
	if err != nil {
		return nil, err
	}
	id, err := chunkID(req.GetChunk())
	if err != nil {
		return nil, err
	}
	pieces, err := writePieces(req)
	if err != nil {
		return nil, err
	}
	l := m.target.Lock(id, m.view.id)
	defer l.Unlock()
	var version uint64
	if req.GetForwarded() {
		ok, err := s.applyForwarded(m, l, id, req, pieces)
		if err != nil || !ok {
			if err != nil {
				err = s.diskError(m, "write to "+id.String(), err)
			}
			return &weftv1.WriteChunkResponse{NeedFullChunk: !ok}, err
		}
		version = req.GetChunkVersion()
	} else {
		info, err := l.Info()
		if err != nil {
			return nil, s.diskError(m, "write to "+id.String(), s.headCorrupt(m, id, err))
		}
		version = info.Version
		if len(req.GetData()) > 0 {
			version++
		}
		if err := l.WritePieces(pieces, int64(req.GetChunkSize()), version, req.GetSync()); err != nil {
			return nil, s.diskError(m, "write to "+id.String(), s.headCorrupt(m, id, err))
		}
	}
	if len(req.GetData()) > 0 {
		s.noteWritten(m.target)
	}
	if err := s.forwardWrite(ctx, m, l, id, req, version); err != nil {
		return nil, err
	}
	return &weftv1.WriteChunkResponse{}, nil
}

// maxPieces bounds the pieces of one write.
const maxPieces = 1 << 16

// writePieces returns the pieces a write request carries: its data at its
// offset, or the pieces it lists (WriteChunkRequest.PieceOffsets), checked
// to add up to its data.
func writePieces(req *weftv1.WriteChunkRequest) ([]chunk.Piece, error) {
	offs, lens, data := req.GetPieceOffsets(), req.GetPieceLengths(), req.GetData()
	if len(offs) == 0 && len(lens) == 0 {
		return []chunk.Piece{{Off: int64(req.GetOffset()), Data: data}}, nil
	}
	bad := func(format string, args ...any) error {
		return status.Errorf(codes.InvalidArgument, "write of pieces of chunk %d of file %d: %s",
			req.GetChunk().GetIndex(), req.GetChunk().GetIno(), fmt.Sprintf(format, args...))
	}
	switch {
	case len(offs) != len(lens):
		return nil, bad("%d offsets but %d lengths", len(offs), len(lens))
	case len(offs) > maxPieces:
		return nil, bad("%d pieces, at most %d", len(offs), maxPieces)
	case req.GetOffset() != weftv1.PiecesOffset:
		return nil, bad("offset %d, want %d for a write of pieces", req.GetOffset(), uint64(weftv1.PiecesOffset))
	}
	pieces := make([]chunk.Piece, len(offs))
	pos := 0
	for i, off := range offs {
		n := int(lens[i])
		if off > chunk.MaxChunkSize || n > len(data)-pos {
			return nil, bad("piece %d (%d bytes at %d) lies past the chunk or the data (%d bytes)", i, n, off, len(data))
		}
		pieces[i] = chunk.Piece{Off: int64(off), Data: data[pos : pos+n]}
		pos += n
	}
	if pos != len(data) {
		return nil, bad("pieces hold %d bytes, data %d", pos, len(data))
	}
	return pieces, nil
}

// headCorrupt answers a client write that the head could not apply. If
// its copy of the chunk is corrupt and a peer holds a good one, the copy
// is repaired in the background and the client told to retry (it sees a
// good write, a little later); with no peer it gets the EIO.
func (s *Server) headCorrupt(m member, id chunk.ID, err error) error {
	s.noteCorrupt(m, id, err)
	if errors.Is(err, chunk.ErrCorrupt) && len(m.servingPeers()) > 0 {
		return status.Errorf(codes.Unavailable, "%v: being repaired from another replica: retry shortly", err)
	}
	return err
}

// applyForwarded applies a forwarded write if this copy is exactly the
// version before it; ok false asks the sender for the whole chunk.
func (s *Server) applyForwarded(m member, l *chunk.Locked, id chunk.ID, req *weftv1.WriteChunkRequest, pieces []chunk.Piece) (ok bool, err error) {
	if len(req.GetData()) == 0 { // sync only
		return true, l.WritePieces(pieces, int64(req.GetChunkSize()), 0, req.GetSync())
	}
	info, err := l.Info()
	if err != nil || req.GetChunkVersion() == 0 || info.Version != req.GetChunkVersion()-1 || !s.verified(m, id) {
		return false, nil
	}
	err = l.WritePieces(pieces, int64(req.GetChunkSize()), req.GetChunkVersion(), req.GetSync())
	if errors.Is(err, chunk.ErrCorrupt) {
		return false, nil // the whole chunk replaces the damaged copy
	}
	return err == nil, err
}

// forwardWrite sends an applied write to the next member, if any, and
// answers its request for the whole chunk. The caller holds the chunk.
func (s *Server) forwardWrite(ctx context.Context, m member, l *chunk.Locked, id chunk.ID, req *weftv1.WriteChunkRequest, version uint64) error {
	next := m.successor()
	if next == nil {
		return nil
	}
	what := fmt.Sprintf("forward write of %v", id)
	ctx, done := forwardContext(ctx, m.view)
	defer done()
	c, err := s.chunkPeer(next)
	if err != nil {
		return s.forwardError(m, next, what, err)
	}
	resp, err := c.WriteChunk(ctx, &weftv1.WriteChunkRequest{
		Chunk: req.GetChunk(), ChainId: m.view.id, ChainVersion: m.view.version,
		Offset: req.GetOffset(), Data: req.GetData(), Sync: req.GetSync(), ChunkSize: req.GetChunkSize(),
		Forwarded: true, ChunkVersion: version, TargetId: next.GetTargetId(),
		PieceOffsets: req.GetPieceOffsets(), PieceLengths: req.GetPieceLengths(),
	})
	if err != nil {
		return s.forwardError(m, next, what, err)
	}
	s.forwards.ok(m)
	if !resp.GetNeedFullChunk() {
		return nil
	}
	full, err := l.ReadFull()
	if err != nil {
		s.noteCorrupt(m, id, err)
		return fmt.Errorf("%s: read the whole chunk for the next member: %w", what, err)
	}
	return s.push(ctx, m, next, id, full)
}

// push sends a whole chunk to the next member (which passes it on down the
// chain). The caller holds the chunk.
func (s *Server) push(ctx context.Context, m member, next *weftv1.ChainMember, id chunk.ID, full chunk.Full) error {
	what := fmt.Sprintf("push %v (version %d)", id, full.Version)
	c, err := s.peers.client(next.GetAddress())
	if err == nil {
		_, err = c.PushChunk(ctx, &weftv1.PushChunkRequest{
			ChainId: m.view.id, ChainVersion: m.view.version, TargetId: next.GetTargetId(), Force: true,
			Chunk: &weftv1.FullChunk{Chunk: &weftv1.ChunkID{Ino: id.Ino, Index: id.Index},
				Version: full.Version, Exists: full.Exists, Data: full.Data},
		})
	}
	if err != nil {
		return s.forwardError(m, next, what, err)
	}
	s.forwards.ok(m)
	s.log.Debug("pushed whole chunk to next member", "chunk", id, "version", full.Version, "chain", m.view.id,
		"target", next.GetTargetId())
	return nil
}

// PushChunk replaces a member's copy of a chunk with the sender's (when a
// forwarded write could not be applied to it) and passes it on down the
// chain. Without force, a copy with a newer version is kept.
func (s *Server) PushChunk(ctx context.Context, req *weftv1.PushChunkRequest) (*weftv1.PushChunkResponse, error) {
	m, err := s.member(req.GetChainId(), req.GetChainVersion(), req.GetTargetId(), roleForwarded)
	if err != nil {
		return nil, err
	}
	fc := req.GetChunk()
	id, err := chunkID(fc.GetChunk())
	if err != nil {
		return nil, err
	}
	l := m.target.Lock(id, m.view.id)
	defer l.Unlock()
	if info, err := l.Info(); err == nil && !req.GetForce() && info.Version > fc.GetVersion() {
		return &weftv1.PushChunkResponse{}, nil
	}
	full := chunk.Full{Version: fc.GetVersion(), Exists: fc.GetExists(), Data: fc.GetData()}
	if err := l.Replace(full); err != nil {
		return nil, s.diskError(m, fmt.Sprintf("replace %v", id), err)
	}
	s.markVerified(m, id)
	if next := m.successor(); next != nil {
		ctx, done := forwardContext(ctx, m.view)
		defer done()
		if err := s.push(ctx, m, next, id, full); err != nil {
			return nil, err
		}
	}
	return &weftv1.PushChunkResponse{}, nil
}

// ReadChunk reads from a chunk on a serving member; the answer is short
// where the chunk ends (the rest reads as zeros). A checksum mismatch
// answers EIO (the client reads another replica) and starts a repair of
// this copy from a serving peer.
func (s *Server) ReadChunk(ctx context.Context, req *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error) {
	data, _, err := s.readChunk(req, nil)
	if err != nil {
		return nil, err
	}
	return &weftv1.ReadChunkResponse{Data: data}, nil
}

// ReadFullChunk returns a whole chunk with its version, from a serving
// member, for a syncing member or a repair.
func (s *Server) ReadFullChunk(ctx context.Context, req *weftv1.ReadFullChunkRequest) (*weftv1.FullChunk, error) {
	m, err := s.member(req.GetChainId(), req.GetChainVersion(), req.GetTargetId(), roleRead)
	if err != nil {
		return nil, err
	}
	id, err := chunkID(req.GetChunk())
	if err != nil {
		return nil, err
	}
	full, err := m.target.ReadFull(id)
	if err != nil {
		s.noteCorrupt(m, id, err)
		return nil, err
	}
	return &weftv1.FullChunk{Chunk: req.GetChunk(), Version: full.Version, Exists: full.Exists, Data: full.Data}, nil
}

// Listing pages are capped at maxListLimit chunks.
const (
	defaultListLimit = 1024
	maxListLimit     = 8192
)

// ListChunks pages through the chunks a serving member holds for its
// chain, with versions, lengths and digests.
func (s *Server) ListChunks(ctx context.Context, req *weftv1.ListChunksRequest) (*weftv1.ListChunksResponse, error) {
	m, err := s.member(req.GetChainId(), req.GetChainVersion(), req.GetTargetId(), roleRead)
	if err != nil {
		return nil, err
	}
	var after *chunk.ID
	if a := req.GetAfter(); a != nil {
		after = &chunk.ID{Ino: a.GetIno(), Index: a.GetIndex()}
	}
	limit := int(req.GetLimit())
	if limit <= 0 {
		limit = defaultListLimit
	}
	infos, more, err := m.target.List(m.view.id, after, min(limit, maxListLimit))
	if err != nil {
		return nil, err
	}
	resp := &weftv1.ListChunksResponse{More: more, Chunks: make([]*weftv1.ChunkInfo, len(infos))}
	for i, in := range infos {
		resp.Chunks[i] = &weftv1.ChunkInfo{Chunk: &weftv1.ChunkID{Ino: in.ID.Ino, Index: in.ID.Index},
			Version: in.Version, Length: uint64(in.Length), Digest: in.Digest}
	}
	return resp, nil
}
