package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/client"
	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/testcluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// haCluster is several weft meta processes over one real etcd, data
// servers and mounts given every meta address.
type haCluster struct {
	*failCluster
	etcd  string
	metas []*haMeta
}

type haMeta struct {
	name, dir, addr string
	proc            *testcluster.Proc
}

// newHACluster starts etcd, n meta servers (the first is started alone
// and elected manager before the others join) and data data servers.
func newHACluster(t *testing.T, n, data int) *haCluster {
	t.Helper()
	srv := etcdtest.Start(t)
	c := &haCluster{failCluster: newProcCluster(t), etcd: strings.Join(srv.Endpoints, ",")}
	for i := 1; i <= n; i++ {
		m := c.startMeta(i)
		if i == 1 {
			c.waitFor("meta1 to be elected manager", failWait, func() bool {
				st, err := fetchStatus(context.Background(), m.addr)
				return err == nil && managerOf(st) == m.addr
			})
		}
	}
	c.metaAddr = c.addrs()
	for range data {
		c.addData()
	}
	// Runs after the mounts' cleanups, before the processes are killed.
	t.Cleanup(func() {
		rest := c.addrs()
		c.checkFsck(strings.Split(rest, ",")[0], rest != "")
	})
	c.waitFor(fmt.Sprintf("%d data servers online and HEALTH_OK", data), failWait, func() bool {
		st, err := fetchStatus(context.Background(), c.metaAddr)
		return err == nil && onlineCount(st) == data && healthLine(st) == healthOK
	})
	return c
}

// startMeta starts meta server i (from 1) on the cluster's etcd.
func (c *haCluster) startMeta(i int) *haMeta {
	c.t.Helper()
	m := &haMeta{name: fmt.Sprintf("meta%d", i), dir: filepath.Join(c.base, fmt.Sprintf("meta%d", i))}
	m.proc = c.start(m.name, "meta", "--dir", m.dir, "--listen", "127.0.0.1:0", "--engine", "etcd",
		"--etcd-endpoints", c.etcd, "--heartbeat-interval", failHeartbeat.String(), "--failure-timeout", failTimeout.String(),
		"--election-ttl", "2s")
	c.waitFor("the address of "+m.name, 30*time.Second, func() bool {
		addr, err := readAddressFile(m.dir)
		m.addr = addr
		return err == nil || !m.proc.Running()
	})
	if !m.proc.Running() {
		c.t.Fatalf("%s exited at start: %v", m.name, m.proc.Err())
	}
	c.metas = append(c.metas, m)
	return m
}

// addrs lists the addresses of the running meta servers.
func (c *haCluster) addrs() string {
	var out []string
	for _, m := range c.metas {
		if m.proc.Running() {
			out = append(out, m.addr)
		}
	}
	return strings.Join(out, ",")
}

// managerOf returns the address of the meta server st marks manager, ""
// if none or several are.
func managerOf(st *weftv1.StatusResponse) string {
	var found []string
	for _, m := range st.GetMetaServers() {
		if m.GetManager() {
			found = append(found, m.GetAddress())
		}
	}
	if len(found) != 1 {
		return ""
	}
	return found[0]
}

// heartbeatAnswered reports whether the meta server at addr answers a
// heartbeat itself (as the manager: a follower would forward it).
func heartbeatAnswered(addr string) bool {
	cc, err := rpc.Dial(addr)
	if err != nil {
		return false
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	// Server id 0 is never registered: the manager answers unknown_server.
	resp, err := weftv1.NewMetaClient(cc).Heartbeat(ctx, &weftv1.HeartbeatRequest{ServerId: 0})
	return err == nil && resp.GetUnknownServer()
}

// TestHAManagerElection runs two and three meta servers over one etcd:
// every one of them reports the same single manager, data servers
// registered through any of them are online; SIGKILL of the manager
// elects another, which answers heartbeats and Status within seconds
// (logged), without marking the data servers offline, and the cluster is
// HEALTH_OK again.
func TestHAManagerElection(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d meta servers", n), func(t *testing.T) {
			c := newHACluster(t, n, 2)
			var managers []string
			for _, m := range c.metas {
				var st *weftv1.StatusResponse
				c.waitFor(fmt.Sprintf("%s to list %d meta servers", m.name, n), failWait, func() bool {
					var err error
					st, err = fetchStatus(context.Background(), m.addr)
					return err == nil && len(st.GetMetaServers()) == n
				})
				managers = append(managers, managerOf(st))
			}
			for i, mg := range managers {
				if mg != c.metas[0].addr {
					t.Errorf("%s reports manager %q, want %s (meta1)", c.metas[i].name, mg, c.metas[0].addr)
				}
			}
			code, out, errOut := runWeft(t, "status", "--meta", c.addrs())
			if code != 0 || !strings.Contains(out, "manager") {
				t.Errorf("weft status: exit %d, no manager shown:\n%s%s", code, out, errOut)
			}
			code, out, errOut = runWeft(t, "status", "--json", "--meta", c.addrs())
			var js statusJSON
			if err := json.Unmarshal([]byte(out), &js); code != 0 || err != nil || len(js.MetaServers) != n {
				t.Errorf("weft status --json: exit %d, %d meta servers listed (want %d):\n%s%s", code, len(js.MetaServers), n, out, errOut)
			}

			// A client given one meta address learns the others.
			cl, err := client.New(context.Background(), client.Config{MetaAddr: c.metas[n-1].addr, MountPoint: "ha-test"})
			if err != nil {
				t.Fatal(err)
			}
			if got := cl.MetaAddresses(); len(got) != n {
				t.Errorf("client given %s knows meta servers %v, want all %d", c.metas[n-1].addr, got, n)
			}
			cl.Close()

			killed := time.Now()
			c.metas[0].proc.Kill(t, syscall.SIGKILL)
			rest := c.addrs()
			var newManager string
			sawOffline := ""
			c.waitFor("a new manager answering heartbeats", failWait, func() bool {
				st, err := fetchStatus(context.Background(), rest)
				if err != nil {
					return false
				}
				for _, s := range st.GetServers() {
					if !s.GetOnline() && managerOf(st) != "" {
						sawOffline = fmt.Sprintf("data server %d offline", s.GetId())
					}
				}
				newManager = managerOf(st)
				return newManager != "" && newManager != c.metas[0].addr && heartbeatAnswered(newManager)
			})
			failover := time.Since(killed)
			t.Logf("failover with %d meta servers: %v from SIGKILL of the manager to a new manager answering heartbeats (election TTL 2s)", n, failover.Round(time.Millisecond))
			c.waitFor("HEALTH_OK after the failover", failWait, func() bool {
				st, err := fetchStatus(context.Background(), rest)
				return err == nil && onlineCount(st) == 2 && healthLine(st) == healthOK && managerOf(st) == newManager
			})
			if sawOffline != "" {
				t.Errorf("the new manager marked a live data server offline after taking over: %s", sawOffline)
			}
			for _, d := range c.data {
				if !d.proc.Running() {
					t.Errorf("data server %d exited during the failover", d.n)
				}
			}
		})
	}
}

// haWorkload creates, writes and renames files in dir until stop is
// closed, counting operations; the first error is returned.
func haWorkload(dir string, stop <-chan struct{}, ops *atomic.Int64, stall *stallMeter) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		began := time.Now()
		p := filepath.Join(dir, fmt.Sprintf("f%d", i))
		if err := os.WriteFile(p, []byte(p), 0o644); err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
		if err := os.Rename(p, p+".r"); err != nil {
			return fmt.Errorf("rename %s: %w", p, err)
		}
		if i%3 == 0 {
			if err := os.Remove(p + ".r"); err != nil {
				return fmt.Errorf("remove %s.r: %w", p, err)
			}
		}
		if i%50 == 0 {
			if err := os.Mkdir(filepath.Join(dir, fmt.Sprintf("d%d", i)), 0o755); err != nil {
				return fmt.Errorf("mkdir: %w", err)
			}
		}
		ops.Add(1)
		stall.record(time.Since(began), p)
	}
}

// TestHAMountSurvivesMetaKill mounts the file system twice with every meta
// address; while both mounts create, rename and remove files, the meta
// server they talk to (also the manager) is killed with SIGKILL. The
// applications see no error, and weft fsck then finds nothing wrong.
func TestHAMountSurvivesMetaKill(t *testing.T) {
	testcluster.NeedFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("mounts and kills servers: run as root")
	}
	c := newHACluster(t, 3, 2)
	mnts := []string{c.mount(), c.mount()}
	stop := make(chan struct{})
	var ops atomic.Int64
	var stall stallMeter
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for i, mnt := range mnts {
		for j := range 2 {
			wg.Go(func() { errs <- haWorkload(filepath.Join(mnt, fmt.Sprintf("w%d-%d", i, j)), stop, &ops, &stall) })
		}
	}
	started := time.Now()
	c.waitFor("the workload to run", failWait, func() bool { return ops.Load() > 200 })
	before := ops.Load()
	t.Logf("before the kill: %d operations in %v", before, time.Since(started).Round(time.Millisecond))
	c.metas[0].proc.Kill(t, syscall.SIGKILL)
	killed := time.Now()
	c.waitFor("the workload to go on after the kill", failWait, func() bool { return ops.Load() > before+500 })
	longest, where := stall.get()
	t.Logf("workload went on after SIGKILL of the meta server in use: %d more operations in %v; longest create+rename: %v (%s)",
		ops.Load()-before, time.Since(killed).Round(time.Millisecond), longest.Round(time.Millisecond), where)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("application error: %v", err)
		}
	}
	rest := c.addrs()
	c.waitFor("HEALTH_OK", failWait, func() bool {
		st, err := fetchStatus(context.Background(), rest)
		return err == nil && healthLine(st) == healthOK
	})
}
