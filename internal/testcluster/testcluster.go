// Package testcluster starts a weft cluster inside a test process: the
// meta service and data servers run the same Open/Serve code as the
// daemons, over real gRPC on 127.0.0.1 listeners, with their state in the
// test's temporary directory; optionally the file system is mounted with
// FUSE. Everything is stopped and unmounted when the test ends.
package testcluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/client"
	"github.com/weft-fs/weft/data"
	"github.com/weft-fs/weft/internal/disk"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/testservers"
	"github.com/weft-fs/weft/meta"
	"github.com/weft-fs/weft/mount"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Options configures a test cluster. Zero values take the defaults.
type Options struct {
	// DataServers is the number of data servers; default 3.
	DataServers int
	// ChunkSize and StripeCount set the cluster's default layout; zero
	// keeps the meta service's defaults (1 MiB, 4).
	ChunkSize   uint32
	StripeCount uint32
	// Replicas is the replica count of the default layout; zero keeps the
	// meta service's default (1). Chains of this width are made as soon as
	// enough data servers registered; Start waits for them to be healthy.
	Replicas uint32
	// Mount mounts the file system with FUSE in a temporary directory
	// (skipping the test if FUSE is not available).
	Mount bool
	// MountOptions are passed to mount.Mount; FsName defaults to "weft".
	MountOptions mount.Options
	// HeartbeatInterval and FailureTimeout configure the cluster manager;
	// defaults 200ms and 2s, short to keep tests fast.
	HeartbeatInterval time.Duration
	FailureTimeout    time.Duration
	// RepairDelay is how long a replicated chain member may stay offline
	// before it is replaced; zero keeps the manager's default (10m).
	RepairDelay time.Duration
	// SyncBandwidth and ScrubRate configure every data server (see
	// data.Config); zero keeps their defaults, a negative ScrubRate turns
	// the background scrub off.
	SyncBandwidth int64
	ScrubRate     int64
	// Logger receives every component's log; default: warnings and errors
	// to t.Log ($WEFT_TEST_LOG=debug|info for more).
	Logger *slog.Logger
	// FS is the file system of the servers' state (see testservers); a
	// *disk.Mem lets PowerLoss simulate a power loss.
	FS disk.FS
}

// Cluster is a running test cluster. Its methods may be called from the
// test goroutine; they fail the test on error.
type Cluster struct {
	t    testing.TB
	opts Options
	srv  *testservers.Servers
	log  *slog.Logger

	mountDir    string
	mountClient *client.Client
	mnt         *mount.FS
	mntDone     chan struct{}
}

// Start starts a cluster and registers its shutdown with t.Cleanup. It
// returns once every data server is online in the meta service's status
// (and the file system is mounted if asked).
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.DataServers <= 0 {
		opts.DataServers = 3
	}
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = 200 * time.Millisecond
	}
	if opts.FailureTimeout <= 0 {
		opts.FailureTimeout = 2 * time.Second
	}
	if opts.MountOptions.FsName == "" {
		opts.MountOptions.FsName = "weft"
	}
	c := &Cluster{t: t, opts: opts}
	c.log = opts.Logger
	if c.log == nil {
		c.log = newTestLogger(t)
		// Registered first, so run last: the servers log while stopping.
		t.Cleanup(func() { c.log.Handler().(*testHandler).w.close() })
	}
	c.srv = testservers.Start(t, testservers.Options{
		DataServers:       opts.DataServers,
		Layout:            &weftv1.Layout{ChunkSize: opts.ChunkSize, StripeCount: opts.StripeCount, Replicas: opts.Replicas},
		HeartbeatInterval: opts.HeartbeatInterval,
		FailureTimeout:    opts.FailureTimeout,
		RepairDelay:       opts.RepairDelay,
		SyncBandwidth:     opts.SyncBandwidth,
		ScrubRate:         opts.ScrubRate,
		Logger:            c.log,
		FS:                opts.FS,
		NoChainWait:       true,
		KeepDataAddrs:     true,
		CheckErrors:       true,
	})
	// Registered after the servers' shutdown, so run before it.
	t.Cleanup(c.shutdown)
	c.WaitOnline(opts.DataServers)
	if opts.Replicas > 1 && int(opts.Replicas) <= opts.DataServers {
		c.WaitHealthy()
	}
	if opts.Mount {
		c.mount()
	}
	return c
}

func (c *Cluster) mount() {
	c.t.Helper()
	if _, err := os.Stat("/dev/fuse"); err != nil {
		c.t.Skipf("testcluster: FUSE is not available (%v); install fuse3", err)
	}
	c.mountDir = filepath.Join(c.Dir(), "mnt")
	if err := os.MkdirAll(c.mountDir, 0o755); err != nil {
		c.t.Fatalf("testcluster: %v", err)
	}
	cl, err := client.New(context.Background(), client.Config{MetaAddr: c.MetaAddr(), MountPoint: c.mountDir, Logger: c.log})
	if err != nil {
		c.t.Fatalf("testcluster: client for the mount: %v", err)
	}
	m, err := mount.Mount(cl, c.mountDir, c.opts.MountOptions)
	if err != nil {
		cl.Close()
		c.t.Fatalf("testcluster: mount on %s: %v", c.mountDir, err)
	}
	c.mountClient, c.mnt, c.mntDone = cl, m, make(chan struct{})
	go func() {
		m.Wait()
		close(c.mntDone)
	}()
}

// MetaAddr is the meta service's address.
func (c *Cluster) MetaAddr() string { return c.srv.MetaAddr() }

// Meta is the in-process meta service.
func (c *Cluster) Meta() *meta.Service { return c.srv.Meta() }

// Dir is the directory holding every server's state.
func (c *Cluster) Dir() string { return c.srv.Dir() }

// MountDir is where the file system is mounted ("" without Options.Mount).
func (c *Cluster) MountDir() string { return c.mountDir }

// MountClient is the client behind the FUSE mount (nil without a mount).
func (c *Cluster) MountClient() *client.Client { return c.mountClient }

// DataDir is the state directory (and target) of data server i (0-based).
func (c *Cluster) DataDir(i int) string { return c.srv.DataDir(i) }

// DataAddr is the address data server i (0-based) listens on, or last
// listened on if stopped.
func (c *Cluster) DataAddr(i int) string { return c.srv.DataAddr(i) }

// DataServer is the running data server i (0-based), e.g. to run a scrub
// pass with its Scrub method; nil while it is stopped.
func (c *Cluster) DataServer(i int) *data.Server { return c.srv.DataServer(i) }

// NewClient returns a new client of the cluster (its own session), closed
// when the test ends.
func (c *Cluster) NewClient() *client.Client {
	c.t.Helper()
	cl, err := client.New(context.Background(), client.Config{MetaAddr: c.MetaAddr(), MountPoint: "testcluster:" + c.t.Name(), Logger: c.log})
	if err != nil {
		c.t.Fatalf("testcluster: new client: %v", err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

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
	online := 0
	c.WaitStatus(what, func(st *weftv1.StatusResponse) bool {
		online = 0
		for _, s := range st.GetServers() {
			if s.GetOnline() {
				online++
			}
		}
		return ok(online)
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
	cc, err := rpc.Dial(c.MetaAddr())
	if err != nil {
		c.t.Fatalf("testcluster: %v", err)
	}
	defer cc.Close()
	mc := weftv1.NewMetaClient(cc)
	deadline := time.Now().Add(30*time.Second + 2*c.opts.FailureTimeout)
	var last error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := mc.Status(ctx, &weftv1.StatusRequest{})
		cancel()
		if err == nil && ok(st) {
			return
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("testcluster: timed out waiting for %s (last status error: %v)", what, last)
}

// StopData stops data server i (0-based) gracefully; its state stays.
func (c *Cluster) StopData(i int) {
	c.t.Helper()
	if c.srv.DataServer(i) == nil {
		c.t.Fatalf("testcluster: data server %d is already stopped", i)
	}
	if err := c.srv.StopData(i); err != nil {
		c.t.Errorf("testcluster: data server %d stopped with: %v", i, err)
	}
}

// StartData starts stopped data server i (0-based) again on the same
// directory (same identity), on its previous address when free, and waits
// until it listens.
func (c *Cluster) StartData(i int) {
	c.t.Helper()
	if c.srv.DataServer(i) != nil {
		c.t.Fatalf("testcluster: data server %d is running", i)
	}
	c.srv.StartData(i)
}

// PowerLoss simulates a power loss of the machine the cluster runs on:
// the mount goes away (what its client had not sent is lost), every
// server stops, and all start again on fs, what the loss left of their
// file system (disk.Mem.CrashCopy, taken by the caller at the instant of
// the loss); then the file system is mounted again. It returns once
// every data server is back online (and, with replicas, every chain
// healthy).
func (c *Cluster) PowerLoss(fs disk.FS) {
	c.t.Helper()
	mounted := c.mnt != nil
	c.shutdown()
	c.mnt = nil
	c.srv.PowerLoss(fs)
	c.WaitOnline(c.opts.DataServers)
	if c.opts.Replicas > 1 && int(c.opts.Replicas) <= c.opts.DataServers {
		c.WaitHealthy()
	}
	if mounted {
		c.mount()
	}
}

// shutdown unmounts and closes the mount's client; the servers stop after
// it. It never leaves a mount behind: a mount that will not go away is
// detached.
func (c *Cluster) shutdown() {
	if c.mnt == nil {
		return
	}
	var err error
	for i := 0; i < 20; i++ {
		if err = c.mnt.Unmount(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		c.t.Errorf("testcluster: unmount %s: %v; detaching it", c.mountDir, err)
		syscall.Unmount(c.mountDir, syscall.MNT_DETACH)
	}
	select {
	case <-c.mntDone:
	case <-time.After(10 * time.Second):
		c.t.Errorf("testcluster: the FUSE server of %s did not stop", c.mountDir)
	}
	if err := c.mountClient.Close(); err != nil {
		c.t.Errorf("testcluster: close the mount's client: %v", err)
	}
}

// newTestLogger logs to t.Log at the level of $WEFT_TEST_LOG (default
// warn), and drops lines once the test is over.
func newTestLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	switch strings.ToLower(os.Getenv("WEFT_TEST_LOG")) {
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "error":
		level = slog.LevelError
	}
	w := &tbWriter{t: t}
	return slog.New(&testHandler{Handler: slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}), w: w})
}

// testHandler is a slog handler whose writer can be closed.
type testHandler struct {
	slog.Handler
	w *tbWriter
}

func (h *testHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &testHandler{Handler: h.Handler.WithAttrs(as), w: h.w}
}

func (h *testHandler) WithGroup(name string) slog.Handler {
	return &testHandler{Handler: h.Handler.WithGroup(name), w: h.w}
}

// tbWriter writes log lines to t.Log until closed.
type tbWriter struct {
	mu     sync.Mutex
	t      testing.TB
	closed bool
}

var _ io.Writer = (*tbWriter)(nil)

func (w *tbWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *tbWriter) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}
