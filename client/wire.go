package client

import (
	"context"
	"fmt"

	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// dataServer is the client's one way to the chunks of a data server: the
// lean protocol of package internal/wire (*wire.Client), over TCP or, to
// a server on this host, its Unix socket. The only other way to chunk
// bytes is reading them in place (localread.go), which starts from the
// same *wire.Client. Errors are gRPC statuses (fserr errnos inside), as
// the retry logic (retry.go) expects.
type dataServer interface {
	// WriteChunk writes req.Data at req.Offset of one chunk.
	WriteChunk(ctx context.Context, req *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error)
	// WritePieces writes pieces of one chunk (req.PieceOffsets and
	// req.PieceLengths; their bytes are pieces, one after another).
	WritePieces(ctx context.Context, req *weftv1.WriteChunkRequest, pieces [][]byte) (*weftv1.WriteChunkResponse, error)
	// ReadChunkInto reads into dst when the answer fits (else into a new
	// buffer) and returns what the server sent: shorter than asked
	// where the chunk ends.
	ReadChunkInto(ctx context.Context, req *weftv1.ReadChunkRequest, dst []byte) ([]byte, error)
	// SyncFile makes a file's chunks of a chain durable.
	SyncFile(ctx context.Context, req *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error)
}

var _ dataServer = (*wire.Client)(nil)

// memberClient returns the client of chain member m's data server.
func (t *chainTable) memberClient(m *weftv1.ChainMember) (dataServer, error) {
	if m.WireAddress == "" {
		return nil, fmt.Errorf("data server %s has no lean data path address", m.Address)
	}
	var ds dataServer = t.wireClient(m.WireAddress)
	if t.wrap != nil {
		ds = t.wrap(ds)
	}
	return ds, nil
}

// connected reports whether the client holds a live connection to the
// data server of member m.
func (t *chainTable) connected(m *weftv1.ChainMember) bool {
	t.connsMu.Lock()
	defer t.connsMu.Unlock()
	w := t.wires[m.WireAddress]
	return w != nil && w.Connected()
}

// freshFor makes sure that a request about to dial member m of chain ch
// (no live connection to its server: never used, or its connections
// broke, as when the server stopped) goes by a table fetched after that:
// the server may be back as a new incarnation elsewhere, and its old
// address may now be anything. It refreshes the table unless that
// happened very recently, and reports whether chain ch changed (the
// caller looks it up again).
func (t *chainTable) freshFor(ctx context.Context, ch *weftv1.Chain, m *weftv1.ChainMember) bool {
	if t.connected(m) {
		return false
	}
	t.refreshSoon(ctx)
	nch := t.get(ch.Id)
	return nch != nil && nch.Version != ch.Version
}

// wireClient returns the lean data path client of a wire address.
func (t *chainTable) wireClient(addr string) *wire.Client {
	t.connsMu.Lock()
	defer t.connsMu.Unlock()
	if t.wires == nil {
		t.wires = make(map[string]*wire.Client)
	}
	w := t.wires[addr]
	if w == nil {
		w = wire.NewClient(addr, 0)
		t.wires[addr] = w
	}
	return w
}
