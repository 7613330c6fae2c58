package cluster

import (
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Servers returns every registered server in id order with its targets
// (in id order), their last capacity report and whether they are online.
// last_heartbeat_ms is the time since the server's last heartbeat (or
// since the manager started, for a server not heard from since).
func (m *Manager) Servers() []*weftv1.ServerStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	out := make([]*weftv1.ServerStatus, 0, len(m.servers))
	for _, s := range m.sortedServers() {
		ss := &weftv1.ServerStatus{
			Id:              s.rec.ID,
			Address:         s.rec.Address,
			Hostname:        s.rec.Hostname,
			Online:          s.online,
			LastHeartbeatMs: now.Sub(s.lastHeartbeat).Milliseconds(),
			Site:            s.rec.Site,
			Rack:            s.rec.Rack,
		}
		for _, id := range m.targetIDsOf(s.rec.ID) {
			t := m.targets[id]
			ts := &weftv1.TargetStatus{Id: id, Path: t.rec.Path, Online: m.targetOnline(id), Removed: t.rec.Removed}
			if r := t.report; r != nil {
				ts.TotalBytes, ts.FreeBytes, ts.UsedBytes, ts.Chunks = r.total, r.free, r.used, r.chunks
				ts.ScrubbedBytes, ts.ScrubErrors, ts.ScrubRepaired = r.scrubbed, r.scrubErrors, r.scrubRepaired
			}
			f := faultOf(t)
			ts.FaultKind, ts.Fault, ts.FaultSinceMs = f.kind, f.reason, f.since
			ss.Targets = append(ss.Targets, ts)
		}
		out = append(out, ss)
	}
	return out
}

// Capacity sums the last capacity reports of the online targets. Targets
// on one server that share a file system (the same device) count its size
// and free space once; used bytes are each target's own chunks.
func (m *Manager) Capacity() (total, free, used uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c := m.remoteCapacity; c != nil && !m.leading.Load() {
		return c[0], c[1], c[2]
	}
	seen := make(map[string]bool)
	for id, t := range m.targets {
		if t.report == nil || !m.targetOnline(id) {
			continue
		}
		used += t.report.used
		if fs := t.report.filesystem; fs != "" {
			key := m.servers[t.rec.ServerID].rec.Hostname + "/" + fs
			if seen[key] {
				continue
			}
			seen[key] = true
		}
		total += t.report.total
		free += t.report.free
	}
	return total, free, used
}
