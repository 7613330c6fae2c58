package testcluster

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// With Options.Processes the servers are "weft meta" and "weft data"
// processes of the weft binary (see Main), their output in Dir()/logs;
// the options map to the daemons' flags.

// metaArgs are the flags of weft meta for the options.
func (c *Cluster) metaArgs(listen string) []string {
	o := c.opts
	args := []string{"meta", "--dir", c.metaCfg.Dir, "--listen", listen,
		"--heartbeat-interval", o.HeartbeatInterval.String()}
	dur := func(flag string, d time.Duration) {
		if d > 0 {
			args = append(args, flag, d.String())
		}
	}
	dur("--failure-timeout", o.FailureTimeout)
	dur("--repair-delay", o.RepairDelay)
	dur("--session-lease", o.SessionLease)
	dur("--open-grace", o.OpenGrace)
	num := func(flag string, v uint32) {
		if v > 0 {
			args = append(args, flag, strconv.FormatUint(uint64(v), 10))
		}
	}
	num("--chunk-size", o.Layout.GetChunkSize())
	num("--stripe-count", o.Layout.GetStripeCount())
	num("--replicas", o.Layout.GetReplicas())
	if c.etcd != nil {
		args = append(args, "--engine", "etcd", "--etcd-endpoints", strings.Join(c.etcd.Endpoints, ","), "--election-ttl", "1s")
	}
	return args
}

// startMetaProc starts weft meta on addr and waits for its address file.
func (c *Cluster) startMetaProc(addr string) (string, func() error) {
	c.t.Helper()
	dir := c.metaCfg.Dir
	os.Remove(filepath.Join(dir, "address"))
	p := c.startProc("meta", c.metaArgs(addr)...)
	return c.waitAddress(p, dir), c.stopProc(p)
}

// startDataProc starts weft data i listening on addr and waits for its
// address file.
func (c *Cluster) startDataProc(i int, addr string) (string, func() error) {
	c.t.Helper()
	ds := c.data[i]
	if addr == "127.0.0.1:0" {
		addr = freePort(c.t)
	}
	args := []string{"data", "--dir", ds.dir, "--listen", addr, "--meta", c.MetaAddr()}
	if c.opts.Front != nil {
		// A weft data process keeps its Unix socket, which a client on
		// this host would use instead of the front.
		c.t.Fatal("testcluster: Front needs servers in process (Processes is set)")
	}
	if o := c.opts; o.SyncBandwidth > 0 {
		args = append(args, "--sync-bandwidth", strconv.FormatInt(o.SyncBandwidth, 10))
	}
	if o := c.opts; o.ScrubRate != 0 {
		args = append(args, "--scrub-rate", strconv.FormatInt(max(o.ScrubRate, 0), 10))
	}
	os.Remove(filepath.Join(ds.dir, "address"))
	p := c.startProc("data"+strconv.Itoa(i+1), args...)
	stop := c.stopProc(p)
	return c.waitAddress(p, ds.dir), stop
}

// startProc starts a server process logging to Dir()/logs/NAME.log.
func (c *Cluster) startProc(name string, args ...string) *Proc {
	c.t.Helper()
	logs := filepath.Join(c.dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		c.t.Fatalf("testcluster: %v", err)
	}
	// Killed by killProcs, after the final fsck, however late it started.
	p := startProc(c.t, name, ProcOptions{Log: filepath.Join(logs, name+".log")}, args...)
	c.mu.Lock()
	c.procs[name] = p
	c.allProcs = append(c.allProcs, p)
	c.mu.Unlock()
	return p
}

// killProcs kills every server process at the end of the test.
func (c *Cluster) killProcs() {
	c.mu.Lock()
	ps := c.allProcs
	c.mu.Unlock()
	for _, p := range ps {
		p.Kill(c.t, syscall.SIGKILL)
	}
}

// stopProc returns the function that stops p gracefully (SIGTERM) and
// returns its exit error.
func (c *Cluster) stopProc(p *Proc) func() error {
	return func() error {
		p.Kill(c.t, syscall.SIGTERM)
		return p.Err()
	}
}

// waitAddress waits until the server p writes its address file in dir.
func (c *Cluster) waitAddress(p *Proc, dir string) string {
	c.t.Helper()
	addr := ""
	WaitFor(c.t, "the address of "+p.Name, 30*time.Second, func() bool {
		if !p.Running() {
			log, _ := os.ReadFile(filepath.Join(c.dir, "logs", p.Name+".log"))
			c.t.Fatalf("testcluster: %s exited at start: %v\n%s", p.Name, p.Err(), log)
		}
		b, err := os.ReadFile(filepath.Join(dir, "address"))
		addr = strings.TrimSpace(string(b))
		return err == nil && addr != ""
	})
	return addr
}

// Proc is the process of a server of a cluster with Options.Processes:
// "meta" or "dataN" (N from 1); nil in process.
func (c *Cluster) Proc(name string) *Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.procs[name]
}

// KillData kills the process of data server i (0-based) with sig, as a
// crash does with SIGKILL, and waits for its exit; StartData starts it
// again. It needs Options.Processes.
func (c *Cluster) KillData(i int, sig syscall.Signal) {
	c.t.Helper()
	p := c.Proc("data" + strconv.Itoa(i+1))
	if p == nil {
		c.t.Fatal("testcluster: KillData needs Options.Processes")
	}
	p.Kill(c.t, sig)
	c.StopData(i)
}

// KillMeta is KillData for the meta service.
func (c *Cluster) KillMeta(sig syscall.Signal) {
	c.t.Helper()
	p := c.Proc("meta")
	if p == nil {
		c.t.Fatal("testcluster: KillMeta needs Options.Processes")
	}
	p.Kill(c.t, sig)
	c.StopMeta()
}

// freePort returns a free port on 127.0.0.1.
func freePort(t interface{ Fatalf(string, ...any) }) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testcluster: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}
