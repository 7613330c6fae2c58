package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/weft-fs/weft/meta/kv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// ErrNotLeader is returned by the calls only the elected cluster manager
// serves (RegisterServer, Heartbeat, ReportSynced, RemoveTarget) when this
// Manager follows: the caller must ask the manager.
var ErrNotLeader = errors.New("this meta server is not the elected cluster manager")

// errUsedElsewhere: a chain this manager believed unused was marked used by
// another meta server (a follower placed a file on it) and must not be
// rebuilt or dropped. The marks are reloaded and the change retried.
var errUsedElsewhere = errors.New("a chain was marked used by another meta server; retrying with its mark")

// errStaleChain: a follower picked a chain whose saved record changed since
// it loaded it.
var errStaleChain = errors.New("the chain table changed while placing a file")

// Leading reports whether this Manager does the manager's duties
// (liveness, repair, chain changes). A Manager made with Config.Follower
// starts following; otherwise it leads.
func (m *Manager) Leading() bool { return m.leading.Load() }

// Lead makes m the cluster manager: it loads the persisted state again
// from eng, which it uses for every write from now on (with etcd, an
// engine whose commits are fenced on the election), and gives every server
// a failure timeout of grace from now, so a takeover never declares the
// data servers dead at once.
func (m *Manager) Lead(ctx context.Context, eng kv.Engine) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.eng = eng
	if err := m.reload(ctx); err != nil {
		return err
	}
	if err := m.markLegacyChains(ctx); err != nil {
		return err
	}
	m.termMu.Lock()
	if m.endTerm != nil {
		m.endTerm()
	}
	m.term, m.endTerm = context.WithCancel(context.Background())
	m.termMu.Unlock()
	m.leading.Store(true)
	m.log.Info("acting as cluster manager", "servers", len(m.servers), "chains", len(m.chains),
		"chain_table_version", m.tableVersion, "grace", m.cfg.FailureTimeout)
	return nil
}

// Follow stops the manager's duties at once (calls in progress that write
// fail on the fenced engine) and from now on reads the state from eng:
// the chain table is reloaded when its version changes, liveness and
// capacity come from the elected manager through ApplyLiveness.
func (m *Manager) Follow(eng kv.Engine) {
	was := m.leading.Swap(false)
	m.termMu.Lock()
	if m.endTerm != nil {
		m.endTerm() // a liveness check waiting on the store gives up mu
	}
	m.termMu.Unlock()
	if was {
		m.log.Warn("no longer the cluster manager: following")
	}
	m.mu.Lock()
	m.eng = eng
	m.mu.Unlock()
}

// termContext returns ctx, also cancelled when the current term ends
// (Follow), and the function that releases it.
func (m *Manager) termContext(ctx context.Context) (context.Context, func()) {
	m.termMu.Lock()
	term := m.term
	m.termMu.Unlock()
	if term == nil {
		return ctx, func() {}
	}
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(term, cancel)
	return cctx, func() { stop(); cancel() }
}

// reload replaces the in-memory state by the persisted one. Called with
// m.mu held.
func (m *Manager) reload(ctx context.Context) error {
	m.servers = make(map[uint64]*serverState)
	m.serverByUUID = make(map[string]uint64)
	m.targets = make(map[uint64]*targetState)
	m.targetByUUID = make(map[string]uint64)
	m.chains = make(map[uint64]*chainRecord)
	m.widths = nil
	m.table = nil
	m.sync = syncStats{}
	return m.load(ctx)
}

// Refresh reloads the persisted state if the chain table version or the
// chain widths changed since the last load (always with force), keeping
// what is known of liveness and capacity. A follower calls it every
// heartbeat interval and before answering GetChains; the manager never
// needs it.
func (m *Manager) Refresh(ctx context.Context, force bool) error {
	if m.leading.Load() {
		return nil
	}
	var version uint64
	var widths []uint32
	m.mu.Lock()
	eng := m.eng
	m.mu.Unlock()
	err := eng.View(ctx, func(t kv.Txn) error {
		var err error
		if version, err = getUint64(t, keyChainTableVersion); err != nil {
			return err
		}
		widths, err = getWidths(t)
		return err
	})
	if err != nil {
		return fmt.Errorf("refresh cluster state: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.leading.Load() || (!force && version == m.tableVersion && slices.Equal(widths, m.widths)) {
		return nil
	}
	servers, targets := m.servers, m.targets
	if err := m.reload(ctx); err != nil {
		return err
	}
	for id, s := range m.servers {
		if old := servers[id]; old != nil {
			s.online, s.lastHeartbeat = old.online, old.lastHeartbeat
		}
	}
	for id, t := range m.targets {
		if old := targets[id]; old != nil {
			t.present, t.report = old.present, old.report
		}
	}
	return nil
}

// ApplyLiveness installs what the elected manager reports of the servers
// (online, last heartbeat, targets' capacity) and the cluster's capacity
// in a follower, so that its placement avoids offline and full targets
// and its StatFS is right. Servers it has not loaded yet are skipped.
func (m *Manager) ApplyLiveness(servers []*weftv1.ServerStatus, total, free, used uint64) {
	if m.leading.Load() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	for _, ss := range servers {
		s := m.servers[ss.Id]
		if s == nil {
			continue
		}
		s.online = ss.Online
		s.lastHeartbeat = now.Add(-time.Duration(ss.LastHeartbeatMs) * time.Millisecond)
		for _, ts := range ss.Targets {
			t := m.targets[ts.Id]
			if t == nil {
				continue
			}
			t.present = ts.Online || !ss.Online // a target of an offline server counts as present
			if ts.TotalBytes > 0 {
				t.report = &capacity{total: ts.TotalBytes, free: ts.FreeBytes, used: ts.UsedBytes, chunks: ts.Chunks,
					scrubbed: ts.ScrubbedBytes, scrubErrors: ts.ScrubErrors, scrubRepaired: ts.ScrubRepaired}
			}
		}
	}
	m.remoteCapacity = &[3]uint64{total, free, used}
}

// FollowerHeartbeat answers a data server's heartbeat in a follower that
// cannot reach the elected manager (an election in progress): the chain
// table as saved, so the server keeps serving with the table every client
// sees. Liveness is not recorded; the next manager gives every server a
// failure timeout of grace when it takes over.
func (m *Manager) FollowerHeartbeat(ctx context.Context, req *weftv1.HeartbeatRequest) (*weftv1.HeartbeatResponse, error) {
	// Bounded: a follower cut off from the store fails the heartbeat soon
	// enough for the data server to try again (through another meta
	// server, or once a manager is elected) before it fences itself.
	rctx, cancel := context.WithTimeout(ctx, max(m.cfg.FailureTimeout/4, m.cfg.HeartbeatInterval))
	defer cancel()
	if err := m.Refresh(rctx, false); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.servers[req.ServerId] == nil {
		return &weftv1.HeartbeatResponse{UnknownServer: true}, nil
	}
	return &weftv1.HeartbeatResponse{Chains: proto.CloneOf(m.chainTable())}, nil
}

// markUsedFollowing saves the Used marks of chains ids as a follower:
// each chain's saved record must still be the one this follower placed
// the file by (same version), else errStaleChain. The manager's own
// commits keep a mark they did not know of (see putChains). Called with
// m.mu held.
func (m *Manager) markUsedFollowing(ctx context.Context, ids []uint64) error {
	var want []*chainRecord
	for _, id := range ids {
		if c := m.chains[id]; !c.Used {
			want = append(want, c)
		}
	}
	if len(want) == 0 {
		return nil
	}
	err := m.eng.Update(ctx, func(t kv.Txn) error {
		for _, c := range want {
			stored, ok, err := getChain(t, c.ID)
			if err != nil {
				return err
			}
			if !ok || stored.Version != c.Version {
				return errStaleChain
			}
			if stored.Used {
				continue
			}
			stored.Used = true
			if err := putJSON(t, idKey(prefixChain, c.ID), stored); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, c := range want {
		c = c.clone()
		c.Used = true
		m.chains[c.ID] = c
	}
	return nil
}

// ensureWidthsFollowing records chain widths as a follower: they are
// added to the saved list, and the manager builds their chains at its
// next liveness check. Called with m.mu held.
func (m *Manager) ensureWidthsFollowing(ctx context.Context, widths []uint32) error {
	var merged []uint32
	err := m.eng.Update(ctx, func(t kv.Txn) error {
		stored, err := getWidths(t)
		if err != nil {
			return err
		}
		merged = mergeWidths(stored, widths)
		if slices.Equal(merged, stored) {
			return nil
		}
		return putJSON(t, []byte(keyWidths), merged)
	})
	if err != nil {
		return fmt.Errorf("record chain widths %v: %w", widths, err)
	}
	m.widths = merged
	return nil
}

// adoptWidths makes the manager build the chains of widths that followers
// recorded. Called by the liveness check with m.mu held.
func (m *Manager) adoptWidths(ctx context.Context) error {
	var stored []uint32
	err := m.eng.View(ctx, func(t kv.Txn) error {
		var err error
		stored, err = getWidths(t)
		return err
	})
	if err != nil {
		return err
	}
	var fresh []uint32
	for _, w := range stored {
		if !slices.Contains(m.widths, w) {
			fresh = append(fresh, w)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	_, err = m.ensureChains(ctx, fresh)
	return err
}

func mergeWidths(a, b []uint32) []uint32 {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// putChains writes the chain records of s (and deletes its dropped ones)
// in transaction t. A chain this manager believed unused but that a
// follower marked used keeps the mark when only its members' states
// change; a change of its members or its deletion fails with
// errUsedElsewhere (the marks are reloaded, and the next check plans
// around the chain).
func (m *Manager) putChains(t kv.Txn, s *stage) error {
	for _, r := range slices.Concat(s.chains, s.used) {
		if !r.Used {
			stored, ok, err := getChain(t, r.ID)
			if err != nil {
				return err
			}
			if ok && stored.Used {
				if !slices.Equal(sortedIDs(stored.Members), sortedIDs(r.Members)) {
					return errUsedElsewhere
				}
				r.Used = true
			}
		}
		if err := putJSON(t, idKey(prefixChain, r.ID), r); err != nil {
			return err
		}
	}
	for _, id := range s.drop {
		stored, ok, err := getChain(t, id)
		if err != nil {
			return err
		}
		if ok && stored.Used {
			return errUsedElsewhere
		}
		if err := t.Delete(idKey(prefixChain, id)); err != nil {
			return err
		}
	}
	if s.widths != nil {
		stored, err := getWidths(t)
		if err != nil {
			return err
		}
		if err := putJSON(t, []byte(keyWidths), mergeWidths(stored, s.widths)); err != nil {
			return err
		}
	}
	return nil
}

// failedCommit reacts to a commit that failed with err: after
// errUsedElsewhere the Used marks are read again. Called with m.mu held.
func (m *Manager) failedCommit(ctx context.Context, err error) {
	if !errors.Is(err, errUsedElsewhere) {
		return
	}
	var marked []*chainRecord
	verr := m.eng.View(ctx, func(t kv.Txn) error {
		return scanJSON(t, prefixChain, func(r *chainRecord) {
			if c := m.chains[r.ID]; c != nil && r.Used && !c.Used {
				marked = append(marked, c)
			}
		})
	})
	if verr != nil {
		return
	}
	for _, c := range marked {
		c = c.clone()
		c.Used = true
		m.chains[c.ID] = c
	}
	if len(marked) > 0 {
		m.log.Info(fmt.Sprintf("%d chains were marked used by other meta servers", len(marked)))
	}
}

func getChain(t kv.Txn, id uint64) (*chainRecord, bool, error) {
	b, ok, err := t.Get(idKey(prefixChain, id))
	if err != nil || !ok {
		return nil, false, err
	}
	c := new(chainRecord)
	if err := json.Unmarshal(b, c); err != nil {
		return nil, false, fmt.Errorf("decode cluster state key %s: %w (the metadata database is damaged)", idKey(prefixChain, id), err)
	}
	return c, true, nil
}

func sortedIDs(ms []memberRecord) []uint64 {
	return slices.Sorted(slices.Values(memberIDs(ms)))
}
