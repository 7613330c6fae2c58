package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/cluster"
	"github.com/weft-fs/weft/internal/rpc"
	"github.com/weft-fs/weft/meta/kv/etcdkv"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// DefaultElectionTTL is the default lease of a meta server's election
// session: a cluster manager that dies is replaced about this long after.
const DefaultElectionTTL = 2 * time.Second

// HAConfig configures one of several meta servers sharing an etcd
// engine: the election of the cluster manager and the registry of meta
// servers (see README.md, "Several meta servers").
type HAConfig struct {
	// Engine is the etcd engine the service runs on (Config.Engine).
	Engine *etcdkv.Engine
	// ElectionTTL is the lease of the election session (whole seconds,
	// at least 1; default DefaultElectionTTL).
	ElectionTTL time.Duration
	// Advertise is the address other meta servers, data servers and
	// clients reach this one at; default the listener's address.
	Advertise string
	// ID names this meta server (see MetaServerID).
	ID string
	// Version is the weft version it runs, shown by weft status.
	Version string
}

// Metadata keys of forwarded and special requests.
const (
	// mdForwarded marks a manager call a follower forwarded: the receiver
	// never forwards it again.
	mdForwarded = "weft-forwarded"
	// mdLiveness asks Status for the servers' liveness and the capacity
	// only (what a follower polls from the manager).
	mdLiveness = "weft-liveness-only"
	// forwardTimeout bounds a forwarded call without a deadline.
	forwardTimeout = 5 * time.Second
)

// ha is the part of a meta server that deals with the other meta servers:
// the election of the cluster manager, the registry, forwarding of the
// manager's calls. With the pebble engine cli is nil: the one meta server
// is the manager.
type ha struct {
	cfg    HAConfig
	cli    *clientv3.Client
	eng    *etcdkv.Engine
	prefix string
	ttl    time.Duration
	mgr    *cluster.Manager
	log    *slog.Logger
	addr   string // advertised address, known once serving

	mu         sync.Mutex
	leaderID   string
	leaderAddr string
	fwdAddr    string
	fwd        *grpc.ClientConn
	lostAt     time.Time // when this server last saw no manager
	// The other meta servers as last read from the registry, connections
	// to them, and the one that last answered as manager (ha_peers.go).
	peers     []metaRecord
	peerConns map[string]*grpc.ClientConn
	peerHint  string

	regMu sync.Mutex
	reg   []metaRecord
	regAt time.Time
}

func newHA(cfg *HAConfig, mgr *cluster.Manager, log *slog.Logger) *ha {
	if log == nil {
		log = slog.Default()
	}
	h := &ha{mgr: mgr, log: log}
	if cfg == nil {
		return h
	}
	h.cfg = *cfg
	h.eng = cfg.Engine
	h.cli = cfg.Engine.Client()
	h.prefix = cfg.Engine.Prefix()
	h.ttl = cfg.ElectionTTL
	if h.ttl <= 0 {
		h.ttl = DefaultElectionTTL
	}
	return h
}

// start records the advertised address; the election runs in run.
func (h *ha) start(listenAddr string) {
	h.addr = listenAddr
	if h.cfg.Advertise != "" {
		h.addr = h.cfg.Advertise
	}
	if h.cli == nil {
		h.setLeader(h.cfg.ID, h.addr)
	}
}

// leader returns the elected manager's id and address ("" while unknown).
func (h *ha) leader() (id, addr string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.leaderID, h.leaderAddr
}

func (h *ha) setLeader(id, addr string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.leaderID != id && id != "" && id != h.cfg.ID {
		h.log.Info("cluster manager elected", "manager", id, "address", addr)
	}
	h.leaderID, h.leaderAddr = id, addr
}

// leaderValue is the value of the election key.
type leaderValue struct {
	ID      string `json:"id"`
	Address string `json:"address"`
}

// run takes part in the election until ctx is done: one etcd session
// (lease of ElectionTTL) at a time, which carries this server's registry
// record and, while it campaigns or leads, its election key. A session
// that ends (etcd unreachable for a TTL) ends the term: the Manager
// follows at once and a new session campaigns again.
func (h *ha) run(ctx context.Context) {
	if h.cli == nil {
		return
	}
	for ctx.Err() == nil {
		err := h.term(ctx)
		if ctx.Err() != nil {
			return
		}
		h.log.Warn("election session with etcd ended; joining the election again", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// term is one election session.
func (h *ha) term(ctx context.Context) error {
	ttl := int(math.Ceil(h.ttl.Seconds()))
	sess, err := concurrency.NewSession(h.cli, concurrency.WithTTL(max(ttl, 1)), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("open an etcd session: %w", err)
	}
	lease := sess.Lease()
	defer func() {
		// Revoking the lease drops the registry record and the election
		// key at once, so a clean stop hands over without waiting a TTL.
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		h.cli.Revoke(rctx, lease)
		cancel()
		sess.Orphan()
	}()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sess.Done():
			cancel()
		case <-sctx.Done():
		}
	}()
	if err := h.publish(sctx, lease); err != nil {
		return err
	}
	go h.republish(sctx, lease)
	el := concurrency.NewElection(sess, h.prefix+electionDir)
	go h.observe(sctx, el)
	val, _ := json.Marshal(leaderValue{ID: h.cfg.ID, Address: h.addr})
	if err := el.Campaign(sctx, string(val)); err != nil {
		return fmt.Errorf("campaign for cluster manager: %w", err)
	}
	began := time.Now()
	guarded := h.eng.Guarded(clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev()))
	if err := h.mgr.Lead(sctx, guarded); err != nil {
		h.mgr.Follow(h.eng)
		return fmt.Errorf("take over as cluster manager: %w", err)
	}
	h.setLeader(h.cfg.ID, h.addr)
	h.mu.Lock()
	vacant := time.Duration(0)
	if !h.lostAt.IsZero() {
		vacant = time.Since(h.lostAt)
	}
	h.mu.Unlock()
	h.log.Info("elected cluster manager", "address", h.addr, "load", time.Since(began).Round(time.Millisecond),
		"no_manager_seen_for", vacant.Round(time.Millisecond))
	<-sctx.Done()
	h.mgr.Follow(h.eng)
	h.setLeader("", "")
	if ctx.Err() != nil {
		return nil
	}
	return errors.New("lost the etcd session: no longer the cluster manager")
}

// republish renews the registry record (its last-seen time) every TTL.
func (h *ha) republish(ctx context.Context, lease clientv3.LeaseID) {
	t := time.NewTicker(h.ttl)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := h.publish(ctx, lease); err != nil && ctx.Err() == nil {
				h.log.Warn("renew this meta server's registry record", "err", err)
			}
			h.members(ctx) // keeps the list of peers fresh (ha_peers.go)
		}
	}
}

// observe follows who is elected.
func (h *ha) observe(ctx context.Context, el *concurrency.Election) {
	for resp := range el.Observe(ctx) {
		if len(resp.Kvs) == 0 {
			continue
		}
		var v leaderValue
		if json.Unmarshal(resp.Kvs[0].Value, &v) == nil {
			h.setLeader(v.ID, v.Address)
		}
	}
}

// pollLiveness has a follower fetch the servers' liveness and capacity
// from the manager every interval, until ctx is done.
func (h *ha) pollLiveness(ctx context.Context, every time.Duration) {
	if h.cli == nil {
		return
	}
	if every <= 0 {
		every = cluster.DefaultHeartbeatInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if h.mgr.Leading() {
			continue
		}
		resp := new(weftv1.StatusResponse)
		cctx, cancel := context.WithTimeout(ctx, every)
		err := h.forward(metadata.AppendToOutgoingContext(cctx, mdLiveness, "1"), weftv1.Meta_Status_FullMethodName, &weftv1.StatusRequest{}, resp)
		cancel()
		if err != nil {
			h.noteNoLeader()
			continue
		}
		h.mgr.ApplyLiveness(resp.Servers, resp.TotalBytes, resp.FreeBytes, resp.UsedBytes)
	}
}

// noteNoLeader remembers when the manager was last found unreachable.
func (h *ha) noteNoLeader() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lostAt.IsZero() || time.Since(h.lostAt) > 10*h.ttl {
		h.lostAt = time.Now()
	}
}

// errNoManager is the answer to a manager call while no manager can be
// reached.
func errNoManager(cause error) error {
	msg := "no cluster manager is reachable right now (a meta server election is in progress?); retry in a few seconds"
	if cause != nil {
		msg += ": " + cause.Error()
	}
	return status.Error(codes.Unavailable, msg)
}

// forward sends a call to the elected manager.
func (h *ha) forward(ctx context.Context, method string, req, resp any) error {
	if h.cli == nil {
		return errNoManager(nil)
	}
	id, addr := h.leader()
	if addr == "" || id == h.cfg.ID {
		if weftv1.MetaCallOf(method).ManagerOnly {
			return h.forwardToPeers(ctx, method, req, resp)
		}
		return errNoManager(nil)
	}
	cc, err := h.conn(addr)
	if err != nil {
		return errNoManager(err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, forwardTimeout)
		defer cancel()
	}
	ctx = metadata.AppendToOutgoingContext(ctx, mdForwarded, "1")
	if err := cc.Invoke(ctx, method, req, resp); err != nil {
		if status.Code(err) == codes.Unavailable {
			return errNoManager(err)
		}
		return err
	}
	return nil
}

// conn returns the cached connection to the manager at addr.
func (h *ha) conn(addr string) (*grpc.ClientConn, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fwd != nil && h.fwdAddr == addr {
		return h.fwd, nil
	}
	if h.fwd != nil {
		h.fwd.Close()
		h.fwd = nil
	}
	cc, err := rpc.Dial(addr)
	if err != nil {
		return nil, err
	}
	h.fwd, h.fwdAddr = cc, addr
	return cc, nil
}

// close closes the connection to the manager.
func (h *ha) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fwd != nil {
		h.fwd.Close()
		h.fwd = nil
	}
	for a, cc := range h.peerConns {
		cc.Close()
		delete(h.peerConns, a)
	}
}

// managing reports whether this meta server does the manager's duties.
func (h *ha) managing() bool { return h == nil || h.mgr == nil || h.mgr.Leading() }

// isForwarded reports whether the incoming call was forwarded by another
// meta server.
func isForwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(mdForwarded)) > 0
}

// hasMD reports whether the incoming call carries metadata key.
func hasMD(ctx context.Context, key string) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(key)) > 0
}
