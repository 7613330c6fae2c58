package cli

import (
	"context"
	"fmt"
	"math"

	"github.com/spf13/cobra"

	"github.com/weft-fs/weft/data"
)

// dataFlags are the flags of "weft data".
type dataFlags struct {
	dir       string
	listen    string
	metaAddr  string
	targets   []string
	site      string
	rack      string
	advertise string
	syncBW    string
	scrubRate string
	debug     bool
}

func newDataCmd() *cobra.Command {
	var f dataFlags
	cmd := &cobra.Command{
		Use:   "data --dir DIR --meta ADDR [--listen ADDR] [--target PATH ...]",
		Short: "Run a data server (stores chunks on its targets)",
		Long: `Run a data server in the foreground until SIGINT or SIGTERM.

It registers with the meta service at --meta and heartbeats; a meta service
that is down is retried. Each --target is a directory on a local disk that
holds chunks; without --target the server stores chunks in --dir. The address
it listens on is written to DIR/address.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runData(cmd.Context(), cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "dir", "", "directory of the server's state and its default target (required)")
	fl.StringVar(&f.listen, "listen", "127.0.0.1:0", "address to listen on (host:port; port 0 lets the system pick)")
	fl.StringVar(&f.metaAddr, "meta", "", "address of the meta service, host:port, or of several meta servers, comma-separated (required)")
	fl.StringArrayVar(&f.targets, "target", nil, "target directory holding chunks (repeatable; default: --dir)")
	fl.StringVar(&f.site, "site", "", "site of this server (failure domain)")
	fl.StringVar(&f.rack, "rack", "", "rack of this server (failure domain)")
	fl.StringVar(&f.advertise, "advertise", "", "address clients use to reach this server (default: the listen address)")
	fl.StringVar(&f.syncBW, "sync-bandwidth", "200MiB", "bytes per second this server sends to fill replicas that are syncing or being re-replicated (e.g. 50MiB)")
	fl.StringVar(&f.scrubRate, "scrub-rate", "20MiB", "bytes per second the background scrub re-reads and verifies (0: no background scrub)")
	fl.BoolVar(&f.debug, "debug", false, "log debug messages")
	return cmd
}

func runData(ctx context.Context, cmd *cobra.Command, f dataFlags) error {
	if f.dir == "" {
		return usagef("--dir is required: the directory where the data server keeps its state")
	}
	if f.metaAddr == "" {
		return usagef("--meta is required: the address (host:port) of the meta service")
	}
	syncBW, err := parseSize(f.syncBW)
	if err != nil {
		return usagef("--sync-bandwidth: %v", err)
	}
	if syncBW == 0 || syncBW > math.MaxInt64 {
		return usagef("--sync-bandwidth must be a positive number of bytes per second such as 200MiB, got %q", f.syncBW)
	}
	scrubRate, err := parseSize(f.scrubRate)
	if err != nil {
		return usagef("--scrub-rate: %v", err)
	}
	if scrubRate > math.MaxInt64 {
		return usagef("--scrub-rate %q is too large", f.scrubRate)
	}
	// 0 on the command line turns the background scrub off; in
	// data.Config that is a negative rate (0 there means the default).
	scrub := int64(scrubRate)
	if scrub == 0 {
		scrub = -1
	}
	if err := ensureDir(f.dir, "--dir"); err != nil {
		return err
	}
	for _, t := range f.targets {
		if err := ensureDir(t, "--target"); err != nil {
			return err
		}
	}
	log := newLogger(cmd.ErrOrStderr(), f.debug)
	srv, err := data.Open(data.Config{
		Dir:       f.dir,
		Targets:   f.targets,
		MetaAddr:  f.metaAddr,
		Advertise: f.advertise,
		Site:      f.site,
		Rack:      f.rack,
		// Sizes were checked against MaxInt64 above.
		SyncBandwidth: int64(syncBW),
		ScrubRate:     scrub,
		Logger:        log,
	})
	if err != nil {
		return failure("open the data server in "+f.dir, err, "check that the directory and targets are writable and no other weft data uses them")
	}
	lis, err := listen(f.listen, "--listen")
	if err != nil {
		srv.Close()
		return err
	}
	addr := lis.Addr().String()
	if err := writeAddressFile(f.dir, addr); err != nil {
		lis.Close()
		srv.Close()
		return failure("start the data server", err, "check that "+f.dir+" is writable")
	}
	fmt.Fprintf(cmd.OutOrStdout(), "weft data listening on %s (dir %s, meta %s)\n", addr, f.dir, f.metaAddr)
	if err := srv.Serve(ctx, lis); err != nil && ctx.Err() == nil {
		return failure("data server on "+addr, err, "see the log above for the cause, then start weft data again")
	}
	log.Info("data server stopped")
	return nil
}
