package meta

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/weft-fs/weft/cluster"
	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// haInterceptor is the meta server's first unary interceptor. In a
// follower it forwards the calls that need the manager's in-memory state
// (registrations, heartbeats, sync reports, target removal, status) to
// the elected manager; a heartbeat that cannot be forwarded is answered
// with the saved chain table. It adds the manager's address to
// registration and heartbeat answers, the live meta servers to session
// answers and Status, reloads a follower's chain table before GetChains,
// and takes the request id of a retried namespace operation (see
// ha_requests.go).
func (s *Service) haInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	h := s.ha
	if weftv1.MetaCallOf(info.FullMethod).ManagerOnly {
		resp, err := s.managerCall(ctx, info.FullMethod, req, handler)
		_, addr := h.leader()
		// resp may hold a nil pointer when the call failed; an answer
		// relayed while no manager is known keeps the address it carries.
		switch r := resp.(type) {
		case *weftv1.RegisterServerResponse:
			if r != nil && addr != "" {
				r.ManagerAddress = addr
			}
		case *weftv1.HeartbeatResponse:
			if r != nil && addr != "" {
				r.ManagerAddress = addr
			}
		}
		return resp, err
	}
	switch info.FullMethod {
	case weftv1.Meta_Status_FullMethodName:
		return s.haStatus(ctx, req, handler)
	case weftv1.Meta_GetChains_FullMethodName:
		if !h.managing() {
			if err := s.cluster.(*cluster.Manager).Refresh(ctx, false); err != nil {
				s.log.Warn("reload the chain table before GetChains", "err", err)
			}
		}
		return handler(ctx, req)
	case weftv1.Meta_OpenSession_FullMethodName, weftv1.Meta_RenewSession_FullMethodName:
		resp, err := handler(ctx, req)
		if err != nil {
			// resp is a nil pointer (e.g. the renewal of a session that
			// expired): the error is the whole answer.
			return resp, err
		}
		switch r := resp.(type) {
		case *weftv1.OpenSessionResponse:
			r.MetaAddresses = h.metaAddresses(ctx)
		case *weftv1.RenewSessionResponse:
			r.MetaAddresses = h.metaAddresses(ctx)
		}
		return resp, err
	}
	return handler(withRequestToken(ctx), req)
}

// managerCall runs a call only the manager serves: here if this server is
// the manager, else at the manager.
func (s *Service) managerCall(ctx context.Context, method string, req any, handler grpc.UnaryHandler) (any, error) {
	h := s.ha
	if h.managing() {
		resp, err := handler(ctx, req)
		if !errors.Is(err, cluster.ErrNotLeader) {
			return resp, err
		}
		if isForwarded(ctx) {
			return nil, errNoManager(err)
		}
		// This server stopped leading while the call waited: forward it.
	}
	if isForwarded(ctx) {
		return nil, errNoManager(fmt.Errorf("%w (the call was forwarded to it)", cluster.ErrNotLeader))
	}
	resp := weftv1.MetaCallOf(method).Reply.New().Interface()
	err := h.forward(ctx, method, req, resp)
	if err != nil && method == weftv1.Meta_Heartbeat_FullMethodName && isNoManager(err) {
		// No manager now: keep the data server serving with the saved
		// table (the next manager gives it a failure timeout of grace).
		h.noteNoLeader()
		return s.cluster.(*cluster.Manager).FollowerHeartbeat(ctx, req.(*weftv1.HeartbeatRequest))
	}
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// haStatus answers Status: a follower returns the manager's (which knows
// liveness, capacity and health), or its own view with a warning when no
// manager answers; the manager adds the live meta servers. A liveness-only
// request (from a follower) gets the servers and capacity alone.
func (s *Service) haStatus(ctx context.Context, req any, handler grpc.UnaryHandler) (any, error) {
	h := s.ha
	mgr := s.cluster.(*cluster.Manager)
	if hasMD(ctx, mdLiveness) {
		resp := &weftv1.StatusResponse{Servers: mgr.Servers()}
		resp.TotalBytes, resp.FreeBytes, resp.UsedBytes = mgr.Capacity()
		return resp, nil
	}
	if !h.managing() && !isForwarded(ctx) {
		resp := new(weftv1.StatusResponse)
		err := h.forward(ctx, weftv1.Meta_Status_FullMethodName, req, resp)
		if err == nil {
			return resp, nil
		}
		out, herr := handler(ctx, req)
		if r, ok := out.(*weftv1.StatusResponse); ok && herr == nil {
			r.MetaServers = h.metaServers(ctx)
			r.Warnings = append(r.Warnings, "this meta server cannot reach the cluster manager (election in progress?): server liveness and chain health shown here may be stale")
		}
		return out, herr
	}
	out, err := handler(ctx, req)
	if r, ok := out.(*weftv1.StatusResponse); ok && err == nil {
		r.MetaServers = h.metaServers(ctx)
	}
	return out, err
}

// isNoManager reports whether err is errNoManager's.
func isNoManager(err error) bool {
	return err != nil && status.Code(err) == codes.Unavailable
}
