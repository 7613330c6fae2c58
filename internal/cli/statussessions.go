package cli

import (
	"fmt"
	"io"
	"sort"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// maxSessionsShown bounds the client sessions the text form of weft
// status lists; --json lists every one the meta service sent.
const maxSessionsShown = 20

// sessionJSON is one client session in weft status --json.
type sessionJSON struct {
	ID         string `json:"id"`
	Host       string `json:"host"`
	MountPoint string `json:"mount_point"`
	Version    string `json:"version"`
	OpenFiles  uint32 `json:"open_files"`
	Locks      uint32 `json:"locks"`
	// ExpiresInMs is the time left on the lease; negative once it ran
	// out and the session is not cleaned up yet.
	ExpiresInMs int64 `json:"expires_in_ms"`
}

// sortedSessions orders sessions by host, mount point and id.
func sortedSessions(st *weftv1.StatusResponse) []*weftv1.SessionStatus {
	list := append([]*weftv1.SessionStatus(nil), st.GetSessionList()...)
	sort.Slice(list, func(i, j int) bool {
		a, b := list[i], list[j]
		if a.GetHost() != b.GetHost() {
			return a.GetHost() < b.GetHost()
		}
		if a.GetMountPoint() != b.GetMountPoint() {
			return a.GetMountPoint() < b.GetMountPoint()
		}
		return a.GetId() < b.GetId()
	})
	return list
}

// toSessionJSON lists st's sessions for --json (never nil).
func toSessionJSON(st *weftv1.StatusResponse) []sessionJSON {
	out := []sessionJSON{}
	for _, s := range sortedSessions(st) {
		out = append(out, sessionJSON{ID: s.GetId(), Host: s.GetHost(), MountPoint: s.GetMountPoint(), Version: s.GetVersion(),
			OpenFiles: s.GetOpenFiles(), Locks: s.GetLocks(), ExpiresInMs: s.GetExpiresInMs()})
	}
	return out
}

// writeSessionList prints the clients (sessions) of st for a person.
func writeSessionList(w io.Writer, st *weftv1.StatusResponse) {
	list := sortedSessions(st)
	fmt.Fprintf(w, "\nclients: %d\n", st.GetSessions())
	if len(list) == 0 {
		return
	}
	fmt.Fprintf(w, "  %-20s  %-30s  %-10s  %10s  %6s  %s\n", "HOST", "MOUNT POINT", "VERSION", "OPEN FILES", "LOCKS", "LEASE LEFT")
	for i, s := range list {
		if i == maxSessionsShown {
			fmt.Fprintf(w, "  ... and %d more (weft status --json lists every client)\n", len(list)-i)
			break
		}
		lease := (time.Duration(s.GetExpiresInMs()) * time.Millisecond).Round(100 * time.Millisecond).String()
		if s.GetExpiresInMs() <= 0 {
			lease = "EXPIRED"
		}
		mp := s.GetMountPoint()
		if mp == "" {
			mp = "-"
		}
		fmt.Fprintf(w, "  %-20s  %-30s  %-10s  %10d  %6d  %s\n", s.GetHost(), mp, s.GetVersion(), s.GetOpenFiles(), s.GetLocks(), lease)
	}
}
