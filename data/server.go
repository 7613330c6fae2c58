// Package data is weft's storage server: the Data gRPC service over the
// chunk store of package data/chunk, replication of chunk mutations along
// chains (head to tail, with per-chunk versions), resync of members that
// missed mutations, repair of bad copies from peers and background scrub,
// and the loop that registers the server with the meta service and
// heartbeats, receiving the chain table that maps each chain to the local
// targets holding it and their roles. See README.md.
package data

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/data/chunk"
	"github.com/weft-fs/weft/internal/disk"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/internal/wire"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Defaults of Config.
const (
	DefaultSyncBandwidth = 200 << 20 // bytes/s copied to syncing members
	DefaultScrubRate     = 20 << 20  // bytes/s re-read by the background scrub
)

// Config configures a data server.
type Config struct {
	Dir       string   // server state dir (server.id file); also the single default target
	Targets   []string // target dirs; default []string{Dir}
	MetaAddr  string   // meta service address host:port
	Advertise string   // address reported to meta for clients/peers; default: listener address
	Site      string   // failure domain: site
	Rack      string   // failure domain: rack
	// SyncBandwidth bounds the bytes per second this server copies into
	// its syncing chain members; default DefaultSyncBandwidth.
	SyncBandwidth int64
	// ScrubRate is the bytes per second the background scrub re-reads and
	// verifies; 0 means DefaultScrubRate, a negative value turns the
	// background scrub off (Server.Scrub still runs a pass on demand).
	ScrubRate int64
	// NoUnixSocket keeps the lean data path (package internal/wire:
	// chunk reads, writes and syncs) off the Unix socket in Dir, so that
	// clients on this host reach the server through its advertised TCP
	// address too (tests that put a proxy in front of it). The lean data
	// path is always served on the listener's port, told apart from gRPC
	// by its first bytes.
	NoUnixSocket bool
	Logger       *slog.Logger
	// FS is the file system the targets are on; default the local one
	// (tests use one that can crash, see package disk).
	FS disk.FS
}

// Server is a data server. Its RPC handlers may be called concurrently.
type Server struct {
	weftv1.UnimplementedDataServer

	cfg         Config
	log         *slog.Logger
	store       *chunk.Store
	serverUUID  string
	targetUUIDs []string
	metaConn    *grpc.ClientConn
	peers       peerPool
	wirePeers   wirePool      // lean data path clients of peers, by wire address
	wireAddr    string        // advertised lean data path address
	stats       []targetStats // by position in store.Targets()

	// incarnation is this process: the server's uuid and a random part
	// new at every start (wire.NewIdentity). It is registered with the
	// meta service, and the lean data path's Unix socket answers with it.
	incarnation string
	// forwards: chains whose mutations this server fails to pass on to
	// the next member, reported in heartbeats (forwardfail.go).
	forwards forwardFailures

	mu         sync.RWMutex
	serverID   uint64   // meta's id of this server, from registration
	targetIDs  []uint64 // meta's ids of store.Targets(), by position
	table      *weftv1.ChainTable
	chains     map[uint64]*chainView // chains with a member on this server
	haveChains bool
	// lastContact is when the last heartbeat (or registration) that the
	// meta service answered was sent; zero until the first one. Requests
	// are refused while it is older than half the failure timeout.
	lastContact    time.Time
	failureTimeout time.Duration

	// refresh asks the heartbeat loop for an early heartbeat (a request
	// named a chain or version this server has not heard of yet).
	refresh chan struct{}

	syncMu   sync.Mutex
	syncs    map[syncKey]*syncSession
	syncWake chan struct{}
	syncRate *tokenBucket
	// resyncedChunks counts the chunks bulk passes copied.
	resyncedChunks atomic.Uint64

	repairMu  sync.Mutex
	repairing map[repairKey]bool
	// bad holds the bad copies found and not repaired (badcopies.go).
	badMu     sync.Mutex
	bad       map[repairKey]*badCopy
	scrubRate *tokenBucket
	scrubNow  chan struct{}

	bgMu  sync.Mutex
	bgCtx context.Context // Serve's; nil before Serve
	bg    sync.WaitGroup  // background work started by handlers

	closeOnce sync.Once
	closeErr  error
}

// chainView is one chain of the table that has a member on this server,
// at one version. ctx is cancelled when the chain's version changes, which
// cuts forwards still waiting on members the new version dropped.
type chainView struct {
	id, version uint64
	members     []*weftv1.ChainMember
	local       map[uint64]*chunk.Target // member target id -> local target
	localPos    map[uint64]int           // member target id -> index in members
	ctx         context.Context
	cancel      context.CancelFunc
}

// Open prepares a data server: its identity (<Dir>/server.id and
// <target>/target.id, created on first start) and its targets' chunk store.
// Nothing talks to the network until Serve.
func Open(cfg Config) (*Server, error) {
	rpc.TuneGC(400)
	if cfg.Dir == "" {
		return nil, errors.New("open data server: no state directory given")
	}
	if cfg.MetaAddr == "" {
		return nil, errors.New("open data server: no meta service address given (host:port)")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.Targets) == 0 {
		cfg.Targets = []string{cfg.Dir}
	}
	if cfg.SyncBandwidth <= 0 {
		cfg.SyncBandwidth = DefaultSyncBandwidth
	}
	if cfg.ScrubRate == 0 {
		cfg.ScrubRate = DefaultScrubRate
	}
	targets := make([]string, len(cfg.Targets))
	for i, t := range cfg.Targets {
		abs, err := filepath.Abs(t)
		if err != nil {
			return nil, fmt.Errorf("open data server: target %s: %w", t, err)
		}
		targets[i] = abs
	}
	cfg.Targets = targets
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("open data server: create state directory: %w", err)
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger, refresh: make(chan struct{}, 1),
		syncs: make(map[syncKey]*syncSession), syncWake: make(chan struct{}, 1),
		syncRate:  newTokenBucket(cfg.SyncBandwidth),
		repairing: make(map[repairKey]bool), bad: make(map[repairKey]*badCopy), scrubNow: make(chan struct{}, 1),
		failureTimeout: failureTimeoutFor(0, defaultHeartbeatInterval),
	}
	if cfg.ScrubRate > 0 {
		s.scrubRate = newTokenBucket(cfg.ScrubRate)
	}
	var err error
	if s.serverUUID, err = loadOrCreateID(filepath.Join(cfg.Dir, "server.id")); err != nil {
		return nil, fmt.Errorf("open data server: %w", err)
	}
	s.incarnation = wire.NewIdentity(s.serverUUID)
	if s.store, err = chunk.Open(cfg.Targets, chunk.Options{Logger: cfg.Logger, FS: cfg.FS}); err != nil {
		return nil, fmt.Errorf("open data server: %w", err)
	}
	for _, t := range s.store.Targets() {
		id, err := loadOrCreateID(filepath.Join(t.Dir(), "target.id"))
		if err != nil {
			s.store.Close()
			return nil, fmt.Errorf("open data server: %w", err)
		}
		s.targetUUIDs = append(s.targetUUIDs, id)
	}
	s.stats = make([]targetStats, len(s.store.Targets()))
	if s.metaConn, err = rpc.Dial(MetaTarget(cfg.MetaAddr)); err != nil {
		s.store.Close()
		return nil, fmt.Errorf("open data server: meta service address %q: %w", cfg.MetaAddr, err)
	}
	return s, nil
}

// Close closes the chunk store and the connections to the meta service and
// to peers. Serve calls it on return; calling it again is harmless.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.bg.Wait()
		s.peers.close()
		s.wirePeers.close()
		s.closeErr = errors.Join(s.store.Close(), s.metaConn.Close())
	})
	return s.closeErr
}

// SetTargetIDs records the ids the meta service gave this server's targets,
// in the order of Config.Targets. The heartbeat loop calls it on
// registration.
func (s *Server) SetTargetIDs(ids []uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.targetIDs = append([]uint64(nil), ids...)
	s.rebuildChainsLocked()
}

// SetChains installs the chain table from the meta service: requests are
// then accepted for chains with a member on one of this server's targets,
// at the chain's current version, in the role the member's state and
// position give it (head, middle, tail; serving or syncing). Syncing
// members start copying what they missed. The heartbeat loop calls it with
// every table it receives.
func (s *Server) SetChains(table *weftv1.ChainTable) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.table = table
	s.haveChains = true
	s.rebuildChainsLocked()
	live := liveAddresses(table)
	s.peers.dropGone(live)
	s.wirePeers.dropGone(live)
}

func (s *Server) rebuildChainsLocked() {
	local := make(map[uint64]*chunk.Target)
	for i, t := range s.store.Targets() {
		if i < len(s.targetIDs) {
			local[s.targetIDs[i]] = t
		}
	}
	old := s.chains
	s.chains = make(map[uint64]*chainView)
	for _, c := range s.table.GetChains() {
		v := &chainView{id: c.GetId(), version: c.GetVersion(), members: c.GetMembers(),
			local: make(map[uint64]*chunk.Target), localPos: make(map[uint64]int)}
		for i, m := range c.GetMembers() {
			if t, ok := local[m.GetTargetId()]; ok {
				v.local[m.GetTargetId()] = t
				v.localPos[m.GetTargetId()] = i
			}
		}
		if len(v.local) == 0 {
			continue
		}
		if o := old[v.id]; o != nil && o.version == v.version && sameTargets(o.local, v.local) && sameMembers(o.members, v.members) {
			s.chains[v.id] = o
			continue
		}
		v.ctx, v.cancel = context.WithCancel(context.Background())
		s.chains[v.id] = v
	}
	for id, o := range old {
		if s.chains[id] != o {
			o.cancel()
		}
	}
	s.dropStaleSyncs()
	s.forwards.dropStale(s.chains)
	select {
	case s.syncWake <- struct{}{}:
	default:
	}
}

func sameTargets(a, b map[uint64]*chunk.Target) bool {
	if len(a) != len(b) {
		return false
	}
	for id, t := range a {
		if b[id] != t {
			return false
		}
	}
	return true
}

// sameMembers reports whether two lists of chain members are the same
// members (target, server, incarnation, addresses, state) in the same
// order. The manager gives a chain a new version whenever they change; a
// view is kept only while they hold, so that no forward ever goes to an
// address the table no longer names.
func sameMembers(a, b []*weftv1.ChainMember) bool {
	return slices.EqualFunc(a, b, func(x, y *weftv1.ChainMember) bool { return proto.Equal(x, y) })
}

func (s *Server) askRefresh() {
	select {
	case s.refresh <- struct{}{}:
	default:
	}
}

func chunkID(c *weftv1.ChunkID) (chunk.ID, error) {
	if c == nil {
		return chunk.ID{}, fmt.Errorf("request names no chunk: %w", syscall.EINVAL)
	}
	return chunk.ID{Ino: c.GetIno(), Index: c.GetIndex()}, nil
}
