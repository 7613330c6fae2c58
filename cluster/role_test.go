package cluster

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// follower opens a second Manager over e's engine, following.
func (e *replEnv) follower() *Manager {
	e.t.Helper()
	cfg := e.cfg
	cfg.Follower = true
	f, err := NewManager(context.Background(), e.eng, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	f.now = e.clock.now
	e.t.Cleanup(func() { f.Close() })
	return f
}

func storedChain(t *testing.T, eng kv.Engine, id uint64) *chainRecord {
	t.Helper()
	var c *chainRecord
	err := eng.View(context.Background(), func(tx kv.Txn) error {
		var err error
		c, _, err = getChain(tx, id)
		return err
	})
	if err != nil || c == nil {
		t.Fatalf("read chain %d: %v", id, err)
	}
	return c
}

// TestFollowerPlacementMarkSurvivesManager: a follower places a file on an
// unused replicated chain (marking it used in the store); the manager,
// which still believes it unused, must not rebuild it when targets join,
// and keeps the mark when it rewrites the chain.
func TestFollowerPlacementMarkSurvivesManager(t *testing.T) {
	e := newReplEnv(t, node{targets: 1}, node{targets: 1}, node{targets: 1})
	e.ensure(2)
	f := e.follower()
	if f.Leading() {
		t.Fatal("a Manager made with Follower leads")
	}
	ids, err := f.PickChains(context.Background(), 1, 2)
	if err != nil || len(ids) != 1 {
		t.Fatalf("follower PickChains: %v %v", ids, err)
	}
	picked := storedChain(t, e.eng, ids[0])
	if !picked.Used {
		t.Fatalf("chain %d not marked used in the store after the follower placed a file on it", ids[0])
	}
	// The manager did not see the mark: targets joining make it plan the
	// unused chains again. The first attempt may fail on the mark; the
	// next keeps the chain.
	for i := 4; i <= 6; i++ {
		e.addNode(node{targets: 1})
		e.tick(time.Second, 1, 2, 3)
		e.tick(time.Second, 1, 2, 3)
	}
	after := storedChain(t, e.eng, ids[0])
	if !after.Used || !slices.Equal(sortedIDs(after.Members), sortedIDs(picked.Members)) {
		t.Errorf("chain %d after targets joined: members %v used %v; want members %v kept and used",
			ids[0], memberIDs(after.Members), after.Used, memberIDs(picked.Members))
	}
	// A rebuild of the chain by the manager (members replaced) is refused
	// and teaches the manager the mark; a change of states keeps it.
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	if e.m.chains[ids[0]].Used {
		t.Skip("the manager learned the mark already")
	}
	rebuilt := e.m.chains[ids[0]].clone()
	rebuilt.Version++
	rebuilt.Members = rebuilt.Members[:1]
	st := e.m.newStage()
	st.chains = append(st.chains, rebuilt)
	if err := e.m.commit(context.Background(), st); !errors.Is(err, errUsedElsewhere) {
		t.Errorf("rebuild of a chain a follower marked used: %v, want errUsedElsewhere", err)
	}
	if !e.m.chains[ids[0]].Used {
		t.Errorf("the manager did not learn the follower's mark on chain %d", ids[0])
	}
}

// TestFollowerRoles: a follower refuses the manager's calls, sees the
// manager's chain changes after Refresh, and after Lead serves them with
// a failure timeout of grace for every server; Follow stops it again.
func TestFollowerRoles(t *testing.T) {
	e := newReplEnv(t, node{targets: 1}, node{targets: 1})
	f := e.follower()
	ctx := context.Background()
	if _, err := f.Heartbeat(ctx, &weftv1.HeartbeatRequest{ServerId: 1}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("follower Heartbeat: %v, want ErrNotLeader", err)
	}
	if _, err := f.RemoveTarget(ctx, 1); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("follower RemoveTarget: %v, want ErrNotLeader", err)
	}
	e.addNode(node{targets: 1})
	if err := f.Refresh(ctx, false); err != nil {
		t.Fatal(err)
	}
	if got, want := f.NumChains(), e.m.NumChains(); got != want {
		t.Errorf("follower has %d chains after Refresh, manager %d", got, want)
	}
	hb, err := f.FollowerHeartbeat(ctx, &weftv1.HeartbeatRequest{ServerId: 3})
	if err != nil || hb.GetChains().GetVersion() != e.table().GetVersion() {
		t.Errorf("FollowerHeartbeat: %v, table %v, want version %d", err, hb.GetChains(), e.table().GetVersion())
	}

	// The old manager steps down, the follower takes over.
	e.m.Follow(e.eng)
	if err := f.Lead(ctx, e.eng); err != nil {
		t.Fatal(err)
	}
	e.clock.advance(e.cfg.FailureTimeout / 2)
	f.checkLiveness(ctx)
	for _, s := range f.Servers() {
		if !s.Online {
			t.Errorf("server %d offline right after the takeover; want a failure timeout of grace", s.Id)
		}
	}
	if _, err := f.Heartbeat(ctx, &weftv1.HeartbeatRequest{ServerId: 1, Targets: e.reports[1]}); err != nil {
		t.Errorf("new manager Heartbeat: %v", err)
	}
	if _, err := e.m.Heartbeat(ctx, &weftv1.HeartbeatRequest{ServerId: 1}); !errors.Is(err, ErrNotLeader) {
		t.Errorf("old manager Heartbeat after Follow: %v, want ErrNotLeader", err)
	}
	e.clock.advance(e.cfg.FailureTimeout)
	f.checkLiveness(ctx)
	online := 0
	for _, s := range f.Servers() {
		if s.Online {
			online++
		}
	}
	if online != 1 {
		t.Errorf("%d servers online after the grace with one heartbeating, want 1", online)
	}
}
