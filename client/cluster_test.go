package client

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/faultproxy"
	"github.com/weft-fs/weft/internal/testcluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// testCluster is a meta service and data servers running in-process.
type testCluster struct {
	*testcluster.Cluster
	t        *testing.T
	ctx      context.Context
	metaAddr string
	dataDirs []string
	proxies  []*countingProxy // per data server, with clusterOpts.proxied
}

// clusterOpts are the less common settings of a test cluster.
type clusterOpts struct {
	// failureTimeout of the cluster manager (default: the manager's).
	failureTimeout time.Duration
	// proxied puts a countingProxy in front of every data server (clients
	// and peers reach it through the proxy).
	proxied bool
	// latency puts a delay line (internal/faultproxy) with this latency
	// each way in front of every data server instead: they are far away.
	latency time.Duration
	// sessionLease and openGrace configure the meta service.
	sessionLease, openGrace time.Duration
}

// startCluster runs a meta service and nData data servers in-process over
// real gRPC on loopback, with the given default layout, and returns once
// every data server's chain is in the chain table.
func startCluster(t *testing.T, layout *weftv1.Layout, nData int) *testCluster {
	t.Helper()
	return startClusterOpts(t, layout, nData, clusterOpts{})
}

// startClusterOpts is startCluster with options.
func startClusterOpts(t *testing.T, layout *weftv1.Layout, nData int, opts clusterOpts) *testCluster {
	t.Helper()
	tc := &testCluster{t: t, proxies: make([]*countingProxy, nData)}
	o := testcluster.Options{DataServers: nData, Layout: layout, FailureTimeout: opts.failureTimeout,
		SessionLease: opts.sessionLease, OpenGrace: opts.openGrace}
	if testing.Verbose() {
		o.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if opts.proxied {
		o.Front = func(i int, addr string) (string, func()) {
			px := newCountingProxy(t, addr)
			tc.proxies[i] = px
			return px.addr(), func() {
				if !px.held.Load() {
					px.close() // connections die at once, as with a killed process
				}
			}
		}
	}
	if opts.latency > 0 {
		o.Front = func(i int, addr string) (string, func()) {
			px, err := faultproxy.New(addr)
			if err != nil {
				t.Fatal(err)
			}
			px.SetLatency(opts.latency)
			return px.Addr(), func() { px.Close() }
		}
	}
	tc.Cluster = testcluster.Start(t, o)
	tc.ctx, tc.metaAddr, tc.dataDirs = tc.Context(), tc.MetaAddr(), tc.DataDirs()
	return tc
}

// fsckFindsOnlyCorruptChunks is for a test that corrupts chunks on
// purpose: fsck must find them, and the one at the end of the test
// nothing else.
func (tc *testCluster) fsckFindsOnlyCorruptChunks() {
	tc.t.Helper()
	tc.LeavesDamage("corrupt_chunk")
	if r := tc.Fsck(false); len(r.GetProblems()) == 0 {
		tc.t.Error("fsck finds nothing, want the corrupt chunks")
	}
}

// startMeta starts the meta service again, on the same address.
func (tc *testCluster) startMeta() { tc.StartMeta() }

// stopMeta stops the meta service.
func (tc *testCluster) stopMeta() { _ = tc.StopMeta() }

// startData starts data server i again on a new port.
func (tc *testCluster) startData(i int) { tc.StartData(i) }

// stopData stops data server i.
func (tc *testCluster) stopData(i int) { _ = tc.StopData(i) }

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func newTestClient(t *testing.T, addr string, cfg Config) *Client {
	t.Helper()
	cfg.MetaAddr = addr
	cfg.MountPoint = "test:" + t.Name()
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close client: %v", err)
		}
	})
	return c
}
