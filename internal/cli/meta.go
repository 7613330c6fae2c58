package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/meta"
	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/etcdkv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// defaultMetaListen is where "weft meta" listens unless told otherwise.
const defaultMetaListen = "127.0.0.1:7000"

// metaFlags are the flags of "weft meta".
type metaFlags struct {
	dir               string
	listen            string
	heartbeatInterval time.Duration
	failureTimeout    time.Duration
	repairDelay       time.Duration
	sessionLease      time.Duration
	openGrace         time.Duration
	chunkSize         string
	stripeCount       uint32
	replicas          uint32
	engine            string
	etcdEndpoints     string
	etcdPrefix        string
	electionTTL       time.Duration
	advertise         string
	debug             bool
}

func newMetaCmd() *cobra.Command {
	var f metaFlags
	cmd := &cobra.Command{
		Use:   "meta --dir DIR [--listen ADDR]",
		Short: "Run the metadata service (namespace, sessions, cluster manager)",
		Long: `Run the metadata service in the foreground until SIGINT or SIGTERM.

It keeps all its state under --dir and writes the address it listens on to
DIR/address once it accepts connections. Data servers (weft data --meta ADDR)
register with it; clients (weft mount --meta ADDR) talk to it.

The metadata lives in an embedded database in DIR (--engine pebble, the
default) or in an etcd cluster (--engine etcd --etcd-endpoints HOST:PORT,...),
under the key prefix --etcd-prefix. Several weft meta over one etcd cluster
and prefix are active/active for the namespace; one of them, elected through
etcd, is the cluster manager (data server liveness, chains, repair), the others
forward its calls to it and take over within about --election-ttl when it dies.
Give data servers and clients every meta address (--meta a,b,c).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runMeta(cmd.Context(), cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dir, "dir", "", "directory of the service's state (required)")
	fl.StringVar(&f.listen, "listen", defaultMetaListen, "address to listen on (host:port; port 0 lets the system pick)")
	fl.DurationVar(&f.heartbeatInterval, "heartbeat-interval", time.Second, "how often data servers report to the meta service")
	fl.DurationVar(&f.failureTimeout, "failure-timeout", 5*time.Second, "a data server without heartbeat for this long is offline")
	fl.DurationVar(&f.repairDelay, "repair-delay", 10*time.Minute, "a replica offline for this long is replaced by another target and re-replicated")
	fl.DurationVar(&f.sessionLease, "session-lease", 30*time.Second, "a client session not renewed for this long expires")
	fl.DurationVar(&f.openGrace, "open-grace", 0, "after a crash, how long unlinked files are kept until clients have replayed their opens "+
		"(0: one and a half session leases; negative: every open is synced and nothing waits)")
	fl.StringVar(&f.chunkSize, "chunk-size", "1MiB", "chunk size of the cluster's default layout (power of two, 64KiB..64MiB)")
	fl.Uint32Var(&f.stripeCount, "stripe-count", 4, "stripe count of the cluster's default layout (chains per file, at least 1)")
	fl.Uint32Var(&f.replicas, "replicas", 1, fmt.Sprintf("copies of every chunk in the cluster's default layout (1..%d)", maxReplicas))
	fl.StringVar(&f.engine, "engine", "pebble", "metadata engine: pebble (embedded, in --dir) or etcd")
	fl.StringVar(&f.etcdEndpoints, "etcd-endpoints", "", "etcd client endpoints for --engine etcd (host:port,...)")
	fl.StringVar(&f.etcdPrefix, "etcd-prefix", etcdkv.DefaultPrefix, "key prefix of this cluster's metadata in etcd")
	fl.DurationVar(&f.electionTTL, "election-ttl", meta.DefaultElectionTTL,
		"with --engine etcd: lease of the cluster manager election (whole seconds); a dead manager is replaced about this long after")
	fl.StringVar(&f.advertise, "advertise", "", "address other meta servers, data servers and clients reach this one at (default: the listen address)")
	fl.BoolVar(&f.debug, "debug", false, "log debug messages")
	return cmd
}

// maxReplicas is the most copies a layout may ask for.
const maxReplicas = 8

// defaultLayout validates the layout flags shared by meta and up.
func defaultLayout(chunkSize string, stripeCount, replicas uint32) (*weftv1.Layout, error) {
	cs, err := parseChunkSize(chunkSize)
	if err != nil {
		return nil, usagef("--chunk-size: %v", err)
	}
	if stripeCount < 1 {
		return nil, usagef("--stripe-count must be at least 1, got %d", stripeCount)
	}
	if replicas < 1 || replicas > maxReplicas {
		return nil, usagef("--replicas must be between 1 and %d, got %d", maxReplicas, replicas)
	}
	return &weftv1.Layout{ChunkSize: cs, StripeCount: stripeCount, Replicas: replicas}, nil
}

func runMeta(ctx context.Context, cmd *cobra.Command, f metaFlags) error {
	if f.dir == "" {
		return usagef("--dir is required: the directory where the meta service keeps its state")
	}
	layout, err := defaultLayout(f.chunkSize, f.stripeCount, f.replicas)
	if err != nil {
		return err
	}
	if f.heartbeatInterval <= 0 || f.failureTimeout <= f.heartbeatInterval {
		return usagef("--failure-timeout (%v) must be longer than --heartbeat-interval (%v), and both positive", f.failureTimeout, f.heartbeatInterval)
	}
	if f.repairDelay <= 0 {
		return usagef("--repair-delay must be positive, got %v", f.repairDelay)
	}
	if f.sessionLease <= 0 {
		return usagef("--session-lease must be positive, got %v", f.sessionLease)
	}
	if f.electionTTL < time.Second || f.electionTTL%time.Second != 0 {
		return usagef("--election-ttl must be a whole number of seconds, at least 1s, got %v", f.electionTTL)
	}
	endpoints, err := checkEngineFlags(f)
	if err != nil {
		return err
	}
	if err := ensureDir(f.dir, "--dir"); err != nil {
		return err
	}
	log := newLogger(cmd.ErrOrStderr(), f.debug)
	var eng kv.Engine
	var ha *meta.HAConfig
	if f.engine == "etcd" {
		e, err := etcdkv.Open(ctx, etcdkv.Options{Endpoints: endpoints, Prefix: f.etcdPrefix})
		if err != nil {
			return failure("open the etcd metadata engine", err, "")
		}
		eng = e
		id, err := meta.MetaServerID(f.dir)
		if err != nil {
			e.Close()
			return failure("start the meta service", err, "check that "+f.dir+" is writable")
		}
		ha = &meta.HAConfig{Engine: e, ElectionTTL: f.electionTTL, Advertise: f.advertise, ID: id, Version: versionString()}
	}
	svc, err := meta.Open(ctx, meta.Config{
		Dir:           f.dir,
		Engine:        eng,
		DefaultLayout: layout,
		Cluster: cluster.Config{
			HeartbeatInterval: f.heartbeatInterval,
			FailureTimeout:    f.failureTimeout,
			RepairDelay:       f.repairDelay,
			Logger:            log,
		},
		SessionLease: f.sessionLease,
		OpenGrace:    f.openGrace,
		Logger:       log,
		HA:           ha,
		Advertise:    f.advertise,
	})
	if err != nil { // meta.Open closed eng
		return failure("open the meta service in "+f.dir, err, "check that no other weft meta uses this directory and that it is writable")
	}
	defer svc.Close()
	lis, err := listen(f.listen, "--listen")
	if err != nil {
		return err
	}
	addr := lis.Addr().String()
	if err := writeAddressFile(f.dir, addr); err != nil {
		lis.Close()
		return failure("start the meta service", err, "check that "+f.dir+" is writable")
	}
	fmt.Fprintf(cmd.OutOrStdout(), "weft meta listening on %s (dir %s, engine %s, replicas %d)\n", addr, f.dir, f.engine, layout.Replicas)
	if err := svc.Serve(ctx, lis); err != nil && ctx.Err() == nil {
		return failure("meta service on "+addr, err, "see the log above for the cause, then start weft meta again")
	}
	log.Info("meta service stopped")
	return nil
}

// checkEngineFlags validates --engine and its etcd flags and returns the
// etcd endpoints.
func checkEngineFlags(f metaFlags) ([]string, error) {
	switch f.engine {
	case "pebble":
		if f.etcdEndpoints != "" {
			return nil, usagef("--etcd-endpoints is only for --engine etcd (the engine is pebble)")
		}
		return nil, nil
	case "etcd":
	default:
		return nil, usagef("--engine must be pebble or etcd, got %q", f.engine)
	}
	var endpoints []string
	for _, ep := range strings.Split(f.etcdEndpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			endpoints = append(endpoints, ep)
		}
	}
	if len(endpoints) == 0 {
		return nil, usagef("--engine etcd needs --etcd-endpoints HOST:PORT[,HOST:PORT...], the client addresses of the etcd cluster")
	}
	if !strings.HasSuffix(f.etcdPrefix, "/") {
		return nil, usagef("--etcd-prefix must end with '/' (so that one cluster's prefix is not the start of another's), got %q", f.etcdPrefix)
	}
	return endpoints, nil
}
