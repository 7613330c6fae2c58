package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Health levels of weft status, as in ceph -s.
const (
	healthOK   = "HEALTH_OK"
	healthWarn = "HEALTH_WARN"
	healthErr  = "HEALTH_ERR"
)

// clusterHealth sums st up: HEALTH_ERR when a chain has no serving member
// (its data cannot be read or written; for the single-copy chains of a
// cluster whose default layout replicates, only HEALTH_WARN), HEALTH_WARN when something runs
// with less redundancy than asked (offline servers, degraded or syncing
// chains), a target's disk is at fault (read-only, failed, full or too
// small) or the meta service warns, else HEALTH_OK. The reasons say why.
func clusterHealth(st *weftv1.StatusResponse) (string, []string) {
	var errs, warns []string
	// A server whose targets were all removed is no longer expected.
	var servers, offline int
	for _, s := range st.GetServers() {
		if retired(s) {
			continue
		}
		servers++
		if !s.GetOnline() {
			offline++
		}
	}
	switch {
	case servers == 0:
		warns = append(warns, "no data servers registered")
	case offline > 0:
		warns = append(warns, fmt.Sprintf("%d of %d data servers offline", offline, servers))
	}
	for _, s := range st.GetServers() {
		for _, t := range s.GetTargets() {
			if k := t.GetFaultKind(); k != "" && t.GetOnline() && !t.GetRemoved() {
				warns = append(warns, fmt.Sprintf("target %d on data server %d %s", t.GetId(), s.GetId(), k))
			}
		}
	}
	defaultReplicas := max(st.GetDefaultLayout().GetReplicas(), 1)
	for _, s := range st.GetChainSummaries() {
		if n := s.GetUnavailable(); n > 0 {
			msg := fmt.Sprintf("%d %s of %d %s unavailable", n, plural(n, "chain"), s.GetReplicas(), plural(s.GetReplicas(), "replica"))
			if s.GetReplicas() == 1 && defaultReplicas > 1 {
				// Every target has a single-copy chain; in a cluster
				// that replicates by default only files explicitly
				// given replicas 1 use them: their loss is a warning.
				warns = append(warns, msg+" (files with replicas 1 on offline servers)")
			} else {
				errs = append(errs, msg)
			}
		}
		if n := s.GetDegraded(); n > 0 {
			warns = append(warns, fmt.Sprintf("%d %s of %d %s degraded", n, plural(n, "chain"), s.GetReplicas(), plural(s.GetReplicas(), "replica")))
		}
		if n := s.GetSyncing(); n > 0 {
			warns = append(warns, fmt.Sprintf("%d %s of %d %s syncing", n, plural(n, "chain"), s.GetReplicas(), plural(s.GetReplicas(), "replica")))
		}
	}
	if n := len(st.GetWarnings()); n > 0 {
		warns = append(warns, fmt.Sprintf("%d %s", n, plural(uint32(n), "warning")))
	}
	switch {
	case len(errs) > 0:
		return healthErr, append(errs, warns...)
	case len(warns) > 0:
		return healthWarn, warns
	}
	return healthOK, nil
}

// retired reports whether every target of server s was removed (and it
// has any).
func retired(s *weftv1.ServerStatus) bool {
	for _, t := range s.GetTargets() {
		if !t.GetRemoved() {
			return false
		}
	}
	return len(s.GetTargets()) > 0 && !s.GetOnline()
}

// plural adds an s to word unless n is 1.
func plural(n uint32, word string) string {
	return choose(n, word, word+"s")
}

// healthLine is the health with its reasons on one line.
func healthLine(st *weftv1.StatusResponse) string {
	h, why := clusterHealth(st)
	if len(why) == 0 {
		return h
	}
	return h + ": " + strings.Join(why, "; ")
}

// writeChainHealth prints the chains' health per replica count, the sync
// backlog and the warnings.
func writeChainHealth(w io.Writer, st *weftv1.StatusResponse) {
	fmt.Fprintf(w, "\nchains:\n")
	for _, s := range st.GetChainSummaries() {
		if s.GetTotal() == 0 {
			fmt.Fprintf(w, "  replicas %d: no chains yet (made once %d targets are in service)\n", s.GetReplicas(), s.GetReplicas())
			continue
		}
		fmt.Fprintf(w, "  replicas %d: %d healthy, %d degraded, %d syncing, %d unavailable\n",
			s.GetReplicas(), s.GetHealthy(), s.GetDegraded(), s.GetSyncing(), s.GetUnavailable())
	}
	if len(st.GetChainSummaries()) == 0 {
		fmt.Fprintf(w, "  none yet (made when data servers register)\n")
	}
	if left := st.GetSyncBytesLeft(); left > 0 {
		fmt.Fprintf(w, "  syncing: %s left, %s\n", formatSize(left), etaString(st.GetSyncEtaMs()))
	} else if syncingChains(st) > 0 {
		fmt.Fprintf(w, "  syncing: amount left not reported yet\n")
	}

	warnings := append([]string(nil), st.GetWarnings()...)
	var degraded uint32
	for _, s := range st.GetChainSummaries() {
		if s.GetReplicas() > 1 {
			degraded += s.GetDegraded()
		}
	}
	if degraded > 0 {
		warnings = append(warnings, fmt.Sprintf(
			"%d replicated %s degraded (a member offline or missing): I/O goes on with the other copies; a member that returns syncs, one gone past the repair delay is replaced (weft target remove ID does it now)",
			degraded, choose(degraded, "chain is", "chains are")))
	}
	if len(warnings) > 0 {
		fmt.Fprintf(w, "\nwarnings:\n")
		for _, s := range warnings {
			fmt.Fprintf(w, "  - %s\n", s)
		}
	}
}

// choose returns one for n == 1, else many.
func choose(n uint32, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// syncingChains counts the chains with a syncing member and none offline.
func syncingChains(st *weftv1.StatusResponse) uint32 {
	var n uint32
	for _, s := range st.GetChainSummaries() {
		n += s.GetSyncing()
	}
	return n
}

// etaString describes the sync estimate in ms (-1: rate unknown).
func etaString(ms int64) string {
	switch {
	case ms < 0:
		return "time left not known yet (no copy rate measured)"
	case ms == 0:
		return "about to finish"
	}
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d < time.Second:
		return "less than a second"
	case d < time.Hour:
		return "about " + d.Round(time.Second).String()
	}
	return "about " + d.Round(time.Minute).String()
}

// writeChainList prints every chain with its version and members in
// chain order (the head first).
func writeChainList(w io.Writer, st *weftv1.StatusResponse) {
	chains := append([]*weftv1.Chain(nil), st.GetChainList()...)
	sort.Slice(chains, func(i, j int) bool { return chains[i].GetId() < chains[j].GetId() })
	fmt.Fprintf(w, "\nchain list (members in chain order, head first):\n")
	if len(chains) == 0 {
		fmt.Fprintf(w, "  (none)\n")
	}
	for _, c := range chains {
		members := make([]string, 0, len(c.GetMembers()))
		for _, m := range c.GetMembers() {
			members = append(members, fmt.Sprintf("target %d (server %d %s, %s)", m.GetTargetId(), m.GetServerId(), m.GetAddress(), m.GetState()))
		}
		if len(members) == 0 {
			members = append(members, "(no members)")
		}
		fmt.Fprintf(w, "  chain %d  version %d  replicas %d  %s: %s\n", c.GetId(), c.GetVersion(), max(c.GetReplicas(), 1), chainState(c), strings.Join(members, ", "))
	}
}

// chainState classifies a chain as the meta service's per-width counts
// do: "unavailable" (no serving member), "degraded" (a member offline or
// missing), "syncing" or "healthy".
func chainState(c *weftv1.Chain) string {
	var serving, syncing, offline int
	for _, m := range c.GetMembers() {
		switch m.GetState() {
		case "serving":
			serving++
		case "syncing":
			syncing++
		default:
			offline++
		}
	}
	switch {
	case serving == 0:
		return "unavailable"
	case offline > 0 || len(c.GetMembers()) < int(c.GetReplicas()):
		return "degraded"
	case syncing > 0:
		return "syncing"
	}
	return "healthy"
}

// scrubString describes a target's scrub counters.
func scrubString(t *weftv1.TargetStatus) string {
	return fmt.Sprintf("scrub: %s verified, %d bad %s found, %d repaired",
		formatSize(t.GetScrubbedBytes()), t.GetScrubErrors(), choose(uint32(min(t.GetScrubErrors(), 2)), "copy", "copies"), t.GetScrubRepaired())
}
