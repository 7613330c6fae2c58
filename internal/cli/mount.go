package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/weft-fs/weft/client"
	"github.com/weft-fs/weft/mount"
)

// mountFlags are the flags of "weft mount".
type mountFlags struct {
	metaAddr   string
	allowOther bool
	cache      cacheSettings
	client     clientSettings
	debug      bool
}

// clientSettings are the client.Config fields weft mount and weft up set.
type clientSettings struct {
	onUnavailable      string        // client.OnUnavailableWait or Fail; "": the client's default
	unavailableTimeout time.Duration // 0: the client's default
	writeBuffer        string        // --write-buffer size
	readAhead          string        // --read-ahead size; 0: off
	localReads         bool          // --local-reads
	closeSync          bool          // --close-sync
}

// addFlags defines --on-unavailable and --unavailable-timeout on cmd.
func (s *clientSettings) addFlags(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&s.onUnavailable, "on-unavailable", client.DefaultOnUnavailable,
		"when no data server of a chain can be reached (replicas 1 and its server down, or every replica down): "+
			"fail (EIO after --unavailable-timeout) or wait (block until it is back)")
	fl.DurationVar(&s.unavailableTimeout, "unavailable-timeout", client.DefaultUnavailableTimeout,
		"with --on-unavailable fail, how long I/O retries an unreachable chain before failing with EIO")
	fl.StringVar(&s.writeBuffer, "write-buffer", "64MiB",
		"bytes of written data the client holds before sending (bounds its memory; e.g. 256MiB)")
	fl.StringVar(&s.readAhead, "read-ahead", "8MiB",
		"largest read-ahead window of a sequential reader near its data servers; it grows up to 8 times with their round trip, once per 5 ms (0: no read-ahead)")
	fl.BoolVar(&s.localReads, "local-reads", true,
		"read chunks of data servers on this host straight from their files (checksums still checked); false: through the servers")
	fl.BoolVar(&s.closeSync, "close-sync", false,
		"close waits until the file's data is on the disks of every replica (fdatasync), as fsync does; "+
			"default: close waits until every replica holds it in memory (it survives any process crash and, with replicas 2 or more, the loss of one machine; fsync makes it durable)")
}

// sizes returns the parsed --write-buffer and --read-ahead (read-ahead -1:
// off).
func (s clientSettings) sizes() (writeBuffer, readAhead int64, err error) {
	wb, err := parseSize(s.writeBuffer)
	if err != nil {
		return 0, 0, usagef("--write-buffer: %v", err)
	}
	if wb < 1<<20 || wb > 1<<40 {
		return 0, 0, usagef("--write-buffer must be between 1MiB and 1TiB, got %q", s.writeBuffer)
	}
	ra, err := parseSize(s.readAhead)
	if err != nil {
		return 0, 0, usagef("--read-ahead: %v", err)
	}
	if ra > 1<<30 {
		return 0, 0, usagef("--read-ahead must be at most 1GiB, got %q", s.readAhead)
	}
	if ra == 0 {
		return int64(wb), -1, nil
	}
	return int64(wb), int64(ra), nil
}

// check validates the flags.
func (s clientSettings) check() error {
	if s.onUnavailable != client.OnUnavailableWait && s.onUnavailable != client.OnUnavailableFail {
		return usagef("--on-unavailable must be %s or %s, got %q", client.OnUnavailableWait, client.OnUnavailableFail, s.onUnavailable)
	}
	if s.unavailableTimeout <= 0 {
		return usagef("--unavailable-timeout must be positive, got %v", s.unavailableTimeout)
	}
	_, _, err := s.sizes()
	return err
}

// apply copies the settings into cfg.
func (s clientSettings) apply(cfg *client.Config) {
	cfg.OnUnavailable = s.onUnavailable
	cfg.UnavailableTimeout = s.unavailableTimeout
	// check has validated the sizes.
	cfg.WriteBufferBytes, cfg.ReadAheadBytes, _ = s.sizes()
	cfg.NoLocalReads = !s.localReads
	cfg.CloseSync = s.closeSync
}

func newMountCmd() *cobra.Command {
	var f mountFlags
	cmd := &cobra.Command{
		Use:   "mount --meta ADDR MOUNTPOINT",
		Short: "Mount a weft file system with FUSE (in the foreground)",
		Long: `Mount the weft file system of the meta service at --meta on MOUNTPOINT.

Runs in the foreground until SIGINT or SIGTERM, or until the file system is
unmounted (umount / fusermount3 -u); then it flushes what is buffered and
unmounts cleanly. As root it mounts directly; as a user it needs fusermount3.

Files with replicas 2 or more keep working when a data server dies. When no
data server of a chain can be reached (replicas 1 and its server down, or
every replica down), --on-unavailable fail returns EIO after
--unavailable-timeout, and --on-unavailable wait blocks until it is back.`,
		Args: exactArgs(1, "the MOUNTPOINT directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runMount(cmd.Context(), cmd, f, args[0])
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.metaAddr, "meta", "", "address of the meta service, host:port, or of several meta servers, comma-separated (required; the client learns the others and fails over between them)")
	fl.BoolVar(&f.allowOther, "allow-other", false, "let every user of the machine use the mount (needs root or user_allow_other in /etc/fuse.conf)")
	f.cache.addFlags(cmd)
	f.client.addFlags(cmd)
	fl.BoolVar(&f.debug, "debug", false, "log every FUSE request")
	return cmd
}

func runMount(ctx context.Context, cmd *cobra.Command, f mountFlags, dir string) error {
	if f.metaAddr == "" {
		return usagef("--meta is required: the address (host:port) of the meta service")
	}
	if err := f.cache.check(); err != nil {
		return err
	}
	if err := f.client.check(); err != nil {
		return err
	}
	if f.allowOther && os.Geteuid() != 0 && !userAllowOther() {
		return failure("mount with --allow-other", errors.New("/etc/fuse.conf does not contain user_allow_other"),
			"add the line user_allow_other to /etc/fuse.conf, run as root, or mount without --allow-other")
	}
	log := newLogger(cmd.ErrOrStderr(), f.debug)
	opts := mount.Options{AllowOther: f.allowOther, Debug: f.debug, FsName: "weft"}
	f.cache.apply(&opts)
	m, err := mountWeft(ctx, f.metaAddr, dir, opts, f.client, log)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "weft mounted on %s (meta %s); stop with Ctrl-C or umount %s\n", m.dir, f.metaAddr, m.dir)
	return m.serve(ctx, cmd.ErrOrStderr())
}

// mounted is a live weft mount of this process.
type mounted struct {
	dir    string
	client *client.Client
	fs     *mount.FS
	cancel context.CancelFunc
	done   chan struct{} // closed when the kernel connection ends
}

// mountWeft connects to the meta service at metaAddr and mounts the file
// system on dir, cleaning up a stale mount left there by a process that
// died.
func mountWeft(ctx context.Context, metaAddr, dir string, opts mount.Options, cs clientSettings, log *slog.Logger) (*mounted, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, failure("mount on "+dir, err, "give a valid directory")
	}
	dir = abs
	// The FUSE adapter logs through the default logger: send it where
	// this command's log goes.
	slog.SetDefault(log)
	if err := prepareMountPoint(dir); err != nil {
		return nil, err
	}
	// The client outlives a cancelled ctx: it must still flush and close
	// its session after SIGINT.
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	cfg := client.Config{MetaAddr: metaAddr, MountPoint: dir, Logger: log}
	cs.apply(&cfg)
	c, err := client.New(cctx, cfg)
	if err != nil {
		cancel()
		return nil, metaUnreachable(metaAddr, err)
	}
	fs, err := mount.Mount(c, dir, opts)
	if err != nil {
		c.Close()
		cancel()
		todo := "check that fuse3 is installed (/dev/fuse and fusermount3) and that the directory is not in use"
		if os.Geteuid() != 0 {
			todo = "install fuse3 (fusermount3) or run as root, and check that you own the directory"
		}
		return nil, failure("mount weft on "+dir, err, todo)
	}
	if err := writeMountRecord(dir, metaAddr); err != nil {
		log.Warn("cannot record the mount; weft layout will need --meta", "err", err)
	}
	m := &mounted{dir: dir, client: c, fs: fs, cancel: cancel, done: make(chan struct{})}
	go func() {
		fs.Wait()
		close(m.done)
	}()
	return m, nil
}

// serve waits until ctx ends (then unmounts) or the file system is
// unmounted from outside, and closes the client (flushing its buffers).
func (m *mounted) serve(ctx context.Context, stderr io.Writer) error {
	select {
	case <-ctx.Done():
		m.unmount(stderr)
	case <-m.done:
		fmt.Fprintf(stderr, "weft: %s was unmounted\n", m.dir)
	}
	return m.close()
}

// unmount unmounts, retrying while the mount is busy, and detaches it
// lazily as a last resort so that no dead mount is left behind.
func (m *mounted) unmount(stderr io.Writer) {
	var err error
	for i := 0; i < 10; i++ {
		if err = m.fs.Unmount(); err == nil {
			break
		}
		select {
		case <-m.done:
			// Unmounted, but buffered writes could not all be flushed.
			fmt.Fprintf(stderr, "weft: %v\n", oneLine(err.Error()))
			return
		case <-time.After(300 * time.Millisecond):
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "weft: unmount %s: %v; detaching it lazily (it goes away when the last file on it is closed)\n", m.dir, oneLine(err.Error()))
		if lerr := lazyUnmount(m.dir); lerr != nil {
			fmt.Fprintf(stderr, "weft: %v; unmount it by hand with umount -l %s\n", lerr, m.dir)
		}
	}
	select {
	case <-m.done:
	case <-time.After(10 * time.Second):
	}
}

// close flushes and closes the client after the mount is gone.
func (m *mounted) close() error {
	removeMountRecord(m.dir)
	err := m.client.Close()
	m.cancel()
	if err != nil {
		return failure("flush and close the client of "+m.dir, err, "data written just before the stop may be lost; check the data servers with weft status")
	}
	return nil
}

// prepareMountPoint checks that dir is a directory to mount on, creating
// it if missing and detaching a dead FUSE mount left on it.
func prepareMountPoint(dir string) error {
	_, err := os.Stat(dir)
	if errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED) {
		if uerr := lazyUnmount(dir); uerr != nil {
			return failure("mount on "+dir, fmt.Errorf("a dead mount is in the way: %w", uerr), "unmount it with umount -l "+dir)
		}
		_, err = os.Stat(dir)
	}
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return failure("create mount point "+dir, err, "create it yourself or choose another directory")
		}
		return nil
	}
	if err != nil {
		return failure("mount on "+dir, err, "choose another directory")
	}
	if mp, err := findWeftMount(dir); err == nil && mp == dir {
		return failure("mount on "+dir, errors.New("a weft file system is already mounted there"), "unmount it first or choose another directory")
	}
	return nil
}

// metaUnreachable explains a failure to talk to the meta service.
func metaUnreachable(addr string, err error) error {
	return failure("cannot reach the meta service at "+addr, errors.New(grpcMessage(err)),
		"is weft meta running? start it with weft up or weft meta")
}

// userAllowOther reports whether /etc/fuse.conf lets users mount with
// allow_other.
func userAllowOther() bool {
	b, err := os.ReadFile("/etc/fuse.conf")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "user_allow_other" {
			return true
		}
	}
	return false
}

func lookPath(prog string) (string, error) { return exec.LookPath(prog) }

// runQuiet runs a program and returns its output as the error if it fails.
func runQuiet(prog string, args ...string) error {
	out, err := exec.Command(prog, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", prog, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
