package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// node is a data server of a test cluster: where it is and how many
// targets it has.
type node struct {
	site, rack string
	targets    int
}

// replEnv is an env whose servers are registered from nodes: server i+1
// (uuid s<i+1>, address h:<i+1>) with targets t<i+1>.<j>, 1 TiB each.
type replEnv struct {
	*env
	reports map[uint64][]*weftv1.TargetReport // by server id
}

func newReplEnv(t *testing.T, nodes ...node) *replEnv {
	t.Helper()
	e := &replEnv{env: newEnv(t), reports: make(map[uint64][]*weftv1.TargetReport)}
	e.cfg.RepairDelay = time.Minute
	e.m.cfg.RepairDelay = time.Minute
	for _, n := range nodes {
		e.addNode(n)
	}
	return e
}

// addNode registers the next server.
func (e *replEnv) addNode(n node) uint64 {
	e.t.Helper()
	i := len(e.reports) + 1
	var reps []*weftv1.TargetReport
	for j := range n.targets {
		reps = append(reps, report(fmt.Sprintf("t%d.%d", i, j+1), 500*GiB))
	}
	resp, err := e.m.RegisterServer(context.Background(), &weftv1.RegisterServerRequest{
		Uuid: fmt.Sprintf("s%d", i), Address: fmt.Sprintf("h:%d", i), Hostname: fmt.Sprintf("host%d", i),
		Site: n.site, Rack: n.rack, Targets: reps,
	})
	if err != nil {
		e.t.Fatalf("register server %d: %v", i, err)
	}
	if resp.FailureTimeoutMs != e.cfg.FailureTimeout.Milliseconds() {
		e.t.Errorf("register server %d: failure timeout %d ms, want %v", i, resp.FailureTimeoutMs, e.cfg.FailureTimeout)
	}
	e.reports[resp.ServerId] = reps
	return resp.ServerId
}

// tick moves the clock by d, heartbeats the servers in up and runs the
// liveness check (and repair).
func (e *replEnv) tick(d time.Duration, up ...uint64) {
	e.t.Helper()
	e.clock.advance(d)
	for _, id := range up {
		e.heartbeat(id, fmt.Sprintf("h:%d", id), e.reports[id]...)
	}
	e.m.checkLiveness(context.Background())
}

// down lets the failure timeout pass with only the servers in up
// heartbeating.
func (e *replEnv) down(up ...uint64) { e.tick(e.cfg.FailureTimeout+time.Second, up...) }

// ensure makes chains of r replicas.
func (e *replEnv) ensure(r uint32) {
	e.t.Helper()
	if err := e.m.EnsureChains(context.Background(), r); err != nil {
		e.t.Fatalf("EnsureChains(%d): %v", r, err)
	}
}

// use marks every chain of width r used, as if files had been placed on
// them: they keep their members from then on.
func (e *replEnv) use(r int) {
	e.t.Helper()
	var ids []uint64
	for _, c := range e.chainsOf(r) {
		ids = append(ids, c.ID)
	}
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	if err := e.m.markUsed(context.Background(), ids); err != nil {
		e.t.Fatal(err)
	}
}

// chainsOf returns copies of the chain records of width r in id order.
func (e *replEnv) chainsOf(r int) []*chainRecord {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	var out []*chainRecord
	for _, id := range e.m.chainIDs {
		if c := e.m.chains[id]; c.width() == r {
			out = append(out, c.clone())
		}
	}
	return out
}

// chain renders chain id as "v<version> <target>/<state>,...".
func (e *replEnv) chain(id uint64) string {
	e.t.Helper()
	for _, c := range e.table().Chains {
		if c.Id == id {
			var ms []string
			for _, mem := range c.Members {
				ms = append(ms, fmt.Sprintf("%d/%s", mem.TargetId, mem.State))
			}
			return fmt.Sprintf("v%d %s", c.Version, strings.Join(ms, ","))
		}
	}
	return "missing"
}

// wantChains checks chains by id against their renderings.
func (e *replEnv) wantChains(when string, want map[uint64]string) {
	e.t.Helper()
	for _, id := range slices.Sorted(mapKeys(want)) {
		if got := e.chain(id); got != want[id] {
			e.t.Errorf("%s: chain %d is %q, want %q", when, id, got, want[id])
		}
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestBuildChains(t *testing.T) {
	ones := func(n int) []node {
		out := make([]node, n)
		for i := range out {
			out[i] = node{targets: 1}
		}
		return out
	}
	for _, c := range []struct {
		name       string
		nodes      []node
		r          int
		wantShared bool
		distinct   string // "rack" or "site": members must differ at that level
	}{
		{name: "R=2 on 4 servers", nodes: ones(4), r: 2},
		{name: "R=3 on 5 servers", nodes: ones(5), r: 3},
		{name: "R=2 on 6 servers", nodes: ones(6), r: 2},
		{name: "R=3 on 6 targets of 3 servers", nodes: []node{{targets: 2}, {targets: 2}, {targets: 2}}, r: 3},
		{name: "R=2 on 4 targets of 3 servers", nodes: []node{{targets: 2}, {targets: 1}, {targets: 1}}, r: 2},
		{name: "R=3 on 2 servers: shared", nodes: []node{{targets: 2}, {targets: 2}}, r: 3, wantShared: true},
		{name: "R=2 on 2 racks", r: 2, distinct: "rack", nodes: []node{
			{rack: "r1", targets: 1}, {rack: "r1", targets: 1}, {rack: "r2", targets: 1}, {rack: "r2", targets: 1}}},
		{name: "R=3 on 3 sites", r: 3, distinct: "site", nodes: []node{
			{site: "A", targets: 1}, {site: "A", targets: 1}, {site: "B", targets: 1},
			{site: "B", targets: 1}, {site: "C", targets: 1}, {site: "C", targets: 1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newReplEnv(t, c.nodes...)
			e.ensure(uint32(c.r))
			chains := e.chainsOf(c.r)
			targets := e.m.inService()
			if len(chains) != len(targets) {
				t.Fatalf("%d chains of %d for %d targets", len(chains), c.r, len(targets))
			}
			homes := make(map[uint64]bool)
			in := make(map[uint64]int)
			for _, ch := range chains {
				ids := memberIDs(ch.Members)
				if len(ids) != c.r || len(slices.Compact(slices.Sorted(slices.Values(ids)))) != c.r {
					t.Errorf("chain %d members %v: want %d distinct targets", ch.ID, ids, c.r)
				}
				if ch.Home != ids[0] || homes[ch.Home] || ch.Version != 1 || countState(ch, stateServing) != c.r {
					t.Errorf("chain %d: home %d, members %v, version %d", ch.ID, ch.Home, ch.Members, ch.Version)
				}
				homes[ch.Home] = true
				for _, id := range ids {
					in[id]++
				}
				servers := make(map[uint64]bool)
				places := make(map[string]bool)
				for _, id := range ids {
					d := e.m.domainOf(id)
					servers[d.server] = true
					switch c.distinct {
					case "rack":
						places[d.site+"/"+d.rack] = true
					case "site":
						places[d.site] = true
					}
				}
				shared := len(servers) < c.r
				if shared != c.wantShared || ch.SharedServer != shared {
					t.Errorf("chain %d members %v on servers %v: flagged %v, want %v", ch.ID, ids, servers, ch.SharedServer, c.wantShared)
				}
				if c.distinct != "" && len(places) != c.r {
					t.Errorf("chain %d members %v: only %d distinct %ss", ch.ID, ids, len(places), c.distinct)
				}
			}
			lo, hi := len(chains), 0
			for _, id := range targets {
				lo, hi = min(lo, in[id]), max(hi, in[id])
			}
			if lo != c.r || hi != c.r {
				t.Errorf("targets are in %d to %d chains, want %d each: %v", lo, hi, c.r, in)
			}
			h := e.m.Health()
			warned := slices.ContainsFunc(h.Warnings, func(w string) bool { return strings.Contains(w, "two copies on one data server") })
			if warned != c.wantShared {
				t.Errorf("shared-server warning %v, want %v: %q", warned, c.wantShared, h.Warnings)
			}
			// Building again changes nothing.
			before := e.table().Version
			e.ensure(uint32(c.r))
			if v := e.table().Version; v != before {
				t.Errorf("EnsureChains again moved the table from version %d to %d", before, v)
			}
		})
	}
}

// Chains of a width asked for before enough targets exist are made when
// they register; a target joining later gets a chain of its own and the
// unused chains are rebuilt around it; and all of it survives a restart.
func TestChainsForLateTargets(t *testing.T) {
	e := newReplEnv(t, node{targets: 1}, node{targets: 1})
	e.ensure(3)
	if n := len(e.chainsOf(3)); n != 0 {
		t.Fatalf("%d chains of 3 on 2 targets", n)
	}
	if _, err := e.m.PickChains(context.Background(), 1, 3); err == nil || !strings.Contains(err.Error(), "only 2 data targets are in service") {
		t.Errorf("PickChains(3) on 2 targets: %v", err)
	}
	if h := e.m.Health(); len(h.Summaries) != 2 || h.Summaries[1].Replicas != 3 || !strings.Contains(strings.Join(h.Warnings, "\n"), "3 replicas are asked for but only 2 targets") {
		t.Errorf("health with too few targets: %v %q", h.Summaries, h.Warnings)
	}
	e.restart()
	e.addNode(node{targets: 1})
	if n := len(e.chainsOf(3)); n != 3 {
		t.Fatalf("%d chains of 3 after the third target registered, want 3", n)
	}
	e.addNode(node{targets: 1})
	chains := e.chainsOf(3)
	if len(chains) != 4 {
		t.Fatalf("%d chains of 3 after the fourth target registered, want 4", len(chains))
	}
	if last := chains[3]; last.Home != 4 || last.Members[0].TargetID != 4 || last.SharedServer {
		t.Errorf("chain of the new target: %+v", last)
	}
	// No file uses them yet: the first three were rebuilt (same ids) so
	// that every target is in three chains, not targets 1-3 in four.
	if got := fmt.Sprint(chainIDsOf(chains)); got != "[4 5 6 8]" {
		t.Errorf("chains of 3 are %s, want [4 5 6 8]", got)
	}
	checkSpread(t, e, 3)
	before := e.table()
	e.restart()
	if after := e.table(); summary(after) != summary(before) {
		t.Errorf("table changed across restart:\n%s\n%s", summary(before), summary(after))
	}
	ids, err := e.m.PickChains(context.Background(), 2, 3)
	if err != nil || len(ids) != 2 {
		t.Fatalf("PickChains(2, 3) = %v, %v", ids, err)
	}
	for _, id := range ids {
		if !slices.ContainsFunc(chains, func(c *chainRecord) bool { return c.ID == id }) {
			t.Errorf("PickChains with 3 replicas picked chain %d, not one of 3 replicas", id)
		}
	}
}
