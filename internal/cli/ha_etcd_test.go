package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/internal/faultproxy"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/testcluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// These tests run several weft meta processes over one real etcd, with
// the network between a meta server and etcd cut by a faultproxy, and
// mounts that each talk to one meta server only.

// newHAClusterWithProxy starts etcd, meta1 reaching etcd only through a
// faultproxy (elected manager before meta2 starts), meta2 reaching etcd
// directly, and data data servers given both meta addresses (meta1 first,
// so they register and heartbeat with it).
func newHAClusterWithProxy(t *testing.T, data int) (*haCluster, *faultproxy.Proxy) {
	t.Helper()
	testcluster.NeedFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("mounts the file system and cuts a meta server off etcd: run as root")
	}
	srv := etcdtest.Start(t)
	etcd := strings.Join(srv.Endpoints, ",")
	proxy, err := faultproxy.New(srv.Endpoints[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	c := &haCluster{failCluster: newProcCluster(t), etcd: proxy.Addr()}
	m1 := c.startMeta(1)
	c.waitFor("meta1 to be elected manager", failWait, func() bool {
		st, err := fetchStatus(context.Background(), m1.addr)
		return err == nil && managerOf(st) == m1.addr
	})
	c.etcd = etcd
	c.startMeta(2)
	c.metaAddr = c.addrs()
	for range data {
		c.addData()
	}
	// Runs after the mounts' cleanups, before the processes are killed.
	t.Cleanup(func() {
		rest := c.addrs()
		c.checkFsck(strings.Split(rest, ",")[0], rest != "")
	})
	c.waitFor(fmt.Sprintf("%d data servers online, HEALTH_OK, two meta servers listed", data), failWait, func() bool {
		st, err := fetchStatus(context.Background(), c.metas[1].addr)
		return err == nil && onlineCount(st) == data && healthLine(st) == healthOK && len(st.GetMetaServers()) == 2
	})
	return c, proxy
}

// mountOn runs weft mount given the one meta address addr and returns the
// mount point and the process.
func mountOn(c *failCluster, addr string) (string, *testcluster.Proc) {
	c.t.Helper()
	saved := c.metaAddr
	c.metaAddr = addr
	defer func() { c.metaAddr = saved }()
	return lockMount(c)
}

// actsAsManager reports whether the meta server at addr answers a
// heartbeat marked as forwarded by another meta server: only the elected
// manager does (a follower never forwards such a call again and refuses
// it), so this tells whether addr itself does the manager's duties.
func actsAsManager(addr string) bool {
	cc, err := rpc.Dial(addr)
	if err != nil {
		return false
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "weft-forwarded", "1")
	resp, err := weftv1.NewMetaClient(cc).Heartbeat(ctx, &weftv1.HeartbeatRequest{ServerId: 0})
	return err == nil && resp.GetUnknownServer()
}

// chainsOf describes every chain (id, members and their states) of st.
func chainsOf(st *weftv1.StatusResponse) string {
	var parts []string
	for _, ch := range st.GetChainList() {
		var ms []string
		for _, m := range ch.GetMembers() {
			ms = append(ms, fmt.Sprintf("%d/%s", m.GetTargetId(), m.GetState()))
		}
		parts = append(parts, fmt.Sprintf("%d:[%s]", ch.GetId(), strings.Join(ms, " ")))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// offlineWatch polls the status at addr until stopped and remembers the
// first data server it saw offline.
type offlineWatch struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	seen string
}

func watchOffline(addr string) *offlineWatch {
	w := &offlineWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			st, err := fetchStatus(context.Background(), addr)
			if err != nil {
				continue
			}
			for _, s := range st.GetServers() {
				if !s.GetOnline() {
					w.mu.Lock()
					if w.seen == "" {
						w.seen = fmt.Sprintf("data server %d (%s) offline at %s", s.GetId(), s.GetAddress(), time.Now().Format("15:04:05.000"))
					}
					w.mu.Unlock()
				}
			}
		}
	}()
	return w
}

// end stops the watch and returns what it saw offline ("" if nothing).
func (w *offlineWatch) end() string {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen
}

// finishWithin runs f in a goroutine and fails the test if it does not return
// within timeout (a file system call that hangs).
func finishWithin(t *testing.T, what string, timeout time.Duration, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(timeout):
		t.Fatalf("%s: no answer after %v", what, timeout)
	}
}

// writeAndCheck writes n files of different sizes in dir (so they land
// on the chains of every data server) and reads them back.
func writeAndCheck(dir, tag string, n int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("%s-%d", tag, i))
		want := pattern(p, 4096+i*7919)
		if err := os.WriteFile(p, want, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		got, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("%s reads back %d bytes that differ from the %d written", p, len(got), len(want))
		}
	}
	return nil
}

// TestHAManagerLosesEtcd cuts the cluster manager (meta1) off etcd while
// it stays reachable by everything else: the connection to etcd refused
// (reset), or silently dropping every byte (a partition only timeouts
// reveal). The other meta server becomes manager (the takeover time is
// logged), the cut-off one stops doing the manager's duties, the data
// servers (registered with meta1) stay online and serving, chains do not
// change, and a mount on the surviving meta server keeps working. Healed,
// the old manager comes back as a follower and the cluster is HEALTH_OK.
func TestHAManagerLosesEtcd(t *testing.T) {
	for _, tc := range []struct {
		name string
		cut  func(*faultproxy.Proxy)
	}{
		{"refused", (*faultproxy.Proxy).Cut},
		{"blackholed", (*faultproxy.Proxy).Blackhole},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, proxy := newHAClusterWithProxy(t, 2)
			m1, m2 := c.metas[0], c.metas[1]
			mnt, _ := mountOn(c.failCluster, m2.addr)
			finishWithin(t, "write through the mount before the cut", failWait, func() error { return writeAndCheck(filepath.Join(mnt, "before"), "f", 8) })
			st, err := fetchStatus(context.Background(), m2.addr)
			if err != nil {
				t.Fatal(err)
			}
			chainsBefore := chainsOf(st)

			watch := watchOffline(m2.addr)
			cut := time.Now()
			tc.cut(proxy)
			t.Logf("%s: meta1 cut off etcd at %s", tc.name, cut.Format("15:04:05.000"))
			c.waitFor("meta2 to answer as manager", failWait, func() bool { return actsAsManager(m2.addr) })
			took := time.Since(cut)
			c.waitFor("status through meta2 to show it the one manager, answering heartbeats", failWait, func() bool {
				st, err := fetchStatus(context.Background(), m2.addr)
				return err == nil && managerOf(st) == m2.addr && heartbeatAnswered(m2.addr)
			})
			t.Logf("%s: meta2 answers as cluster manager %v after meta1 was cut off etcd (election TTL 2s, heartbeat %v, failure timeout %v)",
				tc.name, took.Round(time.Millisecond), failHeartbeat, failTimeout)
			c.waitFor("meta1 to stop acting as manager", failWait, func() bool { return !actsAsManager(m1.addr) })

			// Stay cut off for several failure timeouts: long enough for
			// fenced data servers to be declared offline if heartbeats
			// did not reach the new manager.
			time.Sleep(3 * failTimeout)
			finishWithin(t, "write through the mount on meta2 while meta1 is cut off", failWait, func() error {
				return writeAndCheck(filepath.Join(mnt, "during"), "f", 8)
			})
			st, err = fetchStatus(context.Background(), m2.addr)
			if err != nil {
				t.Fatalf("status through meta2 while meta1 is cut off: %v", err)
			}
			if mg := managerOf(st); mg != m2.addr {
				t.Errorf("status through meta2 while meta1 is cut off: manager %q, want exactly one, meta2 (%s): %v", mg, m2.addr, st.GetMetaServers())
			}
			if n := onlineCount(st); n != 2 {
				t.Errorf("status through meta2 while meta1 is cut off: %d data servers online, want 2", n)
			}
			if actsAsManager(m1.addr) {
				t.Errorf("meta1, cut off etcd, answers as the cluster manager")
			}
			code, out, errOut := runWeft(t, "status", "--meta", m2.addr)
			if code != 0 || strings.Count(out, "manager") < 1 {
				t.Errorf("weft status --meta meta2 while meta1 is cut off: exit %d\n%s%s", code, out, errOut)
			}

			healed := time.Now()
			proxy.Restore()
			for _, m := range []*haMeta{m2, m1} {
				c.waitFor(m.name+" to list both meta servers, meta2 the one manager, HEALTH_OK", failWait, func() bool {
					st, err := fetchStatus(context.Background(), m.addr)
					return err == nil && len(st.GetMetaServers()) == 2 && managerOf(st) == m2.addr &&
						onlineCount(st) == 2 && healthLine(st) == healthOK
				})
			}
			t.Logf("%s: meta1 back as a follower %v after the heal", tc.name, time.Since(healed).Round(time.Millisecond))
			if actsAsManager(m1.addr) {
				t.Errorf("meta1 answers as the cluster manager after the heal; meta2 is manager")
			}
			if !actsAsManager(m2.addr) {
				t.Errorf("meta2 no longer answers as the cluster manager after the heal")
			}
			if seen := watch.end(); seen != "" {
				t.Errorf("a live data server was marked offline: %s", seen)
			}
			st, err = fetchStatus(context.Background(), m1.addr)
			if err != nil {
				t.Fatal(err)
			}
			if got := chainsOf(st); got != chainsBefore {
				t.Errorf("chains changed while meta1 was cut off:\nbefore %s\nafter  %s", chainsBefore, got)
			}
			for _, d := range c.data {
				if !d.proc.Running() {
					t.Errorf("data server %d exited", d.n)
				}
			}
			for _, m := range c.metas {
				if !m.proc.Running() {
					t.Errorf("%s exited: %v", m.name, m.proc.Err())
				}
			}
			finishWithin(t, "write through the mount after the heal", failWait, func() error { return writeAndCheck(filepath.Join(mnt, "after"), "f", 4) })
		})
	}
}

// TestLocksAcrossMetaServers: two meta servers over one etcd, mount A
// given meta1 only and mount B meta2 only (a client stays on the meta
// server it was given while it answers, even after learning the other):
// flock excludes across them, F_GETLK through B reports A's lock and its
// pid, and an F_SETLKW waiting through B is granted when A unlocks.
func TestLocksAcrossMetaServers(t *testing.T) {
	testcluster.NeedFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("mounts the file system twice: run as root")
	}
	c := newHACluster(t, 2, 1)
	m1, m2 := c.metas[0], c.metas[1]
	mA, dA := mountOn(c.failCluster, m1.addr)
	mB, dB := mountOn(c.failCluster, m2.addr)
	pA, pB := startLockProc(t, "pA"), startLockProc(t, "pB")

	t.Run("flock", func(t *testing.T) {
		pA.t, pB.t = t, t
		pA.must("open " + filepath.Join(mA, "flocked"))
		pB.must("open " + filepath.Join(mB, "flocked"))
		pA.must("flock ex nb")
		pB.busy("flock ex nb")
		pB.busy("flock sh nb")
		pA.must("flock sh nb")
		pB.must("flock sh nb")
		pA.busy("flock ex nb")
		pB.must("flock un")
		pA.must("flock ex nb")
		// A waiting flock through B, granted when A unlocks.
		pB.send("flock ex")
		pB.noAnswer("flock ex")
		pA.must("flock un")
		if got := pB.answer("flock ex"); got != "ok" {
			t.Fatalf("waiting flock through meta2: %s", got)
		}
		pA.busy("flock sh nb")
		pB.must("close")
		pA.eventually("flock ex nb")
		pA.must("close")
	})

	t.Run("fcntl", func(t *testing.T) {
		pA.t, pB.t = t, t
		pA.must("open " + filepath.Join(mA, "ranged"))
		pB.must("open " + filepath.Join(mB, "ranged"))
		pA.must("lk wr 0 100")
		pB.busy("lk wr 50 10")
		pB.busy("lk rd 0 1")
		if got, want := pB.do("getlk wr 0 0"), fmt.Sprintf("wr %d 0 100", pA.pid); got != want {
			t.Fatalf("F_GETLK through meta2: %q, want A's lock %q", got, want)
		}
		if got, want := pB.do("getlk rd 99 10"), fmt.Sprintf("wr %d 0 100", pA.pid); got != want {
			t.Fatalf("F_GETLK through meta2: %q, want A's lock %q", got, want)
		}
		pB.must("lk wr 100 10")
		if got, want := pA.do("getlk rd 105 1"), fmt.Sprintf("wr %d 100 10", pB.pid); got != want {
			t.Fatalf("F_GETLK through meta1: %q, want B's lock %q", got, want)
		}
		// F_SETLKW through meta2 waits until A unlocks through meta1.
		pB.send("lk wr 0 50 w")
		pB.noAnswer("F_SETLKW")
		pA.must("lk un 0 0")
		if got := pB.answer("F_SETLKW"); got != "ok" {
			t.Fatalf("F_SETLKW through meta2 after the unlock through meta1: %s", got)
		}
		if got, want := pA.do("getlk rd 10 1"), fmt.Sprintf("wr %d 0 50", pB.pid); got != want {
			t.Fatalf("F_GETLK through meta1 after the grant: %q, want %q", got, want)
		}
		pA.busy("lk rd 0 1")
		pB.must("close") // releases B's POSIX locks
		pA.must("lk wr 0 0")
		pA.must("close")
	})

	// Each mount used the meta server it was given: neither failed over.
	for _, name := range []string{dA.Name, dB.Name} {
		b, _ := os.ReadFile(filepath.Join(c.base, "logs", name+".log"))
		if bytes.Contains(b, []byte("failing over")) {
			t.Errorf("%s failed over to another meta server: the locks were not taken through two meta servers\n%s", name, b)
		}
	}
	st, err := fetchStatus(context.Background(), m2.addr)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(st.GetSessionList()); n != 2 {
		t.Errorf("status lists %d client sessions, want the two mounts: %v", n, st.GetSessionList())
	}
}
