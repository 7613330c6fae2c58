package campaign

import (
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weft-fs/weft/internal/faultproxy"
)

// Result is what a campaign did and found.
type Result struct {
	// Config is the campaign's configuration with its defaults (its seed
	// included): Config.Replay replays it.
	Config Config
	// Schedule is the faults injected.
	Schedule Schedule
	// Findings are the violations of the contract seen; none means the
	// campaign passed.
	Findings []Finding
	// Summary describes the operations, the errors the faults excused,
	// the bytes and names checked.
	Summary string
	// Errors are the first errors of each worker and operation.
	Errors []string
}

// Run runs a campaign: it starts a cluster of weft processes under
// cfg.Dir, runs the workloads on its mounts while the seeded schedule
// injects faults, heals everything, lets the workloads run on past the
// recovery bound, then checks every acknowledged byte and name through a
// fresh mount, fsck and status. An error means the campaign could not
// run; what it found is in the Result.
func Run(cfg Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	logf := cfg.Logf
	res := &Result{Config: cfg}
	logf("campaign: seed %d, engine %s (%d meta servers), %d data servers, %d mounts, faults for %v, recovery bound %v",
		cfg.Seed, cfg.Engine, cfg.MetaServers, cfg.DataServers, cfg.Mounts, cfg.Duration, cfg.RecoveryBound)
	logf("campaign: replay with %s", cfg.Replay())
	c, err := startCluster(cfg)
	defer c.stop()
	if err != nil {
		return res, fmt.Errorf("start the cluster: %w", err)
	}
	shape := Shape{DataServers: cfg.DataServers, MetaServers: cfg.MetaServers, Mounts: cfg.Mounts,
		Proxied: func(i int) bool { return c.data[i].proxied }}
	res.Schedule = MakeSchedule(cfg.Seed, cfg.Duration, cfg.Kinds, shape, cfg.Overlap)
	logf("campaign: schedule (%d faults of %s):\n%s", len(res.Schedule), joinKinds(cfg.Kinds), res.Schedule)

	rec := newRecorder(logf)
	base, err := c.status()
	if err != nil {
		return res, err
	}
	for range cfg.Mounts {
		if _, err := c.addMount(); err != nil {
			return res, err
		}
	}
	datas, metas, err := setUpWorkers(c, rec)
	if err != nil {
		return res, err
	}

	stopWork, stopWatch := make(chan struct{}), make(chan struct{})
	var work sync.WaitGroup
	for _, w := range datas {
		work.Add(1)
		go func() { defer work.Done(); w.run(stopWork) }()
	}
	for _, w := range metas {
		work.Add(1)
		go func() { defer work.Done(); w.run(stopWork) }()
	}
	in := newInjector(c, rec)
	watched := make(chan struct{})
	go func() { in.watch(stopWatch); close(watched) }()

	t0 := time.Now()
	in.run(t0, res.Schedule, nil)
	time.Sleep(time.Until(t0.Add(cfg.Duration)))
	healAll(c, rec)
	quiet := cfg.Quiet
	logf("%s campaign: every fault healed; the workloads go on for %v (errors after %v are findings)",
		time.Now().Format("15:04:05.000"), quiet, cfg.RecoveryBound)
	time.Sleep(quiet)
	close(stopWork)
	if !waitGroup(&work, cfg.RecoveryBound+30*time.Second) {
		rec.find("a workload is stuck in an operation %v after it was told to stop (every fault healed long before)", cfg.RecoveryBound+30*time.Second)
		close(stopWatch)
		<-watched
		return finish(res, rec, cfg)
	}
	for _, w := range datas {
		w.finish()
	}
	for _, w := range metas {
		w.finish()
	}
	close(stopWatch)
	<-watched

	checkAll(c, rec, base, datas, metas)
	return finish(res, rec, cfg)
}

// finish judges the errors and fills in res.
func finish(res *Result, rec *recorder, cfg Config) (*Result, error) {
	excused := rec.judgeErrors(cfg.RecoveryBound)
	res.Summary = rec.summary(excused)
	res.Findings = rec.Findings()
	res.Errors = rec.sampleErrors(40)
	return res, nil
}

// setUpWorkers makes the directories (r2: replicas 2, the default; r3:
// replicas 3) and a data and a metadata worker per mount, alternately in
// each.
func setUpWorkers(c *cluster, rec *recorder) ([]*dataWorker, []*metaWorker, error) {
	m0 := c.mounts[0]
	root, _, _ := m0.rootOf()
	for _, d := range []string{"r2", "r3"} {
		if err := unix.Mkdirat(root, d, 0o755); err != nil {
			return nil, nil, fmt.Errorf("mkdir %s: %w", d, err)
		}
	}
	if err := c.setReplicas(path.Join(m0.point, "r3"), 3); err != nil {
		return nil, nil, err
	}
	var datas []*dataWorker
	var metas []*metaWorker
	seed := uint64(c.cfg.Seed)
	for i, m := range c.mounts {
		dd := fmt.Sprintf("r%d/data%d", 2+i%2, i+1)
		md := fmt.Sprintf("r%d/meta%d", 3-i%2, i+1)
		for _, d := range []string{dd, md} {
			if err := unix.Mkdirat(root, d, 0o755); err != nil {
				return nil, nil, fmt.Errorf("mkdir %s: %w", d, err)
			}
		}
		dw := newDataWorker(fmt.Sprintf("data worker %d (mount%d, %s)", i+1, i+1, dd), m, dd, seed*1000+uint64(i), c.cfg.RecoveryBound, rec)
		dw.evidenceDir = filepath.Join(c.cfg.Dir, "evidence")
		datas = append(datas, dw)
		metas = append(metas, newMetaWorker(fmt.Sprintf("metadata worker %d (mount%d, %s)", i+1, i+1, md), m, md, seed*1000+500+uint64(i), rec))
	}
	return datas, metas, nil
}

// healAll makes sure that every process runs and every link is whole
// after the schedule (a heal that failed is tried again).
func healAll(c *cluster, rec *recorder) {
	for _, m := range c.metas {
		for _, p := range []*faultproxy.Proxy{m.front, m.etcdLink} {
			if p != nil {
				p.Restore()
				p.SetLatency(0)
			}
		}
		m.mu.Lock()
		p := m.proc
		m.mu.Unlock()
		if !p.running() {
			if err := c.startMeta(m); err != nil {
				rec.find("start meta%d after the schedule: %v", m.i+1, err)
			}
		}
	}
	for _, d := range c.data {
		d.mu.Lock()
		ps := append([]*faultproxy.Proxy{d.front}, d.metaLinks...)
		p := d.proc
		d.mu.Unlock()
		for _, x := range ps {
			if x != nil {
				x.Restore()
				x.SetLatency(0)
			}
		}
		p.signal(syscall.SIGCONT)
		if !p.running() {
			if err := c.startData(d, false); err != nil {
				rec.find("start data%d after the schedule: %v", d.i+1, err)
			}
		}
	}
	for _, m := range c.mounts {
		m.mu.Lock()
		p, alive := m.proc, m.alive
		m.mu.Unlock()
		p.signal(syscall.SIGCONT)
		if !alive || !p.running() {
			c.downMount(m)
			if err := c.startMount(m); err != nil {
				rec.find("mount mount%d after the schedule: %v", m.i+1, err)
			}
		}
	}
}

// checkAll checks the end state: status reaches HEALTH_OK, every
// acknowledged byte and name reads back through a fresh mount, fsck finds
// nothing, status counts the files and directories that are visible.
func checkAll(c *cluster, rec *recorder, base *statusJSON, datas []*dataWorker, metas []*metaWorker) {
	logf := c.cfg.Logf
	n := c.cfg.DataServers
	err := c.waitStatus(2*time.Minute, func(st *statusJSON) bool {
		return st.Health == "HEALTH_OK" && st.ServersOnline == n && st.OpenGraceMs == 0
	})
	if err != nil {
		rec.find("status after recovery: HEALTH_OK with every data server online and no open grace period %v", err)
	}
	fresh, err := c.addMount()
	if err != nil {
		rec.find("a fresh mount after the campaign: %v", err)
		return
	}
	root, _, _ := fresh.rootOf()
	bytes := 0
	for _, w := range datas {
		bytes += w.check(root)
	}
	names := 0
	for _, w := range metas {
		w.check(root)
		f, d := w.model.counts()
		names += f + d
	}
	logf("campaign: checked %d acknowledged bytes and %d names through a fresh mount", bytes, names)

	files, dirs, err := countTree(root)
	if err != nil {
		rec.find("walk the file system through a fresh mount: %v", err)
		return
	}
	c.checkFsck(rec, logf)
	st, err := c.status()
	switch {
	case err != nil:
		rec.find("weft status after the campaign: %v", err)
	case st.Health != "HEALTH_OK":
		rec.find("weft status after the campaign: %s", st.describe())
	case st.Files != base.Files+uint64(files) || st.Directories != base.Directories+uint64(dirs):
		rec.find("weft status counts %d files and %d directories where a fresh mount shows %d and %d (%d and %d at the start): %s",
			st.Files, st.Directories, base.Files+uint64(files), base.Directories+uint64(dirs), base.Files, base.Directories, st.describe())
	default:
		logf("campaign: weft status: %s", st.describe())
	}
}

// countTree counts the regular files and directories below root.
func countTree(root int) (files, dirs int, err error) {
	var walk func(p string) error
	walk = func(p string) error {
		names, err := listDir(root, p)
		if err != nil {
			return err
		}
		for _, n := range names {
			q := path.Join(p, n)
			var st unix.Stat_t
			if err := unix.Fstatat(root, q, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				dirs++
				if err := walk(q); err != nil {
					return err
				}
			case unix.S_IFREG:
				files++
			}
		}
		return nil
	}
	return files, dirs, walk(".")
}

// waitGroup waits for wg up to timeout; false if it timed out.
func waitGroup(wg *sync.WaitGroup, timeout time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// checkFsck runs weft fsck: it must find nothing but unacknowledged tails
// (chunks past the size of a file whose writer died or whose close
// failed: garbage fsck names truthfully), which fsck --repair must trim,
// after which fsck must find nothing.
func (c *cluster) checkFsck(rec *recorder, logf func(string, ...any)) {
	r, err := c.fsck(false)
	if err != nil {
		rec.find("weft fsck: %v", err)
		return
	}
	var ps []string
	tails := 0
	for _, p := range r.Problems {
		if p.Kind == "unowned_chunk" && strings.Contains(p.Detail, "past the file's size") {
			tails++
			continue
		}
		ps = append(ps, fmt.Sprintf("%s (inode %d %s): %s", p.Kind, p.Ino, p.Name, p.Detail))
	}
	if len(ps) > 0 || r.ProblemsLeft > uint64(len(r.Problems)) {
		rec.find("weft fsck after the campaign: %d problems: %s", r.ProblemsLeft, strings.Join(ps, "; "))
		return
	}
	if tails == 0 {
		logf("campaign: weft fsck: no problems (%d inodes checked)", r.InodesChecked)
		return
	}
	if _, err := c.fsck(true); err != nil {
		rec.find("weft fsck --repair of %d unacknowledged tails: %v", tails, err)
		return
	}
	r, err = c.fsck(false)
	switch {
	case err != nil:
		rec.find("weft fsck after trimming tails: %v", err)
	case len(r.Problems) > 0:
		rec.find("weft fsck --repair left %d problems (%s: %s)", len(r.Problems), r.Problems[0].Kind, r.Problems[0].Detail)
	default:
		logf("campaign: weft fsck: %d unacknowledged tails (chunks past their file's size), trimmed by fsck --repair; then no problems (%d inodes checked)",
			tails, r.InodesChecked)
	}
}
