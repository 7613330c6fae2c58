package data

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/status"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// dataService is the Data gRPC service of a Server. It is the Server
// itself, except for the Scrub RPC, whose name the Go method
// (*Server).Scrub(ctx) already takes.
type dataService struct {
	*Server
}

// Scrub runs a full scrub pass now, at full speed, and answers with what
// it found over all the server's targets (weft scrub); with known, it
// checks again only the bad copies the server knows of (weft fsck). A
// pass that fails part way answers an error naming what failed, unless
// it was cancelled.
func (d dataService) Scrub(ctx context.Context, req *weftv1.ScrubRequest) (*weftv1.ScrubResponse, error) {
	var res ScrubResult
	var err error
	if req.GetKnown() {
		res, err = d.Server.checkBad(ctx, req.GetRepair()), ctx.Err()
	} else {
		res, err = d.Server.Scrub(ctx)
	}
	resp := &weftv1.ScrubResponse{
		Chunks:   uint64(res.Chunks),
		Bytes:    uint64(res.Bytes),
		Errors:   uint64(res.Errors),
		Repaired: uint64(res.Repaired),
	}
	for _, u := range res.Unrepaired {
		resp.Unrepaired = append(resp.Unrepaired, &weftv1.UnrepairedChunk{
			Chunk: &weftv1.ChunkID{Ino: u.Chunk.Ino, Index: u.Chunk.Index}, TargetId: u.TargetID,
			TargetDir: u.Target, Problem: u.Problem, Reason: u.Reason})
	}
	switch {
	case err == nil:
		return resp, nil
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return nil, status.FromContextError(err).Err()
	}
	d.mu.RLock()
	sid := d.serverID
	d.mu.RUnlock()
	return nil, fmt.Errorf("scrub pass on data server %d: %w (%d chunks verified, %d bad copies found, %d repaired)",
		sid, err, res.Chunks, res.Errors, res.Repaired)
}
