// Package cluster is the cluster manager that lives inside the meta
// service: it keeps the registry of data servers and their targets, the
// chain table (which targets hold which chunks), the liveness of every
// server from its heartbeats, and placement of new files on chains. It
// also asks data servers to truncate or delete a file's chunks.
//
// Identities (servers, targets, chains, id counters, the chain table
// version) are persisted in the metadata kv.Engine under "c/" (see
// keys.go); liveness and capacity reports live in memory and are rebuilt
// from heartbeats. A chain is a first-class object: an id, a version that
// changes with its membership or its members' states, and an ordered list
// of member targets (head first). With one replica every target gets a
// chain of its own; for R >= 2 replicas every target heads a chain of R
// targets on distinct failure domains, members that fail are taken out,
// come back syncing, and are replaced after the repair delay (see
// README.md).
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Defaults of Config.
const (
	DefaultHeartbeatInterval = time.Second
	DefaultFailureTimeout    = 5 * time.Second
	DefaultRepairDelay       = 10 * time.Minute
)

// Config configures a Manager. Zero fields take the defaults.
type Config struct {
	// HeartbeatInterval is told to data servers at registration; it is
	// also the period of the liveness check. Default 1s.
	HeartbeatInterval time.Duration
	// FailureTimeout is how long a server may go without a heartbeat
	// before it is marked offline. Default 5s.
	FailureTimeout time.Duration
	// RepairDelay is how long a member of a replicated chain may stay
	// offline before it is replaced by another target, which then copies
	// the chain's data. Default 10m.
	RepairDelay time.Duration
	// Logger receives state changes (registrations, servers going offline
	// and coming back). Default slog.Default().
	Logger *slog.Logger
	// Follower makes the Manager start as a follower of another meta
	// server elected cluster manager (see Lead and Follow).
	Follower bool
}

// Manager is the cluster manager. All methods are safe for concurrent use.
// It assumes it is the only writer of the "c/" keys of its engine.
type Manager struct {
	eng kv.Engine
	cfg Config
	log *slog.Logger
	now func() time.Time // replaced in tests

	mu           sync.Mutex // guards the fields up to connMu
	servers      map[uint64]*serverState
	serverByUUID map[string]uint64
	targets      map[uint64]*targetState
	targetByUUID map[string]uint64
	chains       map[uint64]*chainRecord // records are replaced, never modified in place
	chainIDs     []uint64                // sorted ids of chains
	chainsOf     map[uint64][]uint64     // target id -> ids of the chains it is a member of
	tableVersion uint64
	nextServer   uint64 // last ids handed out
	nextTarget   uint64
	nextChain    uint64
	widths       []uint32           // chain widths >= 2 asked for, sorted
	usedMarks    bool               // chains record Used (c/usedmarks saved)
	table        *weftv1.ChainTable // built from the above; nil when stale
	sync         syncStats          // progress of syncing members
	rrNext       uint64             // rotating start of round-robin placement
	rng          *rand.Rand         // weighted placement
	// remoteCapacity: in a follower, the capacity the manager last
	// reported (total, free, used); nil until then.
	remoteCapacity *[3]uint64

	connMu sync.Mutex
	conns  map[uint64]*dataConn // by server id
	closed bool

	leading atomic.Bool // does the manager's duties (role.go)
	// term is cancelled when the manager stops leading, so that its
	// liveness check stuck on an unreachable store lets go of mu at once
	// (role.go); nil while it never led through Lead.
	termMu  sync.Mutex
	term    context.Context
	endTerm context.CancelFunc
}

// serverState is a registered server: its persisted record and its
// liveness.
type serverState struct {
	rec           serverRecord
	online        bool
	lastHeartbeat time.Time
	// forwards: the chain members of the server that failed to pass
	// mutations on to the next member, as its last heartbeat said.
	forwards []*weftv1.ForwardFailure
}

// targetState is a registered target: its persisted record and what its
// server last said about it.
type targetState struct {
	rec targetRecord
	// present: the target was in its server's latest registration or
	// heartbeat. A target is online when it is present and its server is.
	present bool
	report  *capacity // last capacity report; nil before the first
}

// capacity is a target's capacity as its server last reported it.
type capacity struct {
	total, free, used, chunks uint64
	filesystem                string // device of the target's file system, "" if unknown
	// Background scrub counters.
	scrubbed, scrubErrors, scrubRepaired uint64
	fault                                fault // disk fault (faults.go)
}

// NewManager loads the servers, targets and chains persisted in eng.
// Servers loaded from the engine count as online until they miss
// heartbeats for cfg.FailureTimeout (counted from now), except that chain
// members saved as offline stay offline until their server heartbeats.
func NewManager(ctx context.Context, eng kv.Engine, cfg Config) (*Manager, error) {
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.FailureTimeout <= 0 {
		cfg.FailureTimeout = DefaultFailureTimeout
	}
	if cfg.RepairDelay <= 0 {
		cfg.RepairDelay = DefaultRepairDelay
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Manager{
		eng:          eng,
		cfg:          cfg,
		log:          cfg.Logger,
		now:          time.Now,
		servers:      make(map[uint64]*serverState),
		serverByUUID: make(map[string]uint64),
		targets:      make(map[uint64]*targetState),
		targetByUUID: make(map[string]uint64),
		chains:       make(map[uint64]*chainRecord),
		rng:          rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		conns:        make(map[uint64]*dataConn),
	}
	if err := m.load(ctx); err != nil {
		return nil, err
	}
	if cfg.Follower {
		return m, nil
	}
	if err := m.markLegacyChains(ctx); err != nil {
		return nil, err
	}
	m.leading.Store(true)
	return m, nil
}

// markLegacyChains marks Used every replicated chain saved before chains
// recorded their use (no c/usedmarks key): files may be placed on them,
// so they must never be rebuilt. Done once, at the first start.
func (m *Manager) markLegacyChains(ctx context.Context) error {
	if m.usedMarks {
		return nil
	}
	var marked []*chainRecord
	for _, id := range m.chainIDs {
		if c := m.chains[id]; c.width() > 1 && !c.Used {
			c = c.clone()
			c.Used = true
			marked = append(marked, c)
		}
	}
	err := m.eng.Update(ctx, func(t kv.Txn) error {
		for _, c := range marked {
			if err := putJSON(t, idKey(prefixChain, c.ID), c); err != nil {
				return err
			}
		}
		return putUint64(t, keyUsedMarks, 1)
	})
	if err != nil {
		return fmt.Errorf("load cluster state: mark the chains of an earlier release used: %w", err)
	}
	for _, c := range marked {
		m.chains[c.ID] = c
	}
	if len(marked) > 0 {
		m.log.Info(fmt.Sprintf("%d replicated chains of an earlier release marked used: they keep their members", len(marked)))
	}
	m.usedMarks = true
	return nil
}

func (m *Manager) load(ctx context.Context) error {
	now := m.now()
	err := m.eng.View(ctx, func(t kv.Txn) error {
		var err error
		if m.tableVersion, err = getUint64(t, keyChainTableVersion); err != nil {
			return err
		}
		if m.nextServer, err = getUint64(t, keyNextServer); err != nil {
			return err
		}
		if m.nextTarget, err = getUint64(t, keyNextTarget); err != nil {
			return err
		}
		if m.nextChain, err = getUint64(t, keyNextChain); err != nil {
			return err
		}
		if m.widths, err = getWidths(t); err != nil {
			return err
		}
		marks, err := getUint64(t, keyUsedMarks)
		if err != nil {
			return err
		}
		m.usedMarks = marks != 0
		if err := scanJSON(t, prefixServer, func(r *serverRecord) {
			m.servers[r.ID] = &serverState{rec: *r, online: true, lastHeartbeat: now}
			m.serverByUUID[r.UUID] = r.ID
			m.nextServer = max(m.nextServer, r.ID)
		}); err != nil {
			return err
		}
		if err := scanJSON(t, prefixTarget, func(r *targetRecord) {
			m.targets[r.ID] = &targetState{rec: *r, present: true}
			m.targetByUUID[r.UUID] = r.ID
			m.nextTarget = max(m.nextTarget, r.ID)
		}); err != nil {
			return err
		}
		return scanJSON(t, prefixChain, func(r *chainRecord) {
			m.chains[r.ID] = r
			m.nextChain = max(m.nextChain, r.ID)
		})
	})
	if err != nil {
		return fmt.Errorf("load cluster state: %w", err)
	}
	for _, c := range m.chains {
		for _, mem := range c.Members {
			t := m.targets[mem.TargetID]
			if t == nil {
				return fmt.Errorf("load cluster state: chain %d lists target %d, which is not registered: the metadata database is damaged", c.ID, mem.TargetID)
			}
			if mem.State == stateOffline {
				t.present = false
			}
		}
	}
	m.reindexChains()
	if len(m.servers) > 0 {
		m.log.Info("cluster state loaded", "servers", len(m.servers), "targets", len(m.targets),
			"chains", len(m.chains), "chain_table_version", m.tableVersion)
	}
	return nil
}

// reindexChains rebuilds chainIDs and chainsOf after chains changed.
func (m *Manager) reindexChains() {
	m.chainIDs = make([]uint64, 0, len(m.chains))
	m.chainsOf = make(map[uint64][]uint64)
	for id, c := range m.chains {
		m.chainIDs = append(m.chainIDs, id)
		for _, mem := range c.Members {
			m.chainsOf[mem.TargetID] = append(m.chainsOf[mem.TargetID], id)
		}
	}
	slices.Sort(m.chainIDs)
}

// stage collects changes to the persisted state; commit writes them in one
// transaction and then installs them in memory, so memory never runs ahead
// of the engine.
type stage struct {
	servers      []serverRecord
	targets      []targetRecord
	chains       []*chainRecord
	nextServer   uint64
	nextTarget   uint64
	nextChain    uint64
	widths       []uint32 // new set of chain widths; nil: unchanged
	tableChanged bool     // something the chain table shows changed (addresses)
	// drop: ids of chains to delete (unused chains left without a home).
	drop []uint64
	// used: chain records newly marked Used. Saved like chains, but the
	// chain table does not show the mark, so its version stays.
	used []*chainRecord
}

func (m *Manager) newStage() *stage {
	return &stage{nextServer: m.nextServer, nextTarget: m.nextTarget, nextChain: m.nextChain}
}

func (s *stage) empty() bool {
	return len(s.servers) == 0 && len(s.targets) == 0 && len(s.chains) == 0 && s.widths == nil && !s.tableChanged &&
		len(s.drop) == 0 && len(s.used) == 0
}

// commit persists s and installs it. Called with m.mu held.
func (m *Manager) commit(ctx context.Context, s *stage) error {
	if s.empty() {
		return nil
	}
	version := m.tableVersion
	if s.tableChanged || len(s.chains) > 0 || len(s.drop) > 0 {
		version++
	}
	err := m.eng.Update(ctx, func(t kv.Txn) error {
		for _, r := range s.servers {
			if err := putJSON(t, idKey(prefixServer, r.ID), r); err != nil {
				return err
			}
		}
		for _, r := range s.targets {
			if err := putJSON(t, idKey(prefixTarget, r.ID), r); err != nil {
				return err
			}
		}
		if err := m.putChains(t, s); err != nil {
			return err
		}
		for _, c := range []struct {
			key      string
			old, new uint64
		}{
			{keyNextServer, m.nextServer, s.nextServer},
			{keyNextTarget, m.nextTarget, s.nextTarget},
			{keyNextChain, m.nextChain, s.nextChain},
			{keyChainTableVersion, m.tableVersion, version},
		} {
			if c.old != c.new {
				if err := putUint64(t, c.key, c.new); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		m.failedCommit(ctx, err)
		return fmt.Errorf("save cluster state: %w", err)
	}
	for _, r := range s.servers {
		if st := m.servers[r.ID]; st != nil {
			st.rec = r
		} else {
			m.servers[r.ID] = &serverState{rec: r}
			m.serverByUUID[r.UUID] = r.ID
		}
	}
	for _, r := range s.targets {
		if st := m.targets[r.ID]; st != nil {
			st.rec = r
		} else {
			m.targets[r.ID] = &targetState{rec: r}
			m.targetByUUID[r.UUID] = r.ID
		}
	}
	for _, r := range slices.Concat(s.chains, s.used) {
		m.chains[r.ID] = r
	}
	for _, id := range s.drop {
		delete(m.chains, id)
	}
	if len(s.chains) > 0 || len(s.drop) > 0 {
		m.reindexChains()
	}
	m.nextServer, m.nextTarget, m.nextChain = s.nextServer, s.nextTarget, s.nextChain
	if s.widths != nil {
		m.widths = s.widths
	}
	m.tableVersion = version
	m.table = nil
	return nil
}

// chainTable returns the current table, building it if stale. Called with
// m.mu held; the result is shared and must not be modified.
func (m *Manager) chainTable() *weftv1.ChainTable {
	if m.table != nil {
		return m.table
	}
	t := &weftv1.ChainTable{Version: m.tableVersion, Chains: make([]*weftv1.Chain, 0, len(m.chainIDs))}
	for _, id := range m.chainIDs {
		c := m.chains[id]
		pc := &weftv1.Chain{Id: c.ID, Version: c.Version, Replicas: uint32(c.width())}
		for _, mem := range c.Members {
			pm := &weftv1.ChainMember{TargetId: mem.TargetID, State: mem.State}
			if tg := m.targets[mem.TargetID]; tg != nil {
				pm.ServerId = tg.rec.ServerID
				if s := m.servers[tg.rec.ServerID]; s != nil {
					pm.Address = s.rec.Address
					pm.WireAddress = s.rec.WireAddress
					pm.Incarnation = s.rec.Incarnation
				}
			}
			pc.Members = append(pc.Members, pm)
		}
		t.Chains = append(t.Chains, pc)
	}
	m.table = t
	return t
}

// GetChains returns the current chain table (a copy the caller owns).
func (m *Manager) GetChains(ctx context.Context, _ *weftv1.GetChainsRequest) (*weftv1.ChainTable, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return proto.CloneOf(m.chainTable()), nil
}

// NumChains returns the number of chains in the table.
func (m *Manager) NumChains() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.chains)
}

// Close closes the connections to data servers. The engine is the
// caller's; it stays open.
func (m *Manager) Close() error {
	m.connMu.Lock()
	defer m.connMu.Unlock()
	m.closed = true
	var errs []error
	for id, c := range m.conns {
		if err := c.cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close connection to data server %d (%s): %w", id, c.addr, err))
		}
		delete(m.conns, id)
	}
	return errors.Join(errs...)
}
