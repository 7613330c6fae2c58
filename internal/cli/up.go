package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/weft-fs/weft/mount"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// startTimeout bounds how long weft up waits for a daemon to come up.
const startTimeout = time.Minute

// upFlags are the flags of "weft up".
type upFlags struct {
	dir          string
	mountPoint   string
	dataServers  int
	chunkSize    string
	stripeCount  uint32
	replicas     uint32
	restartDelay time.Duration
	failTimeout  time.Duration
	repairDelay  time.Duration
	listen       string
	client       clientSettings
	cache        cacheSettings
}

func newUpCmd() *cobra.Command {
	var f upFlags
	cmd := &cobra.Command{
		Use:   "up [--dir DIR] [--mount DIR] [--data-servers N] [--replicas R]",
		Short: "Run a whole cluster on this machine and mount it",
		Long: `Run a whole weft cluster on this machine: one weft meta and N weft data
servers, each an OS process of its own with its state in DIR/meta,
DIR/data1..N and its log in DIR/logs, and mount the file system (for every
user of the machine when allowed). Servers that die are restarted after
--restart-delay. Ctrl-C or SIGTERM unmounts and stops everything; running
weft up again on the same DIR brings every file back.

With --replicas R every chunk of new files is kept on R data servers: a
server that dies (or is missing for --failure-timeout) is taken out of its
chains and I/O goes on with the others; one gone longer than --repair-delay
is replaced and its data copied again. weft status shows the chains' health.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runUp(cmd.Context(), cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "dir", "./weft-data", "cluster directory (state of every server, logs)")
	fl.StringVar(&f.mountPoint, "mount", "./weft-mnt", "where to mount the file system")
	fl.IntVar(&f.dataServers, "data-servers", 3, "number of data servers (1..64)")
	fl.StringVar(&f.chunkSize, "chunk-size", "1MiB", "chunk size of the default layout (power of two, 64KiB..64MiB)")
	fl.Uint32Var(&f.stripeCount, "stripe-count", 4, "stripe count of the default layout (at least 1; capped to the chains that exist)")
	fl.Uint32Var(&f.replicas, "replicas", 1, fmt.Sprintf("copies of every chunk in the default layout (1..%d, at most --data-servers)", maxReplicas))
	fl.DurationVar(&f.failTimeout, "failure-timeout", 5*time.Second, "a data server without heartbeat for this long is taken out of its chains (more than 1s)")
	fl.DurationVar(&f.repairDelay, "repair-delay", 10*time.Minute, "a replica offline for this long is replaced by another data server and re-replicated")
	fl.DurationVar(&f.restartDelay, "restart-delay", 3*time.Second, "wait this long before restarting a server that died (0: never restart)")
	f.client.addFlags(cmd)
	f.cache.addFlags(cmd)
	fl.StringVar(&f.listen, "listen", "127.0.0.1:0", "address of the meta service (port 0: let the system pick; data servers use the same host)")
	return cmd
}

func runUp(ctx context.Context, cmd *cobra.Command, f upFlags) error {
	err := startAndServe(ctx, cmd, f)
	if err != nil && ctx.Err() != nil {
		// Interrupted while starting: what was started has been stopped.
		fmt.Fprintf(cmd.ErrOrStderr(), "weft: interrupted while starting; everything started is stopped again\n")
		return nil
	}
	return err
}

// startAndServe starts the cluster, mounts it and supervises it until ctx
// ends.
func startAndServe(ctx context.Context, cmd *cobra.Command, f upFlags) error {
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if f.dataServers < 1 || f.dataServers > 64 {
		return usagef("--data-servers must be between 1 and 64, got %d", f.dataServers)
	}
	if _, err := defaultLayout(f.chunkSize, f.stripeCount, f.replicas); err != nil {
		return err
	}
	if int(f.replicas) > f.dataServers {
		return usagef("--replicas %d needs at least %d data servers, but --data-servers is %d: raise --data-servers or lower --replicas",
			f.replicas, f.replicas, f.dataServers)
	}
	if f.failTimeout <= time.Second {
		return usagef("--failure-timeout must be longer than the 1s heartbeat interval, got %v", f.failTimeout)
	}
	if f.repairDelay <= 0 {
		return usagef("--repair-delay must be positive, got %v", f.repairDelay)
	}
	if err := f.cache.check(); err != nil {
		return err
	}
	if err := f.client.check(); err != nil {
		return err
	}
	if f.restartDelay < 0 {
		return usagef("--restart-delay must not be negative (0 means never restart), got %v", f.restartDelay)
	}
	host, port, err := net.SplitHostPort(f.listen)
	if err != nil {
		return usagef("--listen %q is not host:port: %v", f.listen, err)
	}
	dir, err := filepath.Abs(f.dir)
	if err != nil {
		return usagef("--dir %q: %v", f.dir, err)
	}
	mnt, err := filepath.Abs(f.mountPoint)
	if err != nil {
		return usagef("--mount %q: %v", f.mountPoint, err)
	}
	exe, err := weftExecutable()
	if err != nil {
		return err
	}
	logDir := filepath.Join(dir, "logs")
	if err := ensureDir(logDir, "--dir"); err != nil {
		return err
	}
	unlock, err := lockClusterDir(dir)
	if err != nil {
		return err
	}
	defer unlock()
	cf, existed, err := loadClusterFile(dir)
	if err != nil {
		return failure("read the cluster record", err, "remove "+filepath.Join(dir, clusterFileName)+" to pick new addresses")
	}

	sup := newSupervisor(exe, f.restartDelay, stderr)
	defer sup.Close()
	// Children stop in two steps after the mount is gone: data servers
	// first (they flush to disk), then the meta service.
	dataCtx, stopData := context.WithCancel(context.WithoutCancel(ctx))
	metaCtx, stopMeta := context.WithCancel(context.WithoutCancel(ctx))
	var metaChild *child
	var dataChildren []*child
	stopAll := func() {
		stopData()
		for _, c := range dataChildren {
			c.wait()
		}
		stopMeta()
		if metaChild != nil {
			metaChild.wait()
		}
	}
	defer stopAll()

	metaListen := f.listen
	if port == "0" {
		metaListen = reuseAddr(cf.MetaAddr, f.listen)
	}
	metaChild = &child{
		name: "meta service", dir: filepath.Join(dir, "meta"), logPath: filepath.Join(logDir, "meta.log"),
		fixedAddr: true, listen: metaListen,
		args: func(listen string) []string {
			return []string{"meta", "--dir", filepath.Join(dir, "meta"), "--listen", listen,
				"--chunk-size", f.chunkSize, "--stripe-count", strconv.FormatUint(uint64(f.stripeCount), 10),
				"--replicas", strconv.FormatUint(uint64(f.replicas), 10),
				"--failure-timeout", f.failTimeout.String(), "--repair-delay", f.repairDelay.String()}
		},
	}
	if err := ensureDir(metaChild.dir, "--dir"); err != nil {
		return err
	}
	if err := sup.start(metaCtx, metaChild); err != nil {
		return failure("start the meta service", err, "check that "+exe+" is a weft binary")
	}
	metaAddr, err := sup.waitListening(ctx, metaChild, startTimeout)
	if err != nil {
		return err
	}
	cf.MetaAddr = metaAddr

	for i := 1; i <= f.dataServers; i++ {
		recorded := ""
		if i <= len(cf.DataAddrs) {
			recorded = cf.DataAddrs[i-1]
		}
		d := filepath.Join(dir, "data"+strconv.Itoa(i))
		c := &child{
			name: "data server " + strconv.Itoa(i), dir: d, logPath: filepath.Join(logDir, "data"+strconv.Itoa(i)+".log"),
			listen: reuseAddr(recorded, net.JoinHostPort(host, "0")),
			args: func(listen string) []string {
				return []string{"data", "--dir", d, "--listen", listen, "--meta", metaAddr}
			},
		}
		if err := ensureDir(d, "--dir"); err != nil {
			return err
		}
		if err := sup.start(dataCtx, c); err != nil {
			return failure("start the "+c.name, err, "check that "+exe+" is a weft binary")
		}
		dataChildren = append(dataChildren, c)
	}
	for _, c := range dataChildren {
		if _, err := sup.waitListening(ctx, c, startTimeout); err != nil {
			return err
		}
	}
	recordAddrs := func() {
		cf.DataAddrs = cf.DataAddrs[:0]
		for _, c := range dataChildren {
			cf.DataAddrs = append(cf.DataAddrs, c.address())
		}
		cf.MountPoint = mnt
		if err := cf.save(dir); err != nil {
			fmt.Fprintf(stderr, "weft: %v; the next weft up may pick new addresses\n", err)
		}
	}
	recordAddrs()
	if err := waitServersOnline(ctx, metaAddr, f.dataServers, startTimeout); err != nil {
		return err
	}
	if !existed && os.Geteuid() != 0 {
		if err := chownRoot(ctx, metaAddr); err != nil {
			fmt.Fprintf(stderr, "weft: %v\n", err)
		}
	}

	allowOther := true
	if os.Geteuid() != 0 && !userAllowOther() {
		allowOther = false
		fmt.Fprintf(stderr, "weft: warning: mounting without allow_other (only you can use the mount): /etc/fuse.conf lacks user_allow_other; add it or run weft up as root\n")
	}
	mountLog, err := os.OpenFile(filepath.Join(logDir, "mount.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return failure("open the mount log", err, "check that "+logDir+" is writable")
	}
	defer mountLog.Close()
	mopts := mount.Options{AllowOther: allowOther, FsName: "weft"}
	f.cache.apply(&mopts)
	m, err := mountWeft(ctx, metaAddr, mnt, mopts, f.client, newLogger(mountLog, false))
	if err != nil {
		return err
	}

	sup.onRestart = func(c *child) { recordAddrs() }
	sup.supervise(metaCtx, metaChild)
	for _, c := range dataChildren {
		sup.supervise(dataCtx, c)
	}
	printUp(stdout, dir, mnt, allowOther, f.replicas, metaChild, dataChildren, logDir)

	select {
	case <-ctx.Done():
		fmt.Fprintf(stderr, "weft: stopping: unmounting %s, then stopping the servers\n", mnt)
		m.unmount(stderr)
	case <-m.done:
		fmt.Fprintf(stderr, "weft: %s was unmounted; stopping the servers\n", mnt)
	}
	closeErr := m.close()
	stopAll()
	fmt.Fprintf(stderr, "weft: stopped; start again with weft up --dir %s --mount %s\n", dir, mnt)
	return closeErr
}

// printUp tells where everything is.
func printUp(w io.Writer, dir, mnt string, allowOther bool, replicas uint32, meta *child, data []*child, logDir string) {
	access := "every user (allow_other)"
	if !allowOther {
		access = "only you"
	}
	fmt.Fprintf(w, "weft is up\n")
	fmt.Fprintf(w, "  mount point:    %s (usable by %s)\n", mnt, access)
	fmt.Fprintf(w, "  cluster dir:    %s (addresses in %s)\n", dir, clusterFileName)
	fmt.Fprintf(w, "  replicas:       %d (default layout)\n", replicas)
	fmt.Fprintf(w, "  meta service:   %-21s dir %s  log %s\n", meta.address(), meta.dir, meta.logPath)
	for _, c := range data {
		fmt.Fprintf(w, "  %s:  %-21s dir %s  log %s\n", c.name, c.address(), c.dir, c.logPath)
	}
	fmt.Fprintf(w, "  client log:     %s\n", filepath.Join(logDir, "mount.log"))
	fmt.Fprintf(w, "status:  weft status --dir %s\n", dir)
	fmt.Fprintf(w, "stop:    Ctrl-C (or SIGTERM) unmounts and stops the servers\n")
}

// weftExecutable is the binary weft up runs its daemons with: $WEFT_EXE,
// or this program.
func weftExecutable() (string, error) {
	if p := os.Getenv("WEFT_EXE"); p != "" {
		return p, nil
	}
	p, err := os.Executable()
	if err != nil {
		return "", failure("find the weft binary to start the servers with", err, "set WEFT_EXE to the path of the weft binary")
	}
	return p, nil
}

// lockClusterDir keeps a second weft up off the same directory.
func lockClusterDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "up.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, failure("lock "+dir, err, "check that the directory is writable")
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, failure("start a cluster in "+dir, errors.New("another weft up is running on this directory"),
				"stop it first, or use another --dir")
		}
		return nil, failure("lock "+dir, err, "check the directory")
	}
	return func() { f.Close() }, nil
}

// waitServersOnline waits until the meta service reports n data servers
// online.
func waitServersOnline(ctx context.Context, metaAddr string, n int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	online := 0
	var lastErr error
	for {
		st, err := fetchStatus(ctx, metaAddr)
		if err == nil {
			if online = onlineCount(st); online >= n {
				return nil
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return lastErr
			}
			return failure("wait for the data servers", fmt.Errorf("only %d of %d registered with the meta service at %s", online, n, metaAddr),
				"see their logs in the logs directory")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// chownRoot gives the root directory of a new cluster to the user who runs
// weft up (it starts owned by root), so that they can use it.
func chownRoot(ctx context.Context, metaAddr string) error {
	mc, closeConn, err := dialMeta(metaAddr)
	if err != nil {
		return err
	}
	defer closeConn()
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	_, err = mc.SetAttr(ctx, &weftv1.SetAttrRequest{
		Caller: &weftv1.Caller{Uid: 0, Gid: 0},
		Ino:    1,
		Valid:  uint32(weftv1.SetAttrValid_SETATTR_UID | weftv1.SetAttrValid_SETATTR_GID),
		Uid:    uint32(os.Geteuid()),
		Gid:    uint32(os.Getegid()),
	})
	if err != nil {
		return failure("give the root directory to uid "+strconv.Itoa(os.Geteuid()), err, "chown it as root")
	}
	return nil
}
