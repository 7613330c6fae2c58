package cluster

import (
	"context"
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
// new file, in the order the file's chunks use them. Chains with a member
// that is not serving, offline or full are skipped. While the usable
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
	m.mu.Lock()
	defer m.mu.Unlock()

	var cands []candidate
	widths := make(map[int]bool)
	for _, id := range m.chainIDs {
		c := m.chains[id]
		widths[len(c.Members)] = true
		if len(c.Members) != int(replicas) {
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
	n = min(n, len(cands))
	if balanced(cands) {
		return m.roundRobin(cands, n), nil
	}
	return m.weighted(cands, n), nil
}

// usable reports whether new files may go to chain c, and its free space.
func (m *Manager) usable(c *chainRecord) (candidate, bool) {
	cand := candidate{id: c.ID, known: true}
	for i, mem := range c.Members {
		if mem.State != stateServing || !m.targetOnline(mem.TargetID) {
			return cand, false
		}
		r := m.targets[mem.TargetID].report
		if r == nil {
			cand.known = false
			continue
		}
		if full(r.total, r.free) {
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
