package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/cluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// chunkFinding is a chunk the scan found suspicious.
type chunkFinding struct {
	chain, ino, index uint64
}

// chunksOf is the number of chunks a file of size bytes spans.
func chunksOf(size, chunkSize uint64) uint64 {
	if chunkSize == 0 {
		return 0
	}
	return (size + chunkSize - 1) / chunkSize
}

// ownerProblem says why the file ino cannot own chunk index of chain, or
// "" if it does: not a regular file, another chain for that index, or
// past the file's size.
func ownerProblem(a *weftv1.Attr, chain, index uint64) string {
	switch {
	case !isReg(a.Mode) || a.Layout == nil || len(a.Layout.Chains) == 0:
		return fmt.Sprintf("inode %d (mode %#o) has no layout and owns no chunks", a.Ino, a.Mode)
	case a.Layout.Chains[index%uint64(len(a.Layout.Chains))] != chain:
		return fmt.Sprintf("the file's layout puts chunk %d on chain %d, not %d (the file reads that chunk from chain %d)",
			index, a.Layout.Chains[index%uint64(len(a.Layout.Chains))], chain, a.Layout.Chains[index%uint64(len(a.Layout.Chains))])
	case index >= chunksOf(a.Size, uint64(a.Layout.ChunkSize)):
		return fmt.Sprintf("it lies past the file's size of %d bytes (left by a write that was never committed: weft fsck --repair or truncate -s %d on the file drops it)", a.Size, a.Size)
	}
	return ""
}

// scanOwner is ownerProblem on the scan's view of an inode.
func scanOwner(in scanInode, chain, index uint64) bool {
	return isReg(in.mode) && len(in.chains) > 0 && in.chains[index%uint64(len(in.chains))] == chain &&
		index < chunksOf(in.size, in.chunkSize)
}

// checkChunks lists the chunks of every chain on its serving members and
// verifies that each belongs to a file, and that the serving members of a
// chain hold the same chunks.
func (f *fscker) checkChunks(ctx context.Context) error {
	sc := f.scan
	gone := map[uint64][]uint64{} // inode missing, not queued: ino -> chains
	var foreign, underReplicated []chunkFinding
	err := f.s.cluster.ScanChunks(ctx, func(r cluster.ChunkReplicas) error {
		f.resp.ChunksChecked += uint64(len(r.Holders))
		in, ok := sc.inodes[r.Ino]
		switch {
		case !ok && !sc.gc[r.Ino]:
			if f.s.deleg.mayBePending(r.Ino) {
				// Possibly a file made under a delegation whose data
				// went ahead of its create: checked by a later fsck.
				break
			}
			if !slices.Contains(gone[r.Ino], r.Chain) {
				gone[r.Ino] = append(gone[r.Ino], r.Chain)
			}
		case !ok:
		case !scanOwner(in, r.Chain, r.Index):
			foreign = append(foreign, chunkFinding{r.Chain, r.Ino, r.Index})
		case len(r.Missing) > 0:
			underReplicated = append(underReplicated, chunkFinding{r.Chain, r.Ino, r.Index})
		}
		return nil
	})
	for _, e := range joinedErrors(err) {
		var ce *cluster.ChainScanError
		if !errors.As(e, &ce) {
			return fmt.Errorf("list chunks: %w", e)
		}
		f.add(problem(fsckUnchecked, 0, 0, "", false, "the chunks of chain %d were not checked: %v", ce.Chain, ce.Err))
	}
	for _, ino := range sortedInos(gone) {
		if err := f.verifyGone(ctx, ino, gone[ino]); err != nil {
			return err
		}
	}
	for _, c := range foreign {
		if err := f.verifyForeign(ctx, c); err != nil {
			return err
		}
	}
	for _, c := range underReplicated {
		if err := f.verifyReplicas(ctx, c); err != nil {
			return err
		}
	}
	return f.checkLayouts(ctx)
}

// joinedErrors splits an errors.Join result.
func joinedErrors(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// verifyGone verifies chunks of an inode that does not exist and is not
// in the GC queue. Inode numbers are never reused, so such chunks are
// garbage (a deletion that reappeared after a crash, a write that landed
// after the file was deleted); the repair queues them for the garbage
// collector, which deletes them as it deletes any file's chunks.
func (f *fscker) verifyGone(ctx context.Context, ino uint64, chains []uint64) error {
	return f.verify(ctx, func(x *tx, repair bool) (*weftv1.FsckProblem, error) {
		if _, found, err := x.t.Get(inodeKey(ino)); err != nil || found {
			return nil, err
		}
		if _, queued, err := x.t.Get(gcKey(ino)); err != nil || queued {
			return nil, err
		}
		detail := ""
		if repair {
			v, err := proto.Marshal(&weftv1.Layout{Chains: chains, StripeCount: uint32(len(chains))})
			if err != nil {
				return nil, err
			}
			if err := x.t.Set(gcKey(ino), v); err != nil {
				return nil, err
			}
			// Should the file come after all (made under a delegation,
			// its data sent ahead of its create), it is refused: its
			// data is gone.
			if err := x.t.Set(deadKey(ino), nil); err != nil {
				return nil, err
			}
			// A number not handed out yet is skipped, so that no new file
			// gets it while its queue entry waits.
			next, err := getUint64(x.t, keyNextIno)
			if err != nil {
				return nil, err
			}
			if ino >= next {
				if err := x.t.Set(keyNextIno, be64(ino+1)); err != nil {
					return nil, err
				}
			}
			detail = "; queued for deletion by the garbage collector"
		}
		return problem(fsckUnowned, ino, 0, "", repair, "chunks of inode %d on chain(s) %v: the inode does not exist and is not queued for deletion%s",
			ino, chains, detail), nil
	})
}

// verifyForeign verifies a chunk whose inode exists but does not own it.
// A chunk past the size of a file nobody has open is an unacknowledged
// tail (a write whose length was never committed: a client that crashed,
// a close that failed); with repair it is trimmed, at the version it has
// now, so that a write landing meanwhile wins (TrimChunk). Other chunks
// are reported, not repaired: the file's layout may be about to change,
// and deleting a chunk of a live file is not undone.
func (f *fscker) verifyForeign(ctx context.Context, c chunkFinding) error {
	r, err := f.s.cluster.ProbeChunk(ctx, c.chain, c.ino, c.index, false)
	if err != nil {
		return f.probeFailed(c, err)
	}
	if len(r.Holders) == 0 {
		return nil
	}
	tail := false
	p, err := f.check(ctx, func(x *tx, _ bool) (*weftv1.FsckProblem, error) {
		a, _, found, err := x.currentInode(c.ino)
		if err != nil || !found {
			return nil, err // deleted meanwhile: the GC takes the chunks
		}
		why := ownerProblem(a, c.chain, c.index)
		if why == "" {
			return nil, nil
		}
		if open, err := x.isOpen(c.ino); err != nil || open {
			return nil, err // a write may be on its way
		}
		tail = pastSize(a, c.chain, c.index)
		return problem(fsckUnowned, c.ino, 0, "", false, "chunk %d of inode %d on chain %d: %s", c.index, c.ino, c.chain, why), nil
	})
	if err != nil || p == nil {
		return err
	}
	if tail && f.repair {
		if err := f.s.cluster.TrimChunk(ctx, c.chain, c.ino, c.index); err != nil {
			p.Detail += fmt.Sprintf("; not trimmed: %v", err)
		} else {
			p.Repaired = true
			p.Detail += "; trimmed"
		}
	}
	f.add(p)
	return nil
}

// pastSize reports that chunk index of chain would belong to file a but
// for lying past its size.
func pastSize(a *weftv1.Attr, chain, index uint64) bool {
	return isReg(a.Mode) && a.Layout != nil && len(a.Layout.Chains) > 0 &&
		a.Layout.Chains[index%uint64(len(a.Layout.Chains))] == chain &&
		index >= chunksOf(a.Size, uint64(a.Layout.ChunkSize))
}

// verifyReplicas verifies a chunk that some serving members of its chain
// lack, and with repair copies it to them.
func (f *fscker) verifyReplicas(ctx context.Context, c chunkFinding) error {
	owned := false
	err := f.s.view(ctx, func(x *tx) error {
		a, _, found, err := x.currentInode(c.ino)
		owned = err == nil && found && ownerProblem(a, c.chain, c.index) == ""
		return err
	})
	if err != nil || !owned {
		return err
	}
	r, err := f.s.cluster.ProbeChunk(ctx, c.chain, c.ino, c.index, f.repair)
	if err != nil {
		return f.probeFailed(c, err)
	}
	if len(r.Holders) == 0 || len(r.Missing) == 0 {
		return nil
	}
	detail := ""
	if r.Repaired {
		detail = "; copied from a member that has it"
	}
	f.add(problem(fsckMissing, c.ino, 0, "", r.Repaired,
		"chunk %d of inode %d is on %d of the %d serving members of chain %d, not on target(s) %v: reads served by those see zeros%s",
		c.index, c.ino, len(r.Holders), len(r.Holders)+len(r.Missing), c.chain, r.Missing, detail))
	return nil
}

// probeFailed reports a chunk that could not be looked at again.
func (f *fscker) probeFailed(c chunkFinding, err error) error {
	f.add(problem(fsckUnchecked, c.ino, 0, "", false, "chunk %d of inode %d on chain %d could not be checked again: %v", c.index, c.ino, c.chain, err))
	return nil
}

// checkLayouts verifies that every file's layout names existing chains.
func (f *fscker) checkLayouts(ctx context.Context) error {
	table, err := f.s.cluster.GetChains(ctx, &weftv1.GetChainsRequest{})
	if err != nil {
		return fmt.Errorf("read the chain table: %w", err)
	}
	known := map[uint64]bool{}
	for _, c := range table.GetChains() {
		known[c.GetId()] = true
	}
	for _, ino := range sortedInos(f.scan.inodes) {
		in := f.scan.inodes[ino]
		if !slices.ContainsFunc(in.chains, func(c uint64) bool { return !known[c] }) {
			continue
		}
		err := f.verify(ctx, func(x *tx, _ bool) (*weftv1.FsckProblem, error) {
			a, _, found, err := x.currentInode(ino)
			if err != nil || !found || !isReg(a.Mode) || a.Layout == nil {
				return nil, err
			}
			var bad []uint64
			for _, c := range a.Layout.Chains {
				if !known[c] {
					bad = append(bad, c)
				}
			}
			if len(bad) == 0 {
				return nil, nil
			}
			return problem(fsckBadLayout, ino, 0, "", false, "the layout of inode %d names chain(s) %v, which do not exist: its data cannot be read or written", ino, bad), nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// checkBadCopies reports the bad copies the data servers know of and have
// not repaired (found by reads and scrubs: weft scrub looks at every
// chunk), each checked again on its server; with repair the servers try
// to repair them from a good replica first.
func (f *fscker) checkBadCopies(ctx context.Context) error {
	bad, repaired, err := f.s.cluster.BadCopies(ctx, f.repair)
	for _, e := range joinedErrors(err) {
		f.add(problem(fsckUnchecked, 0, 0, "", false, "bad copies not checked: %v", e))
	}
	for range repaired {
		f.add(problem(fsckBadCopy, 0, 0, "", true, "a bad copy of a chunk was repaired from a good replica"))
	}
	for _, b := range bad {
		u := b.Copy
		f.add(problem(fsckBadCopy, u.GetChunk().GetIno(), 0, "", false,
			"chunk %d of inode %d on target %d (%s) of data server %d (%s): %s; not repaired: %s",
			u.GetChunk().GetIndex(), u.GetChunk().GetIno(), u.GetTargetId(), u.GetTargetDir(), b.ServerID, b.Address,
			u.GetProblem(), u.GetReason()))
	}
	return nil
}
