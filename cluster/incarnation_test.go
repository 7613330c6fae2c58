package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// registerAs registers server id of e again as incarnation inc at addr.
func (e *replEnv) registerAs(id uint64, inc, addr string) *weftv1.RegisterServerResponse {
	e.t.Helper()
	resp, err := e.m.RegisterServer(context.Background(), &weftv1.RegisterServerRequest{
		Uuid: fmt.Sprintf("s%d", id), Address: addr, WireAddress: addr + "|unix=/x|id=" + inc, Incarnation: inc,
		Hostname: fmt.Sprintf("host%d", id), Targets: e.reports[id],
	})
	if err != nil {
		e.t.Fatalf("register server %d as %s: %v", id, inc, err)
	}
	return resp
}

// membersOf renders the members of chain id in tab as
// "v<version> <target>/<address>/<incarnation>/<state>,...".
func membersOf(tab *weftv1.ChainTable, id uint64) string {
	for _, c := range tab.Chains {
		if c.Id == id {
			var ms []string
			for _, m := range c.Members {
				ms = append(ms, fmt.Sprintf("%d/%s/%s/%s", m.TargetId, m.Address, m.Incarnation, m.State))
			}
			return fmt.Sprintf("v%d %s", c.Version, strings.Join(ms, ","))
		}
	}
	return "missing"
}

// TestRestartIsNewIncarnation: a data server that registers with another
// incarnation (restarted, here at another address, before the failure
// timeout) is taken out of its chains and let back in at once, with new
// chain versions: its members sync what they may have missed (or serve,
// as the last to hold every write), and every member entry carries the
// new incarnation's addresses. A heartbeat of another incarnation than
// the registered one registers first.
func TestRestartIsNewIncarnation(t *testing.T) {
	e := newReplEnv(t, node{targets: 1}, node{targets: 1}, node{targets: 1})
	for id := uint64(1); id <= 3; id++ {
		e.registerAs(id, fmt.Sprintf("i%d.a", id), fmt.Sprintf("h:%d", id))
	}
	e.ensure(2)
	e.use(2)
	chains := e.chainsOf(2)
	if len(chains) != 3 {
		t.Fatalf("%d chains of 2 replicas, want 3", len(chains))
	}
	// Chain 4 (home target 1) is [1, x]; the chain headed elsewhere that
	// has target 1 as a member too.
	var first, second *chainRecord
	for _, c := range chains {
		switch {
		case c.Members[0].TargetID == 1:
			first = c
		case c.Members[1].TargetID == 1:
			second = c
		}
	}
	if first == nil || second == nil {
		t.Fatalf("no chains with target 1 as head and as second member: %v", chains)
	}

	// Server 1 restarts on another port, as incarnation i1.b.
	resp := e.registerAs(1, "i1.b", "h:11")
	for _, c := range []*chainRecord{first, second} {
		got := membersOf(resp.Chains, c.ID)
		other := c.Members[0].TargetID
		if other == 1 {
			other = c.Members[1].TargetID
		}
		want := fmt.Sprintf("v%d %d/h:%d/i%d.a/serving,1/h:11/i1.b/syncing", c.Version+2, other, other, other)
		if got != want {
			t.Errorf("chain %d after the restart of server 1:\n got %s\nwant %s", c.ID, got, want)
		}
	}
	// The same incarnation registering again (the meta service asked it
	// to) changes nothing.
	before := e.table()
	e.registerAs(1, "i1.b", "h:11")
	if after := e.table(); after.Version != before.Version {
		t.Errorf("a registration of the same incarnation moved the chain table from version %d to %d", before.Version, after.Version)
	}

	// A heartbeat of the old incarnation, or at the old address, is
	// asked to register.
	for _, hb := range []*weftv1.HeartbeatRequest{
		{ServerId: 1, Address: "h:1", WireAddress: "h:1|unix=/x|id=i1.a", Incarnation: "i1.a", Targets: e.reports[1]},
		{ServerId: 1, Address: "h:1", WireAddress: "h:11|unix=/x|id=i1.b", Incarnation: "i1.b", Targets: e.reports[1]},
	} {
		resp, err := e.m.Heartbeat(context.Background(), hb)
		if err != nil || !resp.UnknownServer {
			t.Errorf("heartbeat %v: %v, unknown_server %v; want unknown_server", hb, err, resp.GetUnknownServer())
		}
	}
	ok, err := e.m.Heartbeat(context.Background(), &weftv1.HeartbeatRequest{ServerId: 1, Address: "h:11",
		WireAddress: "h:11|unix=/x|id=i1.b", Incarnation: "i1.b", Targets: e.reports[1]})
	if err != nil || ok.UnknownServer {
		t.Errorf("heartbeat of the registered incarnation: %v, unknown_server %v", err, ok.GetUnknownServer())
	}

	// Every member of a chain restarted at once (a whole cluster): the
	// last to register serves again as the last to hold every write, the
	// others sync from it.
	for id := uint64(1); id <= 3; id++ {
		e.registerAs(id, fmt.Sprintf("i%d.c", id), fmt.Sprintf("h:%d", 20+id))
	}
	for _, c := range e.chainsOf(2) {
		serving, syncing := countState(c, stateServing), countState(c, stateSyncing)
		if serving != 1 || syncing != 1 {
			t.Errorf("chain %d after a restart of every server: %d serving, %d syncing; want 1 and 1: %v", c.ID, serving, syncing, c.Members)
		}
	}
	for _, c := range e.table().Chains {
		for _, m := range c.Members {
			if want := fmt.Sprintf("h:%d", 20+m.ServerId); m.Address != want || m.Incarnation != fmt.Sprintf("i%d.c", m.ServerId) {
				t.Errorf("chain %d member %d: address %s incarnation %s, want %s i%d.c", c.Id, m.TargetId, m.Address, m.Incarnation, want, m.ServerId)
			}
		}
	}
}

// TestForwardFailuresInHealth: a member that reports in its heartbeat
// that it cannot pass writes on to the next member makes Health warn
// (status HEALTH_WARN) while its chain is at the reported version; the
// warning goes with the next heartbeat without the report, and a report
// of an older chain version is not shown.
func TestForwardFailuresInHealth(t *testing.T) {
	e := newReplEnv(t, node{targets: 1}, node{targets: 1})
	e.ensure(2)
	e.use(2)
	c := e.chainsOf(2)[0]
	head, next := c.Members[0].TargetID, c.Members[1].TargetID
	server := func(tid uint64) uint64 { return e.m.targets[tid].rec.ServerID }
	hb := func(failures ...*weftv1.ForwardFailure) {
		t.Helper()
		sid := server(head)
		resp, err := e.m.Heartbeat(context.Background(), &weftv1.HeartbeatRequest{ServerId: sid,
			Address: fmt.Sprintf("h:%d", sid), Targets: e.reports[sid], ForwardFailures: failures})
		if err != nil || resp.UnknownServer {
			t.Fatalf("heartbeat: %v %v", err, resp)
		}
	}
	failure := func(version uint64) *weftv1.ForwardFailure {
		return &weftv1.ForwardFailure{ChainId: c.ID, ChainVersion: version, TargetId: head, NextTargetId: next,
			NextServerId: server(next), NextAddress: "h:9", Error: "connection refused", FailingMs: 3000}
	}
	warns := func() string { return strings.Join(e.m.Health().Warnings, "\n") }

	if w := warns(); w != "" {
		t.Fatalf("warnings before any failure: %s", w)
	}
	hb(failure(c.Version))
	want := fmt.Sprintf("chain %d: target %d on data server %d cannot pass writes on to target %d on data server %d at h:9 (failing for 3s: connection refused)",
		c.ID, head, server(head), next, server(next))
	if w := warns(); !strings.Contains(w, want) {
		t.Errorf("warnings with a forward failure:\n%s\nwant one with %q", w, want)
	}
	hb(failure(c.Version - 1))
	if w := warns(); w != "" {
		t.Errorf("warnings with a failure of an older chain version: %s", w)
	}
	hb(failure(c.Version))
	hb()
	if w := warns(); w != "" {
		t.Errorf("warnings after a heartbeat without failures: %s", w)
	}
}
