package cluster

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/fserr"
)

// MaxReplicas is the widest chain the manager builds.
const MaxReplicas = 8

// EnsureChains makes sure the cluster keeps chains of the given width
// (replica count): the width is remembered and the chains of every width
// in use are (re)built, as soon as at least that many targets are
// registered (see buildChains). Replicas 0 and 1 need nothing (every
// target has a chain of one). Called when a layout with replicas R is set
// and at start for the default layout; registrations, removals and the
// liveness check rebuild the widths already in use.
func (m *Manager) EnsureChains(ctx context.Context, replicas uint32) error {
	if replicas <= 1 {
		return nil
	}
	if replicas > MaxReplicas {
		return fserr.Wrap(syscall.EINVAL, "make chains of %d replicas: at most %d replicas are supported", replicas, MaxReplicas)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	_, err := m.ensureChains(ctx, []uint32{replicas})
	return err
}

// ensureChains records widths and (re)builds the chains of every width in
// use, in one transaction; it returns how many chains it made, rebuilt or
// dropped. Called with m.mu held.
func (m *Manager) ensureChains(ctx context.Context, widths []uint32) (int, error) {
	if !m.leading.Load() {
		return 0, m.ensureWidthsFollowing(ctx, widths)
	}
	st := m.newStage()
	all := slices.Clone(m.widths)
	for _, r := range widths {
		if !slices.Contains(all, r) {
			all = append(all, r)
			slices.Sort(all)
			st.widths = all
		}
	}
	for _, r := range all {
		m.buildChains(st, r)
	}
	if err := m.commit(ctx, st); err != nil {
		return 0, fmt.Errorf("make chains of %v replicas: %w", all, err)
	}
	for _, c := range st.chains {
		what := "new chain"
		if c.Version > 1 {
			what = "unused chain rebuilt:"
		}
		m.log.Info(fmt.Sprintf("%s %d of %d replicas: targets %v", what, c.ID, c.Replicas, memberIDs(c.Members)),
			"chain", c.ID, "version", c.Version, "shared_server", c.SharedServer)
		if c.SharedServer {
			m.log.Warn(fmt.Sprintf("chain %d keeps two copies on one data server: add data servers to spread its replicas", c.ID))
		}
	}
	for _, id := range st.drop {
		m.log.Info(fmt.Sprintf("unused chain %d dropped: its home target left service", id), "chain", id)
	}
	return len(st.chains) + len(st.drop), nil
}

// inService returns the ids of the registered targets not removed, in
// order.
func (m *Manager) inService() []uint64 {
	var ids []uint64
	for id, t := range m.targets {
		if !t.rec.Removed {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// memberLoad counts, for each target, the chains of width r it is a
// member of. Called with m.mu held.
func (m *Manager) memberLoad(r int) map[uint64]int {
	load := make(map[uint64]int)
	for _, c := range m.chains {
		if c.width() != r {
			continue
		}
		for _, mem := range c.Members {
			load[mem.TargetID]++
		}
	}
	return load
}

// buildChains stages the chains of width r: every target in service is
// the home (first member) of one, if at least r targets are in service.
// Chains used by a file (Used) keep their members: their data would have
// to move. Every unused chain is planned again from scratch over all the
// targets in service, around the used ones, so that targets registering
// one after another end up as evenly spread as if they had all been there
// from the start: each chain's other members are chosen by chooseMember,
// and every target is in about r chains. An unused chain keeps its id
// (preferably for the same home) and gets a new version only if its
// members change; unused chains left without a home (their home left
// service) are dropped. While fewer than r targets are in service nothing
// can be planned: the chains stay as they are and repair handles them.
func (m *Manager) buildChains(st *stage, r uint32) {
	targets := m.inService()
	if !m.rebuildable(r) {
		return // the unused chains stay as they are; repair keeps them
	}
	homed := make(map[uint64]bool)
	load := make(map[uint64]int)
	var unused []*chainRecord // in id order
	for _, id := range m.chainIDs {
		c := m.chains[id]
		if c.width() != int(r) {
			continue
		}
		if !c.Used {
			unused = append(unused, c)
			continue
		}
		homed[c.Home] = true
		for _, mem := range c.Members {
			load[mem.TargetID]++
		}
	}
	var todo []uint64
	for _, id := range targets {
		if !homed[id] {
			todo = append(todo, id)
			load[id]++ // it will head its own chain
		}
	}
	// Unused chains go to the same home again where they can, the rest
	// to the homes left over, in id order.
	old := make(map[uint64]*chainRecord)
	var spare []*chainRecord
	for _, c := range unused {
		if slices.Contains(todo, c.Home) && old[c.Home] == nil {
			old[c.Home] = c
		} else {
			spare = append(spare, c)
		}
	}
	now := m.now().UnixNano()
	for _, home := range todo {
		members := []uint64{home}
		for len(members) < int(r) {
			id, ok := m.chooseMember(members, load, ring(targets, home))
			if !ok {
				break
			}
			members = append(members, id)
			load[id]++
		}
		if len(members) < int(r) {
			continue // cannot happen: r targets are in service
		}
		prev := old[home]
		if prev == nil && len(spare) > 0 {
			prev, spare = spare[0], spare[1:]
		}
		c := &chainRecord{Version: 1, Replicas: r, Home: home}
		for _, id := range members {
			mem := memberRecord{TargetID: id, State: stateServing}
			if !m.targetWritable(id) {
				// A new chain holds no data: a member that is down
				// has missed nothing yet, so any may come back first.
				mem = memberRecord{TargetID: id, State: stateOffline, LeftServing: true, Since: now}
			}
			c.Members = append(c.Members, mem)
		}
		c.SharedServer = m.sharesServer(c.Members)
		if prev != nil {
			if prev.Home == home && prev.SharedServer == c.SharedServer && sameTargets(prev.Members, members) {
				continue // already so: its member states follow liveness
			}
			c.ID, c.Version = prev.ID, prev.Version+1
		} else {
			st.nextChain++
			c.ID = st.nextChain
		}
		sortMembers(c.Members)
		st.chains = append(st.chains, c)
	}
	for _, c := range spare {
		st.drop = append(st.drop, c.ID)
	}
}

// rebuildable reports whether the unused chains of width r are planned
// by buildChains (at least r targets in service) rather than repaired.
// Called with m.mu held.
func (m *Manager) rebuildable(r uint32) bool {
	return len(m.inService()) >= int(r)
}

// sameTargets reports whether ms are the targets ids, in any order.
func sameTargets(ms []memberRecord, ids []uint64) bool {
	if len(ms) != len(ids) {
		return false
	}
	for _, mem := range ms {
		if !slices.Contains(ids, mem.TargetID) {
			return false
		}
	}
	return true
}

// domain is where a target sits in the failure-domain tree.
type domain struct {
	site, rack string
	server     uint64
}

func (m *Manager) domainOf(id uint64) domain {
	t := m.targets[id]
	d := domain{server: t.rec.ServerID}
	if s := m.servers[d.server]; s != nil {
		d.site, d.rack = s.rec.Site, s.rec.Rack
	}
	return d
}

// closeness counts how many of members share a server, a rack and a site
// with target id: lower is better on each level, the server first.
func (m *Manager) closeness(id uint64, members []uint64) [3]int {
	d := m.domainOf(id)
	var c [3]int
	for _, mid := range members {
		o := m.domainOf(mid)
		if o.server == d.server {
			c[0]++
		}
		if o.site == d.site && o.rack == d.rack {
			c[1]++
		}
		if o.site == d.site {
			c[2]++
		}
	}
	return c
}

// chooseMember picks a target to join a chain whose members are members:
// in service, not a member yet, as far from the members as possible in
// the failure-domain tree (another server first, then another rack, then
// another site). Among equals, for a new chain (after set: how far a
// target comes after the chain's home, see ring) the target in the
// fewest chains, then the nearest after the home, then an online one,
// then the most free space; for a replacement (after nil) it must be
// online and not full, and more free space (in tenths of the most free)
// comes before fewer chains.
// Called with m.mu held.
func (m *Manager) chooseMember(members []uint64, load map[uint64]int, after func(uint64) int) (uint64, bool) {
	repair := after == nil
	type cand struct {
		id     uint64
		close  [3]int
		load   int
		online bool
		free   uint64
		bucket uint64
		ahead  int
	}
	var cands []cand
	var maxFree uint64
	for _, id := range m.inService() {
		if slices.Contains(members, id) {
			continue
		}
		c := cand{id: id, close: m.closeness(id, members), load: load[id], online: m.targetWritable(id)}
		if !repair {
			c.ahead = after(id)
		}
		if r := m.targets[id].report; r != nil {
			if repair && !placeable(r) {
				continue
			}
			c.free = r.free
		}
		if repair && !c.online {
			continue
		}
		maxFree = max(maxFree, c.free)
		cands = append(cands, c)
	}
	if len(cands) == 0 {
		return 0, false
	}
	for i := range cands {
		if maxFree > 0 {
			cands[i].bucket = cands[i].free * 10 / maxFree
		}
	}
	best := slices.MinFunc(cands, func(a, b cand) int {
		if c := slices.Compare(a.close[:], b.close[:]); c != 0 {
			return c
		}
		if repair {
			if c := cmp.Compare(b.bucket, a.bucket); c != 0 {
				return c
			}
			if c := cmp.Compare(a.load, b.load); c != 0 {
				return c
			}
		} else {
			if c := cmp.Compare(a.load, b.load); c != 0 {
				return c
			}
			if c := cmp.Compare(a.ahead, b.ahead); c != 0 {
				return c
			}
			if a.online != b.online {
				if a.online {
					return -1
				}
				return 1
			}
		}
		if c := cmp.Compare(b.free, a.free); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return best.id, true
}

// ring returns, for a target id, how far after home it comes in the
// circular order of targets (ids in order): new chains take the nearest
// equally loaded targets after their home, so that the last chains built
// still find targets with room, as on a hash ring.
func ring(targets []uint64, home uint64) func(uint64) int {
	pos := make(map[uint64]int, len(targets))
	for i, id := range targets {
		pos[id] = i
	}
	h := pos[home]
	return func(id uint64) int {
		p, ok := pos[id]
		if !ok {
			return len(targets)
		}
		return (p - h + len(targets)) % len(targets)
	}
}

// sharesServer reports whether two of members are on one data server.
func (m *Manager) sharesServer(members []memberRecord) bool {
	seen := make(map[uint64]bool)
	for _, mem := range members {
		sid := m.targets[mem.TargetID].rec.ServerID
		if seen[sid] {
			return true
		}
		seen[sid] = true
	}
	return false
}

// stateRank orders members: serving, then syncing, then offline.
func stateRank(s string) int {
	switch s {
	case stateServing:
		return 0
	case stateSyncing:
		return 1
	}
	return 2
}

// sortMembers puts serving members first, then syncing, then offline,
// keeping the chain order within each group.
func sortMembers(ms []memberRecord) {
	slices.SortStableFunc(ms, func(a, b memberRecord) int { return cmp.Compare(stateRank(a.State), stateRank(b.State)) })
}

// memberIDs returns the target ids of ms in order.
func memberIDs(ms []memberRecord) []uint64 {
	ids := make([]uint64, len(ms))
	for i, mem := range ms {
		ids[i] = mem.TargetID
	}
	return ids
}

// countState counts the members of c in state s.
func countState(c *chainRecord, s string) int {
	n := 0
	for _, mem := range c.Members {
		if mem.State == s {
			n++
		}
	}
	return n
}

// sinceTime converts a member's Since to a time (zero if unset).
func sinceTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
