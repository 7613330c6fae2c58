package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// fsckListPage is how many chunks one ListChunks call of ScanChunks asks
// a member for.
const fsckListPage = 4096

// ChunkCopy is one serving member's copy of a chunk.
type ChunkCopy struct {
	TargetID, ServerID uint64
	Version, Length    uint64
}

// ChunkReplicas is one chunk of a chain as its serving members hold it:
// the members that have a copy and those that lack one.
type ChunkReplicas struct {
	Chain      uint64
	Ino, Index uint64
	Holders    []ChunkCopy
	// Missing are the target ids of serving members without a copy.
	Missing []uint64
	// Repaired: ProbeChunk with repair copied the chunk to every member
	// in Missing.
	Repaired bool
}

// ChainScanError says that the chunks of a chain could not be listed (a
// member offline or unreachable); ScanChunks goes on with the other
// chains and returns every such error joined.
type ChainScanError struct {
	Chain uint64
	Err   error
}

func (e *ChainScanError) Error() string {
	return fmt.Sprintf("list the chunks of chain %d: %v", e.Chain, e.Err)
}

func (e *ChainScanError) Unwrap() error { return e.Err }

// fsckMember is a serving member of a chain to list or probe.
type fsckMember struct {
	memberRef
	client weftv1.DataClient
}

// servingMembers returns the serving members of chain id with their
// clients, at the chain's current version; an error if the chain is
// unknown, has no serving member, or one of its members is offline or
// unreachable (its chunks could not be compared).
func (m *Manager) servingMembers(id uint64) ([]fsckMember, error) {
	m.mu.Lock()
	c := m.chains[id]
	if c == nil {
		m.mu.Unlock()
		return nil, fmt.Errorf("chain %d is not in the chain table", id)
	}
	var refs []memberRef
	for _, mem := range c.Members {
		r := m.memberRef(c, mem)
		if c.width() == 1 && (mem.State == stateOffline || !m.targetOnline(mem.TargetID)) {
			m.mu.Unlock()
			return nil, fmt.Errorf("its only member, target %d on data server %d (%s), is offline: check again when it is back",
				mem.TargetID, r.serverID, r.addr)
		}
		if mem.State != stateServing || !m.targetOnline(mem.TargetID) {
			continue
		}
		refs = append(refs, r)
	}
	m.mu.Unlock()
	if len(refs) == 0 {
		return nil, fmt.Errorf("chain %d has no serving member online", id)
	}
	out := make([]fsckMember, len(refs))
	for i, r := range refs {
		c, err := m.dataClient(r.serverID, r.addr)
		if err != nil {
			return nil, err
		}
		out[i] = fsckMember{memberRef: r, client: c}
	}
	return out, nil
}

// listOrder compares chunk ids in the data servers' listing order: ino%256,
// then ino, then index.
func listOrder(a, b *weftv1.ChunkID) int {
	return cmp.Or(cmp.Compare(a.GetIno()%256, b.GetIno()%256), cmp.Compare(a.GetIno(), b.GetIno()),
		cmp.Compare(a.GetIndex(), b.GetIndex()))
}

// memberLister pages through one member's listing of its chain.
type memberLister struct {
	m     fsckMember
	page  []*weftv1.ChunkInfo
	more  bool
	after *weftv1.ChunkID
}

// head returns the member's next chunk, fetching a page when needed; nil
// at the end.
func (l *memberLister) head(ctx context.Context) (*weftv1.ChunkInfo, error) {
	for len(l.page) == 0 {
		if !l.more {
			return nil, nil
		}
		resp, err := l.m.client.ListChunks(ctx, &weftv1.ListChunksRequest{
			ChainId: l.m.chainID, ChainVersion: l.m.chainVersion, After: l.after, Limit: fsckListPage, TargetId: l.m.targetID,
		})
		if err != nil {
			return nil, describe("list chunks", l.m.memberRef, err)
		}
		l.page, l.more = resp.GetChunks(), resp.GetMore()
		if n := len(l.page); n > 0 {
			l.after = l.page[n-1].GetChunk()
		}
	}
	return l.page[0], nil
}

// ScanChunks lists the chunks of every chain on each of its serving
// members and calls visit once per chunk and chain, in listing order per
// chain, with the members holding a copy and those lacking one (merging
// the members' listings as a resync does). Chunks are listed through the
// chain they were written through, so a target's chunks of another chain
// appear under that chain. A chain that cannot be listed (a member
// offline, unreachable, or the chain changing meanwhile) is skipped with a
// *ChainScanError in the joined result; an error of visit stops the scan.
func (m *Manager) ScanChunks(ctx context.Context, visit func(ChunkReplicas) error) error {
	m.mu.Lock()
	ids := slices.Clone(m.chainIDs)
	m.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return err
		}
		err := m.scanChainRetrying(ctx, id, visit)
		var ve visitError
		if errors.As(err, &ve) {
			return ve.err
		}
		if err != nil {
			errs = append(errs, &ChainScanError{Chain: id, Err: err})
		}
	}
	return errors.Join(errs...)
}

// visitError carries an error of the visit function through scanChain.
type visitError struct{ err error }

func (e visitError) Error() string { return e.err.Error() }

// scanChainRetrying scans chain id, again from its start (up to three
// times) when a member refused or could not be reached: a chain whose
// version changed meanwhile is listed anew at its new version. A chunk
// may then be visited more than once.
func (m *Manager) scanChainRetrying(ctx context.Context, id uint64, visit func(ChunkReplicas) error) error {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(m.cfg.HeartbeatInterval):
			}
		}
		err = m.scanChain(ctx, id, visit)
		var ve visitError
		if err == nil || errors.As(err, &ve) {
			return err
		}
	}
	return err
}

// scanChain merges the listings of chain id's serving members.
func (m *Manager) scanChain(ctx context.Context, id uint64, visit func(ChunkReplicas) error) error {
	members, err := m.servingMembers(id)
	if err != nil {
		return err
	}
	listers := make([]*memberLister, len(members))
	for i, mem := range members {
		listers[i] = &memberLister{m: mem, more: true}
	}
	heads := make([]*weftv1.ChunkInfo, len(listers))
	for {
		var low *weftv1.ChunkID
		for i, l := range listers {
			if heads[i], err = l.head(ctx); err != nil {
				return err
			}
			if heads[i] != nil && (low == nil || listOrder(heads[i].GetChunk(), low) < 0) {
				low = heads[i].GetChunk()
			}
		}
		if low == nil {
			return nil
		}
		r := ChunkReplicas{Chain: id, Ino: low.GetIno(), Index: low.GetIndex()}
		for i, l := range listers {
			if h := heads[i]; h != nil && listOrder(h.GetChunk(), low) == 0 {
				r.Holders = append(r.Holders, ChunkCopy{TargetID: l.m.targetID, ServerID: l.m.serverID, Version: h.GetVersion(), Length: h.GetLength()})
				l.page = l.page[1:]
			} else {
				r.Missing = append(r.Missing, l.m.targetID)
			}
		}
		if err := visit(r); err != nil {
			return visitError{err}
		}
	}
}

// ProbeChunk asks every serving member of chain whether it holds chunk
// (ino, index) now. With repair, a chunk that some serving members hold
// and others lack is copied (the newest version) to those lacking it;
// the copy never overwrites a newer version a write installed meanwhile.
func (m *Manager) ProbeChunk(ctx context.Context, chain, ino, index uint64, repair bool) (ChunkReplicas, error) {
	r := ChunkReplicas{Chain: chain, Ino: ino, Index: index}
	members, err := m.servingMembers(chain)
	if err != nil {
		return r, &ChainScanError{Chain: chain, Err: err}
	}
	id := &weftv1.ChunkID{Ino: ino, Index: index}
	var best *weftv1.FullChunk
	for _, mem := range members {
		full, err := mem.client.ReadFullChunk(ctx, &weftv1.ReadFullChunkRequest{
			Chunk: id, ChainId: chain, ChainVersion: mem.chainVersion, TargetId: mem.targetID,
		})
		if err != nil {
			return r, describe(fmt.Sprintf("read chunk %d of inode %d", index, ino), mem.memberRef, err)
		}
		if !full.GetExists() {
			r.Missing = append(r.Missing, mem.targetID)
			continue
		}
		r.Holders = append(r.Holders, ChunkCopy{TargetID: mem.targetID, ServerID: mem.serverID, Version: full.GetVersion(), Length: uint64(len(full.GetData()))})
		if best == nil || full.GetVersion() > best.GetVersion() {
			best = full
		}
	}
	if !repair || best == nil || len(r.Missing) == 0 {
		return r, nil
	}
	for _, mem := range members {
		if !slices.Contains(r.Missing, mem.targetID) {
			continue
		}
		_, err := mem.client.PushChunk(ctx, &weftv1.PushChunkRequest{
			ChainId: chain, ChainVersion: mem.chainVersion, TargetId: mem.targetID,
			Chunk: &weftv1.FullChunk{Chunk: id, Version: best.GetVersion(), Exists: true, Data: best.GetData()},
		})
		if err != nil {
			return r, describe(fmt.Sprintf("copy chunk %d of inode %d", index, ino), mem.memberRef, err)
		}
	}
	r.Repaired = true
	return r, nil
}

// BadCopy is a bad copy of a chunk a data server knows of and has not
// repaired.
type BadCopy struct {
	ServerID uint64
	Address  string
	Copy     *weftv1.UnrepairedChunk
}

// BadCopies asks every online data server for the bad copies it knows of
// (found by reads and scrubs, not repaired), checked again (Scrub with
// known); with repair the servers try to repair them first. Servers that
// could not be asked are in the error.
func (m *Manager) BadCopies(ctx context.Context, repair bool) (bad []BadCopy, repaired int, err error) {
	type server struct {
		id   uint64
		addr string
	}
	var servers []server
	m.mu.Lock()
	for id, s := range m.servers {
		if s.online {
			servers = append(servers, server{id, s.rec.Address})
		}
	}
	m.mu.Unlock()
	slices.SortFunc(servers, func(a, b server) int { return cmp.Compare(a.id, b.id) })
	var errs []error
	for _, s := range servers {
		c, err := m.dataClient(s.id, s.addr)
		var resp *weftv1.ScrubResponse
		if err == nil {
			resp, err = c.Scrub(ctx, &weftv1.ScrubRequest{Known: true, Repair: repair})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("ask data server %d (%s) for its bad copies: %w", s.id, s.addr, err))
			continue
		}
		repaired += int(resp.GetRepaired())
		for _, u := range resp.GetUnrepaired() {
			bad = append(bad, BadCopy{ServerID: s.id, Address: s.addr, Copy: u})
		}
	}
	return bad, repaired, errors.Join(errs...)
}

// TrimChunk deletes chunk (ino, index) of chain, a chunk past its file's
// size that no write will ever make visible (left by a write whose length
// was never committed), on every member: a deletion pushed to the head at
// the version the head holds now, and passed down the chain. A write
// landing meanwhile has a newer version, which the push does not replace,
// so nothing written after the check is lost.
func (m *Manager) TrimChunk(ctx context.Context, chain, ino, index uint64) error {
	members, err := m.servingMembers(chain)
	if err != nil {
		return &ChainScanError{Chain: chain, Err: err}
	}
	head := members[0]
	id := &weftv1.ChunkID{Ino: ino, Index: index}
	info, err := head.client.ReadFullChunk(ctx, &weftv1.ReadFullChunkRequest{
		Chunk: id, ChainId: chain, ChainVersion: head.chainVersion, TargetId: head.targetID,
	})
	if err != nil {
		return describe(fmt.Sprintf("read chunk %d of inode %d", index, ino), head.memberRef, err)
	}
	_, err = head.client.PushChunk(ctx, &weftv1.PushChunkRequest{
		ChainId: chain, ChainVersion: head.chainVersion, TargetId: head.targetID,
		Chunk: &weftv1.FullChunk{Chunk: id, Version: info.GetVersion(), Exists: false},
	})
	if err != nil {
		return describe(fmt.Sprintf("trim chunk %d of inode %d", index, ino), head.memberRef, err)
	}
	return nil
}
