package wire

import (
	"context"

	"google.golang.org/grpc"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// DataClient is a weftv1.DataClient that sends chunk reads, writes and
// syncs over the lean data path and every other request over gRPC.
type DataClient struct {
	weftv1.DataClient
	W *Client
}

// NewDataClient combines the gRPC client g of a data server with the
// lean data path client w of the same server.
func NewDataClient(g weftv1.DataClient, w *Client) DataClient { return DataClient{DataClient: g, W: w} }

// WriteChunk implements weftv1.DataClient over the lean data path. Call
// options are ignored.
func (d DataClient) WriteChunk(ctx context.Context, in *weftv1.WriteChunkRequest, _ ...grpc.CallOption) (*weftv1.WriteChunkResponse, error) {
	return d.W.WriteChunk(ctx, in)
}

// WritePieces sends a write of pieces whose bytes are pieces (see
// Client.WritePieces).
func (d DataClient) WritePieces(ctx context.Context, in *weftv1.WriteChunkRequest, pieces [][]byte) (*weftv1.WriteChunkResponse, error) {
	return d.W.WritePieces(ctx, in, pieces)
}

// ReadChunk implements weftv1.DataClient over the lean data path. Call
// options are ignored.
func (d DataClient) ReadChunk(ctx context.Context, in *weftv1.ReadChunkRequest, _ ...grpc.CallOption) (*weftv1.ReadChunkResponse, error) {
	return d.W.ReadChunk(ctx, in)
}

// SyncFile implements weftv1.DataClient over the lean data path. Call
// options are ignored.
func (d DataClient) SyncFile(ctx context.Context, in *weftv1.SyncFileRequest, _ ...grpc.CallOption) (*weftv1.SyncFileResponse, error) {
	return d.W.SyncFile(ctx, in)
}

// ReadChunkInto reads into dst when the answer fits (see
// Client.ReadChunkInto).
func (d DataClient) ReadChunkInto(ctx context.Context, in *weftv1.ReadChunkRequest, dst []byte) ([]byte, error) {
	return d.W.ReadChunkInto(ctx, in, dst)
}

// ReadChunkShared reads into a buffer it returns (see
// Client.ReadChunkShared).
func (d DataClient) ReadChunkShared(ctx context.Context, in *weftv1.ReadChunkRequest) ([]byte, error) {
	return d.W.ReadChunkShared(ctx, in)
}
