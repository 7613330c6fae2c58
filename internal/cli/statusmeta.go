package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// fetchStatus for a comma-separated list of meta servers: the first that
// answers.
func fetchStatusAny(ctx context.Context, addrs string) (*weftv1.StatusResponse, error) {
	var errs []error
	for _, a := range splitAddrs(addrs) {
		st, err := fetchStatus(ctx, a)
		if err == nil {
			return st, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, usagef("--meta: no address given")
	}
	return nil, errors.Join(errs...)
}

// splitAddrs splits a comma-separated address list, dropping blanks.
func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// writeMetaServers lists the live meta servers, the elected cluster
// manager marked.
func writeMetaServers(w io.Writer, st *weftv1.StatusResponse) {
	ms := st.GetMetaServers()
	if len(ms) == 0 {
		return
	}
	managers := 0
	for _, m := range ms {
		if m.GetManager() {
			managers++
		}
	}
	head := fmt.Sprintf("\nmeta servers: %d", len(ms))
	if managers == 0 {
		head += ", NO MANAGER ELECTED (election in progress?)"
	}
	fmt.Fprintln(w, head)
	for _, m := range ms {
		role := "follower"
		if m.GetManager() {
			role = "manager"
		}
		id := m.GetId()
		if id == "" {
			id = "-" // the embedded engine's single meta server
		}
		line := fmt.Sprintf("  %-12s  %-21s  %-8s", id, m.GetAddress(), role)
		if v := m.GetVersion(); v != "" {
			line += "  version " + v
		}
		if ms := m.GetLastSeenMs(); ms > 0 {
			line += fmt.Sprintf("  seen %s ago", (time.Duration(ms) * time.Millisecond).Round(100*time.Millisecond))
		}
		fmt.Fprintln(w, line)
	}
}

// metaServerJSON is one meta server in weft status --json.
type metaServerJSON struct {
	ID         string `json:"id"`
	Address    string `json:"address"`
	Manager    bool   `json:"manager"`
	LastSeenMs int64  `json:"last_seen_ms"`
	Version    string `json:"version,omitempty"`
}

func toMetaServerJSON(st *weftv1.StatusResponse) []metaServerJSON {
	out := []metaServerJSON{}
	for _, m := range st.GetMetaServers() {
		out = append(out, metaServerJSON{ID: m.GetId(), Address: m.GetAddress(), Manager: m.GetManager(),
			LastSeenMs: m.GetLastSeenMs(), Version: m.GetVersion()})
	}
	return out
}
