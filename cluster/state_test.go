package cluster

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// threeByTwo is three servers of one target each with chains of two:
// chain 4 = [1 2], 5 = [2 3], 6 = [3 1] (chains 1-3 have one replica),
// all used by files.
func threeByTwo(t *testing.T) *replEnv {
	t.Helper()
	e := newReplEnv(t, node{targets: 1}, node{targets: 1}, node{targets: 1})
	e.ensure(2)
	e.wantChains("built", map[uint64]string{4: "v1 1/serving,2/serving", 5: "v1 2/serving,3/serving", 6: "v1 3/serving,1/serving"})
	e.use(2)
	return e
}

func (e *replEnv) synced(server, target, chain, version uint64) error {
	_, err := e.m.ReportSynced(context.Background(), &weftv1.ReportSyncedRequest{
		ServerId: server, TargetId: target, ChainId: chain, ChainVersion: version,
	})
	return err
}

func TestMemberStates(t *testing.T) {
	e := threeByTwo(t)
	v0 := e.table().Version
	steps := []struct {
		name      string
		do        func()
		want      map[uint64]string
		tableBump uint64 // table version increase
	}{
		{"server 2 offline", func() { e.down(1, 3) }, map[uint64]string{
			2: "v2 2/offline", 4: "v2 1/serving,2/offline", 5: "v2 3/serving,2/offline", 6: "v1 3/serving,1/serving"}, 1},
		{"server 2 back: syncing tails; one replica serves at once", func() { e.tick(0, 2) }, map[uint64]string{
			2: "v3 2/serving", 4: "v3 1/serving,2/syncing", 5: "v3 3/serving,2/syncing"}, 1},
		{"synced at the current version: serving", func() {
			if err := e.synced(2, 2, 4, 2); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "stale chain version") {
				t.Errorf("ReportSynced at an old version: %v, want FailedPrecondition", err)
			}
			if err := e.synced(2, 2, 4, 3); err != nil {
				t.Errorf("ReportSynced: %v", err)
			}
			if err := e.synced(2, 2, 4, 3); err != nil {
				t.Errorf("ReportSynced again: %v", err)
			}
		}, map[uint64]string{4: "v4 1/serving,2/serving", 5: "v3 3/serving,2/syncing"}, 1},
		{"bad reports change nothing", func() {
			for _, c := range []struct {
				name                           string
				server, target, chain, version uint64
				want                           codes.Code
			}{
				{"not a member", 1, 1, 5, 3, codes.FailedPrecondition},
				{"wrong server", 3, 2, 5, 3, codes.FailedPrecondition},
				{"no such chain", 2, 2, 99, 1, codes.NotFound},
			} {
				if err := e.synced(c.server, c.target, c.chain, c.version); status.Code(err) != c.want {
					t.Errorf("%s: %v, want %v", c.name, err, c.want)
				}
			}
		}, map[uint64]string{4: "v4 1/serving,2/serving", 5: "v3 3/serving,2/syncing"}, 0},
		{"server 3 down: chain 5 keeps only a syncing member", func() { e.down(1, 2) }, map[uint64]string{
			5: "v4 2/syncing,3/offline", 6: "v2 1/serving,3/offline"}, 1},
		{"server 3 back: it left serving, so it serves again; 2 keeps syncing", func() { e.tick(0, 1, 2, 3) }, map[uint64]string{
			5: "v5 3/serving,2/syncing", 6: "v3 1/serving,3/syncing"}, 1},
		{"nothing changes while all heartbeat", func() { e.tick(e.cfg.HeartbeatInterval, 1, 2, 3) }, nil, 0},
	}
	for _, st := range steps {
		before := e.table().Version
		st.do()
		e.wantChains(st.name, st.want)
		if got := e.table().Version - before; got != st.tableBump {
			t.Errorf("%s: table version moved by %d, want %d", st.name, got, st.tableBump)
		}
	}
	if got := e.table().Version - v0; got != 5 {
		t.Errorf("table version moved by %d in all, want 5", got)
	}
	before := e.table()
	e.restart()
	if after := e.table(); summary(after) != summary(before) {
		t.Errorf("table changed across restart:\n%s\n%s", summary(before), summary(after))
	}
}

// TestLastToLeave: when every member of a chain went offline, the one
// that left last holds every acknowledged write; it serves first when it
// is back and the others sync from it.
func TestLastToLeave(t *testing.T) {
	e := newReplEnv(t, node{targets: 1}, node{targets: 1})
	e.ensure(2) // chain 3 = [1 2], chain 4 = [2 1]
	e.down(2)   // 1 leaves first
	e.wantChains("server 1 down", map[uint64]string{3: "v2 2/serving,1/offline", 4: "v2 2/serving,1/offline"})
	e.down() // then 2
	e.wantChains("both down", map[uint64]string{3: "v3 2/offline,1/offline", 4: "v3 2/offline,1/offline"})
	if _, err := e.m.PickChains(context.Background(), 1, 2); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("PickChains with every chain down: %v, want ENOSPC", err)
	}
	e.restart()
	e.tick(0, 1) // 1 is back first, but missed what 2 acknowledged
	e.wantChains("server 1 back", map[uint64]string{3: "v3 2/offline,1/offline", 4: "v3 2/offline,1/offline"})
	h := e.m.Health()
	if s := h.Summaries[1]; s.Replicas != 2 || s.Unavailable != 2 || s.Total != 2 {
		t.Errorf("summary while waiting for target 2: %v", s)
	}
	if w := strings.Join(h.Warnings, "\n"); !strings.Contains(w, "chain 3 (2 replicas) is unavailable: waiting for target 2 on data server 2, the last to hold every write") {
		t.Errorf("warnings: %q", h.Warnings)
	}
	// Waiting longer than the repair delay replaces nobody: there is
	// nothing to copy from.
	e.tick(2*e.cfg.RepairDelay, 1)
	e.wantChains("after the repair delay", map[uint64]string{3: "v3 2/offline,1/offline"})
	e.tick(0, 1, 2)
	e.wantChains("server 2 back", map[uint64]string{3: "v4 2/serving,1/syncing", 4: "v4 2/serving,1/syncing"})

	// A member that left while syncing never serves first.
	e.down()
	e.wantChains("both down at once", map[uint64]string{3: "v5 2/offline,1/offline"})
	e.tick(0, 1)
	e.wantChains("1 back, it was syncing", map[uint64]string{3: "v5 2/offline,1/offline"})
	e.tick(0, 1, 2)
	if err := e.synced(1, 1, 3, 6); err != nil {
		t.Fatal(err)
	}
	e.wantChains("both serving", map[uint64]string{3: "v7 2/serving,1/serving"})

	// Serving members that left together: whichever is back first serves.
	e.down()
	e.wantChains("both down at once", map[uint64]string{3: "v8 2/offline,1/offline"})
	e.tick(0, 1)
	e.wantChains("1 back first", map[uint64]string{3: "v9 1/serving,2/offline"})
	e.tick(0, 1, 2)
	e.wantChains("2 back", map[uint64]string{3: "v10 1/serving,2/syncing"})
}
