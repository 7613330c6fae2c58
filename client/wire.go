package client

import (
	"context"

	"google.golang.org/grpc/connectivity"

	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// memberClient returns the client of chain member m's data server. Chunk
// reads, writes and syncs go over the lean data path (package
// internal/wire) when the member has a wire address, and over gRPC when
// it has none (a data server of an older version, or with the lean data
// path turned off); everything else goes over gRPC.
func (t *chainTable) memberClient(m *weftv1.ChainMember) (weftv1.DataClient, error) {
	if m.WireAddress == "" {
		return t.conn(m.Address)
	}
	t.connsMu.Lock()
	defer t.connsMu.Unlock()
	cc, ok := t.conns[m.Address]
	if !ok {
		var err error
		if cc, err = rpc.Dial(m.Address); err != nil {
			return nil, err
		}
		t.conns[m.Address] = cc
	}
	w := t.wireClientLocked(m.WireAddress)
	var dc weftv1.DataClient = wire.NewDataClient(weftv1.NewDataClient(cc), w)
	if t.wrap != nil {
		dc = t.wrap(dc)
	}
	return dc, nil
}

// connected reports whether the client holds a live connection to the
// data server of member m (over the path memberClient takes).
func (t *chainTable) connected(m *weftv1.ChainMember) bool {
	t.connsMu.Lock()
	defer t.connsMu.Unlock()
	if m.WireAddress != "" {
		w := t.wires[m.WireAddress]
		return w != nil && w.Connected()
	}
	cc := t.conns[m.Address]
	return cc != nil && cc.GetState() == connectivity.Ready
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
	return t.wireClientLocked(addr)
}

// wireClientLocked is wireClient with t.connsMu held.
func (t *chainTable) wireClientLocked(addr string) *wire.Client {
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

// closeWiresLocked closes the lean data path clients. Called with
// t.connsMu held.
func (t *chainTable) closeWiresLocked() {
	for addr, w := range t.wires {
		w.Close()
		delete(t.wires, addr)
	}
}

// wireCalls is the number of requests sent over the lean data path.
func (t *chainTable) wireCalls() uint64 {
	t.connsMu.Lock()
	defer t.connsMu.Unlock()
	var n uint64
	for _, w := range t.wires {
		n += w.Calls()
	}
	return n
}

// readerInto is a data client that can receive a chunk read into the
// caller's buffer (the lean data path).
type readerInto interface {
	ReadChunkInto(ctx context.Context, in *weftv1.ReadChunkRequest, dst []byte) ([]byte, error)
}

// sharedReader is a data client that reads into a buffer of its own
// that it hands over (the lean data path: one of the shared arena, which
// the server fills in place); give it back with wire.PutShared.
type sharedReader interface {
	ReadChunkShared(ctx context.Context, in *weftv1.ReadChunkRequest) ([]byte, error)
}

// readChunkData reads with dc, into dst when dc can and the answer fits.
// Without dst the data is in a buffer the caller owns: give it back with
// wire.PutShared (a no-op for one that is not the lean data path's).
func readChunkData(ctx context.Context, dc weftv1.DataClient, req *weftv1.ReadChunkRequest, dst []byte) ([]byte, error) {
	if sr, ok := dc.(sharedReader); ok && dst == nil {
		return sr.ReadChunkShared(ctx, req)
	}
	if ri, ok := dc.(readerInto); ok && dst != nil {
		return ri.ReadChunkInto(ctx, req, dst)
	}
	resp, err := dc.ReadChunk(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.Data, nil
}
