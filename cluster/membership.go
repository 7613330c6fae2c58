package cluster

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"syscall"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/internal/fserr"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// RegisterServer records a data server and its targets and marks them
// online. A server or target seen before (same uuid) keeps its id and gets
// the request's address and path; a new one gets the next id, and every
// new target gets a chain of its own (and one of each replicated width in
// use, the unused replicated chains being rebuilt over all targets, see
// buildChains). The response carries the ids, the heartbeat interval, the
// failure timeout and the chain table.
func (m *Manager) RegisterServer(ctx context.Context, req *weftv1.RegisterServerRequest) (*weftv1.RegisterServerResponse, error) {
	if !m.leading.Load() {
		return nil, ErrNotLeader
	}
	if err := validateRegister(req); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()

	sid, known := m.serverByUUID[req.Uuid]
	// Another incarnation of a known server, or the same at other
	// addresses (a server that does not say its incarnation): the process
	// restarted, and whatever its old incarnation was doing is gone.
	restarted := false
	if s := m.servers[sid]; known {
		restarted = req.Incarnation != s.rec.Incarnation || req.Address != s.rec.Address || req.WireAddress != s.rec.WireAddress
		if restarted && s.online {
			// The old incarnation failed, as if it had missed its
			// heartbeats: its members leave their chains (new versions,
			// which fence off every request sent with the old members'
			// addresses), and the new incarnation comes back below as any
			// returning server does (syncing what it may have missed, or
			// serving if it was the last to hold every write). Done
			// before the new addresses are saved, so that if saving fails
			// the retried registration is still a restart.
			s.online = false
			s.forwards = nil
			if err := m.reconcile(ctx, m.chainsOfServer(sid)); err != nil {
				s.online = true
				return nil, fmt.Errorf("register data server %d (%s): take its previous incarnation out of its chains: %w", sid, req.Address, err)
			}
		}
	}

	st := m.newStage()
	old := serverRecord{UUID: req.Uuid}
	if known {
		old = m.servers[sid].rec
	} else {
		st.nextServer++
		sid = st.nextServer
		old.ID = sid
	}
	rec := old
	rec.Address, rec.Hostname, rec.Site, rec.Rack = req.Address, req.Hostname, req.Site, req.Rack
	rec.WireAddress, rec.Incarnation = req.WireAddress, req.Incarnation
	if !known || rec != old {
		st.servers = append(st.servers, rec)
		st.tableChanged = !known || rec.Address != old.Address || rec.WireAddress != old.WireAddress ||
			rec.Incarnation != old.Incarnation
	}

	ids := make([]uint64, len(req.Targets))
	var newTargets []uint64
	for i, tr := range req.Targets {
		tid, ok := m.targetByUUID[tr.Uuid]
		if !ok {
			st.nextTarget++
			tid = st.nextTarget
			trec := targetRecord{ID: tid, UUID: tr.Uuid, ServerID: sid, Path: tr.Path}
			st.targets = append(st.targets, trec)
			m.placeNewTarget(st, trec)
			newTargets = append(newTargets, tid)
		} else if trec := m.targets[tid].rec; trec.ServerID != sid || trec.Path != tr.Path {
			if trec.ServerID != sid {
				m.log.Warn(fmt.Sprintf("target %d (%s) moved from data server %d to data server %d (%s)",
					tid, tr.Path, trec.ServerID, sid, req.Address), "target", tid, "uuid", tr.Uuid)
				// Its chains now lead elsewhere: new versions fence off
				// requests sent to the old server.
				for _, cid := range m.chainsOf[tid] {
					c := m.chains[cid].clone()
					c.Version++
					st.chains = append(st.chains, c)
				}
			}
			trec.ServerID, trec.Path = sid, tr.Path
			st.targets = append(st.targets, trec)
		}
		ids[i] = tid
	}
	if err := m.commit(ctx, st); err != nil {
		return nil, fmt.Errorf("register data server %s (%s): %w", req.Address, req.Uuid, err)
	}
	if restarted {
		m.log.Info(fmt.Sprintf("data server %d restarted: incarnation %s at %s (was %s at %s)", sid,
			rec.Incarnation, rec.Address, old.Incarnation, old.Address), "server", sid, "host", req.Hostname, "targets", ids)
	} else if known {
		m.log.Info(fmt.Sprintf("data server %d (%s) registered again", sid, req.Address),
			"server", sid, "host", req.Hostname, "targets", ids)
	} else {
		m.log.Info(fmt.Sprintf("new data server %d (%s) registered", sid, req.Address),
			"server", sid, "host", req.Hostname, "site", req.Site, "rack", req.Rack, "targets", ids)
	}
	for _, tid := range newTargets {
		t := m.targets[tid]
		m.log.Info(fmt.Sprintf("new target %d (%s) on data server %d", tid, t.rec.Path, sid),
			"target", tid, "chains", m.chainsOf[tid])
	}

	m.noteAlive(m.servers[sid], req.Targets, m.now())
	if err := m.reconcile(ctx, m.chainsOfServer(sid)); err != nil {
		return nil, fmt.Errorf("register data server %d (%s): %w", sid, req.Address, err)
	}
	if len(m.widths) > 0 {
		// New targets head replicated chains of every width in use, and
		// the unused chains are planned again over every target (a
		// changed rack or site too).
		if _, err := m.ensureChains(ctx, nil); err != nil {
			return nil, fmt.Errorf("register data server %d (%s): %w", sid, req.Address, err)
		}
	}
	return &weftv1.RegisterServerResponse{
		ServerId:            sid,
		TargetIds:           ids,
		HeartbeatIntervalMs: m.cfg.HeartbeatInterval.Milliseconds(),
		FailureTimeoutMs:    m.cfg.FailureTimeout.Milliseconds(),
		Chains:              proto.CloneOf(m.chainTable()),
	}, nil
}

func validateRegister(req *weftv1.RegisterServerRequest) error {
	if req.Uuid == "" {
		return fserr.Wrap(syscall.EINVAL, "register data server %s: the request has no server uuid", req.Address)
	}
	if req.Address == "" {
		return fserr.Wrap(syscall.EINVAL, "register data server %s: the request has no address (set --advertise)", req.Uuid)
	}
	seen := make(map[string]bool, len(req.Targets))
	for _, t := range req.Targets {
		if t.Uuid == "" {
			return fserr.Wrap(syscall.EINVAL, "register data server %s: target %s has no uuid", req.Address, t.Path)
		}
		if seen[t.Uuid] {
			return fserr.Wrap(syscall.EINVAL, "register data server %s: target uuid %s is listed twice (two target directories are copies of each other?)", req.Address, t.Uuid)
		}
		seen[t.Uuid] = true
	}
	return nil
}

// placeNewTarget stages the chain of one replica a new target gets: it is
// its only member. Its replicated chains are built by ensureChains once
// the target is registered.
func (m *Manager) placeNewTarget(st *stage, t targetRecord) {
	st.nextChain++
	st.chains = append(st.chains, &chainRecord{
		ID:      st.nextChain,
		Version: 1,
		Members: []memberRecord{{TargetID: t.ID, State: stateServing}},
	})
}

// Heartbeat records that a server is alive and its targets' capacity, and
// returns the chain table. A server id the manager does not know, or a
// target it does not know on that server, gets unknown_server so that the
// server registers (again).
func (m *Manager) Heartbeat(ctx context.Context, req *weftv1.HeartbeatRequest) (*weftv1.HeartbeatResponse, error) {
	if !m.leading.Load() {
		return nil, ErrNotLeader
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.leading.Load() {
		return nil, ErrNotLeader // stopped leading while waiting for mu
	}
	s := m.servers[req.ServerId]
	if s == nil {
		m.log.Debug("heartbeat from an unknown data server: asking it to register", "server", req.ServerId, "address", req.Address)
		return &weftv1.HeartbeatResponse{UnknownServer: true}, nil
	}
	for _, tr := range req.Targets {
		tid, ok := m.targetByUUID[tr.Uuid]
		if !ok || m.targets[tid].rec.ServerID != s.rec.ID {
			m.log.Info(fmt.Sprintf("data server %d (%s) reports target %s (%s) it did not register: asking it to register again",
				s.rec.ID, s.rec.Address, tr.Uuid, tr.Path))
			return &weftv1.HeartbeatResponse{UnknownServer: true}, nil
		}
	}
	if (req.Incarnation != "" || req.Address != "") &&
		(req.Incarnation != s.rec.Incarnation || req.Address != s.rec.Address || req.WireAddress != s.rec.WireAddress) {
		// Addresses belong to an incarnation, and only a registration
		// changes them (with new chain versions): a heartbeat that does
		// not match the record (a process the manager has not heard
		// register, or one that moved) registers first.
		m.log.Info(fmt.Sprintf("data server %d heartbeats as incarnation %s at %s, registered as %s at %s: asking it to register again",
			s.rec.ID, req.Incarnation, req.Address, s.rec.Incarnation, s.rec.Address), "server", s.rec.ID)
		return &weftv1.HeartbeatResponse{UnknownServer: true}, nil
	}
	s.forwards = req.ForwardFailures
	m.noteAlive(s, req.Targets, m.now())
	if err := m.reconcile(ctx, m.chainsOfServer(s.rec.ID)); err != nil {
		return nil, fmt.Errorf("heartbeat of data server %d: %w", s.rec.ID, err)
	}
	return &weftv1.HeartbeatResponse{Chains: proto.CloneOf(m.chainTable())}, nil
}

// noteAlive updates the liveness of s and its targets from a registration
// or heartbeat at now. reports must name only targets of s. Called with
// m.mu held.
func (m *Manager) noteAlive(s *serverState, reports []*weftv1.TargetReport, now time.Time) {
	if !s.online && !s.lastHeartbeat.IsZero() {
		m.log.Info(fmt.Sprintf("data server %d (%s) is back after %v without heartbeats: marked online",
			s.rec.ID, s.rec.Address, now.Sub(s.lastHeartbeat).Round(time.Second)), "server", s.rec.ID)
	}
	s.online = true
	s.lastHeartbeat = now
	reported := make(map[uint64]*weftv1.TargetReport, len(reports))
	for _, tr := range reports {
		reported[m.targetByUUID[tr.Uuid]] = tr
	}
	for _, id := range m.targetIDsOf(s.rec.ID) {
		t := m.targets[id]
		r, ok := reported[id]
		if t.present && !ok {
			m.log.Warn(fmt.Sprintf("target %d (%s) of data server %d (%s) is no longer reported: marked offline",
				id, t.rec.Path, s.rec.ID, s.rec.Address), "target", id)
		}
		t.present = ok
		if ok {
			t.report = &capacity{total: r.TotalBytes, free: r.FreeBytes, used: r.UsedBytes, chunks: r.Chunks, filesystem: r.Filesystem,
				scrubbed: r.ScrubbedBytes, scrubErrors: r.ScrubErrors, scrubRepaired: r.ScrubRepaired,
				fault: fault{kind: r.FaultKind, reason: r.Fault, since: r.FaultSinceMs}}
		}
		m.sync.note(id, r, now)
	}
}

// Run checks liveness every heartbeat interval until ctx is done: a server
// without a heartbeat for the failure timeout is marked offline and its
// chains updated.
func (m *Manager) Run(ctx context.Context) {
	tick := time.NewTicker(m.cfg.HeartbeatInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if !m.leading.Load() {
				if err := m.Refresh(ctx, false); err != nil && ctx.Err() == nil {
					m.log.Warn("follower: reload the chain table (retrying at the next check): " + err.Error())
				}
				continue
			}
			lctx, stop := m.termContext(ctx)
			m.checkLiveness(lctx)
			stop()
		}
	}
}

// checkLiveness marks servers offline whose last heartbeat is older than
// the failure timeout, brings every chain in line with its members'
// liveness, rebuilds unused replicated chains if the targets in service
// changed (see buildChains) and replaces members of replicated chains
// gone longer than the repair delay. A failure to save is logged and
// retried on the next check.
func (m *Manager) checkLiveness(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.leading.Load() {
		return // stopped leading while waiting for mu
	}
	now := m.now()
	for _, s := range m.sortedServers() {
		if s.online && now.Sub(s.lastHeartbeat) > m.cfg.FailureTimeout {
			s.online = false
			m.log.Warn(fmt.Sprintf("data server %d (%s) missed heartbeats for %v: marked offline",
				s.rec.ID, s.rec.Address, m.cfg.FailureTimeout), "server", s.rec.ID)
		}
	}
	if err := m.reconcile(ctx, m.chainIDs); err != nil && ctx.Err() == nil {
		m.log.Error("update chain states after liveness check (retrying at the next check): " + err.Error())
	}
	if err := m.adoptWidths(ctx); err != nil && ctx.Err() == nil {
		m.log.Error("build the chains of widths other meta servers asked for (retrying at the next check): " + err.Error())
	}
	if len(m.widths) > 0 {
		if _, err := m.ensureChains(ctx, nil); err != nil && ctx.Err() == nil {
			m.log.Error("rebuild unused chains (retrying at the next check): " + err.Error())
		}
	}
	if _, err := m.repair(ctx, m.chainIDs); err != nil && ctx.Err() == nil {
		m.log.Error("repair chains (retrying at the next check): " + err.Error())
	}
}

// reconcile brings the given chains in line with the liveness of their
// members and saves the changed ones (each with a new version). Called
// with m.mu held.
//
// With one replica a member whose target goes offline stays in its chain,
// because its data exists nowhere else: its state becomes offline, and
// serving again when the target is back. Replicated chains follow
// reconcileReplicated.
func (m *Manager) reconcile(ctx context.Context, chainIDs []uint64) error {
	st := m.newStage()
	now := m.now()
	for _, id := range chainIDs {
		c := m.chains[id]
		var next *chainRecord
		if c.width() > 1 {
			next = m.reconcileReplicated(c, now)
		} else {
			next = m.reconcileSingle(c)
		}
		if next != nil {
			m.log.Debug(fmt.Sprintf("chain %d changes to version %d", next.ID, next.Version), "members", next.Members)
			st.chains = append(st.chains, next)
		}
	}
	return m.commit(ctx, st)
}

// reconcileSingle returns the new record of chain c of one replica, or nil
// if nothing changed: members follow their targets' liveness.
func (m *Manager) reconcileSingle(c *chainRecord) *chainRecord {
	var next *chainRecord
	for i, mem := range c.Members {
		want := mem.State
		switch online := m.targetOnline(mem.TargetID); {
		case !online:
			want = stateOffline
		case mem.State == stateOffline:
			want = stateServing
		}
		if want == mem.State {
			continue
		}
		if next == nil {
			next = c.clone()
			next.Version++
		}
		next.Members[i].State = want
	}
	return next
}

// targetOnline reports whether target id is present on an online server.
func (m *Manager) targetOnline(id uint64) bool {
	t := m.targets[id]
	if t == nil || !t.present {
		return false
	}
	s := m.servers[t.rec.ServerID]
	return s != nil && s.online
}

// targetIDsOf returns the ids of the targets of server sid in order.
func (m *Manager) targetIDsOf(sid uint64) []uint64 {
	var ids []uint64
	for id, t := range m.targets {
		if t.rec.ServerID == sid {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// chainsOfServer returns the ids of the chains with a member on server sid.
func (m *Manager) chainsOfServer(sid uint64) []uint64 {
	var ids []uint64
	for _, tid := range m.targetIDsOf(sid) {
		ids = append(ids, m.chainsOf[tid]...)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// sortedServers returns the servers in id order.
func (m *Manager) sortedServers() []*serverState {
	out := make([]*serverState, 0, len(m.servers))
	for _, s := range m.servers {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *serverState) int { return cmp.Compare(a.rec.ID, b.rec.ID) })
	return out
}
