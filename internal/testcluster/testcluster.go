// Package testcluster is the one test cluster of weft: a meta service
// (on the embedded engine or on a real etcd) and data servers, either in
// the test process, running the same Open/Serve code as the daemons over
// real gRPC on 127.0.0.1 listeners, or as "weft meta" and "weft data"
// processes (Options.Processes) that a test can kill; their state is in
// the test's temporary directory. The file system is mounted by the weft
// binary's own "weft mount". Proc starts any other weft process a test
// needs.
//
// When the test ends, Start's cleanup unmounts, runs the meta service's
// fsck, fails the test on any finding (but of the kinds the test
// declared with LeavesDamage that it leaves on purpose) and stops
// everything.
//
// It does not import client or mount: their in-package tests use it.
package testcluster

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/weft-fs/weft/data"
	"github.com/weft-fs/weft/internal/disk"
	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/meta"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Engines are the metadata engines a cluster can run on (Options.Engine).
var Engines = []string{EnginePebble, EngineEtcd}

// Metadata engines.
const (
	EnginePebble = "pebble" // embedded, in the meta service's directory
	EngineEtcd   = "etcd"   // a real etcd process (internal/etcdtest)
)

// Options configures a test cluster. Zero values take the defaults.
type Options struct {
	// DataServers is the number of data servers; default 3.
	DataServers int
	// Layout is the meta service's default layout (chunk size, stripe
	// count, replicas); nil or zero fields keep the meta service's
	// defaults. With replicas > 1, Start waits for healthy chains.
	Layout *weftv1.Layout
	// Engine is the metadata engine: EnginePebble (default) or EngineEtcd.
	Engine string
	// HeartbeatInterval, FailureTimeout and RepairDelay configure the
	// cluster manager; HeartbeatInterval defaults to 200ms, the others to
	// the manager's defaults.
	HeartbeatInterval time.Duration
	FailureTimeout    time.Duration
	RepairDelay       time.Duration
	// SyncBandwidth and ScrubRate configure every data server (see
	// data.Config); zero keeps their defaults, a negative ScrubRate turns
	// the background scrub off.
	SyncBandwidth int64
	ScrubRate     int64
	// SessionLease and OpenGrace configure the meta service (see
	// meta.Config); zero keeps its defaults.
	SessionLease time.Duration
	OpenGrace    time.Duration
	// Logger receives every server's log; default: warnings and errors to
	// t.Log ($WEFT_TEST_LOG=debug|info for more).
	Logger *slog.Logger
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
	// Processes runs the servers as processes of the weft binary ("weft
	// meta", "weft data", see Main) instead of in this process, their
	// output in Dir()/logs: KillData and KillMeta can crash them. FS
	// cannot be set then, and Meta and DataServer are nil.
	Processes bool
	// Mount mounts the file system with "weft mount" (see Mount) in the
	// cluster's directory, skipping the test without FUSE; MountArgs are
	// its extra flags.
	Mount     bool
	MountArgs []string
}

// Cluster is a running test cluster. Its methods may be called from any
// goroutine; they fail the test on error.
type Cluster struct {
	t    testing.TB
	opts Options
	dir  string
	ctx  context.Context
	wg   sync.WaitGroup
	etcd *etcdtest.Server // with EngineEtcd

	mu       sync.Mutex
	metaAddr string
	metaCfg  meta.Config
	metaSvc  *meta.Service
	metaStop func() error // nil while stopped
	data     []*dataServer
	mounts   []*mounted
	damage   []string         // fsck findings the test leaves on purpose
	procs    map[string]*Proc // with Processes: the current one of each server
	allProcs []*Proc          // with Processes: every one started
}

// dataServer is one in-process data server.
type dataServer struct {
	dir  string
	srv  *data.Server // nil while stopped
	addr string       // last address it listened on
	stop func() error // nil while stopped
}

// Start starts the meta service and the data servers, registers their
// shutdown with t.Cleanup (after an fsck that must find nothing), and
// returns once every data server is online and the chain table holds a
// chain per data server (with replicas, once every chain is healthy),
// and the file system is mounted if asked.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.DataServers <= 0 {
		opts.DataServers = 3
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = 200 * time.Millisecond
	}
	if opts.Layout == nil {
		opts.Layout = &weftv1.Layout{}
	}
	if opts.Engine == "" {
		opts.Engine = EnginePebble
	}
	if opts.Logger == nil {
		var closeLog func()
		opts.Logger, closeLog = newTestLogger(t)
		// Registered first, so run last: the servers log while stopping.
		t.Cleanup(closeLog)
	}
	// The directory first: its removal must run after the servers stop.
	c := &Cluster{t: t, opts: opts, dir: t.TempDir(), procs: map[string]*Proc{}}
	if opts.Processes && opts.FS != nil {
		t.Fatal("testcluster: Options.FS needs servers in process (not Processes)")
	}
	if opts.Engine == EngineEtcd {
		c.etcd = etcdtest.Start(t)
	} else if opts.Engine != EnginePebble {
		t.Fatalf("testcluster: unknown engine %q (want %q or %q)", opts.Engine, EnginePebble, EngineEtcd)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.ctx = ctx
	t.Cleanup(func() {
		cancel()
		c.wg.Wait()
	})
	t.Cleanup(c.killProcs)
	c.startServers()
	// Registered after the servers' shutdown, so run before it; and
	// before the mounts', so run after them.
	t.Cleanup(c.checkFsck)
	c.WaitOnline(opts.DataServers)
	c.waitChains(opts.DataServers)
	if c.replicated() {
		c.WaitHealthy()
	}
	if opts.Mount {
		c.Mount(opts.MountArgs...)
	}
	return c
}

// replicated reports whether the default layout has replicas and there
// are enough data servers for its chains.
func (c *Cluster) replicated() bool {
	r := int(c.opts.Layout.GetReplicas())
	return r > 1 && r <= c.opts.DataServers
}

// Context is canceled when the test ends, stopping every server.
func (c *Cluster) Context() context.Context { return c.ctx }

// Dir is the directory holding every server's state.
func (c *Cluster) Dir() string { return c.dir }

// Etcd is the etcd server of a cluster on EngineEtcd, else nil.
func (c *Cluster) Etcd() *etcdtest.Server { return c.etcd }

// Status asks the meta service for the cluster status.
func (c *Cluster) Status() *weftv1.StatusResponse {
	c.t.Helper()
	cc, err := rpc.Dial(c.MetaAddr())
	if err != nil {
		c.t.Fatalf("testcluster: %v", err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := weftv1.NewMetaClient(cc).Status(ctx, &weftv1.StatusRequest{})
	if err != nil {
		c.t.Fatalf("testcluster: status: %v", err)
	}
	return st
}

// WaitOnline waits until the meta service reports n data servers online.
func (c *Cluster) WaitOnline(n int) {
	c.t.Helper()
	c.waitServers(func(online int) bool { return online >= n }, fmt.Sprintf("%d data servers online", n))
}

// WaitOffline waits until the meta service reports at most n data servers
// online (after StopData, once the failure timeout has passed).
func (c *Cluster) WaitOffline(n int) {
	c.t.Helper()
	c.waitServers(func(online int) bool { return online <= n }, fmt.Sprintf("at most %d data servers online", n))
}

func (c *Cluster) waitServers(ok func(online int) bool, what string) {
	c.t.Helper()
	c.WaitStatus(what, func(st *weftv1.StatusResponse) bool { return ok(Online(st)) })
}

// Online counts the data servers st reports online.
func Online(st *weftv1.StatusResponse) int {
	online := 0
	for _, s := range st.GetServers() {
		if s.GetOnline() {
			online++
		}
	}
	return online
}

// waitChains waits until the chain table holds at least n chains.
func (c *Cluster) waitChains(n int) {
	c.t.Helper()
	c.WaitStatus(fmt.Sprintf("%d chains", n), func(st *weftv1.StatusResponse) bool {
		total := uint32(0)
		for _, s := range st.GetChainSummaries() {
			total += s.GetTotal()
		}
		return int(total) >= n
	})
}

// WaitHealthy waits until every chain of every width is healthy (all
// members serving, nothing left to sync) and at least one chain exists.
func (c *Cluster) WaitHealthy() {
	c.t.Helper()
	c.WaitStatus("every chain healthy", Healthy)
}

// Healthy reports whether st shows chains, all of them healthy, and no
// bytes left to sync.
func Healthy(st *weftv1.StatusResponse) bool {
	if len(st.GetChainSummaries()) == 0 || st.GetSyncBytesLeft() > 0 {
		return false
	}
	for _, s := range st.GetChainSummaries() {
		if s.GetTotal() == 0 || s.GetHealthy() != s.GetTotal() {
			return false
		}
	}
	return true
}

// WaitStatus polls the meta service's status until ok returns true,
// failing the test (naming what it waited for) after 30s plus twice the
// failure timeout.
func (c *Cluster) WaitStatus(what string, ok func(*weftv1.StatusResponse) bool) {
	c.t.Helper()
	if err := WaitStatus(c.MetaAddr(), 30*time.Second+2*c.opts.FailureTimeout, ok); err != nil {
		c.t.Fatalf("testcluster: waiting for %s: %v", what, err)
	}
}

// WaitStatus polls the status of the meta service at addr until ok
// returns true or timeout passes.
func WaitStatus(addr string, timeout time.Duration, ok func(*weftv1.StatusResponse) bool) error {
	cc, err := rpc.Dial(addr)
	if err != nil {
		return err
	}
	defer cc.Close()
	mc := weftv1.NewMetaClient(cc)
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := mc.Status(ctx, &weftv1.StatusRequest{})
		cancel()
		if err == nil && ok(st) {
			return nil
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("timed out after %v (last status error: %v)", timeout, last)
}
