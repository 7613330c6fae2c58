package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

const (
	minRefreshInterval = 100 * time.Millisecond
	firstBackoff       = 50 * time.Millisecond
	maxBackoff         = 2 * time.Second
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
	conns   map[string]*grpc.ClientConn
}

func (t *chainTable) init(c *Client) {
	t.c = c
	t.chains = make(map[uint64]*weftv1.Chain)
	t.conns = make(map[string]*grpc.ClientConn)
}

// refresh fetches the chain table from the meta service.
func (t *chainTable) refresh(ctx context.Context) error {
	t.refreshMu.Lock()
	defer t.refreshMu.Unlock()
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
	return nil
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

// conn returns the connection to a data server, dialing it on first use.
func (t *chainTable) conn(addr string) (weftv1.DataClient, error) {
	t.connsMu.Lock()
	defer t.connsMu.Unlock()
	cc, ok := t.conns[addr]
	if !ok {
		var err error
		cc, err = rpc.Dial(addr)
		if err != nil {
			return nil, err
		}
		t.conns[addr] = cc
	}
	return weftv1.NewDataClient(cc), nil
}

func (t *chainTable) close() {
	t.connsMu.Lock()
	defer t.connsMu.Unlock()
	for addr, cc := range t.conns {
		cc.Close()
		delete(t.conns, addr)
	}
}

// head picks the member of a chain that takes requests: the first serving
// one, else the first with an address (the meta service may not have
// noticed yet that a server is back; the server itself refuses what it
// cannot serve).
func head(ch *weftv1.Chain) *weftv1.ChainMember {
	for _, m := range ch.Members {
		if (m.State == "" || m.State == "serving") && m.Address != "" {
			return m
		}
	}
	for _, m := range ch.Members {
		if m.Address != "" {
			return m
		}
	}
	return nil
}

// retryable reports whether a data server's error means the chain table
// may be stale or the server is (for now) unreachable.
func retryable(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.FailedPrecondition, codes.Unavailable:
		return true
	}
	return false
}

// errChainNotServing is what a chain without a reachable member reports
// while the client waits for it to come back.
var errChainNotServing = errors.New("no member of the chain has an address")

// onChain runs fn against the serving head of chain id with the chain's
// current version. A stale chain version or an unreachable server makes it
// refresh the chain table and retry with backoff; after
// Config.UnavailableTimeout it gives up with an error wrapping EIO that
// names the server.
func (c *Client) onChain(ctx context.Context, id uint64, what string,
	fn func(ctx context.Context, dc weftv1.DataClient, version uint64) error) error {
	var (
		firstFail time.Time
		backoff   = firstBackoff
		addr      string
		warned    bool
	)
	for {
		ch := c.chains.get(id)
		if ch == nil {
			c.chains.refreshSoon(ctx)
			if ch = c.chains.get(id); ch == nil {
				return fmt.Errorf("%s: chain %d is not in the cluster's chain table (was the data server removed?): %w",
					what, id, syscall.EIO)
			}
		}
		var err error
		if m := head(ch); m == nil {
			err = errChainNotServing
		} else {
			addr = m.Address
			var dc weftv1.DataClient
			if dc, err = c.chains.conn(addr); err != nil {
				return fmt.Errorf("%s on chain %d: %v: %w", what, id, err, syscall.EIO)
			}
			err = fn(ctx, dc, ch.Version)
			if err == nil {
				return nil
			}
			if !retryable(err) {
				return dataError(what, addr, err)
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		now := time.Now()
		if firstFail.IsZero() {
			firstFail = now
		}
		if now.Sub(firstFail) >= c.cfg.UnavailableTimeout {
			c.log.Error("data server unavailable, giving up", "op", what, "chain", id, "server", addr,
				"waited", now.Sub(firstFail).Round(time.Second), "err", err)
			return fmt.Errorf("%s: data server %s of chain %d unavailable for %v (start it again or check `weft status`): %v: %w",
				what, addr, id, c.cfg.UnavailableTimeout, err, syscall.EIO)
		}
		if !warned && now.Sub(firstFail) > time.Second {
			warned = true
			c.log.Warn("data server unavailable, retrying", "op", what, "chain", id, "server", addr, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, maxBackoff)
		c.chains.refreshSoon(ctx)
	}
}

// dataError keeps the errnos a data server may mean for the application
// (no space, quota, I/O error, file too big, read-only) and turns any other
// into EIO: an errno of the server's own files (say EBADF) would mislead
// the caller about its own descriptors.
func dataError(what, addr string, err error) error {
	if e, ok := fserr.Errno(err); ok {
		switch e {
		case syscall.ENOSPC, syscall.EDQUOT, syscall.EIO, syscall.EFBIG, syscall.EROFS:
			return err
		}
	} else if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%s on data server %s: %v: %w", what, addr, err, syscall.EIO)
}
