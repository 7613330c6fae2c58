package cluster

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/fserr"
)

// RemoveTarget takes target id out of service at once, as if its repair
// delay had passed: it is marked removed (persisted; it gets no new chains
// and stays removed if its server reports it again) and replaced in every
// replicated chain that has another serving member; the replacement joins
// as syncing. It returns the number of chains changed. Where no
// replacement fits the target is dropped and the chain stays degraded
// until a target joins; where it holds the only up-to-date copy it stays
// until another member has synced. An unknown id is an error wrapping
// syscall.ENOENT.
func (m *Manager) RemoveTarget(ctx context.Context, id uint64) (uint32, error) {
	if !m.leading.Load() {
		return 0, ErrNotLeader
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.targets[id]
	if t == nil {
		return 0, fserr.Wrap(syscall.ENOENT, "remove target %d: no such target (weft status lists them)", id)
	}
	if !t.rec.Removed {
		st := m.newStage()
		rec := t.rec
		rec.Removed = true
		st.targets = append(st.targets, rec)
		if err := m.commit(ctx, st); err != nil {
			return 0, fmt.Errorf("remove target %d: %w", id, err)
		}
		m.log.Warn(fmt.Sprintf("target %d (%s) of data server %d removed: replacing it in its chains", id, t.rec.Path, t.rec.ServerID),
			"target", id)
	}
	// Unused chains are planned again without it; used ones are repaired.
	built, err := m.ensureChains(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("remove target %d: %w", id, err)
	}
	n, err := m.repair(ctx, m.chainsOf[id])
	if err != nil {
		return 0, fmt.Errorf("remove target %d: %w", id, err)
	}
	return uint32(n + built), nil
}

// repair replaces, in the given replicated chains, the members offline
// for longer than the repair delay and the removed targets, and fills
// the places of members lost earlier, with targets chosen by
// chooseMember; they join as syncing. It saves the changed chains in one
// transaction and returns how many changed. A chain without a serving
// member is left alone: there is nothing to copy from; so is a chain no
// file uses yet while buildChains can plan it again (enough targets in
// service). Called with m.mu held.
func (m *Manager) repair(ctx context.Context, chainIDs []uint64) (int, error) {
	now := m.now()
	st := m.newStage()
	loads := make(map[int]map[uint64]int)
	for _, id := range chainIDs {
		c := m.chains[id]
		if c.width() < 2 || countState(c, stateServing) == 0 || !c.Used && m.rebuildable(uint32(c.width())) {
			// Unused chains are rebuilt instead (buildChains).
			continue
		}
		load := loads[c.width()]
		if load == nil {
			load = m.memberLoad(c.width())
			loads[c.width()] = load
		}
		if next := m.repairChain(c, now, load); next != nil {
			st.chains = append(st.chains, next)
		}
	}
	if err := m.commit(ctx, st); err != nil {
		return 0, err
	}
	return len(st.chains), nil
}

// repairChain returns the repaired record of chain c, or nil if nothing
// changes. load is updated with the members added and dropped.
func (m *Manager) repairChain(c *chainRecord, now time.Time, load map[uint64]int) *chainRecord {
	serving := countState(c, stateServing)
	var kept []memberRecord
	var dropped []uint64
	for _, mem := range c.Members {
		removed := m.targets[mem.TargetID].rec.Removed
		expired := mem.State == stateOffline && mem.Since != 0 && now.Sub(sinceTime(mem.Since)) > m.cfg.RepairDelay
		switch {
		case !removed && !expired:
		case mem.State == stateServing && serving == 1:
			// Its data exists nowhere else yet: it stays until another
			// member has synced.
		default:
			if mem.State == stateServing {
				serving--
			}
			dropped = append(dropped, mem.TargetID)
			continue
		}
		kept = append(kept, mem)
	}
	// Members to replace, oldest loss first; an expired member without a
	// replacement stays (it may still come back), a removed one goes.
	var added []uint64
	for _, tid := range dropped {
		removed := m.targets[tid].rec.Removed
		id, ok := m.chooseMember(append(memberIDs(kept), added...), load, nil)
		switch {
		case ok:
			added = append(added, id)
			load[id]++
			load[tid]--
			m.log.Warn(fmt.Sprintf("chain %d: target %d replaced by target %d, which copies the chain's data", c.ID, tid, id),
				"chain", c.ID, "removed", removed)
		case removed:
			load[tid]--
			m.log.Warn(fmt.Sprintf("chain %d: removed target %d dropped; no target fits to replace it, the chain stays degraded: add a data server", c.ID, tid),
				"chain", c.ID)
		default:
			kept = append(kept, memberOf(c, tid))
		}
	}
	for len(kept)+len(added) < c.width() {
		id, ok := m.chooseMember(append(memberIDs(kept), added...), load, nil)
		if !ok {
			break
		}
		added = append(added, id)
		load[id]++
		m.log.Warn(fmt.Sprintf("chain %d: target %d added in the place of a lost member, copies the chain's data", c.ID, id), "chain", c.ID)
	}
	if len(added) == 0 && len(kept) == len(c.Members) {
		return nil
	}
	next := c.clone()
	next.Version++
	next.Members = kept
	for _, id := range added {
		next.Members = append(next.Members, memberRecord{TargetID: id, State: stateSyncing})
	}
	sortMembers(next.Members)
	next.SharedServer = m.sharesServer(next.Members)
	return next
}

// memberOf returns the member record of target tid in c.
func memberOf(c *chainRecord, tid uint64) memberRecord {
	for _, mem := range c.Members {
		if mem.TargetID == tid {
			return mem
		}
	}
	return memberRecord{TargetID: tid, State: stateOffline}
}
