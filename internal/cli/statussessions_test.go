package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestStatusSessions checks how weft status lists clients: sorted, with
// open files, locks and lease, expired ones marked, --json complete.
func TestStatusSessions(t *testing.T) {
	st := &weftv1.StatusResponse{Sessions: 2, SessionList: []*weftv1.SessionStatus{
		{Id: "b", Host: "node2", MountPoint: "/mnt/w", Version: "v1", OpenFiles: 3, Locks: 2, ExpiresInMs: 12_500},
		{Id: "a", Host: "node1", MountPoint: "", Version: "v1", ExpiresInMs: -10},
	}}
	var text bytes.Buffer
	writeSessionList(&text, st)
	lines := strings.Split(strings.TrimSpace(text.String()), "\n")
	if len(lines) != 4 || lines[0] != "clients: 2" || !strings.Contains(lines[1], "LEASE LEFT") {
		t.Fatalf("unexpected listing:\n%s", text.String())
	}
	for i, want := range [][]string{{"node1", " - ", "EXPIRED"}, {"node2", "/mnt/w", " 3 ", " 2 ", "12.5s"}} {
		for _, w := range want {
			if !strings.Contains(lines[2+i], w) {
				t.Errorf("line %q lacks %q", lines[2+i], w)
			}
		}
	}
	var js bytes.Buffer
	if err := writeStatusJSON(&js, "addr", st); err != nil {
		t.Fatal(err)
	}
	var out struct {
		SessionList []sessionJSON `json:"session_list"`
	}
	if err := json.Unmarshal(js.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	want := sessionJSON{ID: "b", Host: "node2", MountPoint: "/mnt/w", Version: "v1", OpenFiles: 3, Locks: 2, ExpiresInMs: 12_500}
	if len(out.SessionList) != 2 || out.SessionList[1] != want || out.SessionList[0].ID != "a" {
		t.Fatalf("--json session_list %+v", out.SessionList)
	}
}
