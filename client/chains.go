package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

const (
	minRefreshInterval = 100 * time.Millisecond
	firstBackoff       = 50 * time.Millisecond
	maxBackoff         = 500 * time.Millisecond
)

// chainTable is the client's copy of the cluster's chain table and its
// connections to data servers, one per address.
type chainTable struct {
	c *Client

	mu          sync.RWMutex
	version     uint64
	chains      map[uint64]*weftv1.Chain
	lastRefresh time.Time

	refreshMu sync.Mutex // one GetChains at a time

	connsMu sync.Mutex
	wires   map[string]*wire.Client // data servers, by wire address (dataServer)

	outMu   sync.Mutex
	outages map[uint64]*outage // chains failing now
	outN    atomic.Int32       // len(outages), read without the lock

	// wrap, if set before the first data request, wraps every data
	// server client (tests count requests with it).
	wrap func(dataServer) dataServer

	statsMu sync.Mutex
	stats   map[string]*serverStat // per data server address
}

func (t *chainTable) init(c *Client) {
	t.c = c
	t.chains = make(map[uint64]*weftv1.Chain)
	t.outages = make(map[uint64]*outage)
	t.stats = make(map[string]*serverStat)
}

// refresh fetches the chain table from the meta service.
func (t *chainTable) refresh(ctx context.Context) error {
	t.refreshMu.Lock()
	defer t.refreshMu.Unlock()
	return t.refreshLocked(ctx)
}

// refreshIfStale refreshes the table after a data server refused version
// used of chain id, unless another request refreshed it meanwhile (the
// chain's version moved): many requests refused at once cost one
// GetChains.
func (t *chainTable) refreshIfStale(ctx context.Context, id, used uint64) {
	t.refreshMu.Lock()
	defer t.refreshMu.Unlock()
	if ch := t.get(id); ch != nil && ch.Version != used {
		return
	}
	if err := t.refreshLocked(ctx); err != nil {
		t.c.log.Warn("refreshing the chain table failed", "err", err)
	}
}

// refreshLocked is refresh with t.refreshMu held.
func (t *chainTable) refreshLocked(ctx context.Context) error {
	tab, err := t.c.meta.GetChains(ctx, &weftv1.GetChainsRequest{})
	if err != nil {
		return fmt.Errorf("fetch the chain table from the meta service at %s: %w", t.c.cfg.MetaAddr, err)
	}
	m := make(map[uint64]*weftv1.Chain, len(tab.Chains))
	for _, ch := range tab.Chains {
		m[ch.Id] = ch
	}
	t.mu.Lock()
	t.version, t.chains, t.lastRefresh = tab.Version, m, time.Now()
	t.mu.Unlock()
	t.dropGone(tab)
	return nil
}

// dropGone closes the connections to addresses no member of tab has any
// more (incarnations of data servers that restarted elsewhere, servers
// removed): nothing may use them, and they are not kept open.
func (t *chainTable) dropGone(tab *weftv1.ChainTable) {
	live := make(map[string]bool)
	for _, ch := range tab.Chains {
		for _, m := range ch.Members {
			live[m.Address], live[m.WireAddress] = true, true
		}
	}
	t.connsMu.Lock()
	defer t.connsMu.Unlock()
	for addr, w := range t.wires {
		if !live[addr] {
			w.Close()
			delete(t.wires, addr)
		}
	}
}

// refreshSoon refreshes the table unless that happened very recently
// (many failing requests at once cause one GetChains).
func (t *chainTable) refreshSoon(ctx context.Context) {
	t.mu.RLock()
	recent := time.Since(t.lastRefresh) < minRefreshInterval
	t.mu.RUnlock()
	if recent {
		return
	}
	if err := t.refresh(ctx); err != nil {
		t.c.log.Warn("refreshing the chain table failed", "err", err)
	}
}

func (t *chainTable) get(id uint64) *weftv1.Chain {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.chains[id]
}

// lookup returns chain id. A chain the table lacks was made after the
// table was fetched (the meta service names only chains it has in a
// layout), so the table is refreshed at once; concurrent lookups of the
// same new chain cost one GetChains.
func (t *chainTable) lookup(ctx context.Context, id uint64, what string) (*weftv1.Chain, error) {
	if t.inOutage(id) {
		// The chain failed lately: its members may be back elsewhere
		// (new incarnations at other addresses), which only a fresh
		// table tells; an old address may now be anything.
		t.refreshSoon(ctx)
	}
	if ch := t.get(id); ch != nil {
		return ch, nil
	}
	t.refreshMu.Lock()
	var err error
	if t.get(id) == nil {
		err = t.refreshLocked(ctx)
	}
	t.refreshMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if ch := t.get(id); ch != nil {
		return ch, nil
	}
	return nil, fmt.Errorf("%s: chain %d is not in the cluster's chain table (was the data server removed?): %w",
		what, id, syscall.EIO)
}

func (t *chainTable) close() {
	t.connsMu.Lock()
	defer t.connsMu.Unlock()
	for addr, w := range t.wires {
		w.Close()
		delete(t.wires, addr)
	}
}

// dataError keeps the errnos a data server may mean for the application
// (no space, quota, I/O error, file too big) and turns any other into
// EIO: an errno of the server's own files (say EBADF, or EROFS of its
// disk) would mislead the caller about its own descriptors or file
// system.
func dataError(what, addr string, err error) error {
	if e, ok := fserr.Errno(err); ok {
		switch e {
		case syscall.ENOSPC, syscall.EDQUOT, syscall.EIO, syscall.EFBIG:
			return err
		}
	} else if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%s on data server %s: %v: %w", what, addr, err, syscall.EIO)
}

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
