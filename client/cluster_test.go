package client

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/data"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/meta"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// testCluster is a meta service and data servers running in-process.
type testCluster struct {
	t        *testing.T
	ctx      context.Context
	wg       *sync.WaitGroup
	log      *slog.Logger
	metaAddr string
	metaCfg  meta.Config
	stopMeta func()
	dataDirs []string
	stops    []func()
	opts     clusterOpts
	proxies  []*countingProxy // per data server, with clusterOpts.proxied
}

// clusterOpts are the less common settings of a test cluster.
type clusterOpts struct {
	// failureTimeout of the cluster manager (default: the manager's).
	failureTimeout time.Duration
	// proxied puts a countingProxy in front of every data server (clients
	// and peers reach it through the proxy).
	proxied bool
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
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	// Directories first: their removal must run after the servers stop.
	metaDir := t.TempDir()
	tc := &testCluster{t: t, log: log, wg: &sync.WaitGroup{}, dataDirs: make([]string, nData), stops: make([]func(), nData),
		opts: opts, proxies: make([]*countingProxy, nData)}
	for i := range tc.dataDirs {
		tc.dataDirs[i] = t.TempDir()
	}
	ctx, cancel := context.WithCancel(context.Background())
	tc.ctx = ctx
	t.Cleanup(func() {
		cancel()
		tc.wg.Wait()
	})
	tc.metaCfg = meta.Config{
		Dir: metaDir, DefaultLayout: layout, Logger: log,
		Cluster: cluster.Config{HeartbeatInterval: 200 * time.Millisecond, FailureTimeout: opts.failureTimeout, Logger: log},
	}
	tc.metaAddr = "127.0.0.1:0"
	tc.startMeta()
	for i := range nData {
		tc.startData(i)
	}
	cc, err := rpc.Dial(tc.metaAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	mc := weftv1.NewMetaClient(cc)
	deadline := time.Now().Add(20 * time.Second)
	for {
		tab, err := mc.GetChains(ctx, &weftv1.GetChainsRequest{})
		if err == nil && len(tab.Chains) >= nData {
			return tc
		}
		if time.Now().After(deadline) {
			t.Fatalf("data servers did not register in time: chains %v, err %v", tab, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startMeta starts the meta service (again, on the same address).
func (tc *testCluster) startMeta() {
	svc, err := meta.Open(tc.ctx, tc.metaCfg)
	if err != nil {
		tc.t.Fatal(err)
	}
	var lis net.Listener
	for range 50 {
		if lis, err = net.Listen("tcp", tc.metaAddr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.metaAddr = lis.Addr().String()
	ctx, stop := context.WithCancel(tc.ctx)
	done := make(chan struct{})
	tc.wg.Go(func() {
		defer close(done)
		_ = svc.Serve(ctx, lis)
	})
	tc.stopMeta = func() { stop(); <-done }
}

// startData starts data server i (again) on a new port.
func (tc *testCluster) startData(i int) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tc.t.Fatal(err)
	}
	cfg := data.Config{Dir: tc.dataDirs[i], MetaAddr: tc.metaAddr, Logger: tc.log}
	var px *countingProxy
	if tc.opts.proxied {
		px = newCountingProxy(tc.t, lis.Addr().String())
		tc.proxies[i] = px
		cfg.Advertise = px.addr()
	}
	srv, err := data.Open(cfg)
	if err != nil {
		tc.t.Fatal(err)
	}
	ctx, stop := context.WithCancel(tc.ctx)
	done := make(chan struct{})
	tc.wg.Go(func() {
		defer close(done)
		_ = srv.Serve(ctx, lis)
	})
	tc.stops[i] = func() {
		if px != nil && !px.held.Load() {
			px.close() // connections die at once, as with a killed process
		}
		stop()
		<-done
	}
}

// stopData stops data server i.
func (tc *testCluster) stopData(i int) { tc.stops[i]() }

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
