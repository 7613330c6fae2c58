package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"

	"github.com/weft-fs/weft/internal/fserr"
)

// A target is full when its free space is below minFreeFraction of its
// size or below minFreeBytes; its chains get no new files.
const (
	minFreeFraction = 0.01
	minFreeBytes    = 64 << 20
)

// Placement is round robin while the usable chains' free space is within
// balancedSpread of each other (relative to the largest); beyond that it
// is weighted by free space, so emptier targets fill first.
const balancedSpread = 0.10

// candidate is a chain usable for a new file.
type candidate struct {
	id    uint64
	free  uint64 // least free space of its members
	known bool   // every member has reported its capacity
}

// PickChains chooses n distinct chains of the given replica count for a
// new file, in the order the file's chunks use them. With one replica,
// chains with a member that is not serving, offline, removed or full are
// skipped. With more, the chains of that width are made on first use
// (see EnsureChains) and those returned are marked used, so they keep
// their members from then on; chains without a serving member or with a full
// live member are skipped, and healthy chains are preferred while there
// are n of them; fewer targets in service than replicas is an error
// wrapping syscall.EINVAL. While the usable
// chains have about the same free space the choice is round robin from a
// rotating start; once they drift apart by more than 10 % it is random,
// weighted by free space. If fewer than n chains are usable it returns
// those there are; if none is, an error wrapping syscall.ENOSPC.
func (m *Manager) PickChains(ctx context.Context, n int, replicas uint32) ([]uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if replicas == 0 {
		replicas = 1
	}
	n = max(n, 1)
	if replicas > 1 {
		ids, err := m.pickReplicated(ctx, n, replicas)
		// A follower's view of the chains was stale: reload and pick again.
		for attempt := 0; errors.Is(err, errStaleChain) && attempt < 3; attempt++ {
			if err = m.Refresh(ctx, true); err == nil {
				ids, err = m.pickReplicated(ctx, n, replicas)
			}
		}
		return ids, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()

	var cands []candidate
	widths := make(map[int]bool)
	for _, id := range m.chainIDs {
		c := m.chains[id]
		widths[c.width()] = true
		if c.width() != int(replicas) {
			continue
		}
		if cand, ok := m.usable(c); ok {
			cands = append(cands, cand)
		}
	}
	if len(cands) == 0 {
		if len(m.chains) > 0 && !widths[int(replicas)] {
			return nil, fserr.Wrap(syscall.EINVAL, "place a file with %d replicas: the cluster has no chains of %d targets (use replicas 1)", replicas, replicas)
		}
		return nil, fserr.Wrap(syscall.ENOSPC, "place a new file: no data target is online with free space: start a data server (weft data ...) or free space")
	}
	return m.choose(cands, n), nil
}

// choose picks n of cands (n capped to their number): round robin while
// balanced, else weighted by free space.
func (m *Manager) choose(cands []candidate, n int) []uint64 {
	n = min(n, len(cands))
	if balanced(cands) {
		return m.roundRobin(cands, n)
	}
	return m.weighted(cands, n)
}

// pickReplicated is PickChains for chains of replicas >= 2 targets. The
// chains of that width are made first if they do not exist yet. A chain
// is usable when it has a serving member and none of its live members is
// full; healthy chains (every member serving) are preferred while there
// are n of them.
func (m *Manager) pickReplicated(ctx context.Context, n int, replicas uint32) ([]uint64, error) {
	if replicas > MaxReplicas {
		return nil, fserr.Wrap(syscall.EINVAL, "place a file with %d replicas: at most %d are supported", replicas, MaxReplicas)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.widths, replicas) {
		if _, err := m.ensureChains(ctx, []uint32{replicas}); err != nil {
			return nil, fmt.Errorf("place a file with %d replicas: %w", replicas, err)
		}
	}
	var healthy, other []candidate
	exist := false
	for _, id := range m.chainIDs {
		c := m.chains[id]
		if c.width() != int(replicas) {
			continue
		}
		exist = true
		cand, ok := m.usableReplicated(c)
		switch {
		case !ok:
		case chainHealth(c) == "healthy":
			healthy = append(healthy, cand)
		default:
			other = append(other, cand)
		}
	}
	if !exist {
		if len(m.inService()) == 0 {
			return nil, fserr.Wrap(syscall.ENOSPC, "place a new file with %d replicas: no data target is registered: start data servers (weft data ...)", replicas)
		}
		return nil, fserr.Wrap(syscall.EINVAL, "place a file with %d replicas: only %d data targets are in service, fewer than %d: start more data servers or use fewer replicas",
			replicas, len(m.inService()), replicas)
	}
	cands := healthy
	if len(healthy) < n {
		cands = append(healthy, other...)
	}
	if len(cands) == 0 {
		return nil, fserr.Wrap(syscall.ENOSPC, "place a new file with %d replicas: no chain of %d replicas has a serving target with free space: start data servers (weft data ...) or free space",
			replicas, replicas)
	}
	ids := m.choose(cands, n)
	if err := m.markUsed(ctx, ids); err != nil {
		return nil, fmt.Errorf("place a file with %d replicas: %w", replicas, err)
	}
	return ids, nil
}

// markUsed saves the Used mark of the chains ids that do not have it yet
// (one write per chain, once): from now on they may hold data and are
// never rebuilt. Called with m.mu held.
func (m *Manager) markUsed(ctx context.Context, ids []uint64) error {
	if !m.leading.Load() {
		return m.markUsedFollowing(ctx, ids)
	}
	st := m.newStage()
	for _, id := range ids {
		if c := m.chains[id]; !c.Used {
			c = c.clone()
			c.Used = true
			st.used = append(st.used, c)
		}
	}
	return m.commit(ctx, st)
}

// usableReplicated reports whether new files may go to replicated chain
// c, and its free space (the least of its live members'): a member with
// a disk fault or full keeps new files off the chain.
func (m *Manager) usableReplicated(c *chainRecord) (candidate, bool) {
	cand := candidate{id: c.ID, known: true}
	serving, first := 0, true
	for _, mem := range c.Members {
		if mem.State == stateOffline || !m.targetOnline(mem.TargetID) {
			continue
		}
		if mem.State == stateServing {
			serving++
		}
		r := m.targets[mem.TargetID].report
		if r == nil {
			cand.known = false
			continue
		}
		if !placeable(r) {
			return cand, false
		}
		if first || r.free < cand.free {
			cand.free, first = r.free, false
		}
	}
	return cand, serving > 0
}

// usable reports whether new files may go to chain c, and its free space.
func (m *Manager) usable(c *chainRecord) (candidate, bool) {
	cand := candidate{id: c.ID, known: true}
	for i, mem := range c.Members {
		if mem.State != stateServing || !m.targetOnline(mem.TargetID) || m.targets[mem.TargetID].rec.Removed {
			return cand, false
		}
		r := m.targets[mem.TargetID].report
		if r == nil {
			cand.known = false
			continue
		}
		if !placeable(r) {
			return cand, false
		}
		if i == 0 || r.free < cand.free {
			cand.free = r.free
		}
	}
	return cand, true
}

func full(total, free uint64) bool {
	return free < minFreeBytes || float64(free) < minFreeFraction*float64(total)
}

// balanced reports whether round robin is fair enough: every chain's
// capacity is known and the free spaces are within balancedSpread.
func balanced(cands []candidate) bool {
	lo, hi := cands[0].free, cands[0].free
	for _, c := range cands {
		if !c.known {
			return true
		}
		lo, hi = min(lo, c.free), max(hi, c.free)
	}
	return float64(hi-lo) <= balancedSpread*float64(hi)
}

// roundRobin takes n consecutive candidates from a start that moves by one
// on every call, so the first chunks of successive files land on
// successive chains.
func (m *Manager) roundRobin(cands []candidate, n int) []uint64 {
	start := int(m.rrNext % uint64(len(cands)))
	m.rrNext++
	out := make([]uint64, n)
	for i := range out {
		out[i] = cands[(start+i)%len(cands)].id
	}
	return out
}

// weighted draws n distinct candidates, each draw with probability
// proportional to free space among those not drawn yet.
func (m *Manager) weighted(cands []candidate, n int) []uint64 {
	left := append([]candidate(nil), cands...)
	out := make([]uint64, 0, n)
	for len(out) < n {
		var total uint64
		for _, c := range left {
			total += c.free
		}
		r := m.rng.Uint64N(total) // total > 0: usable chains have minFreeBytes free
		i := 0
		for ; r >= left[i].free; i++ {
			r -= left[i].free
		}
		out = append(out, left[i].id)
		left = append(left[:i], left[i+1:]...)
	}
	return out
}

// ChainWidth reports the replica count of chain id, and whether the chain
// exists: a layout chosen elsewhere (a create delegation's) is checked
// against it.
func (m *Manager) ChainWidth(id uint64) (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.chains[id]
	if !ok {
		return 0, false
	}
	return c.width(), true
}
