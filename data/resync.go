package data

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/data/chunk"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Resync of a syncing member. The member receives every mutation
// forwarded down its chain from the moment it became syncing, but its
// chunks are suspect: it missed mutations while away, and may hold writes
// of its own that the chain never acknowledged. A chunk is "verified" once
// its copy is known to equal the chain's: copied whole (by the bulk pass,
// or pushed by the predecessor), or found equal (version, length and
// digest) to the source's. Forwarded writes are applied only to verified
// chunks; for any other the member asks for the whole chunk.
//
// The bulk pass lists the chain's chunks on the source (the nearest
// serving member before this one) and on the member, and copies every
// chunk that differs, under a bandwidth limit; a copy fetched before a
// local mutation of the chunk (a forwarded truncate or delete) is fetched
// again. Then the member reports itself synced to the meta service, which
// makes it serving.

const (
	syncPageSize     = 1024
	syncRetryMax     = 10 * time.Second
	syncRecheckDelay = 2 * time.Second
	// syncStaleRetry is the retry delay after the source refused the pass
	// for a chain version it has not learnt yet (it catches up within a
	// heartbeat, or ~100 ms since the request triggers an early one).
	syncStaleRetry     = 200 * time.Millisecond
	syncCopyAttempts   = 5
	syncMinChunkTokens = 4 << 10
)

type syncKey struct {
	chain, target uint64
}

// syncSession is what a syncing member knows so far. It lives while the
// member stays syncing without the server being cut off.
type syncSession struct {
	key    syncKey
	ctx    context.Context
	cancel context.CancelFunc
	target *chunk.Target

	mu        sync.Mutex
	verified  map[chunk.ID]struct{}
	seq       uint64            // counts local mutations of unverified chunks
	touched   map[uint64]uint64 // ino -> seq of its last truncate/delete
	running   bool
	bytesDone atomic.Uint64
	bytesLeft atomic.Uint64
}

func (ss *syncSession) isVerified(id chunk.ID) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	_, ok := ss.verified[id]
	return ok
}

func (ss *syncSession) markVerified(id chunk.ID) {
	ss.mu.Lock()
	ss.verified[id] = struct{}{}
	ss.mu.Unlock()
}

func (ss *syncSession) now() uint64 {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.seq
}

func (ss *syncSession) touchFile(ino uint64) {
	ss.mu.Lock()
	ss.seq++
	ss.touched[ino] = ss.seq
	ss.mu.Unlock()
}

// changedSince reports a local truncate or delete of the chunk's file
// after seq.
func (ss *syncSession) changedSince(id chunk.ID, seq uint64) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.touched[id.Ino] > seq
}

// session returns the sync session of a syncing member, creating it if
// create; nil for members that are not syncing.
func (s *Server) session(m member, create bool) *syncSession {
	if m.state() != stateSyncing {
		return nil
	}
	k := syncKey{m.view.id, m.targetID}
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	ss := s.syncs[k]
	if ss == nil && create {
		ss = &syncSession{key: k, target: m.target, verified: make(map[chunk.ID]struct{}), touched: make(map[uint64]uint64)}
		ss.ctx, ss.cancel = context.WithCancel(context.Background())
		s.syncs[k] = ss
	}
	return ss
}

// verified reports whether a member's copy of a chunk is known good:
// always on a serving member.
func (s *Server) verified(m member, id chunk.ID) bool {
	if m.state() != stateSyncing {
		return true
	}
	ss := s.session(m, true)
	return ss.isVerified(id)
}

func (s *Server) markVerified(m member, id chunk.ID) {
	if ss := s.session(m, true); ss != nil {
		ss.markVerified(id)
	}
}

func (s *Server) touchFile(m member, ino uint64) {
	if ss := s.session(m, true); ss != nil {
		ss.touchFile(ino)
	}
}

// dropStaleSyncs ends the sessions of members no longer syncing. Called
// with s.mu held.
func (s *Server) dropStaleSyncs() {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	for k, ss := range s.syncs {
		v := s.chains[k.chain]
		if v == nil || v.local[k.target] == nil || memberState(v.members[v.localPos[k.target]]) != stateSyncing {
			ss.cancel()
			delete(s.syncs, k)
		}
	}
}

// resetSyncs forgets what every syncing member had verified.
func (s *Server) resetSyncs() {
	s.syncMu.Lock()
	for k, ss := range s.syncs {
		ss.cancel()
		delete(s.syncs, k)
	}
	s.syncMu.Unlock()
	select {
	case s.syncWake <- struct{}{}:
	default:
	}
}

// syncLoop starts a resync for every syncing member, whenever the chain
// table changes, until ctx is done.
func (s *Server) syncLoop(ctx context.Context) {
	tick := time.NewTicker(syncRecheckDelay)
	defer tick.Stop()
	for {
		s.startSyncs(ctx)
		select {
		case <-ctx.Done():
			s.resetSyncs()
			return
		case <-s.syncWake:
		case <-tick.C:
		}
	}
}

func (s *Server) startSyncs(ctx context.Context) {
	var ms []member
	s.mu.RLock()
	for _, v := range s.chains {
		for id, t := range v.local {
			m := member{view: v, pos: v.localPos[id], targetID: id, target: t}
			if m.state() == stateSyncing {
				ms = append(ms, m)
			}
		}
	}
	s.mu.RUnlock()
	for _, m := range ms {
		ss := s.session(m, true)
		ss.mu.Lock()
		start := !ss.running
		ss.running = true
		ss.mu.Unlock()
		if start {
			s.bg.Go(func() {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				stop := context.AfterFunc(ss.ctx, cancel)
				defer stop()
				s.runSync(ctx, ss)
			})
		}
	}
}

// syncView is the current view of a session's chain: the member and the
// source to copy from. ok is false once the member is no longer syncing.
func (s *Server) syncView(ss *syncSession) (m member, source *weftv1.ChainMember, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	v := s.chains[ss.key.chain]
	if v == nil || v.local[ss.key.target] == nil {
		return member{}, nil, false
	}
	m = member{view: v, pos: v.localPos[ss.key.target], targetID: ss.key.target, target: v.local[ss.key.target]}
	if m.state() != stateSyncing {
		return member{}, nil, false
	}
	for i := m.pos - 1; i >= 0; i-- {
		if memberState(v.members[i]) == stateServing {
			return m, v.members[i], true
		}
	}
	return m, nil, true
}

// runSync runs bulk passes for a session until the member is reported
// synced and the table says it serves (or the session ends).
func (s *Server) runSync(ctx context.Context, ss *syncSession) {
	delay := syncRecheckDelay
	var lastErr string
	for ctx.Err() == nil {
		m, source, ok := s.syncView(ss)
		if !ok {
			return
		}
		err := s.syncPass(ctx, ss, m, source)
		if err == nil {
			err = s.reportSynced(ctx, m)
		}
		if errors.Is(err, errVersionMoved) {
			continue
		}
		wait := syncRecheckDelay
		if err != nil && ctx.Err() == nil {
			if msg := err.Error(); msg != lastErr {
				s.log.Warn("resync of chain member failed; retrying", "chain", m.view.id, "target", m.targetID, "err", err)
				lastErr = msg
			}
			wait, delay = delay, min(2*delay, syncRetryMax)
			if status.Code(err) == codes.FailedPrecondition {
				// The source and this server disagree on the chain's
				// version for a moment: retry soon, not after seconds.
				wait, delay = syncStaleRetry, syncRecheckDelay
			}
		} else {
			delay, lastErr = syncRecheckDelay, ""
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// pendingCopy is a chunk the bulk pass has to copy.
type pendingCopy struct {
	id     chunk.ID
	length uint64
}

// syncPass copies into member m every chunk of its chain that differs from
// the source's.
func (s *Server) syncPass(ctx context.Context, ss *syncSession, m member, source *weftv1.ChainMember) error {
	if source == nil {
		return fmt.Errorf("chain %d (version %d) has no serving member before target %d to copy from", m.view.id, m.view.version, m.targetID)
	}
	c, err := s.peers.client(source.GetAddress())
	if err != nil {
		return err
	}
	start := time.Now()
	todo, err := s.compareChunks(ctx, ss, m, source, c)
	if err != nil {
		return err
	}
	var left uint64
	for _, p := range todo {
		left += p.length
	}
	ss.bytesLeft.Store(left)
	copied := 0
	for _, p := range todo {
		left -= min(p.length, left)
		if ss.isVerified(p.id) {
			ss.bytesLeft.Store(left)
			continue
		}
		if err := s.syncRate.wait(ctx, int64(max(p.length, syncMinChunkTokens))); err != nil {
			return err
		}
		applied, n, err := s.copyChunk(ctx, ss, m, source, c, p.id)
		if err != nil {
			return err
		}
		if applied {
			copied++
			s.resyncedChunks.Add(1)
		}
		ss.bytesDone.Add(n)
		ss.bytesLeft.Store(left)
	}
	ss.bytesLeft.Store(0)
	s.log.Info("resync pass done", "chain", m.view.id, "version", m.view.version, "target", m.targetID,
		"from_server", source.GetServerId(), "chunks_copied", copied, "bytes_copied", ss.bytesDone.Load(),
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}

// compareChunks walks the source's and the member's listings of the chain
// side by side, marks equal chunks verified and returns the others.
func (s *Server) compareChunks(ctx context.Context, ss *syncSession, m member, source *weftv1.ChainMember, c weftv1.DataClient) ([]pendingCopy, error) {
	var todo []pendingCopy
	local := &localLister{t: m.target, chain: m.view.id}
	var after *weftv1.ChunkID
	for {
		seq := ss.now()
		resp, err := c.ListChunks(ctx, &weftv1.ListChunksRequest{ChainId: m.view.id, ChainVersion: m.view.version,
			After: after, Limit: syncPageSize, TargetId: source.GetTargetId()})
		if err != nil {
			return nil, fmt.Errorf("list chunks of chain %d on data server %d (%s): %w", m.view.id, source.GetServerId(), source.GetAddress(), err)
		}
		for _, ci := range resp.GetChunks() {
			id := chunk.ID{Ino: ci.GetChunk().GetIno(), Index: ci.GetChunk().GetIndex()}
			for {
				in, err := local.peek()
				if err != nil {
					return nil, err
				}
				if in == nil || chunk.CompareListOrder(in.ID, id) > 0 {
					todo = append(todo, pendingCopy{id: id, length: ci.GetLength()})
					break
				}
				local.next()
				if in.ID != id { // only here: the source deleted it
					todo = append(todo, pendingCopy{id: in.ID})
					continue
				}
				if in.Version == ci.GetVersion() && uint64(in.Length) == ci.GetLength() && in.Digest == ci.GetDigest() &&
					!ss.changedSince(id, seq) {
					ss.markVerified(id)
				} else {
					todo = append(todo, pendingCopy{id: id, length: ci.GetLength()})
				}
				break
			}
		}
		if !resp.GetMore() || len(resp.GetChunks()) == 0 {
			break
		}
		last := resp.GetChunks()[len(resp.GetChunks())-1].GetChunk()
		after = &weftv1.ChunkID{Ino: last.GetIno(), Index: last.GetIndex()}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	for {
		in, err := local.peek()
		if err != nil {
			return nil, err
		}
		if in == nil {
			return todo, nil
		}
		local.next()
		todo = append(todo, pendingCopy{id: in.ID})
	}
}

// localLister pages through a target's chunks of a chain.
type localLister struct {
	t     *chunk.Target
	chain uint64
	buf   []chunk.Info
	after *chunk.ID
	done  bool
}

func (l *localLister) peek() (*chunk.Info, error) {
	if len(l.buf) == 0 && !l.done {
		infos, more, err := l.t.List(l.chain, l.after, syncPageSize)
		if err != nil {
			return nil, err
		}
		l.buf, l.done = infos, !more
		if len(infos) > 0 {
			l.after = &infos[len(infos)-1].ID
		}
	}
	if len(l.buf) == 0 {
		return nil, nil
	}
	return &l.buf[0], nil
}

func (l *localLister) next() { l.buf = l.buf[1:] }

// copyChunk fetches a chunk from the source and installs it, unless the
// member verified the chunk meanwhile (a push); a copy that a local
// truncate or delete overtook is fetched again.
func (s *Server) copyChunk(ctx context.Context, ss *syncSession, m member, source *weftv1.ChainMember, c weftv1.DataClient, id chunk.ID) (applied bool, n uint64, err error) {
	for range syncCopyAttempts {
		seq := ss.now()
		fc, err := c.ReadFullChunk(ctx, &weftv1.ReadFullChunkRequest{Chunk: &weftv1.ChunkID{Ino: id.Ino, Index: id.Index},
			ChainId: m.view.id, ChainVersion: m.view.version, TargetId: source.GetTargetId()})
		if err != nil {
			return false, 0, fmt.Errorf("copy %v of chain %d from data server %d (%s): %w", id, m.view.id, source.GetServerId(), source.GetAddress(), err)
		}
		l := m.target.Lock(id, m.view.id)
		// Checked under the chunk's lock: whatever a newer session does to
		// the chunk needs the lock too, so it comes after this copy.
		if err := ss.ctx.Err(); err != nil {
			l.Unlock()
			return false, 0, err
		}
		if ss.isVerified(id) {
			l.Unlock()
			return false, 0, nil
		}
		if ss.changedSince(id, seq) {
			l.Unlock()
			continue
		}
		err = l.Replace(chunk.Full{Version: fc.GetVersion(), Exists: fc.GetExists(), Data: fc.GetData()})
		if err == nil {
			ss.markVerified(id)
		}
		l.Unlock()
		return err == nil, uint64(len(fc.GetData())), err
	}
	return false, 0, fmt.Errorf("copy %v of chain %d: it kept changing during %d attempts", id, m.view.id, syncCopyAttempts)
}

// errVersionMoved: the chain changed during a pass; another pass follows.
var errVersionMoved = errors.New("chain version moved during the resync pass")

// reportSynced tells the meta service the member has everything at the
// chain's version. A version that moved meanwhile means another pass.
func (s *Server) reportSynced(ctx context.Context, m member) error {
	s.mu.RLock()
	cur := s.chains[m.view.id]
	sid := s.serverID
	s.mu.RUnlock()
	if cur != m.view {
		return errVersionMoved
	}
	ctx, cancel := context.WithTimeout(ctx, metaCallTimeout)
	defer cancel()
	resp, err := weftv1.NewMetaClient(s.metaConn).ReportSynced(ctx, &weftv1.ReportSyncedRequest{
		ServerId: sid, TargetId: m.targetID, ChainId: m.view.id, ChainVersion: m.view.version})
	if err != nil {
		if status.Code(err) == codes.FailedPrecondition {
			s.askRefresh()
		}
		return fmt.Errorf("report chain %d (version %d) synced on target %d to the meta service at %s: %w",
			m.view.id, m.view.version, m.targetID, s.cfg.MetaAddr, err)
	}
	s.log.Info("chain member synced", "chain", m.view.id, "version", m.view.version, "target", m.targetID)
	if t := resp.GetChains(); t != nil {
		s.mu.RLock()
		newer := s.table == nil || t.GetVersion() >= s.table.GetVersion()
		s.mu.RUnlock()
		if newer {
			s.SetChains(t)
		}
	}
	return nil
}

// syncReports describes the resyncs running on target id.
func (s *Server) syncReports(targetID uint64) []*weftv1.SyncProgress {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	var out []*weftv1.SyncProgress
	for k, ss := range s.syncs {
		if k.target == targetID {
			out = append(out, &weftv1.SyncProgress{ChainId: k.chain, BytesDone: ss.bytesDone.Load(), BytesLeft: ss.bytesLeft.Load()})
		}
	}
	return out
}
