package data

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/weft-fs/weft/data/chunk"
	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

const testChain = 7

// stubMeta answers the calls a data server makes to the meta service:
// registration (ids by the server's site label), heartbeats (no table: the
// tests install tables directly), and synced reports, which it records.
type stubMeta struct {
	weftv1.UnimplementedMetaServer
	addr string

	mu          sync.Mutex
	heartbeatMs int64
	failureMs   int64
	cut         bool
	heartbeats  int
	synced      []*weftv1.ReportSyncedRequest
	onSynced    func(*weftv1.ReportSyncedRequest)
}

func startStubMeta(t *testing.T, heartbeatMs, failureMs int64) *stubMeta {
	t.Helper()
	m := &stubMeta{heartbeatMs: heartbeatMs, failureMs: failureMs}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := rpc.NewServer()
	weftv1.RegisterMetaServer(gs, m)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	m.addr = lis.Addr().String()
	return m
}

func siteIDs(site string) (server, target uint64) {
	var i uint64
	fmt.Sscanf(site, "s%d", &i)
	return i + 1, 10 + i
}

func (m *stubMeta) RegisterServer(ctx context.Context, req *weftv1.RegisterServerRequest) (*weftv1.RegisterServerResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sid, tid := siteIDs(req.GetSite())
	return &weftv1.RegisterServerResponse{ServerId: sid, TargetIds: []uint64{tid},
		HeartbeatIntervalMs: m.heartbeatMs, FailureTimeoutMs: m.failureMs}, nil
}

func (m *stubMeta) Heartbeat(ctx context.Context, req *weftv1.HeartbeatRequest) (*weftv1.HeartbeatResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cut {
		return nil, fmt.Errorf("meta service unreachable (test)")
	}
	m.heartbeats++
	return &weftv1.HeartbeatResponse{}, nil
}

func (m *stubMeta) ReportSynced(ctx context.Context, req *weftv1.ReportSyncedRequest) (*weftv1.ReportSyncedResponse, error) {
	m.mu.Lock()
	m.synced = append(m.synced, req)
	f := m.onSynced
	m.mu.Unlock()
	if f != nil {
		go f(req)
	}
	return &weftv1.ReportSyncedResponse{}, nil
}

func (m *stubMeta) setCut(cut bool) {
	m.mu.Lock()
	m.cut = cut
	m.mu.Unlock()
}

// chainCluster is n real data servers over loopback gRPC sharing one
// chain (id testChain) whose table the test sets directly.
type chainCluster struct {
	t       *testing.T
	servers []*testServer
	meta    *stubMeta

	mu      sync.Mutex
	version uint64
	states  []string // by server index
	live    []bool
}

func newChainCluster(t *testing.T, n int, meta *stubMeta) *chainCluster {
	t.Helper()
	c := &chainCluster{t: t, meta: meta}
	for i := range n {
		cfg := Config{Dir: t.TempDir(), Site: fmt.Sprintf("s%d", i), ScrubRate: -1}
		if meta != nil {
			cfg.MetaAddr = meta.addr
		}
		ts := startServer(t, cfg)
		sid, tid := siteIDs(cfg.Site)
		ts.srv.SetTargetIDs([]uint64{tid})
		ts.srv.mu.Lock()
		ts.srv.serverID = sid
		ts.srv.mu.Unlock()
		c.servers = append(c.servers, ts)
		c.states = append(c.states, stateServing)
		c.live = append(c.live, true)
	}
	c.setStates(c.states...)
	return c
}

// setStates gives the members new states (by server index), bumps the
// chain version and installs the table on every live server.
func (c *chainCluster) setStates(states ...string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.states = append([]string(nil), states...)
	c.version++
	c.installLocked(c.version, nil)
	return c.version
}

// installLocked installs the current table on the live servers (or only
// on the given ones) at version v.
func (c *chainCluster) installLocked(v uint64, only []int) {
	rank := map[string]int{stateServing: 0, stateSyncing: 1, stateOffline: 2}
	order := []int{}
	for i := range c.servers {
		order = append(order, i)
	}
	slices.SortStableFunc(order, func(a, b int) int { return rank[c.states[a]] - rank[c.states[b]] })
	ch := &weftv1.Chain{Id: testChain, Version: v}
	for _, i := range order {
		sid, tid := siteIDs(fmt.Sprintf("s%d", i))
		ch.Members = append(ch.Members, &weftv1.ChainMember{TargetId: tid, ServerId: sid, Address: c.servers[i].addr,
			WireAddress: c.servers[i].wire, State: c.states[i]})
	}
	table := &weftv1.ChainTable{Version: v, Chains: []*weftv1.Chain{ch}}
	for i, ts := range c.servers {
		if c.live[i] && (only == nil || slices.Contains(only, i)) {
			ts.srv.SetChains(table)
		}
	}
}

func (c *chainCluster) curVersion() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

func (c *chainCluster) stop(i int) {
	c.mu.Lock()
	c.live[i] = false
	c.mu.Unlock()
	c.servers[i].stop(c.t)
}

func (c *chainCluster) target(i int) *chunk.Target { return c.servers[i].srv.store.Targets()[0] }

// write writes through server i (the head) at the current version.
func (c *chainCluster) write(i int, ino, index, off uint64, data []byte) error {
	_, err := c.servers[i].client.WriteChunk(context.Background(), &weftv1.WriteChunkRequest{
		Chunk: &weftv1.ChunkID{Ino: ino, Index: index}, ChainId: testChain, ChainVersion: c.curVersion(),
		Offset: off, Data: data, ChunkSize: 1 << 20})
	return err
}

func (c *chainCluster) mustWrite(i int, ino, index, off uint64, data []byte) {
	c.t.Helper()
	if err := c.write(i, ino, index, off, data); err != nil {
		c.t.Fatalf("write chunk %d of inode %d through server %d: %v", index, ino, i, err)
	}
}

// checkIdentical verifies that the given servers hold the same chunks of
// the chain, with equal versions and bytes; it returns how many.
func (c *chainCluster) checkIdentical(t *testing.T, servers ...int) int {
	t.Helper()
	var ref []chunk.Info
	for n, i := range servers {
		infos, _, err := c.target(i).List(testChain, nil, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			ref = infos
			continue
		}
		if len(infos) != len(ref) {
			t.Fatalf("server %d holds %d chunks of the chain, server %d holds %d", i, len(infos), servers[0], len(ref))
		}
		for k, in := range infos {
			r := ref[k]
			if in.ID != r.ID || in.Version != r.Version || in.Length != r.Length || in.Digest != r.Digest {
				t.Fatalf("server %d has %v version %d (%d bytes), server %d has %v version %d (%d bytes)",
					i, in.ID, in.Version, in.Length, servers[0], r.ID, r.Version, r.Length)
			}
			a, err := c.target(i).ReadFull(in.ID)
			if err != nil {
				t.Fatal(err)
			}
			b, err := c.target(servers[0]).ReadFull(in.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a.Data, b.Data) {
				t.Fatalf("%v differs between servers %d and %d at equal version %d", in.ID, i, servers[0], in.Version)
			}
		}
	}
	return len(ref)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func hex2(n uint64) string       { return fmt.Sprintf("%02x", n) }
func strconvHex(n uint64) string { return fmt.Sprintf("%x", n) }
func strconvDec(n uint64) string { return fmt.Sprintf("%d", n) }
