package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weft-fs/weft/data/chunk"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/testcluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// The failure tests run a cluster of separate weft processes (meta, data
// servers, mounts) of the built binary and kill, cut off or damage parts
// of it. Timings are short so that failures are detected quickly.
const (
	failHeartbeat = 250 * time.Millisecond
	failTimeout   = 2 * time.Second
	// failWait bounds every wait of the failure tests for the cluster to
	// reach a state.
	failWait = 60 * time.Second
)

// dataNode is a data server of a failure cluster.
type dataNode struct {
	n         int
	dir       string
	listen    string // fixed after the first start, so restarts reuse it
	advertise string
	metaAddr  string
	extra     []string
	proc      *testcluster.Proc
}

// failCluster is a cluster of weft processes under one temporary
// directory; everything is killed and unmounted when the test ends.
type failCluster struct {
	t        *testing.T
	exe      string
	base     string
	metaAddr string
	meta     *testcluster.Proc
	data     []*dataNode
	mc       weftv1.MetaClient
	mounts   int
	metaArgs []string // extra flags of weft meta
	damage   []string // see leavesDamage
}

// newFailCluster starts weft meta with short heartbeat and failure
// timeouts (plus metaArgs) and n data servers; each data server i (from 1)
// gets dataArgs(i) as extra flags when dataArgs is not nil.
func newFailCluster(t *testing.T, n int, metaArgs []string, dataArgs func(i int) []string) *failCluster {
	t.Helper()
	testcluster.NeedFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("the failure tests mount several file systems and kill their servers: run them as root")
	}
	c := newProcCluster(t)
	c.metaArgs = metaArgs
	metaDir := filepath.Join(c.base, "meta")
	args := append([]string{"meta", "--dir", metaDir, "--listen", "127.0.0.1:0",
		"--heartbeat-interval", failHeartbeat.String(), "--failure-timeout", failTimeout.String()}, metaArgs...)
	c.meta = c.start("meta", args...)
	c.waitFor("the meta service's address", 30*time.Second, func() bool {
		addr, err := readAddressFile(metaDir)
		c.metaAddr = addr
		return err == nil
	})
	cc, err := rpc.Dial(c.metaAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	c.mc = weftv1.NewMetaClient(cc)
	// Runs after the mounts' cleanups, before the processes are killed.
	t.Cleanup(func() { c.checkFsck(c.metaAddr, c.meta.Running()) })
	for i := 1; i <= n; i++ {
		var extra []string
		if dataArgs != nil {
			extra = dataArgs(i)
		}
		c.addData(extra...)
	}
	if err := waitOnline(c.metaAddr, n, failWait); err != nil {
		t.Fatal(err)
	}
	return c
}

// newProcCluster makes the directory of a cluster of processes (with its
// logs), from which everything is killed and unmounted when the test
// ends.
func newProcCluster(t *testing.T) *failCluster {
	t.Helper()
	c := &failCluster{t: t, exe: testcluster.Binary(t), base: t.TempDir()}
	if err := os.MkdirAll(filepath.Join(c.base, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testcluster.CleanupUnder(c.base)
		if t.Failed() {
			logTails(t, filepath.Join(c.base, "logs"))
		}
	})
	return c
}

// leavesDamage declares that the test leaves damage fsck reports as
// findings of the given kinds (see testcluster.Cluster.LeavesDamage).
func (c *failCluster) leavesDamage(kinds ...string) { c.damage = append(c.damage, kinds...) }

// checkFsck runs at the end of the test, once the mounts are gone: it
// starts again the data servers the test left stopped and fails the test
// if fsck of the meta service at addr finds anything but the declared
// damage, unless the test failed already or left the meta service
// stopped (running false).
func (c *failCluster) checkFsck(addr string, running bool) {
	c.t.Helper()
	if c.t.Failed() || !running {
		return
	}
	for _, d := range c.data {
		if !d.proc.Running() {
			c.startData(d)
		}
	}
	if err := waitOnline(addr, len(c.data), failWait); err != nil {
		c.t.Fatal(err)
	}
	testcluster.CheckFsck(c.t, addr, c.damage...)
}

// start runs the weft binary with args; its output goes to logs/NAME.log.
func (c *failCluster) start(name string, args ...string) *testcluster.Proc {
	c.t.Helper()
	return testcluster.StartProc(c.t, name, testcluster.ProcOptions{Log: filepath.Join(c.base, "logs", name+".log"),
		Env: []string{"WEFT_RUNTIME_DIR=" + filepath.Join(c.base, "run")}}, args...)
}

// addData starts one more data server (weft data) with extra flags.
func (c *failCluster) addData(extra ...string) *dataNode {
	c.t.Helper()
	n := len(c.data) + 1
	d := &dataNode{n: n, dir: filepath.Join(c.base, fmt.Sprintf("data%d", n)), listen: "127.0.0.1:0", metaAddr: c.metaAddr, extra: extra}
	c.data = append(c.data, d)
	c.startData(d)
	return d
}

// startData (re)starts data server d and waits for its address file.
func (c *failCluster) startData(d *dataNode) {
	c.t.Helper()
	os.Remove(filepath.Join(d.dir, addressFileName))
	args := []string{"data", "--dir", d.dir, "--listen", d.listen, "--meta", d.metaAddr}
	if d.advertise != "" {
		args = append(args, "--advertise", d.advertise)
	}
	d.proc = c.start(fmt.Sprintf("data%d", d.n), append(args, d.extra...)...)
	c.waitFor(fmt.Sprintf("the address of data server %d", d.n), 30*time.Second, func() bool {
		addr, err := readAddressFile(d.dir)
		if err == nil {
			d.listen = addr
		}
		return err == nil || !d.proc.Running()
	})
	if !d.proc.Running() {
		c.t.Fatalf("data server %d exited at start: %v", d.n, d.proc.Err())
	}
}

// mount runs weft mount on a new directory and waits until it is mounted.
func (c *failCluster) mount(extra ...string) string {
	c.t.Helper()
	mnt, _ := c.mountProc(extra...)
	return mnt
}

// mountProc is mount, returning the mount's process too.
func (c *failCluster) mountProc(extra ...string) (string, *testcluster.Proc) {
	c.t.Helper()
	c.mounts++
	mnt := filepath.Join(c.base, fmt.Sprintf("mnt%d", c.mounts))
	d := c.start(fmt.Sprintf("mount%d", c.mounts), append(append([]string{"mount", "--meta", c.metaAddr}, extra...), mnt)...)
	// Unmount cleanly before the processes are killed (cleanups run last
	// in, first out): SIGTERM flushes and unmounts.
	c.t.Cleanup(func() { c.unmount(d, mnt) })
	c.waitFor("the mount on "+mnt, 30*time.Second, func() bool { return isMounted(mnt) || !d.Running() })
	if !d.Running() {
		c.t.Fatalf("weft mount exited: %v", d.Err())
	}
	return mnt, d
}

// unmount stops the mount process of mnt with SIGTERM; a mount that
// does not go away is aborted.
func (c *failCluster) unmount(d *testcluster.Proc, mnt string) {
	d.Kill(c.t, syscall.SIGTERM)
	if isMounted(mnt) {
		testcluster.CleanupUnder(mnt)
	}
}

// waitFor polls cond until it holds; the test fails after timeout.
func (c *failCluster) waitFor(what string, timeout time.Duration, cond func() bool) {
	c.t.Helper()
	testcluster.WaitFor(c.t, what, timeout, cond)
}

// status asks the meta service for the cluster status.
func (c *failCluster) status() (*weftv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.mc.Status(ctx, &weftv1.StatusRequest{})
}

// chainHealth describes the chains of width r and reports whether all of
// them (at least one) have every member serving.
func chainHealth(st *weftv1.StatusResponse, r uint32) (string, bool) {
	var parts []string
	healthy := false
	for _, s := range st.GetChainSummaries() {
		if s.GetReplicas() != r {
			continue
		}
		parts = append(parts, fmt.Sprintf("%d chains: %d healthy, %d degraded, %d syncing, %d unavailable",
			s.GetTotal(), s.GetHealthy(), s.GetDegraded(), s.GetSyncing(), s.GetUnavailable()))
		healthy = s.GetTotal() > 0 && s.GetHealthy() == s.GetTotal()
	}
	// Every chain of width r must list r serving members.
	for _, ch := range st.GetChainList() {
		if isWidth(ch, r) && !allServing(ch, r) {
			healthy = false
		}
	}
	if len(parts) == 0 {
		return fmt.Sprintf("no chains of width %d", r), false
	}
	return strings.Join(parts, "; "), healthy
}

// isWidth guesses whether ch is a chain of width r: width-1 chains have
// one member, the others more.
func isWidth(ch *weftv1.Chain, r uint32) bool {
	if r == 1 {
		return len(ch.GetMembers()) == 1
	}
	return len(ch.GetMembers()) > 1
}

// allServing reports whether ch has exactly r members, all serving.
func allServing(ch *weftv1.Chain, r uint32) bool {
	if uint32(len(ch.GetMembers())) != r {
		return false
	}
	for _, m := range ch.GetMembers() {
		if m.GetState() != "serving" {
			return false
		}
	}
	return true
}

// waitHealthy waits until every chain of width r is healthy and returns
// how long that took.
func (c *failCluster) waitHealthy(r uint32, timeout time.Duration) time.Duration {
	c.t.Helper()
	start := time.Now()
	last := "no status"
	deadline := start.Add(timeout)
	for {
		st, err := c.status()
		if err == nil {
			var ok bool
			if last, ok = chainHealth(st, r); ok {
				return time.Since(start)
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("chains of width %d not healthy after %v: %s", r, timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// targetPaths maps target ids to their directories.
func targetPaths(st *weftv1.StatusResponse) map[uint64]string {
	m := map[uint64]string{}
	for _, s := range st.GetServers() {
		for _, t := range s.GetTargets() {
			m[t.GetId()] = t.GetPath()
		}
	}
	return m
}

// chunkCopy is one target's copy of a chunk, as the target reads it.
type chunkCopy struct {
	version uint64
	data    []byte
	bad     error // the copy does not read (corrupt)
}

// chunksOn reads every chunk below target dir written through chain id,
// keyed by its path relative to the target.
func chunksOn(t *testing.T, dir string, chain uint64) map[string]chunkCopy {
	t.Helper()
	out := map[string]chunkCopy{}
	root := filepath.Join(dir, "chunks")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() || !strings.HasSuffix(p, ".w") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		dc, err := chunk.Decode(b)
		if dc.Chain != chain && (err == nil || dc.Chain != 0) {
			return nil // of another chain (a copy whose head is bad is in every chain's)
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = chunkCopy{version: dc.Version, data: dc.Data, bad: err}
		return nil
	})
	if err != nil {
		t.Fatalf("walk chunks of %s: %v", dir, err)
	}
	return out
}

// checkReplicasIdentical compares, for every chain of width r, the chunks
// of all its members: same chunks, same versions, byte-identical data. It returns the number of chunks compared.
func (c *failCluster) checkReplicasIdentical(r uint32) int {
	c.t.Helper()
	n, diffs := c.replicaDiffs(r)
	for _, d := range diffs {
		c.t.Error(d)
	}
	return n
}

// replicaDiffs returns the number of chunks compared for chains of width
// r and every difference found between members.
func (c *failCluster) replicaDiffs(r uint32) (int, []string) {
	c.t.Helper()
	st, err := c.status()
	if err != nil {
		c.t.Fatal(err)
	}
	paths := targetPaths(st)
	compared := 0
	var diffs []string
	for _, ch := range st.GetChainList() {
		if !isWidth(ch, r) {
			continue
		}
		var first map[string]chunkCopy
		var firstT uint64
		for i, m := range ch.GetMembers() {
			dir, ok := paths[m.GetTargetId()]
			if !ok {
				diffs = append(diffs, fmt.Sprintf("chain %d: member target %d not in the status", ch.GetId(), m.GetTargetId()))
				continue
			}
			got := chunksOn(c.t, dir, ch.GetId())
			if i == 0 {
				first, firstT = got, m.GetTargetId()
				compared += len(got)
				continue
			}
			for rel, a := range first {
				b, ok := got[rel]
				switch {
				case !ok:
					diffs = append(diffs, fmt.Sprintf("chain %d: chunk %s is on target %d but not on target %d", ch.GetId(), rel, firstT, m.GetTargetId()))
				case a.bad != nil || b.bad != nil:
					diffs = append(diffs, fmt.Sprintf("chain %d: chunk %s does not read on target %d (%v) or %d (%v)",
						ch.GetId(), rel, firstT, a.bad, m.GetTargetId(), b.bad))
				case !bytes.Equal(a.data, b.data):
					diffs = append(diffs, fmt.Sprintf("chain %d: chunk %s differs between targets %d and %d (%d vs %d bytes, first difference at %d)",
						ch.GetId(), rel, firstT, m.GetTargetId(), len(a.data), len(b.data), firstDiff(a.data, b.data)))
				case a.version != b.version:
					diffs = append(diffs, fmt.Sprintf("chain %d: chunk %s has version %d on target %d and %d on target %d",
						ch.GetId(), rel, a.version, firstT, b.version, m.GetTargetId()))
				}
			}
			for rel := range got {
				if _, ok := first[rel]; !ok {
					diffs = append(diffs, fmt.Sprintf("chain %d: chunk %s is on target %d but not on target %d", ch.GetId(), rel, m.GetTargetId(), firstT))
				}
			}
		}
	}
	return compared, diffs
}

// firstDiff is the first offset where a and b differ.
func firstDiff(a, b []byte) int {
	for i := range a {
		if i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

// pattern is the deterministic content of test file id: a SHA-256 chain,
// so that every 32 bytes differ and any misplaced range shows.
func pattern(id string, size int) []byte {
	out := make([]byte, 0, size+32)
	seed := sha256.Sum256([]byte(id))
	for len(out) < size {
		out = append(out, seed[:]...)
		seed = sha256.Sum256(seed[:])
	}
	return out[:size]
}

// freePort reserves a local port number for a server started later.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// dirBytes sums the sizes of the chunk files below a target.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(filepath.Join(dir, "chunks"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.HasSuffix(p, ".w") {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// targetOf returns the id of data server d's (only) target.
func (c *failCluster) targetOf(d *dataNode) uint64 {
	c.t.Helper()
	st, err := c.status()
	if err != nil {
		c.t.Fatal(err)
	}
	for id, p := range targetPaths(st) {
		if p == d.dir {
			return id
		}
	}
	c.t.Fatalf("no target of data server %d (%s) in the status", d.n, d.dir)
	return 0
}

// helpHas reports whether "weft CMD --help" lists flag.
func (c *failCluster) helpHas(flag string, cmd ...string) bool {
	out, _ := exec.Command(c.exe, append(cmd, "--help")...).CombinedOutput()
	return bytes.Contains(out, []byte(flag))
}

// stallMeter records the longest single operation of a workload.
type stallMeter struct {
	mu    sync.Mutex
	max   time.Duration
	where string
}

func (s *stallMeter) record(d time.Duration, where string) {
	s.mu.Lock()
	if d > s.max {
		s.max, s.where = d, where
	}
	s.mu.Unlock()
}

func (s *stallMeter) get() (time.Duration, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max, s.where
}

// describeChains lists the chains of width r as "id:[target/state ...]".
func describeChains(st *weftv1.StatusResponse, r uint32) string {
	var parts []string
	for _, ch := range st.GetChainList() {
		if !isWidth(ch, r) {
			continue
		}
		var ms []string
		for _, m := range ch.GetMembers() {
			ms = append(ms, fmt.Sprintf("%d/%s", m.GetTargetId(), m.GetState()))
		}
		parts = append(parts, fmt.Sprintf("%d:[%s]", ch.GetId(), strings.Join(ms, " ")))
	}
	return strings.Join(parts, " ")
}

// setReplicas gives the new files of dir (a directory on a mount) r
// replicas. Chains of width r made at that moment spread over all the
// targets registered.
func (c *failCluster) setReplicas(dir string, r uint32) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.mc.SetLayout(ctx, &weftv1.SetLayoutRequest{Caller: &weftv1.Caller{}, Ino: inoOf(c.t, dir), Layout: &weftv1.Layout{Replicas: r}})
	if err != nil {
		c.t.Fatalf("set replicas %d on %s: %v", r, dir, err)
	}
}
