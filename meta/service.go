// Package meta is weft's metadata service: the namespace (inodes, directory
// entries, xattrs, layouts, file lengths), client sessions and open files,
// the garbage-collection queue of deleted files, and the gRPC Meta service
// that also fronts the cluster manager.
//
// All state lives in a kv.Engine under the keys documented in keys.go. Each
// namespace operation is one kv.Update, so the namespace stays consistent
// whatever point a meta server dies at. Permissions are checked here with
// the request's Caller, never only in the client. See README.md.
package meta

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/internal/disk"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/wire"
	"github.com/weft-fs/weft/meta/kv"
	"github.com/weft-fs/weft/meta/kv/pebblekv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Defaults of Config.
const (
	defaultChunkSize    = 1 << 20
	defaultStripeCount  = 4
	defaultReplicas     = 1
	defaultSessionLease = 30 * time.Second
)

// Config configures the metadata service.
type Config struct {
	// Dir is the meta server's directory; the pebble engine lives in
	// Dir/db unless Engine is set.
	Dir string
	// Engine, if set, is used instead of a pebble engine in Dir. The
	// service closes it on Close.
	Engine kv.Engine
	// FS is the file system the pebble engine is on; default the local
	// one (tests use one that can crash, see package disk).
	FS disk.FS
	// DefaultLayout is the layout of files with no directory default above
	// them. Zero fields take the defaults: chunk 1 MiB, stripe_count 4
	// (capped to the chains there are at create time), replicas 1.
	DefaultLayout *weftv1.Layout
	// Cluster configures the cluster manager.
	Cluster cluster.Config
	// SessionLease is how long a session lives without renewal; default
	// 30s. An expired session's opens are dropped.
	SessionLease time.Duration
	// OpenGrace is how long after start-up a file that loses its last
	// name or open is kept, when no session is known to have it open,
	// so that clients can replay the opens a crash lost (replay.go);
	// default one and a half leases. Negative: opens are synced as every
	// other change, and nothing waits.
	OpenGrace time.Duration
	// Logger receives the service's log; default slog.Default().
	Logger *slog.Logger
	// HA, with the etcd engine, makes this one of several meta servers:
	// the cluster manager is elected among them (see ha.go). Nil: the
	// only meta server, always the manager.
	HA *HAConfig
	// Advertise is the address clients reach this server at when it is
	// not the listen address (a proxy or NAT in front of it).
	Advertise string
}

// clusterManager is what the namespace needs of cluster.Manager.
type clusterManager interface {
	RegisterServer(context.Context, *weftv1.RegisterServerRequest) (*weftv1.RegisterServerResponse, error)
	Heartbeat(context.Context, *weftv1.HeartbeatRequest) (*weftv1.HeartbeatResponse, error)
	GetChains(context.Context, *weftv1.GetChainsRequest) (*weftv1.ChainTable, error)
	Servers() []*weftv1.ServerStatus
	Capacity() (total, free, used uint64)
	NumChains() int
	PickChains(ctx context.Context, n int, replicas uint32) ([]uint64, error)
	ChainWidth(id uint64) (int, bool)
	TruncateFile(ctx context.Context, ino uint64, layout *weftv1.Layout, size uint64) error
	DeleteFile(ctx context.Context, ino uint64, layout *weftv1.Layout) error
	EnsureChains(ctx context.Context, replicas uint32) error
	ReportSynced(context.Context, *weftv1.ReportSyncedRequest) (*weftv1.ReportSyncedResponse, error)
	RemoveTarget(ctx context.Context, id uint64) (uint32, error)
	Health() cluster.Health
	// fsck: the chunks on the chains' serving members (cluster/fsckops.go).
	ScanChunks(ctx context.Context, visit func(cluster.ChunkReplicas) error) error
	ProbeChunk(ctx context.Context, chain, ino, index uint64, repair bool) (cluster.ChunkReplicas, error)
	BadCopies(ctx context.Context, repair bool) ([]cluster.BadCopy, int, error)
	TrimChunk(ctx context.Context, chain, ino, index uint64) error
	Run(ctx context.Context)
	Close() error
}

// Service is the metadata service. It implements weftv1.MetaServer; its
// methods are safe for concurrent use (the engine serializes or retries
// conflicting transactions).
type Service struct {
	weftv1.UnimplementedMetaServer

	eng       kv.Engine
	cluster   clusterManager
	cfg       Config
	log       *slog.Logger
	clusterID string
	now       func() time.Time

	gcMu      sync.Mutex
	gcRetryAt map[uint64]gcRetry // inodes whose chunk deletion failed
	gcLive    map[uint64]bool    // queued inodes found still existing (logged once, rechecked every pass)

	inos    inoRanges   // inode numbers reserved for this server (counters.go)
	layouts layoutCache // effective layouts of directories (layoutcache.go)

	cb    *callbacks  // callbacks: who caches what (callbacks*.go)
	deleg delegations // create delegations granted (delegate.go)
	// recallWait overrides how long a recall waits (tests); 0: recallWait.
	recallWait time.Duration
	ha         *ha // election, registry, forwarding to the manager (ha*.go)

	wireIDOnce sync.Once // the lean path (wire.go)
	wireID     string
	wireMu     sync.Mutex
	wireAddr   string

	// Lazy opens (replay.go): epoch names this incarnation when opens
	// are committed lazily ("" when they are synced); until graceUntil
	// (ns since the epoch) files nobody is known to have open are kept.
	epoch      string
	graceUntil int64

	closeOnce sync.Once
	closeErr  error
}

// Open opens (creating on first start) the metadata store, starts the
// cluster manager over it and creates the root directory and cluster id
// if they do not exist yet.
func Open(ctx context.Context, cfg Config) (*Service, error) {
	// The service's live heap is small (the engine keeps its memtables
	// and block cache outside it) while every call allocates: with Go's
	// default the collector ran every few hundred calls (8% of the
	// service's CPU under creates).
	rpc.TuneGC(400)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SessionLease <= 0 {
		cfg.SessionLease = defaultSessionLease
	}
	cfg.DefaultLayout = withLayoutDefaults(cfg.DefaultLayout)
	if err := validateLayout(cfg.DefaultLayout); err != nil {
		return nil, fmt.Errorf("default layout: %w", err)
	}
	eng := cfg.Engine
	if eng == nil {
		if cfg.Dir == "" {
			return nil, errors.New("open metadata service: no directory given (set the meta dir, e.g. --dir)")
		}
		fsys := cfg.FS
		if fsys == nil {
			fsys = disk.OS{}
		}
		// Dir holds more than the engine (the Unix socket of local
		// clients), on the local file system.
		if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("create metadata directory: %w", err)
		}
		dbDir := filepath.Join(cfg.Dir, "db")
		if err := fsys.MkdirAll(dbDir, 0o700); err != nil {
			return nil, fmt.Errorf("create metadata directory: %w", err)
		}
		var err error
		if eng, err = pebblekv.OpenFS(dbDir, fsys); err != nil {
			return nil, err
		}
	}
	cfg.Cluster.Follower = cfg.HA != nil // the elected one leads (ha.go)
	mgr, err := cluster.NewManager(ctx, eng, cfg.Cluster)
	if err != nil {
		eng.Close()
		return nil, fmt.Errorf("start cluster manager: %w", err)
	}
	s := newService(eng, mgr, cfg)
	s.ha = newHA(cfg.HA, mgr, cfg.Logger)
	fresh, err := s.initialize(ctx)
	if err == nil {
		err = s.startGrace(ctx, fresh)
	}
	if err == nil {
		// Chains of the default width are made now (or when enough
		// targets have registered).
		if err = mgr.EnsureChains(ctx, cfg.DefaultLayout.Replicas); err != nil {
			err = fmt.Errorf("default layout: %w", err)
		}
	}
	if err == nil {
		if err = s.extendSessions(ctx); err != nil {
			err = fmt.Errorf("renew sessions at start-up: %w", err)
		}
	}
	if err != nil {
		mgr.Close()
		eng.Close()
		return nil, err
	}
	return s, nil
}

func newService(eng kv.Engine, cm clusterManager, cfg Config) *Service {
	return &Service{
		eng: eng, cluster: cm, cfg: cfg, log: cfg.Logger, now: time.Now,
		gcRetryAt: make(map[uint64]gcRetry), gcLive: make(map[uint64]bool), cb: newCallbacks(),
	}
}

// initialize creates the root inode, the inode counter and the cluster id
// on first start, in one transaction; later starts find them and change
// nothing. fresh reports a first start.
func (s *Service) initialize(ctx context.Context) (fresh bool, err error) {
	now := s.now().UnixNano()
	err = s.eng.Update(ctx, func(t kv.Txn) error {
		id, ok, err := t.Get(keyClusterID)
		if err != nil {
			return err
		}
		fresh = !ok
		if ok {
			s.clusterID = string(id)
			return nil
		}
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("make cluster id: %w", err)
		}
		s.clusterID = hex.EncodeToString(b[:])
		x := &tx{t: t, now: now}
		root := &weftv1.Attr{
			Ino: rootIno, Mode: syscall.S_IFDIR | 0o755, Nlink: 2,
			AtimeNs: now, MtimeNs: now, CtimeNs: now, Generation: 1,
		}
		if err := x.putInode(root); err != nil {
			return err
		}
		for _, kvp := range []struct{ k, v []byte }{
			{keyNextIno, be64(rootIno + 1)},
			{keyCountDirs, be64(1)},
			{keyCountFiles, be64(0)},
			{keyClusterID, []byte(s.clusterID)},
		} {
			if err := t.Set(kvp.k, kvp.v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("initialize metadata: %w", err)
	}
	return fresh, nil
}

// ClusterID is the cluster's identity, made on first start.
func (s *Service) ClusterID() string { return s.clusterID }

// Serve runs the Meta gRPC service on lis, the cluster manager's liveness
// checks, the GC loop and session expiry until ctx is done; then it stops
// the server gracefully and closes the service.
func (s *Service) Serve(ctx context.Context, lis net.Listener) error {
	if s.ha == nil {
		mgr, _ := s.cluster.(*cluster.Manager)
		s.ha = newHA(nil, mgr, s.log)
	}
	s.ha.start(lis.Addr().String())
	defer s.ha.close()
	srv := rpc.NewServer(grpc.ChainUnaryInterceptor(s.haInterceptor, s.recallInterceptor, s.callbackInterceptor))
	weftv1.RegisterMetaServer(srv, s)
	gl, wl, wireAddr := s.listenWire(lis)
	ws := wire.NewBatchServer(s, s.log)
	s.wireMu.Lock()
	s.wireAddr = wireAddr
	s.wireMu.Unlock()
	loopCtx, stopLoops := context.WithCancel(ctx)
	var wg sync.WaitGroup
	pollLiveness := func(ctx context.Context) { s.ha.pollLiveness(ctx, s.cfg.Cluster.HeartbeatInterval) }
	for _, loop := range []func(context.Context){s.cluster.Run, s.gcLoop, s.sessionLoop, s.callbackLoop,
		s.ha.run, pollLiveness, s.requestSweepLoop, s.graceLoop} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(loopCtx)
		}()
	}
	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(gl) }()
	go func() {
		if err := ws.Serve(wl); err != nil {
			serveErr <- fmt.Errorf("lean path: %w", err)
		}
	}()
	s.log.Info("meta service listening", "address", lis.Addr().String(), "wire", wireAddr, "cluster", s.clusterID, "engine", s.eng.Name())
	var err error
	select {
	case <-ctx.Done():
		ws.Close(5 * time.Second)
		stopGracefully(srv, 5*time.Second)
		<-serveErr
	case err = <-serveErr:
		ws.Close(5 * time.Second)
		srv.Stop()
		err = fmt.Errorf("meta service on %s: %w", lis.Addr(), err)
	}
	stopLoops()
	wg.Wait()
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	return err
}

// grpcStopper is the part of *grpc.Server that stopGracefully uses.
type grpcStopper interface {
	GracefulStop()
	Stop()
}

// stopGracefully lets running RPCs finish, but not longer than limit.
func stopGracefully(srv grpcStopper, limit time.Duration) {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(limit):
		srv.Stop()
		<-done
	}
}

// Close stops the cluster manager and closes the engine. It is safe to
// call more than once.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		err1 := s.cluster.Close()
		s.noteCleanStop()
		err2 := s.eng.Close()
		s.closeErr = errors.Join(err1, err2)
	})
	return s.closeErr
}

// update runs fn as one namespace transaction stamped with the current time.
func (s *Service) update(ctx context.Context, fn func(x *tx) error) error {
	now := s.now().UnixNano()
	rec := s.newRecorder()
	reqID := takeRequestToken(ctx) // a retried request is applied once (ha_requests.go)
	txn := func(t kv.Txn) error {
		if err := checkRequest(t, reqID); err != nil {
			return err
		}
		return s.recordUpdate(rec, t, func(t kv.Txn) error { return fn(&tx{t: t, now: now, grace: now < s.graceUntil}) })
	}
	var err error
	if g := updateGroupOf(ctx); g != nil {
		err = g.update(ctx, txn) // a call of a batch (batch.go)
	} else {
		err = s.eng.Update(ctx, txn)
	}
	if err == nil {
		s.committed(ctx, rec)
	}
	return err
}

// view runs fn in a read-only snapshot.
func (s *Service) view(ctx context.Context, fn func(x *tx) error) error {
	now := s.now().UnixNano()
	return s.eng.View(ctx, func(t kv.Txn) error { return fn(&tx{t: t, now: now, grace: now < s.graceUntil}) })
}
