package cluster

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// syncRateWindow is how far back the sync rate behind the estimate of
// Health.SyncETA looks.
const syncRateWindow = time.Minute

// maxListed caps the chain ids a warning lists.
const maxListed = 8

// syncStats follows the SyncProgress reports of syncing members.
type syncStats struct {
	left    map[uint64]uint64    // target id -> bytes its syncs still have to copy
	done    map[[2]uint64]uint64 // (target, chain) -> bytes_done last reported
	total   uint64               // bytes copied by all syncs seen so far
	samples []syncSample         // total over the last syncRateWindow
}

type syncSample struct {
	at    time.Time
	total uint64
}

// note records target id's report r (nil: not reported) at now. Called
// with m.mu held.
func (s *syncStats) note(id uint64, r *weftv1.TargetReport, now time.Time) {
	if s.left == nil {
		s.left = make(map[uint64]uint64)
		s.done = make(map[[2]uint64]uint64)
	}
	delete(s.left, id)
	seen := make(map[[2]uint64]bool)
	if r != nil {
		var left uint64
		for _, p := range r.Syncs {
			k := [2]uint64{id, p.ChainId}
			seen[k] = true
			left += p.BytesLeft
			if prev, ok := s.done[k]; ok && p.BytesDone >= prev {
				s.total += p.BytesDone - prev
			} else {
				s.total += p.BytesDone // a new sync, or one started again
			}
			s.done[k] = p.BytesDone
		}
		if left > 0 {
			s.left[id] = left
		}
	}
	for k := range s.done {
		if k[0] == id && !seen[k] {
			delete(s.done, k)
		}
	}
	if len(s.left) == 0 {
		s.samples = nil // no sync going on: the next rate starts afresh
		return
	}
	s.samples = append(s.samples, syncSample{at: now, total: s.total})
	cut := 0
	for cut < len(s.samples)-1 && now.Sub(s.samples[cut].at) > syncRateWindow {
		cut++
	}
	s.samples = s.samples[cut:]
}

// rate returns the bytes per second copied over the recent window, 0 if
// unknown.
func (s *syncStats) rate() float64 {
	if len(s.samples) < 2 {
		return 0
	}
	first, last := s.samples[0], s.samples[len(s.samples)-1]
	d := last.at.Sub(first.at).Seconds()
	if d <= 0 {
		return 0
	}
	return float64(last.total-first.total) / d
}

// Health is the replication state of the cluster, for Status.
type Health struct {
	// Summaries counts the chains of each width by health, widths in
	// increasing order (widths asked for but not built yet included).
	Summaries []*weftv1.ChainSummary
	// SyncBytesLeft sums what syncing members still have to copy, as
	// their servers last reported.
	SyncBytesLeft uint64
	// SyncETA estimates how long that takes at the rate of the last
	// minute: 0 when nothing is left, -1 when the rate is not known yet.
	SyncETA time.Duration
	// Warnings are things an admin should look at, one sentence each.
	Warnings []string
	// Chains is the chain table's chains.
	Chains []*weftv1.Chain
}

// chainHealth classifies a chain as "healthy", "degraded", "syncing" or
// "unavailable" (see weftv1.ChainSummary).
func chainHealth(c *chainRecord) string {
	serving, syncing := countState(c, stateServing), countState(c, stateSyncing)
	offline := len(c.Members) - serving - syncing
	switch {
	case serving == 0:
		return "unavailable"
	case offline > 0 || len(c.Members) < c.width():
		return "degraded"
	case syncing > 0:
		return "syncing"
	}
	return "healthy"
}

// Health reports the chains' health per width, the sync backlog and
// warnings (including bad copies found by the data servers' scrub).
func (m *Manager) Health() Health {
	m.mu.Lock()
	defer m.mu.Unlock()
	var h Health
	byWidth := make(map[uint32]*weftv1.ChainSummary)
	summary := func(r uint32) *weftv1.ChainSummary {
		s := byWidth[r]
		if s == nil {
			s = &weftv1.ChainSummary{Replicas: r}
			byWidth[r] = s
			h.Summaries = append(h.Summaries, s)
		}
		return s
	}
	for _, r := range m.widths {
		summary(r)
	}
	shared := make(map[uint32][]uint64)
	var unavailable, stuck []string
	now := m.now()
	for _, id := range m.chainIDs {
		c := m.chains[id]
		r := uint32(c.width())
		s := summary(r)
		s.Total++
		switch chainHealth(c) {
		case "healthy":
			s.Healthy++
		case "degraded":
			s.Degraded++
			if r > 1 && m.waitsForRepair(c, now) {
				stuck = append(stuck, fmt.Sprint(c.ID))
			}
		case "syncing":
			s.Syncing++
		default:
			s.Unavailable++
			unavailable = append(unavailable, m.unavailableWhy(c))
		}
		if c.SharedServer {
			shared[r] = append(shared[r], c.ID)
		}
		for _, mem := range c.Members {
			if t := m.targets[mem.TargetID]; t.rec.Removed && mem.State == stateServing && r > 1 && countState(c, stateServing) == 1 {
				h.Warnings = append(h.Warnings, fmt.Sprintf(
					"target %d is removed but still holds the only up-to-date copy of chain %d: it leaves the chain once another member has synced",
					mem.TargetID, c.ID))
			}
		}
	}
	slices.SortFunc(h.Summaries, func(a, b *weftv1.ChainSummary) int { return int(a.Replicas) - int(b.Replicas) })

	inService := len(m.inService())
	for _, r := range m.widths {
		if byWidth[r].Total == 0 && inService < int(r) {
			h.Warnings = append(h.Warnings, fmt.Sprintf(
				"%d replicas are asked for but only %d targets are in service: chains of %d replicas are made once %d targets are registered (start more data servers)",
				r, inService, r, r))
		}
	}
	for _, r := range slices.Sorted(maps.Keys(shared)) {
		h.Warnings = append(h.Warnings, fmt.Sprintf(
			"%d chains of %d replicas keep two copies on one data server (%s): losing that server loses both; add data servers (or racks) to spread them",
			len(shared[r]), r, listIDs(shared[r])))
	}
	if len(stuck) > 0 {
		h.Warnings = append(h.Warnings, fmt.Sprintf(
			"%d chains are degraded and no target can replace their lost members (chains %s): add data servers or targets on other servers",
			len(stuck), listStrings(stuck)))
	}
	for i, w := range unavailable {
		if i == maxListed {
			h.Warnings = append(h.Warnings, fmt.Sprintf("%d more chains are unavailable", len(unavailable)-maxListed))
			break
		}
		h.Warnings = append(h.Warnings, w)
	}

	h.Warnings = append(h.Warnings, m.forwardWarnings()...)
	h.Warnings = append(h.Warnings, m.faultWarnings()...)

	for _, id := range slices.Sorted(maps.Keys(m.targets)) {
		if r := m.targets[id].report; r != nil && r.scrubErrors > 0 {
			h.Warnings = append(h.Warnings, fmt.Sprintf(
				"target %d on data server %d: scrub found %d bad chunk copies and repaired %d of them (check the disk if this grows)",
				id, m.targets[id].rec.ServerID, r.scrubErrors, r.scrubRepaired))
		}
	}

	for _, left := range m.sync.left {
		h.SyncBytesLeft += left
	}
	if h.SyncBytesLeft > 0 {
		h.SyncETA = -1
		if rate := m.sync.rate(); rate > 0 {
			h.SyncETA = time.Duration(float64(h.SyncBytesLeft) / rate * float64(time.Second))
		}
	}
	h.Chains = proto.CloneOf(m.chainTable()).Chains
	return h
}

// waitsForRepair reports whether degraded chain c has a member offline
// past the repair delay, or a missing member, that no target replaces.
func (m *Manager) waitsForRepair(c *chainRecord, now time.Time) bool {
	if len(c.Members) < c.width() {
		return true
	}
	for _, mem := range c.Members {
		if mem.State == stateOffline && mem.Since != 0 && now.Sub(sinceTime(mem.Since)) > m.cfg.RepairDelay {
			return true
		}
	}
	return false
}

// unavailableWhy says why chain c has no serving member and what it waits
// for.
func (m *Manager) unavailableWhy(c *chainRecord) string {
	if c.width() == 1 {
		tid := c.Members[0].TargetID
		return fmt.Sprintf("chain %d (1 replica) is unavailable: target %d on data server %d is offline",
			c.ID, tid, m.targets[tid].rec.ServerID)
	}
	i := m.lastToLeaveOnline(c)
	if i < 0 {
		return fmt.Sprintf("chain %d (%d replicas) has no member holding every write: its data may be lost", c.ID, c.width())
	}
	tid := c.Members[i].TargetID
	return fmt.Sprintf("chain %d (%d replicas) is unavailable: waiting for target %d on data server %d, the last to hold every write, to come back",
		c.ID, c.width(), tid, m.targets[tid].rec.ServerID)
}

// listIDs renders ids as "chains 1, 2, 3" with at most maxListed ids.
func listIDs(ids []uint64) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return "chains " + listStrings(s)
}

// listStrings joins at most maxListed items, saying how many more there
// are.
func listStrings(items []string) string {
	if len(items) <= maxListed {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:maxListed], ", ") + fmt.Sprintf(" and %d more", len(items)-maxListed)
}

// forwardWarnings describes the chains whose mutations a member fails to
// pass on to the next one (ForwardFailure reports of the online servers'
// last heartbeats, for the chains' current versions): writes to them fail
// although every member heartbeats, so the manager alone would call them
// healthy. Called with m.mu held.
func (m *Manager) forwardWarnings() []string {
	var out []string
	for _, s := range m.sortedServers() {
		if !s.online {
			continue
		}
		for _, f := range s.forwards {
			c := m.chains[f.ChainId]
			if c == nil || c.Version != f.ChainVersion {
				continue // the chain changed since: the report is stale
			}
			out = append(out, fmt.Sprintf(
				"chain %d: target %d on data server %d cannot pass writes on to target %d on data server %d at %s (failing for %v: %s): writes to the chain fail until that server is reachable from data server %d or leaves the chain",
				f.ChainId, f.TargetId, s.rec.ID, f.NextTargetId, f.NextServerId, f.NextAddress,
				(time.Duration(f.FailingMs)*time.Millisecond).Round(time.Second), f.Error, s.rec.ID))
		}
	}
	slices.Sort(out)
	return out
}
