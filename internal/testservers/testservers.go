// Package testservers runs a weft meta service and data servers inside a
// test process, over real gRPC on 127.0.0.1 listeners, with their state in
// the test's temporary directory. It is the server half of test clusters:
// the in-package tests of client and mount use it directly (they cannot
// import internal/testcluster, which imports them), and internal/testcluster
// builds on it. It must not import client or mount.
package testservers

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/data"
	"github.com/weft-fs/weft/internal/disk"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/meta"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Options configures the servers. Zero values take the defaults.
type Options struct {
	// DataServers is the number of data servers; default 3.
	DataServers int
	// Layout is the meta service's default layout (chunk size, stripe
	// count, replicas); nil or zero fields keep the meta service's
	// defaults.
	Layout *weftv1.Layout
	// HeartbeatInterval, FailureTimeout and RepairDelay configure the
	// cluster manager; HeartbeatInterval defaults to 200ms, the others to
	// the manager's defaults.
	HeartbeatInterval time.Duration
	FailureTimeout    time.Duration
	RepairDelay       time.Duration
	// SyncBandwidth and ScrubRate configure every data server (see
	// data.Config); zero keeps their defaults.
	SyncBandwidth int64
	ScrubRate     int64
	// SessionLease and OpenGrace configure the meta service (see
	// meta.Config); zero keeps its defaults.
	SessionLease time.Duration
	OpenGrace    time.Duration
	// Logger receives every server's log; default: discarded.
	Logger *slog.Logger
	// NoChainWait makes Start return without waiting for the chain table
	// to hold a chain per data server.
	NoChainWait bool
	// KeepDataAddrs restarts a data server on its previous address when
	// that is still free (default: on a new port).
	KeepDataAddrs bool
	// Front, if set, is called each time data server i has its listener
	// on addr, before the server opens: it returns the address the server
	// advertises instead (e.g. of a proxy in front of it) and a function,
	// possibly nil, run first when the server is stopped. A server with a
	// front (advertise not empty) serves no lean data path: every request
	// goes through the front, over gRPC, and none through its Unix socket
	// past the front.
	Front func(i int, addr string) (advertise string, stop func())
	// FS is the file system every server keeps its state on (the meta
	// service's engine, the data servers' targets); default the local
	// one. With a *disk.Mem, PowerLoss simulates a power loss.
	FS disk.FS
	// CheckErrors fails the test (t.Errorf) when a server still running
	// at the end of the test returns an error other than context.Canceled
	// from Serve. (StopMeta and StopData return their server's error.)
	CheckErrors bool
}

// Servers are a running meta service and data servers. Their methods may
// be called from any goroutine; they fail the test on error.
type Servers struct {
	t    testing.TB
	opts Options
	dir  string
	ctx  context.Context
	wg   sync.WaitGroup

	mu       sync.Mutex
	metaAddr string
	metaCfg  meta.Config
	metaSvc  *meta.Service
	metaStop func() error // nil while stopped
	data     []*dataServer
}

// dataServer is one in-process data server.
type dataServer struct {
	dir  string
	srv  *data.Server // nil while stopped
	addr string       // last address it listened on
	stop func() error // nil while stopped
}

// Start starts the meta service and the data servers, registers their
// shutdown with t.Cleanup, and (unless Options.NoChainWait) returns once
// the chain table holds at least one chain per data server.
func Start(t testing.TB, opts Options) *Servers {
	t.Helper()
	if opts.DataServers <= 0 {
		opts.DataServers = 3
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = 200 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	// The directory first: its removal must run after the servers stop.
	s := &Servers{t: t, opts: opts, dir: t.TempDir()}
	ctx, cancel := context.WithCancel(context.Background())
	s.ctx = ctx
	t.Cleanup(func() {
		cancel()
		s.wg.Wait()
	})
	layout := opts.Layout
	if layout == nil {
		layout = &weftv1.Layout{}
	}
	s.metaCfg = meta.Config{
		Dir: filepath.Join(s.dir, "meta"), DefaultLayout: layout, Logger: opts.Logger,
		SessionLease: opts.SessionLease, OpenGrace: opts.OpenGrace, FS: opts.FS,
		Cluster: cluster.Config{HeartbeatInterval: opts.HeartbeatInterval, FailureTimeout: opts.FailureTimeout,
			RepairDelay: opts.RepairDelay, Logger: opts.Logger},
	}
	s.metaAddr = "127.0.0.1:0"
	s.StartMeta()
	for i := range opts.DataServers {
		s.data = append(s.data, &dataServer{dir: filepath.Join(s.dir, "data"+strconv.Itoa(i+1))})
	}
	for i := range opts.DataServers {
		s.StartData(i)
	}
	if !opts.NoChainWait {
		s.waitChains(opts.DataServers)
	}
	return s
}

// waitChains waits until the chain table holds at least n chains.
func (s *Servers) waitChains(n int) {
	s.t.Helper()
	cc, err := rpc.Dial(s.MetaAddr())
	if err != nil {
		s.t.Fatalf("testservers: %v", err)
	}
	defer cc.Close()
	mc := weftv1.NewMetaClient(cc)
	deadline := time.Now().Add(20 * time.Second)
	for {
		tab, err := mc.GetChains(s.ctx, &weftv1.GetChainsRequest{})
		if err == nil && len(tab.Chains) >= n {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("data servers did not register in time: chains %v, err %v", tab, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Context is canceled when the test ends, stopping every server.
func (s *Servers) Context() context.Context { return s.ctx }

// Dir is the directory holding every server's state.
func (s *Servers) Dir() string { return s.dir }

// MetaAddr is the meta service's address (the same across restarts).
func (s *Servers) MetaAddr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.metaAddr
}

// Meta is the running meta service; nil while it is stopped.
func (s *Servers) Meta() *meta.Service {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.metaSvc
}

// StartMeta starts the meta service (again, on the same address and
// state; a restart waits up to 5s for the address to be free).
func (s *Servers) StartMeta() {
	s.t.Helper()
	s.mu.Lock()
	running, addr, cfg := s.metaStop != nil, s.metaAddr, s.metaCfg
	s.mu.Unlock()
	if running {
		s.t.Fatal("testservers: the meta service is running")
	}
	svc, err := meta.Open(s.ctx, cfg)
	if err != nil {
		s.t.Fatalf("testservers: open meta service: %v", err)
	}
	var lis net.Listener
	for range 50 {
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		svc.Close()
		s.t.Fatalf("testservers: listen for meta service: %v", err)
	}
	s.mu.Lock()
	s.metaAddr, s.metaSvc = lis.Addr().String(), svc
	s.metaStop = s.serve("meta service", func(ctx context.Context) error { return svc.Serve(ctx, lis) }, nil)
	s.mu.Unlock()
}

// StopMeta stops the meta service and returns what its Serve returned.
func (s *Servers) StopMeta() error {
	s.mu.Lock()
	stop := s.metaStop
	s.metaStop, s.metaSvc = nil, nil
	s.mu.Unlock()
	if stop == nil {
		return nil
	}
	return stop()
}

// DataServers is the number of data servers.
func (s *Servers) DataServers() int { return len(s.data) }

// DataDir is the state directory (and target) of data server i (0-based).
func (s *Servers) DataDir(i int) string { return s.data[i].dir }

// DataDirs are the state directories of the data servers.
func (s *Servers) DataDirs() []string {
	dirs := make([]string, len(s.data))
	for i, ds := range s.data {
		dirs[i] = ds.dir
	}
	return dirs
}

// DataAddr is the address data server i (0-based) listens on, or last
// listened on if stopped.
func (s *Servers) DataAddr(i int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data[i].addr
}

// DataServer is the running data server i (0-based); nil while it is
// stopped.
func (s *Servers) DataServer(i int) *data.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.data[i].srv
}

// StartData starts stopped data server i (0-based), again on the same
// directory (same identity): on a new port, or with Options.KeepDataAddrs
// on its previous address when free.
func (s *Servers) StartData(i int) {
	s.t.Helper()
	s.mu.Lock()
	ds := s.data[i]
	running, addr := ds.stop != nil, ds.addr
	s.mu.Unlock()
	if running {
		s.t.Fatalf("testservers: data server %d is running", i)
	}
	if addr == "" || !s.opts.KeepDataAddrs {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		lis, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		s.t.Fatalf("testservers: listen for data server %d: %v", i, err)
	}
	cfg := data.Config{Dir: ds.dir, MetaAddr: s.MetaAddr(), SyncBandwidth: s.opts.SyncBandwidth,
		ScrubRate: s.opts.ScrubRate, Logger: s.opts.Logger, FS: s.opts.FS}
	var front func()
	if s.opts.Front != nil {
		cfg.Advertise, front = s.opts.Front(i, lis.Addr().String())
		if cfg.Advertise != "" {
			cfg.NoUnixSocket = true
		}
	}
	srv, err := data.Open(cfg)
	if err != nil {
		lis.Close()
		if front != nil {
			front()
		}
		s.t.Fatalf("testservers: open data server %d in %s: %v", i, ds.dir, err)
	}
	stop := s.serve("data server "+strconv.Itoa(i), func(ctx context.Context) error { return srv.Serve(ctx, lis) }, front)
	s.mu.Lock()
	ds.addr, ds.srv, ds.stop = lis.Addr().String(), srv, stop
	s.mu.Unlock()
}

// StopData stops data server i (0-based); its state stays. It returns
// what the server's Serve returned (nil if it was not running).
func (s *Servers) StopData(i int) error {
	s.mu.Lock()
	ds := s.data[i]
	stop := ds.stop
	ds.stop, ds.srv = nil, nil
	s.mu.Unlock()
	if stop == nil {
		return nil
	}
	return stop()
}

// serve runs fn in a goroutine with a context canceled by the returned
// stop function (or at the end of the test), which runs before first, then
// waits for fn and returns its error.
func (s *Servers) serve(what string, fn func(ctx context.Context) error, before func()) func() error {
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	var err error
	var stopped atomic.Bool
	s.wg.Go(func() {
		defer close(done)
		err = fn(ctx)
		if s.opts.CheckErrors && !stopped.Load() && err != nil && !errors.Is(err, context.Canceled) {
			s.t.Errorf("testservers: %s: %v", what, err)
		}
	})
	var once sync.Once
	return func() error {
		once.Do(func() {
			stopped.Store(true)
			if before != nil {
				before()
			}
			cancel()
			<-done
		})
		return err
	}
}
