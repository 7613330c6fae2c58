package campaign

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/weft-fs/weft/internal/etcdtest"
	"github.com/weft-fs/weft/internal/faultproxy"
)

// Timings of the campaign's cluster: short, so that failures are seen
// and handled within seconds.
const (
	heartbeat     = 250 * time.Millisecond
	failTimeout   = 2 * time.Second
	sessionLease  = 3 * time.Second
	electionTTL   = 2 * time.Second
	chunkSize     = "256KiB"
	stripeCount   = "4"
	startTimeout  = 30 * time.Second
	cleanStopWait = 20 * time.Second
)

// cluster is the campaign's weft processes and the proxies between them.
//
// Network: every meta server is reached only through a proxy (one port
// serves gRPC and the lean path; --advertise names it, and a plain file
// where its Unix socket would be keeps local clients on TCP); with
// etcd, each reaches etcd through a proxy of its own. Data servers of
// even index (data1, data3, ...) are proxied (one proxy: a data server
// serves gRPC and the lean path on one port, --advertise names it), and
// reach the meta servers through proxies of their own; the others listen directly
// and serve local clients on their Unix socket (and in place reads), as
// weft up's servers do. Network faults hit proxied servers only.
type cluster struct {
	cfg    Config
	logDir string
	env    []string
	spawn  *spawner

	etcd   *etcdtest.Server
	metas  []*metaNode
	data   []*dataNode
	mounts []*mountNode
}

// metaNode is one meta server.
type metaNode struct {
	i        int
	dir      string
	listen   string            // its own port, kept across restarts
	front    *faultproxy.Proxy // what everyone else dials
	etcdLink *faultproxy.Proxy // its link to etcd (etcd engine)

	mu   sync.Mutex
	proc *proc
}

// dataNode is one data server.
type dataNode struct {
	i       int
	dir     string
	proxied bool

	mu        sync.Mutex
	listen    string // its own port (a new one at a new-port restart): gRPC and the lean path
	front     *faultproxy.Proxy
	metaLinks []*faultproxy.Proxy // to each meta server's front (proxied only)
	proc      *proc
}

// mountNode is one mount the workloads run on.
type mountNode struct {
	i     int
	point string

	mu    sync.Mutex
	proc  *proc
	root  int // descriptor of the mount's root; -1 while down
	gen   int // bumped at every new mount
	alive bool
}

func (c *cluster) name(kind string, i int) string { return fmt.Sprintf("%s%d", kind, i+1) }

// startCluster starts etcd (if asked), the meta servers and the data
// servers, and waits for every data server to be online.
func startCluster(cfg Config) (*cluster, error) {
	c := &cluster{cfg: cfg, logDir: filepath.Join(cfg.Dir, "logs")}
	c.env = []string{"WEFT_EXE=" + cfg.Weft, "WEFT_RUNTIME_DIR=" + filepath.Join(cfg.Dir, "run")}
	if err := os.MkdirAll(c.logDir, 0o755); err != nil {
		return c, err
	}
	var err error
	if c.spawn, err = startSpawner(); err != nil {
		return c, err
	}
	if cfg.Engine == Etcd {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, "etcd"), 0o755); err != nil {
			return c, err
		}
		srv, err := etcdtest.Launch(filepath.Join(cfg.Dir, "etcd"))
		if err != nil {
			return c, err
		}
		c.etcd = srv
	}
	for i := range cfg.MetaServers {
		m := &metaNode{i: i, dir: filepath.Join(cfg.Dir, c.name("meta", i))}
		var err error
		if m.listen, err = freePort(); err != nil {
			return c, err
		}
		if m.front, err = faultproxy.New(m.listen); err != nil {
			return c, err
		}
		if c.etcd != nil {
			if m.etcdLink, err = faultproxy.New(c.etcd.Endpoints[0]); err != nil {
				return c, err
			}
		}
		if err := blockUnixSocket(m.dir, "meta.sock"); err != nil {
			return c, err
		}
		c.metas = append(c.metas, m)
	}
	for _, m := range c.metas {
		if err := c.startMeta(m); err != nil {
			return c, err
		}
		if c.etcd != nil && m.i == 0 {
			// The first one is the manager before the others start.
			if err := c.waitStatus(startTimeout, func(st *statusJSON) bool { return len(st.MetaServers) == 1 }); err != nil {
				return c, fmt.Errorf("the first meta server does not answer as manager: %w", err)
			}
		}
	}
	for i := range cfg.DataServers {
		d := &dataNode{i: i, dir: filepath.Join(cfg.Dir, c.name("data", i)), proxied: i%2 == 0}
		if d.proxied {
			if err := blockUnixSocket(d.dir, "wire.sock"); err != nil {
				return c, err
			}
			for _, m := range c.metas {
				p, err := faultproxy.New(m.front.Addr())
				if err != nil {
					return c, err
				}
				d.metaLinks = append(d.metaLinks, p)
			}
		}
		c.data = append(c.data, d)
		if err := c.startData(d, true); err != nil {
			return c, err
		}
	}
	err = c.waitStatus(startTimeout, func(st *statusJSON) bool {
		return st.ServersOnline == cfg.DataServers && st.Health == "HEALTH_OK"
	})
	if err != nil {
		return c, fmt.Errorf("the cluster did not come up: %w", err)
	}
	return c, nil
}

// blockUnixSocket puts a plain file where a server would make its Unix
// socket, so that it makes none: local clients then use TCP, through the
// server's proxies.
func blockUnixSocket(dir, name string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name), []byte("no socket: clients go through the proxies\n"), 0o644)
}

// metaAddrs is the --meta of data servers and mounts: every meta
// server's front.
func (c *cluster) metaAddrs() string {
	var out []string
	for _, m := range c.metas {
		out = append(out, m.front.Addr())
	}
	return strings.Join(out, ",")
}

// startMeta starts meta server m on its ports and waits for its address.
func (c *cluster) startMeta(m *metaNode) error {
	args := []string{"meta", "--dir", m.dir, "--listen", m.listen, "--advertise", m.front.Addr(),
		"--heartbeat-interval", heartbeat.String(), "--failure-timeout", failTimeout.String(),
		"--session-lease", sessionLease.String(), "--replicas", "2", "--chunk-size", chunkSize, "--stripe-count", stripeCount}
	if c.etcd != nil {
		args = append(args, "--engine", "etcd", "--etcd-endpoints", m.etcdLink.Addr(), "--election-ttl", electionTTL.String())
	}
	os.Remove(filepath.Join(m.dir, "address"))
	p, err := startProc(c.spawn, c.cfg.Weft, c.logDir, c.name("meta", m.i), c.env, args...)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.proc = p
	m.mu.Unlock()
	_, err = waitAddress(p, m.dir, startTimeout)
	return err
}

// startData starts data server d: on its last ports, or on new ones (and
// behind new proxies) when fresh.
func (c *cluster) startData(d *dataNode, fresh bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if fresh || d.listen == "" {
		var err error
		if d.listen, err = freePort(); err != nil {
			return err
		}
		if d.proxied {
			old := d.front
			if d.front, err = faultproxy.New(d.listen); err != nil {
				return err
			}
			if old != nil {
				old.Close() // the old address is dead, as a moved server's is
			}
		}
	}
	args := []string{"data", "--dir", d.dir, "--listen", d.listen}
	if d.proxied {
		var links []string
		for _, p := range d.metaLinks {
			links = append(links, p.Addr())
		}
		args = append(args, "--advertise", d.front.Addr(), "--meta", strings.Join(links, ","))
	} else {
		args = append(args, "--meta", c.metaAddrs())
	}
	os.Remove(filepath.Join(d.dir, "address"))
	p, err := startProc(c.spawn, c.cfg.Weft, c.logDir, c.name("data", d.i), c.env, args...)
	if err != nil {
		return err
	}
	d.proc = p
	_, err = waitAddress(p, d.dir, startTimeout)
	return err
}

// startMount mounts m (again) and opens its root.
func (c *cluster) startMount(m *mountNode) error {
	if err := os.MkdirAll(m.point, 0o755); err != nil {
		return err
	}
	p, err := startProc(c.spawn, c.cfg.Weft, c.logDir, c.name("mount", m.i), c.env, "mount", "--meta", c.metaAddrs(),
		"--unavailable-timeout", c.cfg.UnavailableTimeout.String(), m.point)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(startTimeout)
	for !isMounted(m.point) {
		if !p.running() {
			return fmt.Errorf("weft mount on %s exited at start (%s)", m.point, p.err)
		}
		if time.Now().After(deadline) {
			p.stop(syscall.SIGKILL, time.Second)
			return fmt.Errorf("weft mount on %s not mounted after %v", m.point, startTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fd, err := syscall.Open(m.point, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		p.stop(syscall.SIGKILL, time.Second)
		detach(m.point)
		return fmt.Errorf("open the root of the mount on %s: %w", m.point, err)
	}
	m.mu.Lock()
	m.proc, m.root, m.alive = p, fd, true
	m.gen++
	m.mu.Unlock()
	return nil
}

// addMount mounts one more file system for the workloads or the checks.
func (c *cluster) addMount() (*mountNode, error) {
	m := &mountNode{i: len(c.mounts), root: -1}
	m.point = filepath.Join(c.cfg.Dir, c.name("mnt", m.i))
	c.mounts = append(c.mounts, m)
	return m, c.startMount(m)
}

// downMount takes mount m down after its process was stopped: the
// workloads leave it (markDown) and it is detached, its connection
// aborted, so that every call on it fails (ENOTCONN) instead of waiting.
func (c *cluster) downMount(m *mountNode) error {
	c.markDown(m)
	return detach(m.point)
}

// markDown tells the workloads that mount m goes away: they close their
// files on it; its root descriptor is closed.
func (c *cluster) markDown(m *mountNode) {
	m.mu.Lock()
	root := m.root
	m.root, m.alive = -1, false
	m.gen++
	m.mu.Unlock()
	if root >= 0 {
		syscall.Close(root)
	}
}

// rootOf returns mount m's root descriptor and generation; ok is false
// while it is down.
func (m *mountNode) rootOf() (fd, gen int, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.root, m.gen, m.alive
}

// procs lists every process of the cluster with its name.
func (c *cluster) procs() map[string]*proc {
	out := map[string]*proc{}
	for _, m := range c.metas {
		m.mu.Lock()
		if m.proc != nil {
			out[c.name("meta", m.i)] = m.proc
		}
		m.mu.Unlock()
	}
	for _, d := range c.data {
		d.mu.Lock()
		if d.proc != nil {
			out[c.name("data", d.i)] = d.proc
		}
		d.mu.Unlock()
	}
	for _, m := range c.mounts {
		m.mu.Lock()
		if m.proc != nil {
			out[c.name("mount", m.i)] = m.proc
		}
		m.mu.Unlock()
	}
	return out
}

// stop ends everything: mounts (cleanly), data servers, meta servers,
// etcd, the proxies.
func (c *cluster) stop() {
	for _, m := range c.mounts {
		c.markDown(m) // a mount in use goes away only when its files are closed
		m.mu.Lock()
		p := m.proc
		m.mu.Unlock()
		if p != nil {
			p.stop(syscall.SIGTERM, 10*time.Second)
		}
		detach(m.point)
	}
	for _, d := range c.data {
		d.mu.Lock()
		if d.proc != nil {
			d.proc.stop(syscall.SIGTERM, 10*time.Second)
		}
		for _, p := range append([]*faultproxy.Proxy{d.front}, d.metaLinks...) {
			if p != nil {
				p.Close()
			}
		}
		d.mu.Unlock()
	}
	for _, m := range c.metas {
		m.mu.Lock()
		if m.proc != nil {
			m.proc.stop(syscall.SIGTERM, 10*time.Second)
		}
		for _, p := range []*faultproxy.Proxy{m.front, m.etcdLink} {
			if p != nil {
				p.Close()
			}
		}
		m.mu.Unlock()
	}
	if c.etcd != nil {
		c.etcd.Stop()
	}
	detach(c.cfg.Dir)
	if c.spawn != nil {
		c.spawn.close()
	}
}
