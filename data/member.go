package data

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/data/chunk"
	"github.com/weft-fs/weft/internal/fserr"
	"github.com/weft-fs/weft/internal/rpc"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// Member states in a chain table.
const (
	stateServing = "serving"
	stateSyncing = "syncing"
	stateOffline = "offline"
)

// forwardTimeout bounds one forward to the next member; a member that
// stops answering is normally cut off sooner, when the chain's version
// changes.
const forwardTimeout = 30 * time.Second

func memberState(m *weftv1.ChainMember) string {
	if m.GetState() == "" {
		return stateServing
	}
	return m.GetState()
}

// role is what a request asks of the member it reaches.
type role int

const (
	roleHead      role = iota // a client mutation: the chain's head applies it first
	roleForwarded             // a mutation from the previous member
	roleRead                  // a client read, or a copy for a peer: serving members only
)

// member is a chain member on this server, resolved for one request.
type member struct {
	view     *chainView
	pos      int // index in view.members
	targetID uint64
	target   *chunk.Target
}

func (m member) state() string { return memberState(m.view.members[m.pos]) }

// successor is the next member a mutation goes to: the first serving or
// syncing member after this one, or nil at the tail.
func (m member) successor() *weftv1.ChainMember {
	for _, n := range m.view.members[m.pos+1:] {
		if st := memberState(n); st == stateServing || st == stateSyncing {
			return n
		}
	}
	return nil
}

// peers returns the chain's serving members other than this one, for
// copying a chunk from.
func (m member) servingPeers() []*weftv1.ChainMember {
	var out []*weftv1.ChainMember
	for i, n := range m.view.members {
		if i != m.pos && memberState(n) == stateServing && n.GetAddress() != "" {
			out = append(out, n)
		}
	}
	return out
}

// member fences a request: the server must be in touch with the meta
// service, the chain must have a member here at exactly version, and that
// member must be able to play role. targetID names the member on requests
// between members; 0 picks the head (mutations) or a serving member
// (reads).
func (s *Server) member(chainID, version, targetID uint64, r role) (member, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.fencedLocked(); err != nil {
		return member{}, err
	}
	if !s.haveChains {
		return member{}, status.Errorf(codes.Unavailable,
			"data server has no chain table from the meta service at %s yet: retry shortly", s.cfg.MetaAddr)
	}
	v, ok := s.chains[chainID]
	if !ok {
		s.askRefresh()
		return member{}, status.Errorf(codes.FailedPrecondition,
			"stale chain version: chain %d has no member on this data server: refresh the chain table and retry", chainID)
	}
	if v.version != version {
		if version > v.version {
			s.askRefresh()
		}
		return member{}, status.Errorf(codes.FailedPrecondition,
			"stale chain version: chain %d is at version %d here, request has %d: refresh the chain table and retry",
			chainID, v.version, version)
	}
	if targetID != 0 {
		t, ok := v.local[targetID]
		if !ok {
			return member{}, status.Errorf(codes.FailedPrecondition,
				"stale chain version: target %d is not a member of chain %d (version %d) on this data server: refresh the chain table and retry",
				targetID, chainID, version)
		}
		m := member{view: v, pos: v.localPos[targetID], targetID: targetID, target: t}
		return m, m.allows(r)
	}
	switch r {
	case roleHead:
		for i, n := range v.members {
			if memberState(n) != stateServing {
				continue
			}
			t, ok := v.local[n.GetTargetId()]
			if !ok {
				return member{}, status.Errorf(codes.FailedPrecondition,
					"not the chain head: chain %d (version %d) is headed by target %d on data server %d (%s): refresh the chain table and retry",
					chainID, version, n.GetTargetId(), n.GetServerId(), n.GetAddress())
			}
			return member{view: v, pos: i, targetID: n.GetTargetId(), target: t}, nil
		}
		return member{}, status.Errorf(codes.Unavailable, "chain %d (version %d) has no serving member: retry when one is back", chainID, version)
	case roleRead:
		var last member
		for id, t := range v.local {
			m := member{view: v, pos: v.localPos[id], targetID: id, target: t}
			if m.state() == stateServing {
				return m, nil
			}
			last = m
		}
		return member{}, last.allows(r)
	default:
		return member{}, status.Errorf(codes.FailedPrecondition, "forwarded request for chain %d names no target member", chainID)
	}
}

// allows checks that the member's state lets it play role.
func (m member) allows(r role) error {
	st := m.state()
	switch {
	case st == stateServing:
		return nil
	case st == stateSyncing && r == roleForwarded:
		return nil
	case st == stateSyncing:
		return status.Errorf(codes.FailedPrecondition,
			"target %d is still syncing in chain %d (version %d) and does not serve reads: read from a serving member",
			m.targetID, m.view.id, m.view.version)
	default:
		return status.Errorf(codes.FailedPrecondition,
			"target %d is %s in chain %d (version %d): refresh the chain table and retry",
			m.targetID, st, m.view.id, m.view.version)
	}
}

// failureTimeoutFor is the meta service's failure timeout as told at
// registration, or 2.5 heartbeat intervals if it did not say.
func failureTimeoutFor(ms int64, interval time.Duration) time.Duration {
	if ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return interval * 5 / 2
}

// fencedLocked refuses I/O while the server has not heard from the meta
// service for half its failure timeout: by the time the manager declares
// the server offline and continues the chains without it, the server has
// stopped serving data it may have missed and accepting writes the others
// will not see. A server that never reached the meta service (its table
// set directly) is not fenced.
func (s *Server) fencedLocked() error {
	if s.lastContact.IsZero() {
		return nil
	}
	if gap := time.Since(s.lastContact); gap > s.failureTimeout/2 {
		return status.Errorf(codes.Unavailable,
			"data server cut off from the meta service at %s (no heartbeat answer for %s, fencing after %s): refusing I/O until it answers again; use another replica or retry",
			s.cfg.MetaAddr, gap.Round(time.Millisecond), s.failureTimeout/2)
	}
	return nil
}

// leaseLocked is how long a chunk handed out for reading in place may be
// read without asking again: until the server would fence itself if it
// heard nothing more from the meta service (so a client never reads a
// copy the chain has gone on without), at most maxReadLease.
func (s *Server) leaseLocked() time.Duration {
	if s.lastContact.IsZero() {
		return maxReadLease
	}
	return min(maxReadLease, s.failureTimeout/2-time.Since(s.lastContact))
}

// maxReadLease bounds the lease of a chunk read in place.
const maxReadLease = 2 * time.Second

// noteContact records a call to the meta service sent at sent and
// answered. If the server had been cut off long enough to fence itself,
// the chains may have continued without its members: what syncing members
// had verified no longer holds.
func (s *Server) noteContact(sent time.Time) {
	s.mu.Lock()
	prev := s.lastContact
	if sent.After(prev) {
		s.lastContact = sent
	}
	ft := s.failureTimeout
	s.mu.Unlock()
	if !prev.IsZero() && sent.Sub(prev) > ft/2 {
		s.log.Warn("meta service answers again after the server fenced itself; restarting resyncs", "meta", s.cfg.MetaAddr,
			"silence", sent.Sub(prev).Round(time.Millisecond))
		s.resetSyncs()
	}
}

// forwardContext is ctx bounded by forwardTimeout and cancelled when the
// chain's version changes.
func forwardContext(ctx context.Context, v *chainView) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, forwardTimeout)
	stop := context.AfterFunc(v.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// forwardError turns the failure of the next member into what the client
// should do: a refused chain version means the table is changing (refresh
// and retry); an errno is the member's answer (kept); anything else means
// the member is unreachable (retry after the manager takes it out).
func (s *Server) forwardError(m member, next *weftv1.ChainMember, what string, err error) error {
	where := fmt.Sprintf("chain %d (version %d): %s: next member, target %d on data server %d (%s)",
		m.view.id, m.view.version, what, next.GetTargetId(), next.GetServerId(), next.GetAddress())
	if m.view.ctx.Err() != nil {
		s.askRefresh()
		return status.Errorf(codes.FailedPrecondition, "stale chain version: %s: the chain changed meanwhile: refresh the chain table and retry", where)
	}
	if _, ok := fserr.Errno(err); ok {
		return fmt.Errorf("%s, failed: %w", where, err)
	}
	if status.Code(err) == codes.FailedPrecondition {
		s.askRefresh()
		return status.Errorf(codes.FailedPrecondition, "stale chain version: %s, refused: %s", where, status.Convert(err).Message())
	}
	msg := status.Convert(err).Message()
	s.forwards.failed(m, next, msg)
	return status.Errorf(codes.Unavailable, "%s, is unavailable (%s): retry after the cluster manager has taken it out of the chain",
		where, msg)
}

// peerPool keeps one client connection per peer address.
type peerPool struct {
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	closed bool
}

func (p *peerPool) client(addr string) (weftv1.DataClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("data server is shutting down")
	}
	if cc := p.conns[addr]; cc != nil {
		return weftv1.NewDataClient(cc), nil
	}
	cc, err := rpc.Dial(addr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "connect to data server %s: %v", addr, err)
	}
	if p.conns == nil {
		p.conns = make(map[string]*grpc.ClientConn)
	}
	p.conns[addr] = cc
	return weftv1.NewDataClient(cc), nil
}

func (p *peerPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for addr, cc := range p.conns {
		cc.Close()
		delete(p.conns, addr)
	}
}

// dropGone closes the connections to addresses not in live.
func (p *peerPool) dropGone(live map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, cc := range p.conns {
		if !live[addr] {
			cc.Close()
			delete(p.conns, addr)
		}
	}
}
