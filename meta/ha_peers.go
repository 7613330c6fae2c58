package meta

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/internal/rpc"
)

// A meta server that cannot tell from etcd who the cluster manager is (it
// lost its etcd session: etcd is unreachable from here, or an election is
// in progress) still relays the data servers' registrations and
// heartbeats to the manager: it tries the other meta servers it last read
// from the registry, each call marked forwarded. A follower refuses a
// forwarded manager call (Unavailable) and only the elected manager
// answers it, so the first answer comes from the manager; that server is
// tried first next time. Without this, data servers connected to a meta
// server cut off etcd would never reach the new manager and be marked
// offline by it.

// peerTryTimeout bounds the try of one other meta server.
const peerTryTimeout = time.Second

// notePeers remembers the other meta servers of a registry read.
func (h *ha) notePeers(recs []metaRecord) {
	var peers []metaRecord
	for _, r := range recs {
		if r.ID != h.cfg.ID && r.Address != h.addr {
			peers = append(peers, r)
		}
	}
	h.mu.Lock()
	h.peers = peers
	h.mu.Unlock()
}

// forwardToPeers sends a manager call to the other meta servers last
// known, the one that answered as manager last time first, until one
// answers it.
func (h *ha) forwardToPeers(ctx context.Context, method string, req, resp any) error {
	h.mu.Lock()
	peers, hint := slices.Clone(h.peers), h.peerHint
	h.mu.Unlock()
	if i := slices.IndexFunc(peers, func(r metaRecord) bool { return r.Address == hint }); i > 0 {
		peers[0], peers[i] = peers[i], peers[0]
	}
	var last error
	for _, p := range peers {
		if ctx.Err() != nil {
			break
		}
		cc, err := h.peerConn(p.Address)
		if err != nil {
			last = err
			continue
		}
		tctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, mdForwarded, "1"), peerTryTimeout)
		err = cc.Invoke(tctx, method, req, resp)
		cancel()
		if err == nil {
			h.mu.Lock()
			changed := h.peerHint != p.Address
			h.peerHint = p.Address
			h.mu.Unlock()
			if changed {
				h.log.Warn("the cluster manager cannot be learned from etcd: relaying data server calls to the meta server that answers as manager",
					"manager", p.ID, "address", p.Address)
			}
			return nil
		}
		if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
			return err // the manager's own answer
		}
		last = err
	}
	return errNoManager(last)
}

// peerConn returns the connection to the meta server at addr, dialed on
// first use.
func (h *ha) peerConn(addr string) (*grpc.ClientConn, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cc := h.peerConns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := rpc.Dial(addr)
	if err != nil {
		return nil, err
	}
	if h.peerConns == nil {
		h.peerConns = make(map[string]*grpc.ClientConn)
	}
	h.peerConns[addr] = cc
	return cc, nil
}
