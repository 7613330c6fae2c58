package data

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/weft-fs/weft/data/chunk"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Repair and scrub. A copy found bad (a checksum mismatch, a damaged
// header, a data file shorter than its header says) by a read or by the
// scrub is replaced by a serving peer's copy of the chunk. The peer's copy
// is fetched without holding the chunk (the peer may be forwarding a write
// to this member, which needs it), then installed under the chunk's lock
// unless a newer version arrived meanwhile, in which case it is fetched
// again.

const (
	repairAttempts    = 3
	scrubPage         = 256
	scrubFirstDelay   = time.Minute
	scrubPassSpacing  = time.Hour
	repairCallTimeout = time.Minute
)

// targetStats counts a target's scrub work and holds its disk fault
// mark (faults.go), reported in heartbeats.
type targetStats struct {
	scrubbed atomic.Uint64 // bytes verified by the scrub
	errors   atomic.Uint64 // bad copies found (by the scrub or reads)
	repaired atomic.Uint64 // bad copies replaced from a peer
	fault    targetFault
}

type repairKey struct {
	target *chunk.Target
	id     chunk.ID
}

func (s *Server) statsOf(t *chunk.Target) *targetStats {
	for i, x := range s.store.Targets() {
		if x == t {
			return &s.stats[i]
		}
	}
	return &targetStats{}
}

// noteCorrupt starts a background repair of m's copy of a chunk if err
// reports corruption.
func (s *Server) noteCorrupt(m member, id chunk.ID, err error) {
	if !errors.Is(err, chunk.ErrCorrupt) {
		return
	}
	s.statsOf(m.target).errors.Add(1)
	s.noteBad(m.target, m.targetID, id, err)
	k := repairKey{m.target, id}
	s.repairMu.Lock()
	if s.repairing[k] {
		s.repairMu.Unlock()
		return
	}
	s.repairing[k] = true
	s.repairMu.Unlock()
	s.bgMu.Lock()
	ctx := s.bgCtx
	if ctx == nil || ctx.Err() != nil {
		s.bgMu.Unlock()
		return
	}
	s.bg.Add(1)
	s.bgMu.Unlock()
	go func() {
		defer s.bg.Done()
		defer func() {
			s.repairMu.Lock()
			delete(s.repairing, k)
			s.repairMu.Unlock()
		}()
		err := s.repair(ctx, m.target, m.targetID, id)
		s.noteRepair(m.target, id, err)
		if err != nil {
			s.log.Error("cannot repair corrupt chunk", "chunk", id, "target", m.target.Dir(), "err", err)
		}
	}()
}

// repair replaces target's copy of chunk id (target being member
// targetID) with a serving peer's.
func (s *Server) repair(ctx context.Context, t *chunk.Target, targetID uint64, id chunk.ID) error {
	ctx, cancel := context.WithTimeout(ctx, repairCallTimeout)
	defer cancel()
	var chains []uint64
	if info, err := t.Stat(id); err == nil && info.Chain != 0 {
		chains = []uint64{info.Chain}
	} else { // chain unknown: ask every chain this target is in
		s.mu.RLock()
		for cid, v := range s.chains {
			if v.local[targetID] != nil {
				chains = append(chains, cid)
			}
		}
		s.mu.RUnlock()
	}
	var errs []error
	for _, cid := range chains {
		done, err := s.repairFrom(ctx, t, targetID, cid, id, len(chains) > 1)
		if done {
			return err
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return fmt.Errorf("repair %v on target %s: the target is in no chain of this server's table", id, t.Dir())
	}
	return errors.Join(errs...)
}

// repairFrom repairs chunk id from the serving peers of chain cid. With
// guess (the chunk's chain is not known), a peer without the chunk is no
// answer. done reports that no other chain need be tried.
func (s *Server) repairFrom(ctx context.Context, t *chunk.Target, targetID, cid uint64, id chunk.ID, guess bool) (done bool, err error) {
	for range repairAttempts {
		s.mu.RLock()
		v := s.chains[cid]
		s.mu.RUnlock()
		if v == nil || v.local[targetID] == nil {
			return false, fmt.Errorf("repair %v: target %d is not in chain %d", id, targetID, cid)
		}
		m := member{view: v, pos: v.localPos[targetID], targetID: targetID, target: t}
		peers := m.servingPeers()
		if len(peers) == 0 {
			return false, fmt.Errorf("repair %v on target %s: chain %d has no other serving member to copy from (replicas 1?)",
				id, t.Dir(), cid)
		}
		var fc *weftv1.FullChunk
		var from *weftv1.ChainMember
		var errs []error
		for _, p := range peers {
			c, err := s.peers.client(p.GetAddress())
			if err == nil {
				fc, err = c.ReadFullChunk(ctx, &weftv1.ReadFullChunkRequest{Chunk: &weftv1.ChunkID{Ino: id.Ino, Index: id.Index},
					ChainId: cid, ChainVersion: v.version, TargetId: p.GetTargetId()})
			}
			if err == nil {
				from = p
				break
			}
			errs = append(errs, fmt.Errorf("data server %d (%s): %w", p.GetServerId(), p.GetAddress(), err))
		}
		if from == nil {
			return false, fmt.Errorf("repair %v of chain %d: no peer could give its copy: %w", id, cid, errors.Join(errs...))
		}
		if guess && !fc.GetExists() {
			return false, fmt.Errorf("repair %v: chain %d does not hold it", id, cid)
		}
		l := t.Lock(id, cid)
		if info, err := l.Info(); err == nil && info.Exists && info.Version > fc.GetVersion() {
			l.Unlock() // written meanwhile: fetch again
			continue
		}
		err := l.Replace(chunk.Full{Version: fc.GetVersion(), Exists: fc.GetExists(), Data: fc.GetData()})
		l.Unlock()
		if err != nil {
			return true, fmt.Errorf("repair %v: %w", id, err)
		}
		s.statsOf(t).repaired.Add(1)
		s.log.Info(fmt.Sprintf("repaired %v on target %d (%s) from server %d (%s)", id, targetID, t.Dir(),
			from.GetServerId(), from.GetAddress()), "version", fc.GetVersion(), "chain", cid)
		return true, nil
	}
	return true, fmt.Errorf("repair %v: it kept changing during %d attempts", id, repairAttempts)
}

// ScrubResult counts what a scrub pass found.
type ScrubResult struct {
	Chunks   int   // chunks verified
	Bytes    int64 // bytes verified
	Errors   int   // bad copies found
	Repaired int   // bad copies replaced from a peer
	// Unrepaired lists the bad copies not repaired (the first
	// maxUnrepaired of them).
	Unrepaired []Unrepaired
}

// Unrepaired is a bad copy a scrub found and could not repair.
type Unrepaired struct {
	Chunk    chunk.ID
	TargetID uint64
	Target   string // the target's directory
	Problem  string // what is wrong with the copy
	Reason   string // why it was not repaired
}

// maxUnrepaired bounds the bad copies a scrub pass lists.
const maxUnrepaired = 100

// Scrub runs a full scrub pass now, at full speed: every chunk of every
// target is read and checked against its checksums and header, and bad
// copies are repaired from a serving peer before it returns. It may run
// while the background scrub does.
func (s *Server) Scrub(ctx context.Context) (ScrubResult, error) {
	return s.scrubPass(ctx, nil)
}

// scrubLoop runs a throttled scrub pass a minute after start and then at
// most once an hour, until ctx is done.
func (s *Server) scrubLoop(ctx context.Context) {
	if s.scrubRate == nil {
		return
	}
	wait := scrubFirstDelay
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		start := time.Now()
		res, err := s.scrubPass(ctx, s.scrubRate)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.Warn("scrub pass failed", "err", err)
		}
		s.log.Info("scrub pass done", "chunks", res.Chunks, "bytes", res.Bytes, "bad", res.Errors, "repaired", res.Repaired,
			"took", time.Since(start).Round(time.Second))
		wait = max(scrubPassSpacing-time.Since(start), time.Minute)
	}
}

func (s *Server) scrubPass(ctx context.Context, limit *tokenBucket) (ScrubResult, error) {
	var res ScrubResult
	s.mu.RLock()
	ids := append([]uint64(nil), s.targetIDs...)
	s.mu.RUnlock()
	var errs []error
	for i, t := range s.store.Targets() {
		var tid uint64
		if i < len(ids) {
			tid = ids[i]
		}
		var after *chunk.ID
		for {
			batch, more, err := t.Chunks(after, scrubPage)
			if err != nil {
				errs = append(errs, err)
				break
			}
			for _, id := range batch {
				if err := ctx.Err(); err != nil {
					return res, err
				}
				n, err := t.Verify(id)
				res.Bytes += n
				s.stats[i].scrubbed.Add(uint64(n))
				if werr := limit.wait(ctx, n); werr != nil {
					return res, werr
				}
				res.Chunks++
				if err == nil {
					continue
				}
				if !errors.Is(err, chunk.ErrCorrupt) {
					errs = append(errs, err)
					continue
				}
				res.Errors++
				s.stats[i].errors.Add(1)
				s.noteBad(t, tid, id, err)
				rerr := s.repair(ctx, t, tid, id)
				s.noteRepair(t, id, rerr)
				if rerr != nil {
					s.log.Error("scrub found a corrupt chunk and cannot repair it", "chunk", id, "target", t.Dir(), "err", rerr)
					if len(res.Unrepaired) < maxUnrepaired {
						res.Unrepaired = append(res.Unrepaired, Unrepaired{Chunk: id, TargetID: tid, Target: t.Dir(),
							Problem: err.Error(), Reason: rerr.Error()})
					}
					continue
				}
				res.Repaired++
			}
			if !more || len(batch) == 0 {
				break
			}
			after = &batch[len(batch)-1]
		}
	}
	return res, errors.Join(errs...)
}
