// Package data is weft's storage server: the Data gRPC service over the
// chunk store of package data/chunk, and the loop that registers the server
// with the meta service and heartbeats, receiving the chain table that maps
// each chain to the local target holding it.
package data

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/data/chunk"
	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Config configures a data server.
type Config struct {
	Dir       string   // server state dir (server.id file); also the single default target
	Targets   []string // target dirs; default []string{Dir}
	MetaAddr  string   // meta service address host:port
	Advertise string   // address reported to meta for clients/peers; default: listener address
	Site      string   // failure domain: site
	Rack      string   // failure domain: rack
	Logger    *slog.Logger
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

	mu         sync.RWMutex
	serverID   uint64   // meta's id of this server, from registration
	targetIDs  []uint64 // meta's ids of store.Targets(), by position
	table      *weftv1.ChainTable
	chains     map[uint64]localChain // chain id -> the local member
	haveChains bool

	// refresh asks the heartbeat loop for an early heartbeat (a request
	// named a chain or version this server has not heard of yet).
	refresh chan struct{}

	closeOnce sync.Once
	closeErr  error
}

type localChain struct {
	version uint64
	target  *chunk.Target
}

// Open prepares a data server: its identity (<Dir>/server.id and
// <target>/target.id, created on first start) and its targets' chunk store.
// Nothing talks to the network until Serve.
func Open(cfg Config) (*Server, error) {
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
	s := &Server{cfg: cfg, log: cfg.Logger, refresh: make(chan struct{}, 1)}
	var err error
	if s.serverUUID, err = loadOrCreateID(filepath.Join(cfg.Dir, "server.id")); err != nil {
		return nil, fmt.Errorf("open data server: %w", err)
	}
	if s.store, err = chunk.Open(cfg.Targets, chunk.Options{Logger: cfg.Logger}); err != nil {
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
	if s.metaConn, err = rpc.Dial(cfg.MetaAddr); err != nil {
		s.store.Close()
		return nil, fmt.Errorf("open data server: meta service address %q: %w", cfg.MetaAddr, err)
	}
	return s, nil
}

// Close closes the chunk store and the connection to the meta service.
// Serve calls it on return; calling it again is harmless.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
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
// at the chain's current version. The heartbeat loop calls it with every
// table it receives.
func (s *Server) SetChains(table *weftv1.ChainTable) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.table = table
	s.haveChains = true
	s.rebuildChainsLocked()
}

func (s *Server) rebuildChainsLocked() {
	local := make(map[uint64]*chunk.Target)
	for i, t := range s.store.Targets() {
		if i < len(s.targetIDs) {
			local[s.targetIDs[i]] = t
		}
	}
	s.chains = make(map[uint64]localChain)
	for _, c := range s.table.GetChains() {
		for _, m := range c.GetMembers() {
			if t, ok := local[m.GetTargetId()]; ok {
				s.chains[c.GetId()] = localChain{version: c.GetVersion(), target: t}
				break
			}
		}
	}
}

// target fences a request: it returns the local target of chainID if
// version is the chain's current version.
func (s *Server) target(chainID, version uint64) (*chunk.Target, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.haveChains {
		return nil, status.Errorf(codes.Unavailable,
			"data server has no chain table from the meta service at %s yet: retry shortly", s.cfg.MetaAddr)
	}
	c, ok := s.chains[chainID]
	if !ok {
		s.askRefresh()
		return nil, status.Errorf(codes.FailedPrecondition,
			"stale chain version: chain %d has no member on this data server: refresh the chain table and retry", chainID)
	}
	if c.version != version {
		if version > c.version {
			s.askRefresh()
		}
		return nil, status.Errorf(codes.FailedPrecondition,
			"stale chain version: chain %d is at version %d here, request has %d: refresh the chain table and retry",
			chainID, c.version, version)
	}
	return c.target, nil
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

// WriteChunk writes data into a chunk on the chain's local target.
func (s *Server) WriteChunk(ctx context.Context, req *weftv1.WriteChunkRequest) (*weftv1.WriteChunkResponse, error) {
	t, err := s.target(req.GetChainId(), req.GetChainVersion())
	if err != nil {
		return nil, err
	}
	id, err := chunkID(req.GetChunk())
	if err != nil {
		return nil, err
	}
	if err := t.Write(id, int64(req.GetOffset()), req.GetData(), int64(req.GetChunkSize()), req.GetSync()); err != nil {
		return nil, err
	}
	return &weftv1.WriteChunkResponse{}, nil
}

// ReadChunk reads from a chunk on the chain's local target; the answer is
// short where the chunk ends (the rest reads as zeros).
func (s *Server) ReadChunk(ctx context.Context, req *weftv1.ReadChunkRequest) (*weftv1.ReadChunkResponse, error) {
	t, err := s.target(req.GetChainId(), req.GetChainVersion())
	if err != nil {
		return nil, err
	}
	id, err := chunkID(req.GetChunk())
	if err != nil {
		return nil, err
	}
	data, err := t.Read(id, int64(req.GetOffset()), int(req.GetLength()))
	if err != nil {
		return nil, err
	}
	return &weftv1.ReadChunkResponse{Data: data}, nil
}

// TruncateFile cuts the file's chunks on the chain's local target to the
// new length.
func (s *Server) TruncateFile(ctx context.Context, req *weftv1.TruncateFileRequest) (*weftv1.TruncateFileResponse, error) {
	t, err := s.target(req.GetChainId(), req.GetChainVersion())
	if err != nil {
		return nil, err
	}
	if err := t.TruncateFile(req.GetIno(), int64(req.GetSize()), int64(req.GetChunkSize())); err != nil {
		return nil, err
	}
	return &weftv1.TruncateFileResponse{}, nil
}

// DeleteFile removes the file's chunks from every local target.
func (s *Server) DeleteFile(ctx context.Context, req *weftv1.DeleteFileRequest) (*weftv1.DeleteFileResponse, error) {
	var errs []error
	for _, t := range s.store.Targets() {
		errs = append(errs, t.DeleteFile(req.GetIno()))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &weftv1.DeleteFileResponse{}, nil
}

// SyncFile makes the file's chunks on the chain's local target durable.
func (s *Server) SyncFile(ctx context.Context, req *weftv1.SyncFileRequest) (*weftv1.SyncFileResponse, error) {
	t, err := s.target(req.GetChainId(), req.GetChainVersion())
	if err != nil {
		return nil, err
	}
	if err := t.SyncFile(req.GetIno()); err != nil {
		return nil, err
	}
	return &weftv1.SyncFileResponse{}, nil
}
