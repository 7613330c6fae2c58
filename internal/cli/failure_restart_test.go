package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/testcluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// These tests restart data servers on other ports than they had (a new
// incarnation at new addresses) and check that nobody goes on using the
// old ones: writes, fsyncs and reads work again within a bounded delay,
// and status does not say HEALTH_OK while they fail.

// opBound bounds one write-fsync-close of a new file, or one read, once
// the cluster says it is healthy: far more than it takes (milliseconds),
// far less than the client's own give-up time (30 s by default), so that
// a write stuck on a dead address fails the test.
const opBound = 20 * time.Second

// writeNewFile writes, fsyncs and closes a new file of size bytes in dir
// (one chunk per chain of the default layout at 1 MiB chunks), within
// opBound.
func writeNewFile(dir, name string, size int) error {
	done := make(chan error, 1)
	go func() {
		content := pattern(name, size)
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			done <- err
			return
		}
		if _, err := f.Write(content); err != nil {
			f.Close()
			done <- fmt.Errorf("write: %w", err)
			return
		}
		if err := f.Sync(); err != nil {
			f.Close()
			done <- fmt.Errorf("fsync: %w", err)
			return
		}
		done <- f.Close()
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	case <-time.After(opBound):
		return fmt.Errorf("%s: write, fsync and close did not finish within %v", name, opBound)
	}
}

// healthOf returns the health line of the cluster whose meta service mc
// answers.
func healthOf(mc weftv1.MetaClient) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := mc.Status(ctx, &weftv1.StatusRequest{})
	if err != nil {
		return "", err
	}
	return healthLine(st), nil
}

// waitHealthOK waits until status says HEALTH_OK and returns when it did.
func waitHealthOK(t *testing.T, mc weftv1.MetaClient, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		h, err := healthOf(mc)
		if err == nil && h == healthOK {
			return time.Now()
		}
		if err != nil {
			h = err.Error()
		}
		last = h
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no HEALTH_OK within %v; last: %s", timeout, last)
	return time.Time{}
}

// occupy listens on addr so that a server restarted there has to take
// another port; the listener is closed when the test ends.
func occupy(t *testing.T, addr string) {
	t.Helper()
	var l net.Listener
	var err error
	for range 100 { // the killed process's socket may linger a moment
		if l, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("occupy %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
}

// TestFailureRestartedDataServerNewPorts: under weft up (replicas 2), a data
// server killed with SIGKILL is restarted by the supervisor before the
// failure timeout, on a new port (its old one is taken meanwhile). A
// writer goes on writing and fsyncing new files through it all: none of
// its operations fails, and once status says HEALTH_OK new files are
// written, fsynced and closed at once, on every chain.
func TestFailureRestartedDataServerNewPorts(t *testing.T) {
	dir, mnt := newUpDirs(t)
	up := startUp(t, dir, mnt, "--data-servers", "3", "--replicas", "2",
		"--failure-timeout", "15s", "--restart-delay", "1s")
	cc, err := rpc.Dial(up.metaAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	mc := weftv1.NewMetaClient(cc)
	waitHealthOK(t, mc, time.Minute)
	const size = 4 << 20 // a chunk on each of the layout's 4 chains
	work := filepath.Join(mnt, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeNewFile(work, "before", size); err != nil {
		t.Fatal(err)
	}

	// The writer: new files, each written, fsynced and closed.
	stop := make(chan struct{})
	var wmu sync.Mutex
	var werrs []error
	written := 0
	var longest time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			began := time.Now()
			err := writeNewFile(work, fmt.Sprintf("w%04d", i), size)
			wmu.Lock()
			longest = max(longest, time.Since(began))
			if err != nil {
				werrs = append(werrs, err)
			} else {
				written++
			}
			wmu.Unlock()
		}
	})

	data2 := filepath.Join(dir, "data2")
	pid := testcluster.PidOf("--dir", data2)
	if pid == 0 {
		t.Fatal("no process of data server 2 found")
	}
	old, err := readAddressFile(data2)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	syscall.Kill(pid, syscall.SIGKILL)
	occupy(t, old)
	waitFor(t, time.Minute, "the restart of data server 2", func() bool {
		return strings.Contains(up.Output(), "data server 2 is running again")
	})
	restarted := time.Now()
	now, _ := readAddressFile(data2)
	if now == old {
		t.Fatalf("data server 2 restarted on its old address %s although it was taken", old)
	}
	t.Logf("data server 2 restarted on %s (was %s)", now, old)

	// Once status says HEALTH_OK, writes must work at once.
	ok := waitHealthOK(t, mc, time.Minute)
	t.Logf("HEALTH_OK %v after the restart", ok.Sub(restarted).Round(time.Millisecond))
	for i := range 3 {
		if err := writeNewFile(work, fmt.Sprintf("after-ok-%d", i), size); err != nil {
			h, _ := healthOf(mc)
			t.Errorf("after HEALTH_OK: %v (status now: %s)", err, h)
		}
	}
	close(stop)
	wg.Wait()
	wmu.Lock()
	t.Logf("the writer completed %d files of %d MiB during the kill and restart; the longest took %v",
		written, size>>20, longest.Round(time.Millisecond))
	for _, err := range werrs {
		t.Errorf("writer: %v", err)
	}
	wmu.Unlock()
	for _, name := range []string{"before", "after-ok-0"} {
		if got, err := os.ReadFile(filepath.Join(work, name)); err != nil || !bytes.Equal(got, pattern(name, size)) {
			t.Errorf("read back %s: err %v, equal %v", name, err, bytes.Equal(got, pattern(name, size)))
		}
	}
	up.stop(t)
}

// restartAll stops every data server and the meta service of c cleanly
// (SIGTERM) and starts them again: the meta service on its address, the
// data servers each on a new port (their old ones are taken meanwhile).
func (c *failCluster) restartAll() {
	c.t.Helper()
	var olds []string
	began := time.Now()
	for _, d := range c.data {
		olds = append(olds, d.listen)
		d.proc.Kill(c.t, syscall.SIGTERM)
	}
	c.meta.Kill(c.t, syscall.SIGTERM)
	c.t.Logf("cluster stopped in %v", time.Since(began).Round(time.Millisecond))
	began = time.Now()
	defer func() { c.t.Logf("cluster started again in %v", time.Since(began).Round(time.Millisecond)) }()
	for _, a := range olds {
		occupy(c.t, a)
	}
	metaDir := filepath.Join(c.base, "meta")
	c.meta = c.start("meta", append([]string{"meta", "--dir", metaDir, "--listen", c.metaAddr,
		"--heartbeat-interval", failHeartbeat.String(), "--failure-timeout", failTimeout.String()}, c.metaArgs...)...)
	for _, d := range c.data {
		d.listen = "127.0.0.1:0"
		c.startData(d)
	}
	// Every data server registered at its new address.
	c.waitFor("every data server registered at its new address", failWait, func() bool {
		st, err := c.status()
		if err != nil {
			return false
		}
		at := make(map[string]bool)
		for _, s := range st.GetServers() {
			at[s.GetAddress()] = s.GetOnline()
		}
		for _, d := range c.data {
			if !at[d.listen] {
				return false
			}
		}
		return true
	})
}

// TestFailureClusterRestartNewPorts: a cluster (replicas 2) stopped
// cleanly and started again, every data server on a new port, takes
// writes and fsyncs of new files at once, on every chain, and reads the
// old ones back.
func TestFailureClusterRestartNewPorts(t *testing.T) {
	c := newFailCluster(t, 3, []string{"--replicas", "2"}, nil)
	c.waitHealthy(2, failWait)
	mnt := c.mount()
	const size = 4 << 20
	if err := writeNewFile(mnt, "before", size); err != nil {
		t.Fatal(err)
	}
	c.restartAll()
	// A mount from before the restart and a new one.
	fresh := c.mount()
	for i, dir := range []string{mnt, fresh, mnt} {
		began := time.Now()
		if err := writeNewFile(dir, fmt.Sprintf("after-%d", i), size); err != nil {
			h, _ := healthOf(c.mc)
			t.Errorf("right after the restart: %v (status: %s)", err, h)
		} else {
			t.Logf("after-%d written, fsynced and closed in %v", i, time.Since(began).Round(time.Millisecond))
		}
	}
	for _, name := range []string{"before", "after-0", "after-1"} {
		if got, err := os.ReadFile(filepath.Join(fresh, name)); err != nil || !bytes.Equal(got, pattern(name, size)) {
			t.Errorf("read back %s: err %v, equal %v", name, err, bytes.Equal(got, pattern(name, size)))
		}
	}
}

// TestFailureOutageEndsReadsRecover: every replica of every chain down
// (replicas 2, both data servers killed) long enough for a reader to get
// EIO (--unavailable-timeout), then both back on new ports: once status
// says HEALTH_OK the reader reads every file within a few seconds.
func TestFailureOutageEndsReadsRecover(t *testing.T) {
	c := newFailCluster(t, 2, []string{"--replicas", "2"}, nil)
	c.waitHealthy(2, failWait)
	writer := c.mount()
	const size, nFiles = 4 << 20, 6
	for i := range nFiles {
		if err := writeNewFile(writer, fmt.Sprintf("f%d", i), size); err != nil {
			t.Fatal(err)
		}
	}
	reader := c.mount("--unavailable-timeout", "2s")
	// The reader knows the chains (a first file read), then the outage.
	if got, err := os.ReadFile(filepath.Join(reader, "f0")); err != nil || !bytes.Equal(got, pattern("f0", size)) {
		t.Fatalf("read f0 before the outage: %v", err)
	}
	var olds []string
	for _, d := range c.data {
		olds = append(olds, d.listen)
		d.proc.Kill(t, syscall.SIGKILL)
	}
	for _, a := range olds {
		occupy(t, a)
	}
	// The reader gives up on the chains (EIO) while they are down.
	deadline := time.Now().Add(failWait)
	for {
		_, err := os.ReadFile(filepath.Join(reader, "f1"))
		if errors.Is(err, syscall.EIO) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reads during the outage did not fail with EIO: last %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.waitFor("the data servers offline", failWait, func() bool {
		return waitServers(c.metaAddr, func(online int) bool { return online == 0 }, time.Second) == nil
	})
	for _, d := range c.data {
		d.listen = "127.0.0.1:0"
		c.startData(d)
	}
	ok := waitHealthOK(t, c.mc, failWait)
	for i := 1; i < nFiles; i++ {
		name := fmt.Sprintf("f%d", i)
		var err error
		var got []byte
		failures := 0
		for time.Since(ok) < opBound {
			if got, err = os.ReadFile(filepath.Join(reader, name)); err == nil {
				break
			}
			if failures++; failures == 1 {
				t.Logf("read %s %v after HEALTH_OK: %v", name, time.Since(ok).Round(time.Millisecond), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		switch {
		case err != nil:
			t.Errorf("read %s: still failing %v after HEALTH_OK: %v", name, time.Since(ok).Round(time.Millisecond), err)
		case !bytes.Equal(got, pattern(name, size)):
			t.Errorf("read %s: %d bytes, first difference at %d", name, len(got), firstDiff(got, pattern(name, size)))
		default:
			t.Logf("read %s %v after HEALTH_OK", name, time.Since(ok).Round(time.Millisecond))
		}
	}
}

// TestFailureStatusWarnsWhileForwardsFail: a data server that heartbeats
// but cannot be reached at the address it registered (a wrong
// --advertise; a link between data servers cut) makes writes to its
// chains fail at the members before it. Status must not say HEALTH_OK
// meanwhile: it warns about the forward that fails.
func TestFailureStatusWarnsWhileForwardsFail(t *testing.T) {
	dead := freePort(t) // nothing listens there
	c := newFailCluster(t, 2, []string{"--replicas", "2"}, func(i int) []string {
		if i == 2 {
			return []string{"--advertise", dead}
		}
		return nil
	})
	c.leavesDamage("chain_not_checked") // data server 2 is never reachable
	// On one host, its Unix socket would reach it all the same: without
	// the socket file, the other server and the mount use its address.
	if err := os.Remove(filepath.Join(c.data[1].dir, "wire.sock")); err != nil {
		t.Fatal(err)
	}
	mnt := c.mount("--unavailable-timeout", "3s")
	// The write fails (EIO after the unavailable timeout) on every chain
	// that reaches data server 2; status is asked meanwhile.
	done := make(chan error, 1)
	go func() { done <- writeNewFile(mnt, "f", 4<<20) }()
	warned := ""
	deadline := time.Now().Add(failWait)
	for warned == "" {
		if time.Now().After(deadline) {
			st, _ := c.status()
			t.Fatalf("no warning about the failing forwards within %v; status: %s %v", failWait, healthLine(st), st.GetWarnings())
		}
		select {
		case err := <-done:
			t.Logf("the write ended: %v", err)
			if err == nil {
				t.Fatal("the write succeeded although data server 2 cannot be reached")
			}
			done = nil
		case <-time.After(100 * time.Millisecond):
		}
		st, err := c.status()
		if err != nil {
			continue
		}
		h := healthLine(st)
		if strings.HasPrefix(h, healthOK) {
			if done == nil {
				t.Fatalf("status says %s while writes to data server 2's chains fail", h)
			}
			continue
		}
		for _, w := range st.GetWarnings() {
			if strings.Contains(w, "cannot pass writes on") && strings.Contains(w, dead) {
				warned = w
			}
		}
	}
	t.Logf("status warns: %s", warned)
}
