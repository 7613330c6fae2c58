package cluster

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// reconcileReplicated returns the new record of replicated chain c, or nil
// if nothing changed. The rules:
//
//   - A serving or syncing member whose target is not online, or whose
//     disk is read-only or failed (faults.go), becomes offline; the chain version it left at, whether it was serving and
//     the time are recorded.
//   - A member that was offline never serves again without a sync: when
//     its target is back it becomes a syncing tail, filled by its
//     predecessor, and serving when it reports it is done (ReportSynced).
//   - If no member is serving, the member that left last while serving
//     holds every acknowledged write: when it is back it serves again at
//     once, and the others wait (offline) until it is, then sync from it.
//
// Called with m.mu held.
func (m *Manager) reconcileReplicated(c *chainRecord, now time.Time) *chainRecord {
	next := c.clone()
	next.Version++
	changed := false
	for i := range next.Members {
		mem := &next.Members[i]
		if mem.State != stateOffline && !m.targetWritable(mem.TargetID) {
			m.log.Warn(fmt.Sprintf("chain %d: target %d (%s) is unreachable: taken out of the chain", c.ID, mem.TargetID, mem.State),
				"chain", c.ID, "version", next.Version)
			*mem = memberRecord{TargetID: mem.TargetID, State: stateOffline,
				Left: next.Version, LeftServing: mem.State == stateServing, Since: now.UnixNano()}
			changed = true
		}
	}
	if countState(next, stateServing) == 0 {
		if i := m.lastToLeaveOnline(next); i >= 0 && m.targetWritable(next.Members[i].TargetID) {
			m.log.Info(fmt.Sprintf("chain %d: target %d, the last to hold every write, is back: serving again",
				c.ID, next.Members[i].TargetID), "chain", c.ID, "version", next.Version)
			next.Members[i] = memberRecord{TargetID: next.Members[i].TargetID, State: stateServing}
			changed = true
		}
	}
	if countState(next, stateServing) > 0 {
		for i := range next.Members {
			mem := &next.Members[i]
			if mem.State == stateOffline && m.targetWritable(mem.TargetID) {
				m.log.Info(fmt.Sprintf("chain %d: target %d is back: syncing what it missed", c.ID, mem.TargetID),
					"chain", c.ID, "version", next.Version)
				*mem = memberRecord{TargetID: mem.TargetID, State: stateSyncing}
				changed = true
			}
		}
	}
	if !changed {
		return nil
	}
	sortMembers(next.Members)
	return next
}

// lastToLeave returns the index of the offline member of c that left last
// while serving (the first such when several left together), or -1 if no
// member left serving.
func lastToLeave(c *chainRecord) int {
	best := -1
	for i, mem := range c.Members {
		if mem.State == stateOffline && mem.LeftServing && (best < 0 || mem.Left > c.Members[best].Left) {
			best = i
		}
	}
	return best
}

// lastToLeaveOnline is lastToLeave, but among members that left together
// last it prefers one whose target is online.
func (m *Manager) lastToLeaveOnline(c *chainRecord) int {
	best := lastToLeave(c)
	if best < 0 {
		return best
	}
	for i, mem := range c.Members {
		if mem.State == stateOffline && mem.LeftServing && mem.Left == c.Members[best].Left && m.targetWritable(mem.TargetID) {
			return i
		}
	}
	return best
}

// ReportSynced records that a syncing member has copied everything it
// missed while the chain was at req.chain_version: it becomes serving
// (new chain version). A report for another chain version, or for a
// member that is not syncing (anymore), is refused with FailedPrecondition
// (the data server syncs again against the current chain); a report for a
// member already serving succeeds. The response carries the chain table.
func (m *Manager) ReportSynced(ctx context.Context, req *weftv1.ReportSyncedRequest) (*weftv1.ReportSyncedResponse, error) {
	if !m.leading.Load() {
		return nil, ErrNotLeader
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.chains[req.ChainId]
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "report sync of chain %d: no such chain in the chain table", req.ChainId)
	}
	idx := -1
	for i, mem := range c.Members {
		if mem.TargetID == req.TargetId {
			idx = i
		}
	}
	if idx < 0 {
		return nil, status.Errorf(codes.FailedPrecondition,
			"report sync of chain %d: target %d is not a member of the chain (version %d) any more: stop syncing it",
			c.ID, req.TargetId, c.Version)
	}
	if t := m.targets[req.TargetId]; req.ServerId != 0 && t.rec.ServerID != req.ServerId {
		return nil, status.Errorf(codes.FailedPrecondition,
			"report sync of chain %d: target %d belongs to data server %d, not %d: register again",
			c.ID, req.TargetId, t.rec.ServerID, req.ServerId)
	}
	switch c.Members[idx].State {
	case stateServing:
		return &weftv1.ReportSyncedResponse{Chains: proto.CloneOf(m.chainTable())}, nil
	case stateOffline:
		return nil, status.Errorf(codes.FailedPrecondition,
			"report sync of chain %d: target %d is offline in the chain (version %d): wait for the next heartbeat",
			c.ID, req.TargetId, c.Version)
	}
	if c.Version != req.ChainVersion {
		return nil, status.Errorf(codes.FailedPrecondition,
			"report sync of chain %d: stale chain version %d, the chain is at version %d: sync again against its current members",
			c.ID, req.ChainVersion, c.Version)
	}
	if countState(c, stateServing) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition,
			"report sync of chain %d: the chain has no serving member to have synced from", c.ID)
	}
	next := c.clone()
	next.Version++
	next.Members[idx].State = stateServing
	sortMembers(next.Members)
	st := m.newStage()
	st.chains = append(st.chains, next)
	if err := m.commit(ctx, st); err != nil {
		return nil, fmt.Errorf("report sync of chain %d by target %d: %w", c.ID, req.TargetId, err)
	}
	m.log.Info(fmt.Sprintf("chain %d: target %d finished syncing: serving", c.ID, req.TargetId),
		"chain", c.ID, "version", next.Version)
	return &weftv1.ReportSyncedResponse{Chains: proto.CloneOf(m.chainTable())}, nil
}
