package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// Retries of a chain operation refused because the data server has not
// seen the current chain table yet, or unreachable before the manager
// noticed it is down, back off from retryFirstDelay to retryMaxDelay.
const (
	retryFirstDelay = 50 * time.Millisecond
	retryMaxDelay   = time.Second
)

// dataConn is a cached connection to one data server.
type dataConn struct {
	addr   string
	cc     *grpc.ClientConn
	client weftv1.DataClient
}

// memberRef is where to send a chain operation: one member of a chain at
// the chain's current version.
type memberRef struct {
	chainID, chainVersion uint64
	targetID, serverID    uint64
	addr                  string
}

func (r memberRef) String() string {
	return fmt.Sprintf("chain %d at data server %d (%s)", r.chainID, r.serverID, r.addr)
}

// TruncateFile cuts the chunks of inode ino to a file length of size on
// every chain of layout, in parallel. A chain of one replica is asked
// directly; if its data server is offline the call fails with an error
// wrapping syscall.EIO that names the server. A replicated chain is asked
// at its head (first serving member), which passes the request down the
// chain; it fails only if no member serves. The call can be repeated
// (truncation is idempotent).
func (m *Manager) TruncateFile(ctx context.Context, ino uint64, layout *weftv1.Layout, size uint64) error {
	if layout == nil || len(layout.Chains) == 0 {
		return nil
	}
	chains := slices.Compact(slices.Sorted(slices.Values(layout.Chains)))
	what := fmt.Sprintf("truncate inode %d to %d bytes", ino, size)
	m.mu.Lock()
	for _, id := range chains {
		if _, err := m.chainTargets(what, id); err != nil {
			m.mu.Unlock()
			return err
		}
	}
	m.mu.Unlock()
	errs := make([]error, len(chains))
	var wg sync.WaitGroup
	for i, id := range chains {
		wg.Go(func() {
			errs[i] = m.onChain(ctx, what, id, func(ctx context.Context, c weftv1.DataClient, r memberRef) error {
				_, err := c.TruncateFile(ctx, &weftv1.TruncateFileRequest{
					Ino: ino, Size: size, ChunkSize: layout.ChunkSize,
					ChainId: r.chainID, ChainVersion: r.chainVersion,
				})
				return err
			})
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// DeleteFile removes every chunk of inode ino from the data servers that
// hold layout's chains. For chains of one replica every online server
// holding one is asked (for all of the file's chunks on it), even when
// others are not; a replicated chain is asked at its head with the chain
// id, and the request goes down the chain (members offline now drop the
// chunks when they sync). Any failure is returned (wrapping syscall.EIO
// for a server that is down) so that the caller retries the whole
// deletion later, which is harmless for what is already done.
func (m *Manager) DeleteFile(ctx context.Context, ino uint64, layout *weftv1.Layout) error {
	if layout == nil || len(layout.Chains) == 0 {
		return nil
	}
	what := fmt.Sprintf("delete the chunks of inode %d", ino)
	byServer := make(map[uint64]memberRef)
	var replicated []uint64
	var errs []error
	m.mu.Lock()
	for _, id := range slices.Compact(slices.Sorted(slices.Values(layout.Chains))) {
		if c := m.chains[id]; c != nil && c.width() > 1 {
			replicated = append(replicated, id)
			continue
		}
		refs, err := m.chainMembers(what, id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, r := range refs {
			byServer[r.serverID] = r
		}
	}
	m.mu.Unlock()
	results := make(chan error, len(byServer)+len(replicated))
	for _, id := range replicated {
		go func() {
			results <- m.onChain(ctx, what, id, func(ctx context.Context, c weftv1.DataClient, r memberRef) error {
				_, err := c.DeleteFile(ctx, &weftv1.DeleteFileRequest{Ino: ino, ChainId: r.chainID, ChainVersion: r.chainVersion})
				return err
			})
		}()
	}
	for _, r := range byServer {
		go func() {
			c, err := m.dataClient(r.serverID, r.addr)
			if err == nil {
				_, err = c.DeleteFile(ctx, &weftv1.DeleteFileRequest{Ino: ino})
			}
			if err != nil {
				err = describe(what, r, err)
			}
			results <- err
		}()
	}
	for range len(byServer) + len(replicated) {
		errs = append(errs, <-results)
	}
	return errors.Join(errs...)
}

// memberRef says where member mem of chain c lives (server and address,
// empty if unknown). Called with m.mu held.
func (m *Manager) memberRef(c *chainRecord, mem memberRecord) memberRef {
	r := memberRef{chainID: c.ID, chainVersion: c.Version, targetID: mem.TargetID}
	if t := m.targets[mem.TargetID]; t != nil {
		r.serverID = t.rec.ServerID
		if s := m.servers[r.serverID]; s != nil {
			r.addr = s.rec.Address
		}
	}
	return r
}

// chainMembers returns where to send an operation on chain id, or an error
// wrapping syscall.EIO if the chain is unknown or a member is offline.
// Called with m.mu held.
func (m *Manager) chainMembers(what string, id uint64) ([]memberRef, error) {
	c := m.chains[id]
	if c == nil {
		return nil, fserr.Wrap(syscall.EIO, "%s: chain %d is not in the chain table (the file's layout is damaged)", what, id)
	}
	refs := make([]memberRef, 0, len(c.Members))
	for _, mem := range c.Members {
		r := m.memberRef(c, mem)
		if mem.State == stateOffline || !m.targetOnline(mem.TargetID) {
			return nil, fserr.Wrap(syscall.EIO, "%s: data server %d (%s) holding chain %d is offline: retry when it is back",
				what, r.serverID, r.addr, c.ID)
		}
		refs = append(refs, r)
	}
	return refs, nil
}

// chainTargets returns where to send an operation on chain id: every
// member of a chain of one replica (chainMembers), the head of a
// replicated one (chainHead). Called with m.mu held.
func (m *Manager) chainTargets(what string, id uint64) ([]memberRef, error) {
	if c := m.chains[id]; c != nil && c.width() > 1 {
		r, err := m.chainHead(what, c)
		if err != nil {
			return nil, err
		}
		return []memberRef{r}, nil
	}
	return m.chainMembers(what, id)
}

// chainHead returns the first serving member of replicated chain c, or an
// error wrapping syscall.EIO if none is online. Called with m.mu held.
func (m *Manager) chainHead(what string, c *chainRecord) (memberRef, error) {
	for _, mem := range c.Members {
		if mem.State != stateServing || !m.targetOnline(mem.TargetID) {
			continue
		}
		r := memberRef{chainID: c.ID, chainVersion: c.Version, targetID: mem.TargetID}
		r.serverID = m.targets[mem.TargetID].rec.ServerID
		if s := m.servers[r.serverID]; s != nil {
			r.addr = s.rec.Address
		}
		return r, nil
	}
	return memberRef{}, fserr.Wrap(syscall.EIO, "%s: chain %d (%d replicas) has no serving member online: retry when its data servers are back",
		what, c.ID, c.width())
}

// onChain runs call on the members of chain id that chainTargets names.
// A refusal for a stale chain version or an unreachable server is retried
// with the chain's current members (after the manager's own table
// changed) until the failure timeout (plus two heartbeats) has
// passed, the time it takes for the server to learn the new table or for
// the manager to mark it offline.
func (m *Manager) onChain(ctx context.Context, what string, id uint64, call func(context.Context, weftv1.DataClient, memberRef) error) error {
	deadline := time.Now().Add(m.cfg.FailureTimeout + 2*m.cfg.HeartbeatInterval)
	delay := retryFirstDelay
	for {
		m.mu.Lock()
		refs, err := m.chainTargets(what, id)
		m.mu.Unlock()
		if err != nil {
			return err
		}
		var last memberRef
		for _, r := range refs {
			last = r
			var c weftv1.DataClient
			if c, err = m.dataClient(r.serverID, r.addr); err == nil {
				err = call(ctx, c, r)
			}
			if err != nil {
				break
			}
		}
		if err == nil {
			return nil
		}
		if !retryable(err) || time.Now().Add(delay).After(deadline) {
			return describe(what, last, err)
		}
		select {
		case <-ctx.Done():
			return describe(what, last, err)
		case <-time.After(delay):
		}
		delay = min(2*delay, retryMaxDelay)
	}
}

// retryable reports whether err may go away by itself: the server did not
// know the chain version yet, or could not be reached.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.Unavailable:
		return true
	}
	return false
}

// describe wraps the error of an operation on member r. An unreachable
// server, or one still refusing the chain version, becomes syscall.EIO with
// a hint; errors carrying an errno keep it.
func describe(what string, r memberRef, err error) error {
	if _, ok := fserr.Errno(err); !ok {
		switch status.Code(err) {
		case codes.Unavailable:
			return fmt.Errorf("%s: %s is unreachable (%v): retry when it is back: %w", what, r, err, syscall.EIO)
		case codes.FailedPrecondition:
			return fmt.Errorf("%s: %s refused chain version %d (%v): retry in a few seconds: %w", what, r, r.chainVersion, err, syscall.EIO)
		}
	}
	return fmt.Errorf("%s: %s: %w", what, r, err)
}

// dataClient returns the cached client of server sid, dialing addr if
// there is none or the server's address changed.
func (m *Manager) dataClient(sid uint64, addr string) (weftv1.DataClient, error) {
	m.connMu.Lock()
	defer m.connMu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("connect to data server %d (%s): the cluster manager is closed", sid, addr)
	}
	if c := m.conns[sid]; c != nil {
		if c.addr == addr {
			return c.client, nil
		}
		c.cc.Close()
		delete(m.conns, sid)
	}
	cc, err := rpc.Dial(addr)
	if err != nil {
		return nil, fmt.Errorf("connect to data server %d: %w", sid, err)
	}
	c := &dataConn{addr: addr, cc: cc, client: weftv1.NewDataClient(cc)}
	m.conns[sid] = c
	return c.client, nil
}
