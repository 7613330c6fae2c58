package cluster

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/pebblekv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

const (
	GiB = uint64(1) << 30
	TiB = uint64(1) << 40
)

// fakeClock is the manager's clock in tests; it moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// logBuffer collects log output; safe for the Run goroutine.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// env is a manager over a real pebble engine with a fake clock.
type env struct {
	t     *testing.T
	dir   string
	eng   kv.Engine
	m     *Manager
	clock *fakeClock
	logs  *logBuffer
	cfg   Config
}

func newEnv(t *testing.T) *env {
	return newEnvTimeouts(t, time.Second, 5*time.Second)
}

// newEnvTimeouts is newEnv with the given heartbeat interval and failure
// timeout.
func newEnvTimeouts(t *testing.T, heartbeat, failure time.Duration) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir(), clock: &fakeClock{t: time.Now()}, logs: &logBuffer{}}
	e.cfg = Config{
		HeartbeatInterval: heartbeat,
		FailureTimeout:    failure,
		Logger:            slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	e.openEngine()
	e.open()
	return e
}

func (e *env) openEngine() {
	e.t.Helper()
	eng, err := pebblekv.Open(e.dir)
	if err != nil {
		e.t.Fatal(err)
	}
	e.eng = eng
	e.t.Cleanup(func() { eng.Close() })
}

// open starts a manager over e.eng; servers it loads count their last
// heartbeat from the fake clock's now.
func (e *env) open() {
	e.t.Helper()
	m, err := NewManager(context.Background(), e.eng, e.cfg)
	if err != nil {
		e.t.Fatalf("NewManager: %v", err)
	}
	m.now = e.clock.now
	for _, s := range m.servers {
		s.lastHeartbeat = e.clock.now()
	}
	e.m = m
	e.t.Cleanup(func() { m.Close() })
}

// restart closes the manager and the engine and opens both again.
func (e *env) restart() {
	e.t.Helper()
	if err := e.m.Close(); err != nil {
		e.t.Fatal(err)
	}
	if err := e.eng.Close(); err != nil {
		e.t.Fatal(err)
	}
	e.openEngine()
	e.open()
}

func report(uuid string, free uint64) *weftv1.TargetReport {
	return &weftv1.TargetReport{Uuid: uuid, Path: "/srv/" + uuid, TotalBytes: TiB, FreeBytes: free, UsedBytes: TiB - free}
}

func (e *env) register(uuid, addr string, targets ...*weftv1.TargetReport) *weftv1.RegisterServerResponse {
	e.t.Helper()
	resp, err := e.m.RegisterServer(context.Background(), &weftv1.RegisterServerRequest{
		Uuid: uuid, Address: addr, Hostname: "host-" + uuid, Targets: targets,
	})
	if err != nil {
		e.t.Fatalf("RegisterServer %s: %v", uuid, err)
	}
	return resp
}

func (e *env) heartbeat(id uint64, addr string, targets ...*weftv1.TargetReport) *weftv1.HeartbeatResponse {
	e.t.Helper()
	resp, err := e.m.Heartbeat(context.Background(), &weftv1.HeartbeatRequest{ServerId: id, Address: addr, Targets: targets})
	if err != nil {
		e.t.Fatalf("Heartbeat %d: %v", id, err)
	}
	return resp
}

func (e *env) table() *weftv1.ChainTable {
	e.t.Helper()
	tab, err := e.m.GetChains(context.Background(), &weftv1.GetChainsRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	return tab
}

// summary renders a chain table as "v<version> <chain>@<version>:<target>/<server>/<address>/<state> ...".
func summary(tab *weftv1.ChainTable) string {
	s := fmt.Sprintf("v%d", tab.Version)
	for _, c := range tab.Chains {
		s += fmt.Sprintf(" %d@%d:", c.Id, c.Version)
		for i, mem := range c.Members {
			if i > 0 {
				s += ","
			}
			s += fmt.Sprintf("%d/%d/%s/%s", mem.TargetId, mem.ServerId, mem.Address, mem.State)
		}
	}
	return s
}

// TestRegistration runs registrations in sequence and checks the ids handed
// out and the chain table after each, across manager and engine restarts.
func TestRegistration(t *testing.T) {
	e := newEnv(t)
	steps := []struct {
		name       string
		restart    bool
		uuid, addr string
		targets    []string
		wantServer uint64
		wantTarget []uint64
		wantTable  string
	}{
		{
			name: "first server", uuid: "sA", addr: "a:1", targets: []string{"tA1", "tA2"},
			wantServer: 1, wantTarget: []uint64{1, 2},
			wantTable: "v1 1@1:1/1/a:1/serving 2@1:2/1/a:1/serving",
		},
		{
			name: "second server", uuid: "sB", addr: "b:1", targets: []string{"tB1"},
			wantServer: 2, wantTarget: []uint64{3},
			wantTable: "v2 1@1:1/1/a:1/serving 2@1:2/1/a:1/serving 3@1:3/2/b:1/serving",
		},
		{
			// A restart: its chains get new versions.
			name: "same server, new address", uuid: "sA", addr: "a:2", targets: []string{"tA1", "tA2"},
			wantServer: 1, wantTarget: []uint64{1, 2},
			wantTable: "v5 1@3:1/1/a:2/serving 2@3:2/1/a:2/serving 3@1:3/2/b:1/serving",
		},
		{
			name: "same server unchanged", uuid: "sA", addr: "a:2", targets: []string{"tA2", "tA1"},
			wantServer: 1, wantTarget: []uint64{2, 1},
			wantTable: "v5 1@3:1/1/a:2/serving 2@3:2/1/a:2/serving 3@1:3/2/b:1/serving",
		},
		{
			name: "after restart", restart: true, uuid: "sB", addr: "b:1", targets: []string{"tB1"},
			wantServer: 2, wantTarget: []uint64{3},
			wantTable: "v5 1@3:1/1/a:2/serving 2@3:2/1/a:2/serving 3@1:3/2/b:1/serving",
		},
		{
			name: "new target on a known server", uuid: "sB", addr: "b:1", targets: []string{"tB1", "tB2"},
			wantServer: 2, wantTarget: []uint64{3, 4},
			wantTable: "v6 1@3:1/1/a:2/serving 2@3:2/1/a:2/serving 3@1:3/2/b:1/serving 4@1:4/2/b:1/serving",
		},
		{
			name: "new server after restart", restart: true, uuid: "sC", addr: "c:1", targets: []string{"tC1"},
			wantServer: 3, wantTarget: []uint64{5},
			wantTable: "v7 1@3:1/1/a:2/serving 2@3:2/1/a:2/serving 3@1:3/2/b:1/serving 4@1:4/2/b:1/serving 5@1:5/3/c:1/serving",
		},
		{
			name: "target moved to another server", uuid: "sC", addr: "c:1", targets: []string{"tC1", "tB2"},
			wantServer: 3, wantTarget: []uint64{5, 4},
			wantTable: "v8 1@3:1/1/a:2/serving 2@3:2/1/a:2/serving 3@1:3/2/b:1/serving 4@2:4/3/c:1/serving 5@1:5/3/c:1/serving",
		},
		{
			name: "after restart, the move is kept", restart: true, uuid: "sC", addr: "c:1", targets: []string{"tC1", "tB2"},
			wantServer: 3, wantTarget: []uint64{5, 4},
			wantTable: "v8 1@3:1/1/a:2/serving 2@3:2/1/a:2/serving 3@1:3/2/b:1/serving 4@2:4/3/c:1/serving 5@1:5/3/c:1/serving",
		},
	}
	for _, st := range steps {
		if st.restart {
			before := e.table()
			e.restart()
			if after := e.table(); !proto.Equal(before, after) {
				t.Fatalf("%s: chain table changed across a restart:\nbefore %s\nafter  %s", st.name, summary(before), summary(after))
			}
		}
		var reports []*weftv1.TargetReport
		for _, u := range st.targets {
			reports = append(reports, report(u, 500*GiB))
		}
		resp := e.register(st.uuid, st.addr, reports...)
		if resp.ServerId != st.wantServer || fmt.Sprint(resp.TargetIds) != fmt.Sprint(st.wantTarget) {
			t.Errorf("%s: got server %d targets %v, want server %d targets %v",
				st.name, resp.ServerId, resp.TargetIds, st.wantServer, st.wantTarget)
		}
		if resp.HeartbeatIntervalMs != 1000 {
			t.Errorf("%s: heartbeat interval %d ms, want 1000", st.name, resp.HeartbeatIntervalMs)
		}
		if got := summary(resp.Chains); got != st.wantTable {
			t.Errorf("%s: chain table\n got %s\nwant %s", st.name, got, st.wantTable)
		}
		if got := summary(e.table()); got != st.wantTable {
			t.Errorf("%s: GetChains\n got %s\nwant %s", st.name, got, st.wantTable)
		}
	}
	if n := e.m.NumChains(); n != 5 {
		t.Errorf("NumChains = %d, want 5", n)
	}
}

func TestRegisterRejectsBadRequests(t *testing.T) {
	e := newEnv(t)
	for _, c := range []struct {
		name string
		req  *weftv1.RegisterServerRequest
	}{
		{"no uuid", &weftv1.RegisterServerRequest{Address: "a:1"}},
		{"no address", &weftv1.RegisterServerRequest{Uuid: "s"}},
		{"target without uuid", &weftv1.RegisterServerRequest{Uuid: "s", Address: "a:1", Targets: []*weftv1.TargetReport{{Path: "/x"}}}},
		{"target twice", &weftv1.RegisterServerRequest{Uuid: "s", Address: "a:1", Targets: []*weftv1.TargetReport{report("t", GiB), report("t", GiB)}}},
	} {
		if _, err := e.m.RegisterServer(context.Background(), c.req); err == nil {
			t.Errorf("%s: RegisterServer succeeded", c.name)
		}
	}
	if n := len(e.m.Servers()); n != 0 {
		t.Errorf("%d servers registered by bad requests", n)
	}
}

func TestHeartbeat(t *testing.T) {
	e := newEnv(t)
	e.register("sA", "a:1", report("tA1", 500*GiB))
	e.register("sB", "b:1", report("tB1", 500*GiB))

	for _, c := range []struct {
		name        string
		id          uint64
		addr        string
		targets     []*weftv1.TargetReport
		wantUnknown bool
		wantTable   string
	}{
		{"never registered", 7, "x:1", nil, true, ""},
		{"unknown target", 1, "a:1", []*weftv1.TargetReport{report("tA1", GiB), report("tNew", GiB)}, true, ""},
		{"target of another server", 1, "a:1", []*weftv1.TargetReport{report("tB1", GiB)}, true, ""},
		{"known", 1, "a:1", []*weftv1.TargetReport{report("tA1", 400*GiB)}, false,
			"v2 1@1:1/1/a:1/serving 2@1:2/2/b:1/serving"},
		// Addresses change only by a registration (the server restarted).
		{"new address", 2, "b:2", []*weftv1.TargetReport{report("tB1", 300*GiB)}, true, ""},
	} {
		resp := e.heartbeat(c.id, c.addr, c.targets...)
		if resp.UnknownServer != c.wantUnknown {
			t.Errorf("%s: unknown_server = %v, want %v", c.name, resp.UnknownServer, c.wantUnknown)
		}
		if !c.wantUnknown {
			if got := summary(resp.Chains); got != c.wantTable {
				t.Errorf("%s: chain table\n got %s\nwant %s", c.name, got, c.wantTable)
			}
		}
	}

	// Registered at the new address, the server's chain gets new versions
	// (out with the old address, back with the new one).
	e.register("sB", "b:2", report("tB1", 300*GiB))
	want := "v5 1@1:1/1/a:1/serving 2@3:2/2/b:2/serving"
	if got := summary(e.table()); got != want {
		t.Errorf("registered at a new address: chain table\n got %s\nwant %s", got, want)
	}

	e.clock.advance(1500 * time.Millisecond)
	servers := e.m.Servers()
	if len(servers) != 2 {
		t.Fatalf("Servers() = %v", servers)
	}
	for i, want := range []struct {
		addr string
		free uint64
	}{{"a:1", 400 * GiB}, {"b:2", 300 * GiB}} {
		s := servers[i]
		if s.Id != uint64(i+1) || s.Address != want.addr || !s.Online || s.LastHeartbeatMs != 1500 || s.Hostname == "" {
			t.Errorf("server %d status: %v", i+1, s)
		}
		if len(s.Targets) != 1 || s.Targets[0].FreeBytes != want.free || s.Targets[0].TotalBytes != TiB || !s.Targets[0].Online {
			t.Errorf("server %d targets: %v", i+1, s.Targets)
		}
	}
	total, free, used := e.m.Capacity()
	if total != 2*TiB || free != 700*GiB || used != 2*TiB-700*GiB {
		t.Errorf("Capacity() = %d, %d, %d", total, free, used)
	}

	// The moved address survives a restart.
	e.restart()
	if got := summary(e.table()); got != want {
		t.Errorf("after restart: %s, want %s", got, want)
	}
}

// Targets of several servers on one host that share a file system count
// its size once; targets on different file systems or hosts add up.
func TestCapacitySharedFilesystem(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	withFS := func(uuid, fs string, free uint64) *weftv1.TargetReport {
		r := report(uuid, free)
		r.Filesystem = fs
		return r
	}
	for _, s := range []struct {
		uuid, host string
		target     *weftv1.TargetReport
	}{
		{"s1", "node1", withFS("t1", "dev 8:1", 600*GiB)},
		{"s2", "node1", withFS("t2", "dev 8:1", 600*GiB)},
		{"s3", "node1", withFS("t3", "dev 8:2", 100*GiB)},
		{"s4", "node2", withFS("t4", "dev 8:1", 200*GiB)},
	} {
		resp, err := e.m.RegisterServer(ctx, &weftv1.RegisterServerRequest{
			Uuid: s.uuid, Address: s.uuid + ":1", Hostname: s.host, Targets: []*weftv1.TargetReport{s.target},
		})
		if err != nil {
			t.Fatal(err)
		}
		e.heartbeat(resp.ServerId, s.uuid+":1", s.target)
	}
	total, free, _ := e.m.Capacity()
	if total != 3*TiB || free != 900*GiB {
		t.Errorf("Capacity() total, free = %d GiB, %d GiB; want %d GiB, %d GiB", total/GiB, free/GiB, 3*TiB/GiB, 900)
	}
}
