package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// inChains returns the ids of the chains of width r target tid is in.
func (e *replEnv) inChains(r int, tid uint64) []uint64 {
	var ids []uint64
	for _, c := range e.chainsOf(r) {
		for _, mem := range c.Members {
			if mem.TargetID == tid {
				ids = append(ids, c.ID)
			}
		}
	}
	return ids
}

func TestRepairAfterDelay(t *testing.T) {
	e := threeByTwo(t)
	e.down(1, 2)
	e.wantChains("server 3 down", map[uint64]string{5: "v2 2/serving,3/offline", 6: "v2 1/serving,3/offline"})
	e.tick(30*time.Second, 1, 2)
	e.wantChains("before the repair delay", map[uint64]string{5: "v2 2/serving,3/offline", 6: "v2 1/serving,3/offline"})
	e.restart() // the time it left is kept
	e.tick(31*time.Second, 1, 2)
	e.wantChains("past the repair delay", map[uint64]string{
		4: "v1 1/serving,2/serving", 5: "v3 2/serving,1/syncing", 6: "v3 1/serving,2/syncing"})
	if ids := e.inChains(2, 3); len(ids) != 0 {
		t.Errorf("target 3 is still in chains %v", ids)
	}
	h := e.m.Health()
	if s := h.Summaries[1]; s.Total != 3 || s.Healthy != 1 || s.Syncing != 2 || s.Degraded != 0 {
		t.Errorf("summary after repair: %v", s)
	}
	// Server 3 returns: its replicated chains are gone; it serves its own
	// chain of one replica again.
	e.tick(0, 1, 2, 3)
	e.wantChains("server 3 back", map[uint64]string{3: "v3 3/serving", 5: "v3 2/serving,1/syncing", 6: "v3 1/serving,2/syncing"})
	before := e.table()
	e.restart()
	if after := e.table(); summary(after) != summary(before) {
		t.Errorf("table changed across restart:\n%s\n%s", summary(before), summary(after))
	}
}

func TestRemoveTarget(t *testing.T) {
	ctx := context.Background()
	e := newReplEnv(t, node{targets: 1}, node{targets: 1}, node{targets: 1}, node{targets: 1})
	e.ensure(2)
	e.use(2)
	in4 := e.inChains(2, 4)
	n, err := e.m.RemoveTarget(ctx, 4)
	if err != nil || int(n) != len(in4) || n == 0 {
		t.Fatalf("RemoveTarget(4) = %d, %v; want %d chains changed", n, err, len(in4))
	}
	for _, c := range e.chainsOf(2) {
		if len(c.Members) != 2 || c.SharedServer || countState(c, stateServing) == 0 {
			t.Errorf("chain %d after the removal: %+v", c.ID, c)
		}
		for _, mem := range c.Members {
			if mem.TargetID == 4 {
				t.Errorf("target 4 still in chain %d", c.ID)
			}
			if mem.State == stateSyncing && !containsID(in4, c.ID) {
				t.Errorf("chain %d without target 4 changed: %+v", c.ID, c)
			}
		}
	}
	if n, err := e.m.RemoveTarget(ctx, 4); err != nil || n != 0 {
		t.Errorf("RemoveTarget(4) again = %d, %v; want 0, nil", n, err)
	}
	if _, err := e.m.RemoveTarget(ctx, 42); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("RemoveTarget(42) = %v, want ENOENT", err)
	}
	// Its server registers again and a new width is asked for: it stays
	// removed and gets no chains.
	e.restart()
	e.register("s4", "h:4", e.reports[4]...)
	e.ensure(3)
	if ids := append(e.inChains(2, 4), e.inChains(3, 4)...); len(ids) != 0 {
		t.Errorf("removed target 4 is in chains %v", ids)
	}
	if n := len(e.chainsOf(3)); n != 3 {
		t.Errorf("%d chains of 3 replicas on 3 targets in service", n)
	}
}

// Without a target to replace a removed one, the chain goes on with fewer
// members, Status says so, and the place is filled when a target joins.
func TestRemoveTargetWithoutReplacement(t *testing.T) {
	ctx := context.Background()
	e := newReplEnv(t, node{targets: 1}, node{targets: 1})
	e.ensure(2) // chain 3 = [1 2], chain 4 = [2 1]
	e.use(2)
	// Target 2 is the only up-to-date copy of chain 4 while 1 syncs:
	// removing 2 keeps it there until 1 has synced.
	e.down(2)
	e.tick(0, 1, 2)
	e.wantChains("1 syncing", map[uint64]string{3: "v3 2/serving,1/syncing", 4: "v3 2/serving,1/syncing"})
	if n, err := e.m.RemoveTarget(ctx, 2); err != nil || n != 0 {
		t.Fatalf("RemoveTarget(2) = %d, %v; want 0 chains changed", n, err)
	}
	if w := strings.Join(e.m.Health().Warnings, "\n"); !strings.Contains(w, "target 2 is removed but still holds the only up-to-date copy of chain 3") {
		t.Errorf("warnings: %s", w)
	}
	for _, c := range []uint64{3, 4} {
		if err := e.synced(1, 1, c, 3); err != nil {
			t.Fatal(err)
		}
	}
	e.tick(e.cfg.HeartbeatInterval, 1, 2)
	e.wantChains("2 dropped", map[uint64]string{3: "v5 1/serving", 4: "v5 1/serving"})
	h := e.m.Health()
	if s := h.Summaries[1]; s.Degraded != 2 {
		t.Errorf("summary: %v", s)
	}
	if w := strings.Join(h.Warnings, "\n"); !strings.Contains(w, "2 chains are degraded and no target can replace their lost members (chains 3, 4)") {
		t.Errorf("warnings: %s", w)
	}
	if ids, err := e.m.PickChains(ctx, 1, 2); err != nil || len(ids) != 1 {
		t.Errorf("PickChains on degraded chains: %v, %v", ids, err)
	}
	e.addNode(node{targets: 1}) // target 3, chain 5 (one replica), chain 6 = [3 1]
	e.tick(e.cfg.HeartbeatInterval, 1, 2, 3)
	e.wantChains("place filled", map[uint64]string{3: "v6 1/serving,3/syncing", 4: "v6 1/serving,3/syncing", 6: "v1 3/serving,1/serving"})
}

func containsID(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

func TestHealth(t *testing.T) {
	e := threeByTwo(t)
	withSync := func(done, left uint64) []*weftv1.TargetReport {
		r := report("t2.1", 500*GiB)
		r.Syncs = []*weftv1.SyncProgress{{ChainId: 4, BytesDone: done, BytesLeft: left}}
		return []*weftv1.TargetReport{r}
	}
	e.down(1, 3)
	e.tick(0, 1, 3)
	h := e.m.Health()
	want := []string{"replicas:1 total:3 healthy:2 unavailable:1", "replicas:2 total:3 healthy:1 degraded:2"}
	for i, s := range h.Summaries {
		if i >= len(want) || strings.Join(strings.Fields(s.String()), " ") != want[i] {
			t.Errorf("summary %d: %v, want %s", i, s, want[i])
		}
	}
	if len(h.Chains) != 6 || h.SyncBytesLeft != 0 || h.SyncETA != 0 {
		t.Errorf("health: %d chains, %d bytes left, eta %v", len(h.Chains), h.SyncBytesLeft, h.SyncETA)
	}
	if w := strings.Join(h.Warnings, "\n"); !strings.Contains(w, "chain 2 (1 replica) is unavailable: target 2 on data server 2 is offline") {
		t.Errorf("warnings: %s", w)
	}

	e.heartbeat(2, "h:2", withSync(0, 1000)...)
	if h := e.m.Health(); h.SyncBytesLeft != 1000 || h.SyncETA != -1 || h.Summaries[1].Syncing != 2 {
		t.Errorf("sync started: %d bytes left, eta %v, %v", h.SyncBytesLeft, h.SyncETA, h.Summaries[1])
	}
	e.clock.advance(10 * time.Second)
	e.heartbeat(2, "h:2", withSync(500, 500)...)
	if h := e.m.Health(); h.SyncBytesLeft != 500 || h.SyncETA != 10*time.Second {
		t.Errorf("sync at 50 B/s: %d bytes left, eta %v", h.SyncBytesLeft, h.SyncETA)
	}
	r := report("t2.1", 500*GiB)
	r.ScrubbedBytes, r.ScrubErrors, r.ScrubRepaired = 1<<30, 2, 1
	e.heartbeat(2, "h:2", r)
	h = e.m.Health()
	if h.SyncBytesLeft != 0 || h.SyncETA != 0 {
		t.Errorf("sync done: %d bytes left, eta %v", h.SyncBytesLeft, h.SyncETA)
	}
	if w := strings.Join(h.Warnings, "\n"); !strings.Contains(w, "target 2 on data server 2: scrub found 2 bad chunk copies and repaired 1 of them") {
		t.Errorf("warnings: %s", w)
	}
}

func TestPickReplicatedChains(t *testing.T) {
	e := threeByTwo(t)
	e.down(1, 2) // chains 5 and 6 degraded
	var got []string
	for range 3 {
		ids, err := e.m.PickChains(context.Background(), 1, 2)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprint(ids))
	}
	if s := strings.Join(got, " "); s != "[4] [4] [4]" {
		t.Errorf("one chain while one is healthy: %s, want [4] [4] [4]", s)
	}
	ids, err := e.m.PickChains(context.Background(), 3, 2)
	if err != nil || len(ids) != 3 {
		t.Errorf("three chains with one healthy: %v, %v", ids, err)
	}
	if _, err := e.m.PickChains(context.Background(), 1, 9); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("PickChains with 9 replicas: %v, want EINVAL", err)
	}
}
