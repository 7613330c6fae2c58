package testcluster

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/data"
	"github.com/weft-fs/weft/meta"
	"github.com/weft-fs/weft/meta/kv/etcdkv"
)

// startServers starts the meta service and the data servers.
func (c *Cluster) startServers() {
	c.t.Helper()
	o := c.opts
	c.metaCfg = meta.Config{
		Dir: filepath.Join(c.dir, "meta"), DefaultLayout: o.Layout, Logger: o.Logger,
		SessionLease: o.SessionLease, OpenGrace: o.OpenGrace, FS: o.FS,
		Cluster: cluster.Config{HeartbeatInterval: o.HeartbeatInterval, FailureTimeout: o.FailureTimeout,
			RepairDelay: o.RepairDelay, Logger: o.Logger},
	}
	c.metaAddr = "127.0.0.1:0"
	c.StartMeta()
	for i := range o.DataServers {
		c.data = append(c.data, &dataServer{dir: filepath.Join(c.dir, "data"+strconv.Itoa(i+1))})
	}
	for i := range o.DataServers {
		c.StartData(i)
	}
}

// MetaAddr is the meta service's address (the same across restarts).
func (c *Cluster) MetaAddr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.metaAddr
}

// Meta is the running meta service; nil while it is stopped.
func (c *Cluster) Meta() *meta.Service {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.metaSvc
}

// StartMeta starts the meta service (again, on the same address and
// state; a restart waits up to 5s for the address to be free). On
// EngineEtcd it runs as the daemon does there: over an etcd engine, with
// its election.
func (c *Cluster) StartMeta() {
	c.t.Helper()
	c.mu.Lock()
	running, addr, cfg := c.metaStop != nil, c.metaAddr, c.metaCfg
	c.mu.Unlock()
	if running {
		c.t.Fatal("testcluster: the meta service is running")
	}
	if c.opts.Processes {
		addr, stop := c.startMetaProc(addr)
		c.mu.Lock()
		c.metaAddr, c.metaStop = addr, stop
		c.mu.Unlock()
		return
	}
	var lis net.Listener
	var err error
	for range 50 {
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("testcluster: listen for meta service: %v", err)
	}
	if c.etcd != nil {
		eng, err := etcdkv.Open(c.ctx, etcdkv.Options{Endpoints: c.etcd.Endpoints})
		if err != nil {
			lis.Close()
			c.t.Fatalf("testcluster: open the etcd engine: %v", err)
		}
		err = os.MkdirAll(cfg.Dir, 0o700)
		id := ""
		if err == nil {
			id, err = meta.MetaServerID(cfg.Dir)
		}
		if err != nil {
			eng.Close()
			lis.Close()
			c.t.Fatalf("testcluster: meta server id: %v", err)
		}
		cfg.Engine = eng
		cfg.HA = &meta.HAConfig{Engine: eng, ElectionTTL: time.Second, ID: id, Advertise: lis.Addr().String()}
	}
	svc, err := meta.Open(c.ctx, cfg)
	if err != nil {
		lis.Close()
		c.t.Fatalf("testcluster: open meta service: %v", err)
	}
	c.mu.Lock()
	c.metaAddr, c.metaSvc = lis.Addr().String(), svc
	c.metaStop = c.serve("meta service", func(ctx context.Context) error { return svc.Serve(ctx, lis) }, nil)
	c.mu.Unlock()
}

// StopMeta stops the meta service and returns what its Serve returned.
func (c *Cluster) StopMeta() error {
	c.mu.Lock()
	stop := c.metaStop
	c.metaStop, c.metaSvc = nil, nil
	c.mu.Unlock()
	if stop == nil {
		return nil
	}
	return stop()
}

// DataServers is the number of data servers.
func (c *Cluster) DataServers() int { return len(c.data) }

// DataDir is the state directory (and target) of data server i (0-based).
func (c *Cluster) DataDir(i int) string { return c.data[i].dir }

// DataDirs are the state directories of the data servers.
func (c *Cluster) DataDirs() []string {
	dirs := make([]string, len(c.data))
	for i, ds := range c.data {
		dirs[i] = ds.dir
	}
	return dirs
}

// DataAddr is the address data server i (0-based) listens on, or last
// listened on if stopped.
func (c *Cluster) DataAddr(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.data[i].addr
}

// DataServer is the running data server i (0-based), e.g. to run a scrub
// pass with its Scrub method; nil while it is stopped.
func (c *Cluster) DataServer(i int) *data.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.data[i].srv
}

// StartData starts stopped data server i (0-based), again on the same
// directory (same identity): on a new port, or with Options.KeepDataAddrs
// on its previous address when free.
func (c *Cluster) StartData(i int) {
	c.t.Helper()
	c.mu.Lock()
	ds := c.data[i]
	running, addr := ds.stop != nil, ds.addr
	c.mu.Unlock()
	if running {
		c.t.Fatalf("testcluster: data server %d is running", i)
	}
	if addr == "" || !c.opts.KeepDataAddrs {
		addr = "127.0.0.1:0"
	}
	if c.opts.Processes {
		addr, stop := c.startDataProc(i, addr)
		c.mu.Lock()
		ds.addr, ds.stop = addr, stop
		c.mu.Unlock()
		return
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		lis, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		c.t.Fatalf("testcluster: listen for data server %d: %v", i, err)
	}
	cfg := data.Config{Dir: ds.dir, MetaAddr: c.MetaAddr(), SyncBandwidth: c.opts.SyncBandwidth,
		ScrubRate: c.opts.ScrubRate, Logger: c.opts.Logger, FS: c.opts.FS}
	var front func()
	if c.opts.Front != nil {
		cfg.Advertise, front = c.opts.Front(i, lis.Addr().String())
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
		c.t.Fatalf("testcluster: open data server %d in %s: %v", i, ds.dir, err)
	}
	stop := c.serve("data server "+strconv.Itoa(i), func(ctx context.Context) error { return srv.Serve(ctx, lis) }, front)
	c.mu.Lock()
	ds.addr, ds.srv, ds.stop = lis.Addr().String(), srv, stop
	c.mu.Unlock()
}

// StopData stops data server i (0-based) gracefully; its state stays. It
// returns what the server's Serve returned (nil if it was not running).
func (c *Cluster) StopData(i int) error {
	c.mu.Lock()
	ds := c.data[i]
	stop := ds.stop
	ds.stop, ds.srv = nil, nil
	c.mu.Unlock()
	if stop == nil {
		return nil
	}
	return stop()
}

// serve runs fn in a goroutine with a context canceled by the returned
// stop function (or at the end of the test), which runs before first,
// then waits for fn and returns its error. An error other than
// context.Canceled of a server that was not stopped fails the test.
func (c *Cluster) serve(what string, fn func(ctx context.Context) error, before func()) func() error {
	ctx, cancel := context.WithCancel(c.ctx)
	done := make(chan struct{})
	var err error
	var stopped atomic.Bool
	c.wg.Go(func() {
		defer close(done)
		err = fn(ctx)
		if !stopped.Load() && err != nil && !errors.Is(err, context.Canceled) {
			c.t.Errorf("testcluster: %s: %v", what, err)
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
