package data

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/weft-fs/weft/data/chunk"
)

// Bad copies. Every bad copy a read or a scrub finds is remembered until
// it is repaired (or turns out good, or its chunk is gone), with what is
// wrong and, once a repair failed, why it could not be repaired: weft
// fsck asks for them (Scrub with known set), without a scrub pass over
// every chunk.

// maxBadCopies bounds the bad copies remembered.
const maxBadCopies = 10000

// badCopy is a bad copy not repaired yet.
type badCopy struct {
	targetID uint64
	problem  string
	reason   string // why the last repair failed; "" before one did
}

// noteBad remembers target t's copy of chunk id as bad.
func (s *Server) noteBad(t *chunk.Target, targetID uint64, id chunk.ID, err error) {
	s.badMu.Lock()
	defer s.badMu.Unlock()
	k := repairKey{t, id}
	if b := s.bad[k]; b != nil {
		b.problem = err.Error()
		return
	}
	if len(s.bad) < maxBadCopies {
		s.bad[k] = &badCopy{targetID: targetID, problem: err.Error()}
	}
}

// noteRepair records the outcome of a repair of t's copy of chunk id.
func (s *Server) noteRepair(t *chunk.Target, id chunk.ID, err error) {
	s.badMu.Lock()
	defer s.badMu.Unlock()
	k := repairKey{t, id}
	if err == nil {
		delete(s.bad, k)
		return
	}
	if b := s.bad[k]; b != nil {
		b.reason = err.Error()
	}
}

// checkBad checks the remembered bad copies again: a copy that reads
// good now (replaced by a resync or a push meanwhile) or is gone is
// forgotten; with repair, the others are repaired from a peer if they can
// be. It answers what is still bad, as a scrub pass would.
func (s *Server) checkBad(ctx context.Context, repair bool) ScrubResult {
	s.badMu.Lock()
	keys := make([]repairKey, 0, len(s.bad))
	for k := range s.bad {
		keys = append(keys, k)
	}
	s.badMu.Unlock()
	slices.SortFunc(keys, func(a, b repairKey) int {
		return cmp.Or(cmp.Compare(a.target.Dir(), b.target.Dir()), chunk.CompareListOrder(a.id, b.id))
	})
	var res ScrubResult
	for _, k := range keys {
		if ctx.Err() != nil {
			break
		}
		n, err := k.target.Verify(k.id)
		res.Chunks++
		res.Bytes += n
		if !errors.Is(err, chunk.ErrCorrupt) {
			if err == nil {
				s.noteRepair(k.target, k.id, nil) // good now, or gone
			}
			continue
		}
		res.Errors++
		s.badMu.Lock()
		b := s.bad[k]
		s.badMu.Unlock()
		if b == nil {
			continue
		}
		if repair {
			rerr := s.repair(ctx, k.target, b.targetID, k.id)
			s.noteRepair(k.target, k.id, rerr)
			if rerr == nil {
				res.Repaired++
				continue
			}
		}
		s.badMu.Lock()
		reason := b.reason
		s.badMu.Unlock()
		if reason == "" {
			reason = "not repaired yet (a repair may be under way)"
		}
		if len(res.Unrepaired) < maxUnrepaired {
			res.Unrepaired = append(res.Unrepaired, Unrepaired{Chunk: k.id, TargetID: b.targetID, Target: k.target.Dir(),
				Problem: err.Error(), Reason: reason})
		}
	}
	return res
}
