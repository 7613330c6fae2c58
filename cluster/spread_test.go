package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/weft-fs/weft/meta/kv"
)

// chainIDsOf returns the ids of chains.
func chainIDsOf(chains []*chainRecord) []uint64 {
	ids := make([]uint64, len(chains))
	for i, c := range chains {
		ids[i] = c.ID
	}
	return ids
}

// layoutOf renders the chains of width r by home: "home:[sorted members]".
func layoutOf(e *replEnv, r int) string {
	var out []string
	for _, c := range e.chainsOf(r) {
		out = append(out, fmt.Sprintf("%d:%v", c.Home, slices.Sorted(slices.Values(memberIDs(c.Members)))))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// checkSpread checks that every target in service heads one chain of
// width r and is a member of exactly r, that members are distinct and on
// distinct servers (there are enough here).
func checkSpread(t *testing.T, e *replEnv, r int) {
	t.Helper()
	chains := e.chainsOf(r)
	targets := e.m.inService()
	if len(chains) != len(targets) {
		t.Errorf("%d chains of %d for %d targets: %s", len(chains), r, len(targets), layoutOf(e, r))
	}
	in := make(map[uint64]int)
	homes := make(map[uint64]bool)
	for _, c := range chains {
		ids := memberIDs(c.Members)
		servers := make(map[uint64]bool)
		for _, id := range ids {
			in[id]++
			servers[e.m.domainOf(id).server] = true
		}
		if len(ids) != r || len(servers) != r || c.SharedServer {
			t.Errorf("chain %d: members %v on %d servers (shared %v), want %d on distinct servers", c.ID, ids, len(servers), c.SharedServer, r)
		}
		if homes[c.Home] || !slices.Contains(ids, c.Home) {
			t.Errorf("chain %d: home %d (members %v) heads another chain or is no member", c.ID, c.Home, ids)
		}
		homes[c.Home] = true
	}
	for _, id := range targets {
		if in[id] != r {
			t.Errorf("target %d is in %d chains of %d, want %d: %s", id, in[id], r, r, layoutOf(e, r))
		}
	}
}

// Servers registering one after another, the width asked for before any
// of them (as `weft up --replicas R` does), end with every target in
// exactly R chains, on distinct failure domains, the same layout as when
// all were there from the start; chain ids, once made, stay.
func TestSpreadWhenRegisteringOneByOne(t *testing.T) {
	ones := func(n int) []node {
		out := make([]node, n)
		for i := range out {
			out[i] = node{targets: 1}
		}
		return out
	}
	for _, c := range []struct {
		name  string
		nodes []node
		r     int
		racks bool // members must span both racks
	}{
		{name: "R=2 on 3 servers", nodes: ones(3), r: 2},
		{name: "R=3 on 4 servers", nodes: ones(4), r: 3},
		{name: "R=3 on 6 servers of 2 racks", r: 3, racks: true, nodes: []node{
			{rack: "r1", targets: 1}, {rack: "r2", targets: 1}, {rack: "r1", targets: 1},
			{rack: "r2", targets: 1}, {rack: "r1", targets: 1}, {rack: "r2", targets: 1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newReplEnv(t)
			e.ensure(uint32(c.r))
			var ids []uint64
			for i, n := range c.nodes {
				e.addNode(n)
				e.tick(e.cfg.HeartbeatInterval, e.m.inService()...) // server ids = target ids here
				chains := e.chainsOf(c.r)
				if i+1 < c.r {
					if len(chains) != 0 {
						t.Fatalf("%d chains of %d on %d targets", len(chains), c.r, i+1)
					}
					continue
				}
				now := chainIDsOf(chains)
				for _, id := range ids {
					if !slices.Contains(now, id) {
						t.Errorf("after server %d: chain %d is gone (chains %v)", i+1, id, now)
					}
				}
				ids = now
				checkSpread(t, e, c.r)
			}
			for _, ch := range e.chainsOf(c.r) {
				racks := make(map[string]bool)
				for _, mem := range ch.Members {
					racks[e.m.domainOf(mem.TargetID).rack] = true
				}
				if c.racks && len(racks) != 2 {
					t.Errorf("chain %d members %v all on one rack", ch.ID, memberIDs(ch.Members))
				}
			}
			all := newReplEnv(t, c.nodes...)
			all.ensure(uint32(c.r))
			if got, want := layoutOf(e, c.r), layoutOf(all, c.r); got != want {
				t.Errorf("registered one by one: %s\nall at once:            %s", got, want)
			}
			// Nothing changes any more: no table churn on ticks, restarts
			// or EnsureChains.
			before := summary(e.table())
			e.restart()
			e.tick(e.cfg.HeartbeatInterval, e.m.inService()...)
			e.ensure(uint32(c.r))
			if after := summary(e.table()); after != before {
				t.Errorf("table changed with nothing to change:\n%s\n%s", before, after)
			}
		})
	}
}

// A chain PickChains returned for a file keeps its members, whatever
// joins or leaves later, also across restarts; the unused ones are
// rebuilt around it, and an unused chain whose home leaves is dropped.
func TestUsedChainNeverRebuilt(t *testing.T) {
	ctx := context.Background()
	e := newReplEnv(t, node{targets: 1}, node{targets: 1})
	e.ensure(2) // chain 3 = [1 2], 4 = [2 1]
	v := e.table().Version
	ids, err := e.m.PickChains(ctx, 1, 2)
	if err != nil || len(ids) != 1 {
		t.Fatalf("PickChains(1, 2) = %v, %v", ids, err)
	}
	used := ids[0]
	if got := e.table().Version; got != v {
		t.Errorf("marking chain %d used moved the table from version %d to %d", used, v, got)
	}
	if _, err := e.m.PickChains(ctx, 2, 2); err != nil { // both used now
		t.Fatal(err)
	}
	want := e.chain(used)
	other := 7 - used // the other one of 3 and 4, also used now
	wantOther := e.chain(other)
	e.restart()
	for range 3 {
		e.addNode(node{targets: 1})
		e.tick(e.cfg.HeartbeatInterval, e.m.inService()...)
	}
	if n, err := e.m.RemoveTarget(ctx, 5); err != nil || n == 0 {
		t.Fatalf("RemoveTarget(5) = %d, %v", n, err)
	}
	e.restart()
	e.tick(e.cfg.HeartbeatInterval, 1, 2, 3, 4, 5)
	if got := e.chain(used); got != want {
		t.Errorf("used chain %d is %q, want %q unchanged", used, got, want)
	}
	if got := e.chain(other); got != wantOther {
		t.Errorf("used chain %d is %q, want %q unchanged", other, got, wantOther)
	}
	// Targets 1-4 are in service; 1 and 2 head the used chains, 3 and 4
	// unused ones, built around them; target 5's unused chain is gone.
	chains := e.chainsOf(2)
	if len(chains) != 4 {
		t.Fatalf("%d chains of 2, want 4: %s", len(chains), layoutOf(e, 2))
	}
	in := make(map[uint64]int)
	for _, c := range chains {
		if c.Home == 5 || slices.Contains(memberIDs(c.Members), 5) {
			t.Errorf("removed target 5 in chain %d: %+v", c.ID, c)
		}
		if c.Used != (c.ID == used || c.ID == other) {
			t.Errorf("chain %d used %v", c.ID, c.Used)
		}
		for _, mem := range c.Members {
			in[mem.TargetID]++
		}
	}
	for id := uint64(1); id <= 4; id++ {
		if in[id] != 2 {
			t.Errorf("target %d in %d chains of 2, want 2: %s", id, in[id], layoutOf(e, 2))
		}
	}
}

// Replicated chains saved before chains recorded their use may hold
// files: they are marked used when the manager first opens the state.
func TestLegacyChainsMarkedUsed(t *testing.T) {
	e := newReplEnv(t, node{targets: 1}, node{targets: 1})
	e.ensure(2)
	chains := e.chainsOf(2)
	err := e.eng.Update(context.Background(), func(t kv.Txn) error {
		if err := t.Delete([]byte(keyUsedMarks)); err != nil {
			return err
		}
		for _, c := range chains {
			if err := putJSON(t, idKey(prefixChain, c.ID), c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.restart()
	before := layoutOf(e, 2)
	for _, c := range e.chainsOf(2) {
		if !c.Used {
			t.Errorf("chain %d of an earlier release not marked used", c.ID)
		}
	}
	e.addNode(node{targets: 1})
	if after := layoutOf(e, 2); !strings.HasPrefix(after, before) {
		t.Errorf("chains of an earlier release changed: %s, then %s", before, after)
	}
}
